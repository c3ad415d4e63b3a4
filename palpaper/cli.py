"""`pal-paper`: the paper's results, each from one command.

    pal-paper list                      the results, their cells, their commands
    pal-paper run missing --runs 0      queue the grid's cells as DVC experiments,
                                        run DVC's queue, then render the table
    pal-paper collect missing --runs 0  render it again from finished experiments
    pal-paper plan all -p configs/food101.yaml   projected GPU time of a preset

A cell is an experiment on the current commit, named after the params it
changes; `run` queues only the cells that have not finished on this commit,
so an interrupted grid resumes where it stopped. Tables (and figures) go to
results/paper/<dataset>/<result>.md, .csv and .png.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from palcore.cliutil import clean_errors, setup_logging
from palcore.errors import ParamsError
from palcore.outputs import write_bytes_atomic
from palcore.params import read_params_file
from palpaper import render, workers
from palpaper.experiments import ExperimentError, Repo, wait
from palpaper.grids import RESULTS, Cell, Column, GridError, get, result

log = logging.getLogger(__name__)

JOBS_HELP = (
    "Queue workers (`dvc queue start -j N`): N cells at once. Every worker sees "
    "the same devices, so on a GPU box they share the first GPU: use --gpus "
    "there. 1 on a CPU."
)
GPUS_HELP = (
    "One queue worker per CUDA device id listed (e.g. 0,1,2,3), each pinned to "
    "its card with CUDA_VISIBLE_DEVICES: every cell runs on one card, the "
    "workers share the DVC cache. List a card twice for two cells on it at "
    f"once. Replaces -j. Default: ${workers.ENV} when set."
)


# the keys the grids read beyond the ones they change
REQUIRED = (
    "data.dataset",
    "solve.width",
    "pipelines.main",
    "protocol.runs",
    "ablation",
)


def _params(path: Path, text: str | None = None) -> dict[str, Any]:
    """The params file (or its `text` at a commit), with the keys grids read."""
    if text is None:
        params = read_params_file(path)
    else:
        try:
            params = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ParamsError(f"{path}: not valid YAML") from None
    for key in REQUIRED:
        try:
            get(params, key)
        except GridError:
            raise ParamsError(f"{path}: no key '{key}'") from None
    return params


def _results(names: Sequence[str]) -> list[str]:
    if not names or list(names) == ["all"]:
        return list(RESULTS)
    return [result(n).id for n in names]


def _runs(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        runs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GridError(f"--runs: run ids separated by commas, got '{text}'") from None
    if not runs:
        raise GridError("--runs: name at least one run id")
    return runs


def _shard(text: str) -> slice:
    """K/N: the slice of every N-th cell from the K-th."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise GridError(f"--shard: K/N such as 1/4, got '{text}'") from None
    if not 1 <= k <= n:
        raise GridError(f"--shard: K must be 1 to N, got '{text}'")
    return slice(k - 1, None, n)


def _command(names: Sequence[str], runs: list[int] | None) -> str:
    cmd = "pal-paper run " + " ".join(names)
    return cmd + (f" --runs {','.join(map(str, runs))}" if runs is not None else "")


def _grid(
    names: list[str], params: dict[str, Any], runs: list[int] | None
) -> tuple[dict[str, list[Column]], list[Cell]]:
    """Each result's columns, and the distinct cells of them all in order."""
    columns = {n: RESULTS[n].columns(params, runs) for n in names}
    cells: dict[str, Cell] = {}
    for cols in columns.values():
        for c in cols:
            cells.setdefault(c.cell.name, c.cell)
    return columns, list(cells.values())


