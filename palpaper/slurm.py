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

import getpass
import json
import math
import re
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click

from palcore.errors import PalError
from palcore.outputs import write_bytes_atomic
from palpaper.experiments import Repo
from palpaper.grids import RESULTS, Cell
from palpaper.plan import Packing, card, cell_seconds, costs

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
    size = costs()["datasets"].get(str(params["data"]["dataset"]))
    c = card(None, "GPU" if gpus else "CPU")
    alone = Packing(1, float(c["packing"][1]), 0.0)
    longest, wanted = 0.0, {cell.name for cell in cells}
    for rid in ids:
        for col in RESULTS[rid].columns(params, runs, cite):
            if size is None or col.cell.name not in wanted:
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


def _slurm(args: list[str], cwd: Path) -> str:
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


def new_folder(repo: Repo) -> Path:
    base = repo.root.resolve() / FOLDER
    n = 1
    while (base / f"{repo.short}-{n}").exists():
        n += 1
    return base / f"{repo.short}-{n}"


def submit(
    repo: Repo,
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
    array = _slurm(["sbatch", "--parsable", str(sub / "task.sh")], repo.root).strip()
    array = array.split(";")[0]
    record["array"] = array
    _save(sub, record)
    dep = f"--dependency=afterany:{array}"
    after = _slurm(["sbatch", "--parsable", dep, str(sub / "collect.sh")], repo.root)
    record["collect"] = after.strip().split(";")[0]
    _save(sub, record)
    return array, record["collect"]


def _save(sub: Path, record: dict[str, Any]) -> None:
    write_bytes_atomic(sub / "submission.json", json.dumps(record, indent=1).encode())


def _queue(job_ids: Sequence[str], root: Path) -> dict[str, tuple[str, str]]:
    """SLURM job or array task id -> (state, reason or node) of this user's
    jobs still queued, of the arrays `job_ids` (`squeue -j` would refuse the
    ids SLURM has forgotten)."""
    if not job_ids:
        return {}
    user = getpass.getuser()
    out = _slurm(["squeue", "-h", "-r", "-u", user, "-o", "%i|%T|%r|%N"], root)
    wanted = set(job_ids)
    jobs = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[0].split("_")[0] in wanted:
            where = parts[2] if parts[1] == "PENDING" else parts[3]
            jobs[parts[0]] = (parts[1], where)
    return jobs


def _submissions(repo: Repo) -> list[tuple[Path, dict]]:
    """This commit's submission folders and records, oldest first."""
    subs = sorted(
        (repo.root.resolve() / FOLDER).glob(f"{repo.short}-*/submission.json"),
        key=lambda p: int(p.parent.name.rsplit("-", 1)[1]),
    )
    return [(p.parent, json.loads(p.read_text())) for p in subs]


def cell_states(
    repo: Repo, cells: Sequence[Cell], records: list[tuple[Path, dict]]
) -> tuple[dict[str, tuple[str, str, str]], dict[str, tuple[str, str]]]:
    """Each cell's (state, detail, log) by its name, from the project's
    experiments, `squeue` and the newest submission of the cell in
    `records`; and the queue of those submissions' jobs."""
    where: dict[str, tuple[Path, dict, int]] = {}
    for sub, rec in records:
        for i, c in enumerate(rec["cells"]):
            where[c["exp"]] = (sub, rec, i)
    ids = [r[k] for _, r in records for k in ("array", "collect") if r.get(k)]
    queued = _queue(ids, repo.root)
    finished = repo.finished(cells)
    states = {
        c.name: _cell_state(
            repo.exp_name(c), finished, where.get(repo.exp_name(c)), queued
        )
        for c in cells
    }
    return states, queued


IN_QUEUE = ("running", "waiting")  # states of a cell whose task SLURM still holds


def status_report(repo: Repo, cells: Sequence[Cell]) -> dict[str, Any]:
    """`pal-paper status`: each cell's state (finished, running, waiting,
    stopped or failed) with its experiment, SLURM job and log, the count of
    each state, and the collect job of the newest submission."""
    records = _submissions(repo)
    states, queued = cell_states(repo, cells, records)
    counts: dict[str, int] = {}
    rows = []
    for c in cells:
        state, detail, log_path = states[c.name]
        counts[state] = counts.get(state, 0) + 1
        rows.append(
            {
                "cell": c.name,
                "experiment": repo.exp_name(c),
                "state": state,
                "detail": detail,
                "log": log_path,
            }
        )
    report: dict[str, Any] = {"commit": repo.short, "counts": counts, "cells": rows}
    if records and records[-1][1].get("collect"):
        sub, rec = records[-1]
        job = rec["collect"]
        report["collect"] = {
            "job": job,
            "state": queued.get(job, ("ended", ""))[0].lower(),
            "log": f"{sub}/collect.out",
        }
    return report


def status_lines(report: Mapping[str, Any]) -> list[str]:
    """The summary, then a line per cell (its state and job; its log on a
    line of its own), then the collect job's."""
    summary = ", ".join(f"{n} {s}" for s, n in report["counts"].items())
    lines = [f"{len(report['cells'])} cells on {report['commit']}: {summary}"]
    for row in report["cells"]:
        detail = f" ({row['detail']})" if row["detail"] else ""
        lines.append(f"  {row['cell']}: {row['state']}{detail}")
        if row["log"]:
            lines.append(f"    log {row['log']}")
    if "collect" in report:
        c = report["collect"]
        lines.append(f"  tables: collect job {c['job']} {c['state']}")
        lines.append(f"    log {c['log']}")
    return lines


def to_submit(repo: Repo, cells: Sequence[Cell]) -> tuple[list[Cell], int]:
    """The cells neither finished nor held by SLURM (running or waiting: a
    second task would run the same cell in the same clone), and how many
    SLURM holds."""
    states, _ = cell_states(repo, cells, _submissions(repo))
    held = sum(states[c.name][0] in IN_QUEUE for c in cells)
    todo = [c for c in cells if states[c.name][0] not in ("finished", *IN_QUEUE)]
    return todo, held


def _cell_state(
    name: str,
    finished: dict[str, str],
    sub: tuple[Path, dict, int] | None,
    queued: dict[str, tuple[str, str]],
) -> tuple[str, str, str]:
    """A cell's state, what its job says, and its task's log ("" if none)."""
    if name in finished:
        return "finished", "", ""
    if sub is None:
        return "not submitted", "", ""
    folder, rec, i = sub
    log_path = f"{folder}/task-{i}.out"
    job = f"{rec.get('array')}_{i}"
    if job in queued:
        state, where = queued[job]
        if state in ("RUNNING", "COMPLETING"):
            return "running", f"job {job} on {where}", log_path
        return "waiting", f"job {job}, {state.lower()}: {where}", log_path
    try:
        last = json.loads((folder / f"task-{i}.json").read_text())
    except (OSError, ValueError):
        return "failed", f"job {job} ended before its cell started", log_path
    if last["state"] == "stopped":
        why = f"job {job}, {last['signal']}: scancel or pre-emption"
        return "stopped", why, log_path
    if last["state"] == "running":
        return "failed", f"job {job} killed mid-cell", log_path
    return "failed", f"job {job}, `dvc exp run` exit {last.get('rc')}", log_path
