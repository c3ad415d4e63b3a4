"""`pal-paper submit` and `pal-paper status`: a grid as one SLURM array job.

`submit` writes a submission folder `.dvc/tmp/slurm/<commit>-<n>/` beside the
project's other DVC state (on the shared file system with the project):
`submission.json` (the cells, one per array task), `task.sh` (the array job:
one task per cell, `%N` of them at once) and `collect.sh` (`pal-paper
collect`, a job that starts when every task has ended, `afterany`: a partial
grid renders with its missing cells named). Each task runs `pal-paper task`
(palpaper/cluster.py): its cell in its own clone, then its experiment pushed
to the project. Each task's log is `task-<i>.out` there, every try appended;
`status` lists each cell's state from the project's experiments, `squeue`
and the state file its last try left (`task-<i>.json`).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from palcore.errors import PalError
from palcore.outputs import write_bytes_atomic
from palpaper.backbone import backbone_scale, scaled
from palpaper.cells import check_cells, untracked_inputs
from palpaper.grids import RESULTS
from palpaper.inputs import parse_runs
from palpaper.overrides import Cell
from palpaper.plan import Packing, card, cell_seconds
from palpaper.refs import ExperimentRefs
from palpaper.sizes import dataset_size

FOLDER = Path(".dvc") / "tmp" / "slurm"
SIGNAL_S = 180  # SIGUSR1 at most this long before the time limit


def signal_s(time_min: int) -> int:
    """Seconds before the limit that SIGUSR1 comes (SLURM sends it up to 60 s
    earlier still): SIGNAL_S, or a sixth of a short limit (10 s for 1 min)."""
    return min(SIGNAL_S, time_min * 10)


START_MIN = 10  # per task beyond the projected tuning: start-up, solve, evaluate


def parse_time(text: str | None) -> int | None:
    """sbatch's --time formats (MIN, MIN:SEC, H:MM:SS, D-H, D-H:MM,
    D-H:MM:SS) as whole minutes, a part minute rounded up; None: none given."""
    if text is None:
        return None
    match = re.fullmatch(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?", text.strip())
    if match is None:
        raise click.BadParameter(
            f"'{text}' is none of sbatch's formats: MIN, MIN:SEC, H:MM:SS, D-H, "
            "D-H:MM, D-H:MM:SS"
        )
    days, first, b, c = (int(g) if g else None for g in match.groups())
    a = int(first or 0)  # the pattern's one group that always matches
    if days is not None:  # D-H[:MM[:SS]]
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # H:MM:SS
        seconds = a * 3600 + (b or 0) * 60 + c
    else:  # MIN[:SEC]
        seconds = a * 60 + (b or 0)
    if seconds <= 0:
        raise click.BadParameter(f"'{text}' is no time: at least a minute")
    return -(-seconds // 60)


SLURM_OPTIONS = (
    click.option("--partition", "-p", default=None, help="SLURM partition."),
    click.option("--account", "-A", default=None, help="SLURM account."),
    click.option("--qos", default=None, help="SLURM quality of service."),
    click.option(
        "--mem",
        default=None,
        metavar="SIZE",
        help="Memory of each task, as sbatch takes it (32G, 500M).",
    ),
    click.option("--constraint", "-C", default=None, help="Node features (sbatch -C)."),
    click.option(
        "--gpu-type",
        default=None,
        metavar="TYPE",
        help="The GPU type of --gres (gpu:TYPE:N), e.g. h100.",
    ),
    click.option(
        "--sbatch-arg",
        "extra",
        multiple=True,
        metavar="OPTION",
        help="Any other sbatch option for each task, as one word "
        "(--sbatch-arg=--exclusive); repeatable.",
    ),
    click.option(
        "--gpus-per-task",
        "gpus",
        default=1,
        show_default=True,
        type=click.IntRange(0),
        help="GPUs of each task, from SLURM's allocation (--gres=gpu:N); 0 on "
        "CPU nodes.",
    ),
    click.option(
        "--cpus-per-task",
        "cpus",
        default=None,
        type=click.IntRange(1),
        help="CPU cores of each task. Default: the cluster's.",
    ),
    click.option(
        "--time",
        "time_min",
        default=None,
        metavar="TIME",
        callback=lambda ctx, param, value: parse_time(value),
        help="Each task's limit, in sbatch's formats (MIN, H:MM:SS, D-H:MM…). "
        "Default: from `pal-paper plan`'s time of the longest cell. A cell "
        "that outlasts it is stopped ahead of the limit, requeued and resumed.",
    ),
    click.option(
        "--throttle",
        default=8,
        show_default=True,
        type=click.IntRange(1),
        help="Tasks running at once (--array …%N).",
    ),
    click.option("--dry-run", is_flag=True, help="Print the scripts; submit nothing."),
)


def options(fn: Any) -> Any:
    """`pal-paper submit`'s SLURM options."""
    for option in reversed(SLURM_OPTIONS):
        fn = option(fn)
    return fn