runs_option = click.option(
    "--runs",
    default=None,
    metavar="R[,R…]",
    help="Run ids of each cell (sets protocol.runs). Default: the committed "
    "protocol.runs. Use --runs 0 where three runs per cell do not fit.",
)
params_path_option = click.option(
    "--params",
    "-p",
    "params_file",
    default="params.yaml",
    show_default=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The params file the cells change (the committed one for run/collect).",
)
out_option = click.option(
    "--out",
    default="results/paper",
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder of the rendered results; each dataset gets its own subfolder.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def main(verbose: bool) -> None:
    """The paper's results, each from one command (DVC experiments).

    RESULT is one of: missing (Tables 1-2), steps (the per-step figures),
    ablation (Table 3), prompt (prompt layers, length, pool size), upsampling
    (Table 4), tasks (Table 5), stability (stability/plasticity), or all.
    """
    setup_logging(verbose)


@main.command("list")
@params_path_option
@runs_option
@clean_errors
def list_cmd(params_file: Path, runs: str | None) -> None:
    """Each result: where it is in the paper, its cells and their params."""
    params = _params(params_file)
    for name, r in RESULTS.items():
        cols = r.columns(params, _runs(runs))
        plural = "" if len(cols) == 1 else "s"
        click.echo(f"{name}: {r.paper}; {len(cols)} column{plural}, cells:")
        for c in cols:
            click.echo(f"  {c.label}: {c.cell.name}  ({c.cell.describe()})")


@main.command("run")
@click.argument("names", nargs=-1, metavar="RESULT…")
@runs_option
@click.option(
    "-j", "--jobs", default=1, show_default=True, type=click.IntRange(1), help=JOBS_HELP
)
@click.option(
    "--cells",
    default=None,
    metavar="NAME[,NAME…]",
    help="Run only these cells (names as `pal-paper list` prints them).",
)
@click.option(
    "--shard",
    default=None,
    metavar="K/N",
    help="Run every N-th cell from the K-th (1-based): one share of the grid, "
    "for one of N clones, each pinned to its own GPU (README).",
)
@click.option("--gpus", default=None, metavar="ID[,ID…]", help=GPUS_HELP)
@click.option("--no-wait", is_flag=True, help="Queue and start workers, then return.")
@out_option
@clean_errors
def run_cmd(
    names: tuple[str, ...],
    runs: str | None,
    jobs: int,
    cells: str | None,
    shard: str | None,
    gpus: str | None,
    no_wait: bool,
    out: Path,
) -> None:
    """Queue the cells of RESULT… not yet finished on this commit, run them
    with DVC's queue, and render each result into OUT/<dataset>/.

    Cells that vary solve.* only rerun the analytic stages from the cached
    features. The workspace must be committed: cells are experiments on HEAD.
    """
    ids = _results(names)
    run_ids = _runs(runs)
    shard_slice = None if shard is None else _shard(shard)
    cards = workers.parse_gpus(
        gpus if gpus is not None else os.environ.get(workers.ENV)
    )
    repo = Repo(Path.cwd())
    _refuse_uncommitted(repo, out)
    params = _params(Path("params.yaml"))
    columns, todo = _grid(ids, params, run_ids)
    if cells is not None:
        wanted = [c.strip() for c in cells.split(",") if c.strip()]
        unknown = [w for w in wanted if w not in {c.name for c in todo}]
        if unknown:
            raise GridError(
                f"--cells: no cell '{unknown[0]}' in {', '.join(ids)} "
                "(`pal-paper list` names them)"
            )
        todo = [c for c in todo if c.name in wanted]
    if shard_slice is not None:
        todo = todo[shard_slice]
    finished = repo.finished()
    status = repo.queue_status()
    queued = []
    for c in todo:
        state = status.get(repo.exp_name(c))
        if state == "Running" and repo.interrupted(repo.exp_name(c)):
            log.info(
                "cell %s was interrupted (its process is gone): queued again", c.name
            )
            repo.kill(repo.exp_name(c))
            state = "Failed"
        if repo.exp_name(c) in finished or state in ("Queued", "Running"):
            continue
        if state is not None:  # failed before: drop it so the name is free
            repo.forget(repo.exp_name(c))
        repo.queue(c)
        queued.append(c.name)
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
        if cards or "Running" not in repo.queue_status().values():
            repo.start(jobs, cards)  # pinned: only the workers that are gone
        if no_wait:
            log.info("workers started; `dvc queue status` shows them")
            return
        outcome = _wait(repo, pending, jobs, cards, _command(ids, run_ids))
        failed = [c for c in pending if outcome[repo.exp_name(c)] == "failed"]
        if failed:
            raise ExperimentError(
                "\nError: ".join(
                    f"cell '{c.name}' ({c.describe()}) failed: `dvc queue logs "
                    f"{repo.exp_name(c)}` shows why; rerun: {_command(ids, run_ids)}"
                    for c in failed
                )
            )
    if cells is not None or shard is not None:
        log.info("ran the cells asked for; `pal-paper collect` renders the tables")
        return
    _collect(repo, ids, params, run_ids, out)


def _refuse_uncommitted(repo: Repo, out: Path) -> None:
    """Cells are experiments on HEAD: refuse tracked changes, except the
    tables pal-paper itself renders under OUT (its own previous run's)."""
    try:
        own = out.resolve().relative_to(repo.root.resolve()).as_posix() + "/"
    except ValueError:  # OUT outside the repository: nothing of it is tracked
        own = None
    dirty = [p for p in repo.dirty() if own is None or not p.startswith(own)]
    if dirty:
        raise ExperimentError(
            f"uncommitted changes ({', '.join(dirty[:3])}"
            f"{', …' if len(dirty) > 3 else ''}): the cells are experiments on "
            "HEAD; commit or stash them first"
        )


def _wait(
    repo: Repo,
    pending: list[Cell],
    jobs: int,
    cards: list[str] | None,
    rerun: str,
) -> dict[str, str]:
    """Wait for the cells with a progress bar; Ctrl-C ends the workers and the
    cells they run, which the next run queues again."""
    from tqdm import tqdm

    try:
        with tqdm(total=len(pending), desc="cells", unit="cell") as bar:
            return wait(repo, pending, jobs, cards, progress=bar.update)
    except KeyboardInterrupt:
        repo.stop()
        raise ExperimentError(
            f"interrupted: the grid's workers and their cells were stopped; "
            f"finished cells are kept, `{rerun}` runs the rest"
        ) from None


@main.command("collect")
@click.argument("names", nargs=-1, metavar="RESULT…")
@runs_option
@click.option(
    "--rev",
    default=None,
    metavar="COMMIT",
    help="The commit the cells ran on. Default: HEAD.",
)
@out_option
@clean_errors
def collect_cmd(
    names: tuple[str, ...], runs: str | None, rev: str | None, out: Path
) -> None:
    """Render RESULT… from the cells' finished experiments into OUT/<dataset>/.

    A cell without a finished experiment is one line naming it and the
    command that runs it (an `Error:` line per cell); nothing is written then.
    """
    repo = Repo(Path.cwd(), rev)
    params_text = repo.show(repo.baseline, "params.yaml")
    if params_text is None:
        raise ParamsError(f"params.yaml: not in commit {repo.short}")
    params = _params(Path(f"params.yaml at {repo.short}"), params_text)
    _collect(repo, _results(names), params, _runs(runs), out)


def _collect(
    repo: Repo,
    ids: list[str],
    params: dict[str, Any],
    runs: list[int] | None,
    out: Path,
) -> None:
    columns, cells = _grid(ids, params, runs)
    dataset = str(get(params, "data.dataset"))
    finished = repo.finished()
    lacking = [c for c in cells if repo.exp_name(c) not in finished]
    if lacking:
        status = repo.queue_status()
        lines = []
        for c in lacking:
            why = {
                "Failed": f"failed (`dvc queue logs {repo.exp_name(c)}`)",
                "Queued": "still queued",
                "Running": "still running",
            }.get(
                status.get(repo.exp_name(c), ""),
                f"has no finished experiment on {repo.short}",
            )
            owners = [i for i in ids if any(x.cell.name == c.name for x in columns[i])]
            lines.append(
                f"cell '{c.name}' ({c.describe()}) {why}; rerun: "
                f"{_command(owners, runs)}"
            )
        raise ExperimentError("\nError: ".join(lines))
    metrics: dict[str, dict[str, Any]] = {}
    for c in cells:
        m = repo.metrics(finished[repo.exp_name(c)], dataset)
        if m is None:
            raise ExperimentError(
                f"cell '{c.name}': its experiment has no readable "
                f"results/{dataset}/metrics.json; rerun: {_command(ids, runs)}"
            )
        metrics[c.name] = m
    folder = out / dataset
    for rid in ids:
        r = RESULTS[rid]
        data = {col.key: metrics[col.cell.name] for col in columns[rid]}
        table = render.build(r, columns[rid], data, dataset, _command([rid], runs))
        files = {
            f"{rid}.md": table.markdown().encode(),
            f"{rid}.csv": table.csv().encode(),
        }
        png = render.figure(r, columns[rid], data, table.caption.split(";")[0])
        if png is not None:
            files[f"{rid}.png"] = png
        for name, blob in files.items():
            write_bytes_atomic(folder / name, blob)
        n = len(columns[rid])
        log.info("%s: %s (%d cell%s)", rid, folder / f"{rid}.md", n, "s" * (n != 1))


def costs() -> dict[str, Any]:
    return render.package_yaml("costs.yaml")


FREE_KEYS = {"pipelines.main", "protocol.runs"}


def tunings(r: Any, cell: Cell, params: dict[str, Any]) -> tuple[int, int]:
    """(trained tunings, extractions) a cell adds to what `dvc repro` made."""
    if r.keeps_features:
        return 0, 0
    variants = cell.value(params, "pipelines.main")
    run_ids = cell.value(params, "protocol.runs")
    changed = {k for k, _ in cell.overrides} - FREE_KEYS
    if not changed:  # the committed scenario: new variants or runs only
        old_v = set(get(params, "pipelines.main"))
        old_r = set(get(params, "protocol.runs"))
        pairs = [
            (v, x)
            for v in variants
            for x in run_ids
            if v not in old_v or x not in old_r
        ]
    else:
        pairs = [(v, x) for v in variants for x in run_ids]
    trained = sum(
        1
        for v, _ in pairs
        if (get(params, "ablation").get(v, {}).get("changes") or {})
        .get("tune", {})
        .get("epochs")
        != 0
    )
    return trained, len(pairs)


@main.command("plan")
@click.argument("names", nargs=-1, metavar="RESULT…")
@params_path_option
@runs_option
@click.option(
    "--gpus",
    "cards",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    metavar="N",
    help="Cards the grid runs on (`pal-paper run --gpus`): the wall time on N.",
)
@clean_errors
def plan_cmd(
    names: tuple[str, ...], params_file: Path, runs: str | None, cards: int
) -> None:
    """Projected GPU time of RESULT… for a preset (e.g. -p configs/food101.yaml):
    the tunings and extractions its cells add to a finished `dvc repro`, times
    the per-tuning time measured on a GPU (bench/README.md), and the wall time
    on N cards (--gpus N: a card runs one cell at a time)."""
    params = _params(params_file)
    dataset = str(get(params, "data.dataset"))
    table = costs()
    if dataset not in table["datasets"]:
        raise GridError(
            f"{params_file}: no measured GPU time for data.dataset '{dataset}' "
            f"(measured: {', '.join(table['datasets'])})"
        )
    per = table["datasets"][dataset]
    ids = _results(names)
    _, cells = _grid(ids, params, _runs(runs))
    click.echo(
        f"{dataset}, one {table['card']}: tune {per['tune_min']} min and extract "
        f"{per['extract_min']} min per (variant, run) ({table['source']})"
    )
    total = 0.0
    seen: set[str] = set()
    cell_hours: list[float] = []
    for rid in ids:
        cols = RESULTS[rid].columns(params, _runs(runs))
        t = e = 0
        for c in cols:
            if c.cell.name in seen:
                continue
            seen.add(c.cell.name)
            dt, de = tunings(RESULTS[rid], c.cell, params)
            t, e = t + dt, e + de
            cell_hours.append((dt * per["tune_min"] + de * per["extract_min"]) / 60)
        hours = (t * per["tune_min"] + e * per["extract_min"]) / 60
        total += hours
        click.echo(
            f"  {rid}: {len(cols)} cell{'s' * (len(cols) != 1)}, {t} tunings, "
            f"{e} extractions: {hours:.1f} h"
        )
    click.echo(
        f"  all of them: {total:.1f} h (cells shared between results counted once)"
    )
    wall = workers.wall_hours(cell_hours, cards)
    click.echo(
        f"  on {cards} card{'s' * (cards != 1)}: {wall:.1f} h wall "
        f"({len(cell_hours)} cells, longest {max(cell_hours, default=0.0):.1f} h)"
    )
