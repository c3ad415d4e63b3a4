"""bench/gpu_check.py's before and after: the image path measured in one
process (bench/image_path.py), a rehearsal per image path (`PAL_IMAGE_PATH`
set for its stage processes), and `pal-paper plan all`'s Food101 tunings and
extractions priced at each path's projected minutes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

PATHS = ("legacy", "new")
SCALES = {  # image_path.measure's arguments per gpu_check scale
    "full": dict(config="vilt-b32", photos=512, batch=256, seconds=5.0),
    "smallest": dict(config="tiny", photos=24, batch=16, seconds=0.5),
}


def paths_check(work: Path, device: str, scale: str) -> dict[str, Any]:
    """bench/image_path.py's before/after; {'exit': 1, 'error': line} if it
    fails."""
    import image_path
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    try:
        result = image_path.measure(device=dev, work=work, **SCALES[scale])
        result["exit"] = 0
    except Exception as exc:  # one line in the report, the run goes on
        result = {"exit": 1, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    finally:
        os.environ.pop("PAL_IMAGE_PATH", None)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def with_path(path: str, fn, *args, **kwargs):
    """fn(...) with PAL_IMAGE_PATH set for `path` (inherited by the rehearsal's
    stage processes)."""
    os.environ["PAL_IMAGE_PATH"] = "legacy" if path == "legacy" else ""
    try:
        return fn(*args, **kwargs)
    finally:
        os.environ.pop("PAL_IMAGE_PATH", None)


def plan_counts(preset: str = "configs/food101.yaml") -> tuple[int, int] | None:
    """(tunings, extractions) of `pal-paper plan all -p preset`, summed over its
    results (each cell counted once, as plan does); None if it cannot run."""
    cmd = [sys.executable, "-m", "palpaper", "plan", "all", "-p", preset]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.findall(r"(\d+) tunings, (\d+) extractions", r.stdout)
    if r.returncode or not found:
        return None
    return sum(int(t) for t, _ in found), sum(int(e) for _, e in found)


def priced(report: dict[str, Any], counts: tuple[int, int] | None) -> dict:
    """Per path: Food101's projected protocol hours and plan-all hours."""
    out = {}
    for path in PATHS:
        r = report.get("rehearsal" if path == "new" else f"rehearsal_{path}") or {}
        p = (r.get("projections") or {}).get("UPMC-Food101")
        if not p:
            continue
        entry = {"tune_min": p["tune_min"], "extract_min": p["extract_min"],
                 "once_min": p.get("once_min", 0.0),
                 "protocol_h": p["protocol_h"]}  # fmt: skip
        if counts:  # the per-dataset stages once, whatever the cells
            t, e = counts
            minutes = t * p["tune_min"] + e * p["extract_min"] + entry["once_min"]
            entry["plan_all_h"] = round(minutes / 60, 1)
        out[path] = entry
    return {"counts": counts, "paths": out}


def markdown(report: dict[str, Any]) -> list[str]:
    """The before/after sections of report.md."""
    import image_path

    lines = []
    if "paths" in report:
        r = report["paths"]
        lines += ["", "## The image path, before (legacy) and after", ""]
        if r["exit"]:
            lines.append(f"Failed: {r['error']}.")
        else:
            lines += image_path.markdown(r)
    plan = report.get("plan") or {}
    if plan.get("paths"):
        counts = plan["counts"]
        what = "`pal-paper plan all` (did not run)"
        if counts:
            what = f"`pal-paper plan all`: {counts[0]} tunings, {counts[1]} extractions"
        lines += ["", f"## Projected Food101 hours per image path; {what}", ""]
        lines += md_table(
            ["path", "tune min", "extract min", "once per dataset min", "protocol h",
             "plan all h"],
            [[path, p["tune_min"], p["extract_min"], p.get("once_min", 0.0),
              p["protocol_h"], p.get("plan_all_h", "–")]
             for path, p in plan["paths"].items()],
        )  # fmt: skip
    return lines


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table: the header, its rule, one line per row."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(v) for v in row) + " |" for row in rows),
    ]
