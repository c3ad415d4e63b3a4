"""Where the cells of a SLURM submission stand (`pal-paper status`, and
`pal-paper submit`'s choice of the cells to send): each cell's state from
the project's finished experiments, `squeue` and its task's last word, with
its job and log; `--json` prints the report `status_report` makes."""

from __future__ import annotations

import getpass
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from palpaper.overrides import Cell
from palpaper.refs import ExperimentRefs
from palpaper.slurm import FOLDER, call_slurm


def _queue(job_ids: Sequence[str], root: Path) -> dict[str, tuple[str, str]]:
    """SLURM job or array task id -> (state, reason or node) of this user's
    jobs still queued, of the arrays `job_ids` (`squeue -j` would refuse the
    ids SLURM has forgotten)."""
    if not job_ids:
        return {}
    user = getpass.getuser()
    out = call_slurm(["squeue", "-h", "-r", "-u", user, "-o", "%i|%T|%r|%N"], root)
    wanted = set(job_ids)
    jobs = {}
    for line in out.splitlines():
        parts = line.split("|")
        if len(parts) == 4 and parts[0].split("_")[0] in wanted:
            where = parts[2] if parts[1] == "PENDING" else parts[3]
            jobs[parts[0]] = (parts[1], where)
    return jobs


def _submissions(repo: ExperimentRefs) -> list[tuple[Path, dict]]:
    """This commit's submission folders and records, oldest first."""
    subs = sorted(
        (repo.root.resolve() / FOLDER).glob(f"{repo.short}-*/submission.json"),
        key=lambda p: int(p.parent.name.rsplit("-", 1)[1]),
    )
    return [(p.parent, json.loads(p.read_text())) for p in subs]


def cell_states(
    repo: ExperimentRefs, cells: Sequence[Cell], records: list[tuple[Path, dict]]
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


def status_report(repo: ExperimentRefs, cells: Sequence[Cell]) -> dict[str, Any]:
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


def to_submit(repo: ExperimentRefs, cells: Sequence[Cell]) -> tuple[list[Cell], int]:
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
