"""`pal-paper run`'s grid: the cells left to run, queued on DVC's queue,
waited for with a progress bar, rendered; Ctrl-C stops the workers.

A cell is an experiment on HEAD, so the workspace must be committed (the
tables under OUT that pal-paper renders itself excepted); `run` queues only
the cells that have not finished on this commit, so an interrupted grid
resumes where it stopped.
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palcore.params import DEFAULT_PARAMS
from palpaper import plan, workers
from palpaper.cells import announce_copies, check_cells, untracked_inputs
from palpaper.collect import collect, command, grid
from palpaper.experiments import Repo, wait
from palpaper.grids import RESULTS
from palpaper.inputs import (
    parse_baselines,
    parse_cells,
    parse_results,
    parse_runs,
    parse_shard,
    read_params,
)
from palpaper.overrides import Cell, GridError
from palpaper.tools import ExperimentError

log = logging.getLogger(__name__)


def refuse_uncommitted(repo: Repo, out: Path) -> None:
    """Cells are experiments on HEAD: refuse tracked changes, except what
    pal-paper itself writes (its own previous run's): the tables under OUT
    and the reports it copies to results/<dataset>/<report>/."""
    try:
        own = out.resolve().relative_to(repo.root.resolve()).as_posix() + "/"
    except ValueError:  # OUT outside the repository: nothing of it is tracked
        own = None
    reports = {r.report for r in RESULTS.values() if r.report is not None}

    def written(path: str) -> bool:
        parts = path.split("/")
        if parts[0] == "results" and len(parts) > 3 and parts[2] in reports:
            return True
        return own is not None and path.startswith(own)

    dirty = [p for p in repo.dirty() if not written(p)]
    if dirty:
        raise ExperimentError(
            f"uncommitted changes ({', '.join(dirty[:3])}"
            f"{', …' if len(dirty) > 3 else ''}): the cells are experiments on "
            "HEAD; commit or stash them first"
        )


@dataclass(frozen=True, kw_only=True)
class GridRun:
    """What one `pal-paper run` asks for."""

    ids: list[str]  # the results whose cells run
    runs: list[int] | None  # --runs; None: the preset's protocol.runs
    cells: list[str] | None  # --cells: cells' names or columns' keys; None: all
    shard: slice | None  # --shard's slice of the cells
    jobs: int  # -j: DVC queue workers
    cards: list[str] | None  # --gpus: one worker pinned per card
    no_wait: bool  # return once the workers are started
    out: Path  # where the results are rendered
    rerun: str  # the command line that resumes this run
    cite: bool = False  # --baselines cited: Tables 1-2's baselines from the paper


def grid_run(
    names: Sequence[str],
    *,
    runs: str | None,
    jobs: int | None,
    cells: str | None,
    shard: str | None,
    gpus: str | None,
    no_wait: bool,
    baselines: str,
    out: Path,
) -> tuple[GridRun, dict[str, Any]]:
    """`pal-paper run`'s options (by their names), read and checked before
    the workspace is:
    the run (its workers every card filled where neither --gpus,
    PAL_PAPER_GPUS nor -j says, `fill_cards`) and the params it runs on."""
    ids, run_ids = parse_results(names), parse_runs(runs)
    part = None if shard is None else parse_shard(shard)
    cards = workers.parse_gpus(
        gpus if gpus is not None else os.environ.get(workers.ENV)
    )
    wanted = parse_cells(cells)
    params = read_params(DEFAULT_PARAMS)
    cite = parse_baselines(baselines, ids, params)
    if cards is None and jobs is None:  # fill every card torch sees
        cards = fill_cards(ids, params, run_ids, cite)
    jobs = jobs or 1
    run = GridRun(
        ids=ids,
        runs=run_ids,
        cells=wanted,
        shard=part,
        jobs=jobs,
        cards=cards,
        no_wait=no_wait,
        out=out,
        rerun=command(ids, run_ids, wanted, shard, jobs, cite=cite),
        cite=cite,
    )
    return run, params


def run_grid(repo: Repo, run: GridRun, params: dict[str, Any]) -> None:
    """`pal-paper run`'s work: check, queue, start workers, wait, render."""
    ids, jobs, cards = run.ids, run.jobs, run.cards
    todo = select_cells(ids, params, run.runs, run.cells, run.shard, run.cite)
    finished = repo.finished(todo)
    check_cells(
        repo.root, params, [c for c in todo if repo.exp_name(c) not in finished]
    )
    copies = untracked_inputs(repo.root, params)
    queued = _queue(repo, todo, finished, copies)
    kept = [c.name for c in todo if repo.exp_name(c) in finished]
    log.info(
        "%d cells on %s: %d finished before (kept), %d queued now, %d already queued",
        len(todo),
        repo.short,
        len(kept),
        len(queued),
        len(todo) - len(kept) - len(queued),
    )
    for name in queued:
        log.info("queued cell %s", name)
    pending = [c for c in todo if repo.exp_name(c) not in finished]
    if pending:
        announce_copies(repo.root, copies)
        if cards or "Running" not in repo.queue_status().values():
            repo.start(jobs, cards)  # pinned: only the workers that are gone
        if run.no_wait:
            log.info("workers started; `dvc queue status` shows them")
            return
        outcome = _wait(repo, pending, jobs, cards, copies)
        if cards:
            _stop_idle_workers(repo)
        failed = [c for c in pending if outcome[repo.exp_name(c)] == "failed"]
        if failed:
            raise ExperimentError(
                "\nError: ".join(
                    f"cell '{c.name}' ({c.describe()}) failed: `dvc queue logs "
                    f"{repo.exp_name(c)}` shows why; rerun: {run.rerun}"
                    for c in failed
                )
            )
    collect(repo, ids, params, run.runs, run.out, run.cite)


def select_cells(
    ids: list[str],
    params: dict[str, Any],
    runs: list[int] | None,
    wanted: list[str] | None,
    shard: slice | None,
    cite: bool = False,
) -> list[Cell]:
    """The cells of the results, narrowed to `--cells` (each a cell's name or
    a column's key, such as missing's `text-0.1`) and `--shard`; `cite`: the
    route `--baselines cited`."""
    columns, todo = grid(ids, params, runs, cite)
    if wanted is not None:
        keys: dict[str, set[str]] = {}  # a key can name a cell in each result
        for c in (c for cols in columns.values() for c in cols):
            keys.setdefault(c.key, set()).add(c.cell.name)
        names = {c.name for c in todo}
        unknown = [w for w in wanted if w not in names and w not in keys]
        if unknown:
            raise GridError(
                f"--cells: no cell '{unknown[0]}' in {', '.join(ids)} "
                "(`pal-paper list` names them)"
            )
        chosen = set().union(*({w} if w in names else keys[w] for w in wanted))
        todo = [c for c in todo if c.name in chosen]
    if shard is not None:
        todo = todo[shard]
    return todo


def fill_cards(
    ids: list[str], params: dict[str, Any], runs: list[int] | None, cite: bool
) -> list[str] | None:
    """`pal-paper run`'s workers where neither --gpus, PAL_PAPER_GPUS nor -j
    says: on a GPU (tune.device), J pinned workers a card torch sees
    (`workers.fill`; J from the card's packing in palpaper/costs.yaml, or
    PAL_PAPER_CARD's, and the largest tuning of the grid's methods); None
    where tune runs on the CPU or torch sees no card (one unpinned worker)."""
    if plan.device_kind(params) != "GPU":
        return None
    card = plan.card(None, "GPU")
    gib = card.largest(plan.trained_methods(ids, params, runs, cite))
    gpus, per_card = workers.fill(lambda memory: card.slots(gib, memory))
    if gpus:
        log.info(workers.fill_line(per_card, card["packing"], card.where))
    return gpus or None


def _queue(
    repo: Repo, todo: list[Cell], finished: dict[str, str], copies: list[str]
) -> list[str]:
    """Queue the cells neither finished nor queued nor running; returns their
    names. A task whose process is gone is killed (its copy removed) first.
    The finished experiments are listed again after the queue's states, so a
    cell that finished in between is not taken for a failed one."""
    status = repo.queue_status()
    finished = {**finished, **repo.finished()}
    queued = []
    for c in todo:
        name = repo.exp_name(c)
        state = status.get(name)
        if state == "Running" and repo.interrupted(name):
            log.info(
                "cell %s was interrupted (its process is gone): queued again", c.name
            )
            repo.kill(name)
            state = "Failed"
        if name in finished or state in ("Queued", "Running"):
            continue
        if state is not None:  # failed before: drop it so the name is free
            repo.remove_copies(name)
            repo.forget(name)
        repo.queue(c, copies)
        queued.append(c.name)
    return queued


def _wait(
    repo: Repo,
    pending: list[Cell],
    jobs: int,
    cards: list[str] | None,
    copies: list[str],
) -> dict[str, str]:
    """Wait for the cells with a progress bar."""
    from palcore.progress import tqdm

    with tqdm(total=len(pending), desc="cells", unit="cell") as bar:
        return wait(repo, pending, jobs, cards, progress=bar.update, copy_paths=copies)


def _stop_idle_workers(repo: Repo) -> None:
    """The grid is done: its pinned workers end here once DVC's queue holds
    nothing queued or running. A worker exits by itself when the queue is
    empty, but beside a worker that was killed it can stay in its warm
    shutdown for good (met after a killed worker's rerun: idle 11 minutes,
    gone at SIGTERM)."""
    if {"Queued", "Running"} & set(repo.queue_status().values()):
        return
    if n := workers.stop(repo.root):
        log.info("%d pinned workers stopped: the queue is empty", n)


def interrupted(repo: Repo, rerun: str) -> str:
    """Ctrl-C: stop DVC's queue workers, the pinned ones and the cells they
    run (a killed cell is queued again by the next run); the line that says so."""
    try:
        repo.stop()
    except (ExperimentError, KeyboardInterrupt):
        return (
            "interrupted; DVC's queue workers may go on with the grid "
            "(`dvc queue status`): `dvc queue stop --kill` stops them, and "
            f"`{rerun}` resumes the grid"
        )
    return (
        "interrupted: the grid's workers and their cells were stopped; "
        f"finished cells are kept, `{rerun}` runs the rest"
    )


def run_interruptible(repo: Repo, run: GridRun, params: dict[str, Any]) -> None:
    """`run_grid`, where SIGTERM (what a batch scheduler or `kill` sends)
    stops the grid as Ctrl-C does: an ExperimentError of `interrupted`'s line."""
    previous = signal.signal(signal.SIGTERM, _as_ctrl_c)
    try:
        run_grid(repo, run, params)
    except KeyboardInterrupt:
        raise ExperimentError(interrupted(repo, run.rerun)) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def _as_ctrl_c(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