class SlurmError(PalError):
    """sbatch or squeue refused, or SLURM is not installed."""


@dataclass(frozen=True)
class Options:
    """What a cluster user sets; None: the cluster's default."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    mem: str | None = None  # per task
    constraint: str | None = None
    gpu_type: str | None = None  # --gres=gpu:TYPE:N
    extra: tuple[str, ...] = ()  # other sbatch options, for each task
    gpus: int = 1  # per task, from SLURM's allocation (--gres=gpu:N)
    cpus: int | None = None  # per task
    throttle: int = 8  # tasks at once (--array …%N)

    def __post_init__(self) -> None:
        if self.mem is not None and not re.fullmatch(r"\d+[KMGT]?", self.mem):
            raise SlurmError(f"--mem: '{self.mem}' is no size sbatch takes (32G, 500M)")
        for arg in self.extra:
            if not arg.startswith("-"):
                raise SlurmError(
                    f"--sbatch-arg: '{arg}' is no sbatch option (--exclusive)"
                )


def time_limit(
    ids: Sequence[str],
    cells: Sequence[Cell],
    params: dict,
    gpus: int,
    runs: Sequence[int] | None = None,
    cite: bool = False,
) -> int:
    """Minutes per task: 1.25 × the longest cell's projected work on its
    slot (`pal-paper plan`'s prices, on the GPU card `PAL_PAPER_CARD` names
    or h200 when the task has a GPU, else the CPU) plus START_MIN. A task
    holds its cards alone (`--gres`), so its cell's slot is a whole card: J =
    1. A cell longer than the cluster allows is fine: it is stopped ahead of
    the limit, requeued and resumed."""
    size = dataset_size(params, "params.yaml")
    c = scaled(card(None, "GPU" if gpus else "CPU"), backbone_scale(params))
    alone = Packing(1, float(c["packing"][1]), 0.0)
    longest, wanted = 0.0, {cell.name for cell in cells}
    for rid in ids:
        for col in RESULTS[rid].columns(params, runs, cite):
            if col.cell.name not in wanted:
                continue
            work = cell_seconds(RESULTS[rid], col.cell, params, c, size) / 60
            longest = max(longest, alone.slot_h(work))
    return math.ceil(1.25 * longest) + START_MIN


def _sbatch_lines(opts: Options, time_min: int) -> list[str]:
    """The options of both jobs. As #SBATCH lines they yield to the
    cluster's SBATCH_* environment variables (sbatch reads those over the
    script), so a site's own settings are never overridden."""
    lines = [f"--time={time_min}"]
    for name in ("partition", "account", "qos"):
        value = getattr(opts, name)
        lines += [f"--{name}={value}"] * (value is not None)
    return lines


def scripts(
    root: Path,
    sub: Path,
    n_tasks: int,
    collect_args: list[str],
    opts: Options,
    time_min: int,
) -> tuple[str, str]:
    """The array job's batch script and the collect job's."""
    tool = str(Path(sys.executable).parent / "pal-paper")
    head = ["#!/bin/bash", f"#SBATCH --chdir={root}"]
    task = [
        *head,
        f"#SBATCH --job-name=pal-{sub.name}",
        f"#SBATCH --array=0-{n_tasks - 1}%{opts.throttle}",
        *(f"#SBATCH {line}" for line in _sbatch_lines(opts, time_min)),
        f"#SBATCH --signal=B:USR1@{signal_s(time_min)}",
        "#SBATCH --requeue",
        "#SBATCH --open-mode=append",
        f"#SBATCH --output={sub}/task-%a.out",
    ]
    if opts.gpus:
        kind = f"{opts.gpu_type}:" if opts.gpu_type else ""
        task.append(f"#SBATCH --gres=gpu:{kind}{opts.gpus}")
    if opts.cpus:
        task.append(f"#SBATCH --cpus-per-task={opts.cpus}")
    task += [f"#SBATCH --mem={opts.mem}"] * (opts.mem is not None)
    task += [f"#SBATCH --constraint={opts.constraint}"] * bool(opts.constraint)
    task += [f"#SBATCH {arg}" for arg in opts.extra]
    task += [
        "# one cell per task, in its clone; its experiment pushed to the project",
        "umask 0002  # the group's shared DVC cache and clones",
        f"exec {shlex.quote(tool)} task {shlex.quote(str(sub))}",
    ]
    collect = [
        *head,
        f"#SBATCH --job-name=pal-{sub.name}-collect",
        *(f"#SBATCH {line}" for line in _sbatch_lines(opts, 30)),
        f"#SBATCH --output={sub}/collect.out",
        "# after every task of the array ended (afterany): the tables",
        "umask 0002",
        f"exec {shlex.quote(tool)} collect {shlex.join(collect_args)}",
    ]
    return "\n".join(task) + "\n", "\n".join(collect) + "\n"


