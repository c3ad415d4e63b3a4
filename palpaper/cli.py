"""`pal-paper`: the paper's results, each from one command.

    pal-paper list                      the results, their cells, their commands
    pal-paper run missing --runs 0      queue the grid's cells as DVC experiments,
                                        run DVC's queue, then render the table
    pal-paper collect missing --runs 0  render it again from finished experiments
    pal-paper run missing --baselines cited   Tables 1-2 without running the
                                        five compared methods: the paper's numbers
    pal-paper plan all --params configs/food101.yaml   a preset's GPU time
    pal-paper plan paper --cards 8      the whole paper's, both datasets

A cell is an experiment on the current commit, named after the params it
changes; `run` queues only the cells that have not finished on this commit,
so an interrupted grid resumes where it stopped. Tables (and figures) go to
results/paper/<dataset>/<result>.md, .csv and .png.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import click

from palcore.cliutil import clean_errors, setup_logging
from palcore.errors import ParamsError
from palcore.params import DEFAULT_PARAMS
from palpaper import cluster, running, slurm, slurm_state
from palpaper.collect import collect, command
from palpaper.experiments import Repo
from palpaper.grids import RESULTS
from palpaper.inputs import (
    parse_baselines,
    parse_cells,
    parse_results,
    parse_runs,
    read_params,
)
from palpaper.options import (
    GPUS_HELP,
    JOBS_HELP,
    baselines_option,
    cells_option,
    json_option,
    out_option,
    params_path_option,
    runs_option,
    shard_option,
)
from palpaper.plan import CARD_ENV, named_report, tunings
from palpaper.views import list_lines, list_report, plan_text

__all__ = ["main", "tunings"]

log = logging.getLogger(__name__)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.version_option(package_name="pal-pipeline")
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
@baselines_option
@json_option
@clean_errors
def list_cmd(
    params_file: Path, runs: str | None, baselines: str, as_json: bool
) -> None:
    """Each result: where it is in the paper, its cells and their params."""
    params = read_params(params_file)
    cite = parse_baselines(baselines, list(RESULTS), params)
    listing = {
        name: (r, r.columns(params, parse_runs(runs), cite))
        for name, r in RESULTS.items()
    }
    if as_json:
        click.echo(json.dumps(list_report(listing), indent=1))
        return
    for line in list_lines(listing):
        click.echo(line)


@main.command("run")
@click.argument("names", nargs=-1, metavar="RESULT…")
@runs_option
@click.option("-j", "--jobs", default=None, type=click.IntRange(1), help=JOBS_HELP)
@cells_option
@shard_option
@click.option("--gpus", default=None, metavar="ID[,ID…]", help=GPUS_HELP)
@click.option("--no-wait", is_flag=True, help="Queue and start workers, then return.")
@baselines_option
@out_option
@clean_errors
def run_cmd(names: tuple[str, ...], **options: Any) -> None:
    """Queue the cells of RESULT… not yet finished on this commit, run them
    with DVC's queue, and render each result into OUT/<dataset>/.

    Cells that vary solve.* only rerun the analytic stages from the cached
    features. The workspace must be committed: cells are experiments on HEAD
    (the tables under OUT that pal-paper renders itself may differ).
    Before anything is queued, `pal check` runs on each cell's params (one
    line per problem). A dataset or backbone folder that neither git nor DVC
    tracks is copied into each running cell's temporary copy of the project
    (`dvc exp run --copy-paths`; `dvc add` it to link it from the cache).
    Ctrl-C, or SIGTERM from a batch scheduler, stops DVC's queue workers and
    the cells they run; the same command resumes the grid.
    """
    run, params = running.grid_run(names, **options)
    repo = Repo(Path.cwd())
    running.refuse_uncommitted(repo, run.out)
    running.run_interruptible(repo, run, params)


@main.command("collect")
@click.argument("names", nargs=-1, metavar="RESULT…")
@runs_option
@click.option(
    "--rev",
    default=None,
    metavar="COMMIT",
    help="The commit the cells ran on. Default: HEAD.",
)
@baselines_option
@out_option
@clean_errors
def collect_cmd(
    names: tuple[str, ...], runs: str | None, rev: str | None, baselines: str, out: Path
) -> None:
    """Render RESULT… from the cells' finished experiments into OUT/<dataset>/.

    A cell without a finished experiment is marked – in the table (a partial
    grid, no figure) and named in one line with the command that runs it,
    and --rev when it finished on another commit. A result none of whose
    cells finished is an error line; nothing of it is written.
    """
    repo = Repo(Path.cwd(), rev)
    params_text = repo.show(repo.baseline, DEFAULT_PARAMS.as_posix())
    if params_text is None:
        raise ParamsError(f"params.yaml: not in commit {repo.short}")
    params = read_params(Path(f"params.yaml at {repo.short}"), params_text)
    ids = parse_results(names)
    cite = parse_baselines(baselines, ids, params)
    collect(repo, ids, params, parse_runs(runs), out, cite)


@main.command("plan")
@click.argument("names", nargs=-1, metavar="RESULT…")
@params_path_option
@runs_option
@click.option(
    "--cards",
    "cards",
    default=1,
    show_default=True,
    type=click.IntRange(1),
    metavar="N",
    help="How many cards the grid runs on: the wall time on N.",
)
@click.option(
    "--card",
    "card_name",
    default=None,
    metavar="NAME|PATH",
    help="The card priced: one of palpaper/costs.yaml's cards (h200, h100, "
    "cpu) or a card file (`palbench/gpu_check.py --parts pace`'s card.yaml). "
    f"Default: tune.device's: on a GPU ${CARD_ENV} or h200, else cpu.",
)
@json_option
@clean_errors
def plan_cmd(
    names: tuple[str, ...],
    params_file: Path,
    runs: str | None,
    cards: int,
    card_name: str | None,
    as_json: bool,
) -> None:
    """Projected time of RESULT… from the params (e.g. --params configs/food101.yaml)
    on a card: the tunings and extractions its cells add to a finished `dvc
    repro`, each at its own epochs, tasks and data.per_class and at its prompt
    method's rate (palpaper/costs.yaml, or --card's file); the card filled
    with as many tunings at once as its packing and memory allow; the card-
    hours, the wall time on N cards (--cards N), the longest cell, and the
    memory of the largest solve. `pal-paper plan paper`: the whole paper,
    Food101's results (configs/food101.yaml) and N24News's Table 2 and step
    figure (configs/n24news.yaml), and their total."""
    report = named_report(names, params_file, parse_runs(runs), cards, card_name)
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    for line in plan_text(report):
        click.echo(line)


@main.command("submit")
@click.argument("names", nargs=-1, metavar="RESULT…")
@runs_option
@cells_option
@baselines_option
@slurm.options
@clean_errors
def submit_cmd(
    names: tuple[str, ...],
    runs: str | None,
    cells: str | None,
    baselines: str,
    dry_run: bool,
    time_min: int | None,
    **opts: Any,
) -> None:
    """Submit the cells of RESULT… not yet finished on this commit to SLURM:
    one array job, a task per cell (each in its own clone of the project,
    sharing its DVC cache; its experiment pushed back here), and a job that
    renders the tables when every task has ended (`pal-paper collect`).
    `pal-paper status RESULT…` shows the cells; the same command again
    submits only the cells neither finished nor still in SLURM's queue
    (docs/USAGE.md)."""
    ids, run_ids = parse_results(names), parse_runs(runs)
    repo = Repo(Path.cwd())
    running.refuse_uncommitted(repo, Path("results/paper"))
    params = read_params(DEFAULT_PARAMS)
    cite = parse_baselines(baselines, ids, params)
    todo = running.select_cells(ids, params, run_ids, parse_cells(cells), None, cite)
    pending, held = slurm_state.to_submit(repo, todo)
    if held:
        click.echo(f"{held} cells still in SLURM's queue (running or waiting): kept")
    elif not pending:
        click.echo(f"every cell finished on {repo.short}: `pal-paper collect` renders")
    if not pending:
        return
    ask = slurm.Request(
        ids=ids, runs=runs, cite=cite, opts=opts, time_min=time_min, dry_run=dry_run
    )
    jobs, limit = slurm.submit_cells(repo, pending, params, ask)
    if jobs is not None:
        click.echo(
            f"submitted {len(pending)} cells of {repo.short} as array job {jobs[0]} "
            f"({limit} min a task), the tables as job {jobs[1]} after it; "
            f"`{command(ids, run_ids, verb='status', cite=cite)}` shows them"
        )


@main.command("status")
@click.argument("names", nargs=-1, metavar="RESULT…")
@runs_option
@baselines_option
@json_option
@clean_errors
def status_cmd(
    names: tuple[str, ...], runs: str | None, baselines: str, as_json: bool
) -> None:
    """Each cell of RESULT… on this commit: finished, running, waiting,
    stopped or failed (from the experiments, squeue and each task's last
    word), with its SLURM job and log."""
    ids = parse_results(names)
    repo = Repo(Path.cwd())
    params = read_params(DEFAULT_PARAMS)
    cite = parse_baselines(baselines, ids, params)
    todo = running.select_cells(ids, params, parse_runs(runs), None, None, cite)
    report = slurm_state.status_report(repo, todo)
    if as_json:
        click.echo(json.dumps(report, indent=1))
        return
    for line in slurm_state.status_lines(report):
        click.echo(line)


@main.command("task", hidden=True)
@click.argument("folder", type=click.Path(file_okay=False, path_type=Path))
@clean_errors
def task_cmd(folder: Path) -> None:
    """An array task of `pal-paper submit` (its batch script runs this)."""
    try:
        array = os.environ["SLURM_ARRAY_JOB_ID"]
        index = int(os.environ["SLURM_ARRAY_TASK_ID"])
    except (KeyError, ValueError):
        raise click.ClickException(
            "not a SLURM array task (pal-paper submit)"
        ) from None
    raise SystemExit(cluster.run_task(folder, array, index))