def call_slurm(args: list[str], cwd: Path) -> str:
    try:
        proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    except FileNotFoundError:
        raise SlurmError(
            f"'{args[0]}' not found: SLURM's commands are not installed"
        ) from None
    if proc.returncode != 0:
        msg = " ".join((proc.stderr or proc.stdout).split()) or "(no output)"
        raise SlurmError(f"{args[0]}: {msg}")
    return proc.stdout


def new_folder(repo: ExperimentRefs) -> Path:
    base = repo.root.resolve() / FOLDER
    n = 1
    while (base / f"{repo.short}-{n}").exists():
        n += 1
    return base / f"{repo.short}-{n}"


def submit(
    repo: ExperimentRefs,
    cells: Sequence[Cell],
    copies: list[str],
    collect_args: list[str],
    opts: Options,
    time_min: int,
    dry_run: bool,
) -> tuple[str, str] | None:
    """Write the submission and sbatch its two jobs: (array id, collect id);
    `dry_run`: print the scripts, write and submit nothing."""
    sub = new_folder(repo)
    task, collect = scripts(
        repo.root.resolve(), sub, len(cells), collect_args, opts, time_min
    )
    if dry_run:
        print(f"# {sub}/task.sh (sbatch task.sh)\n{task}")
        print(
            f"# {sub}/collect.sh (sbatch --dependency=afterany:<array job> collect.sh)"
        )
        print(collect, end="")
        return None
    sub.mkdir(parents=True)
    record: dict[str, Any] = {
        "origin": str(repo.root.resolve()),
        "baseline": repo.baseline,
        "cells": [
            {"name": c.name, "exp": repo.exp_name(c), "set_args": list(c.set_args)}
            for c in cells
        ],
        "copies": copies,
    }
    (sub / "task.sh").write_text(task)
    (sub / "collect.sh").write_text(collect)
    _save(sub, record)
    array = call_slurm(
        ["sbatch", "--parsable", str(sub / "task.sh")], repo.root
    ).strip()
    array = array.split(";")[0]
    record["array"] = array
    _save(sub, record)
    dep = f"--dependency=afterany:{array}"
    after = call_slurm(
        ["sbatch", "--parsable", dep, str(sub / "collect.sh")], repo.root
    )
    record["collect"] = after.strip().split(";")[0]
    _save(sub, record)
    return array, record["collect"]


@dataclass(frozen=True, kw_only=True)
class Request:
    """What `pal-paper submit` was asked: the results `ids`, --runs as given
    (`runs`), cited baselines (`cite`), the sbatch options (`opts`, the
    fields of `Options`), --time (`time_min`) and --dry-run."""

    ids: Sequence[str]
    runs: str | None
    cite: bool
    opts: dict[str, Any]
    time_min: int | None
    dry_run: bool


def submit_cells(
    repo: ExperimentRefs, cells: Sequence[Cell], params: dict[str, Any], ask: Request
) -> tuple[tuple[str, str] | None, int]:
    """`pal-paper submit`'s work once its cells are known: check their params,
    set a task's time limit (--time, else `time_limit`) and `submit` them
    with the job that renders the results asked. The job ids (None on a dry
    run) and the limit in minutes."""
    check_cells(repo.root, params, cells)
    sbatch = Options(**ask.opts)
    runs = parse_runs(ask.runs)
    limit = ask.time_min or time_limit(
        ask.ids, cells, params, sbatch.gpus, runs, ask.cite
    )
    collect_args = [*ask.ids, *(["--runs", ask.runs] if ask.runs else [])]
    collect_args += ["--baselines", "cited"] * ask.cite
    copies = untracked_inputs(repo.root, params)
    jobs = submit(repo, cells, copies, collect_args, sbatch, limit, ask.dry_run)
    return jobs, limit


def _save(sub: Path, record: dict[str, Any]) -> None:
    write_bytes_atomic(sub / "submission.json", json.dumps(record, indent=1).encode())
