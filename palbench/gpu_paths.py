"""palbench/gpu_check.py's before and after: the image path of an older tree
(`--baseline`) and of this one (palbench/image_path.py, one process each, on the
same photos and model), a rehearsal per tree (gpu_check runs its stage
processes with that tree on PYTHONPATH), and `pal-paper plan all`'s Food101
tunings and extractions priced at each tree's projected minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

REHEARSALS = {"before": "rehearsal_before", "after": "rehearsal"}  # report keys
SCALES = {  # image_path.py's arguments per gpu_check scale
    "full": dict(config="vilt-b32", photos=512, batch=256, seconds=5.0),
    "smallest": dict(config="tiny", photos=24, batch=16, seconds=0.5),
}


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a part measuring `tree`: its code first on
    PYTHONPATH, this package after it (run with another working folder than
    the repository, which `python -m` would put first)."""
    path = os.pathsep.join(dict.fromkeys([str(tree), str(ROOT)]))
    return dict(os.environ, PYTHONPATH=path, HF_HUB_OFFLINE="1")


def trees(baseline: Path | None) -> list[tuple[str, Path]]:
    """(name, tree) of each tree measured: the baseline's first, if given."""
    return ([("before", baseline)] if baseline else []) + [("after", ROOT)]


def baseline_tree(spec: str | None, work: Path) -> Path | None:
    """`--baseline`: a folder holding an older tree, or a commit of this
    repository archived into `work/baseline` (`git archive`); None: none."""
    if not spec:
        return None
    if Path(spec).is_dir():
        return Path(spec).resolve()
    where = work / "baseline"
    where.mkdir(parents=True, exist_ok=True)
    paths = ["palcore", "pipeline", "solver", "params.yaml", "contracts.yaml"]
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", spec, *paths],
        capture_output=True,
        check=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(where)], input=archive, check=True)
    return where


def paths_check(
    work: Path, device: str, scale: str, baseline: Path | None
) -> dict[str, Any]:
    """palbench/image_path.py on each tree (`trees`), and the cosine of the
    features of after against before; {'exit': 1, 'error': line} if one
    fails."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    args = SCALES[scale]
    result: dict[str, Any] = {"paths": {}, "exit": 0}
    for name, tree in trees(baseline):
        cmd = [
            sys.executable,
            "-m",
            "palbench.image_path",
            "--device",
            device,
            "--workdir",
            str(work),
            "--out",
            str(work / f"{name}.json"),
            "--features",
            str(work / f"{name}.pt"),
            *(f"--{k}={v}" for k, v in args.items()),
        ]
        r = subprocess.run(
            cmd, env=tree_env(tree), cwd=work, capture_output=True, text=True
        )
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["no output"])[-1]
            result.update(exit=1, error=f"{name} ({tree}): {last}")
            break
        measured = json.loads((work / f"{name}.json").read_text())
        for key in ("config", "card", "batch", "photos"):
            result[key] = measured.pop(key)
        result["paths"][name] = measured
    if result["exit"] == 0 and baseline is not None:
        a, b = (torch.load(work / f"{n}.pt") for n in ("before", "after"))
        cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
        result["feature_cosine_min"] = round(float(cos.min()), 6)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def plan_counts(preset: str = "configs/food101.yaml") -> tuple[int, int] | None:
    """(tunings, extractions) of `pal-paper plan all --params preset`, summed
    over its results on the default route (each cell counted once, as plan
    does); None if it cannot run."""
    cmd = [sys.executable, "-m", "palpaper", "plan", "all", "--params", preset]
    cmd.append("--json")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        r = subprocess.run(
            cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode:
        return None
    (grid,) = json.loads(r.stdout)["datasets"]
    rows = grid["routes"]["measured"]["results"]
    return sum(x["tunings"] for x in rows), sum(x["extractions"] for x in rows)


def priced(report: dict[str, Any], counts: tuple[int, int] | None) -> dict:
    """Per tree: Food101's projected protocol hours and plan-all hours."""
    out = {}
    for path, key in REHEARSALS.items():
        r = report.get(key) or {}
        p = (r.get("projections") or {}).get("UPMC-Food101")
        if not p:
            continue
        entry = {
            "tune_min": p["tune_min"],
            "extract_min": p["extract_min"],
            "once_min": p.get("once_min", 0.0),
            "protocol_h": p["protocol_h"],
        }
        if counts:  # the per-dataset stages once, whatever the cells
            t, e = counts
            minutes = t * p["tune_min"] + e * p["extract_min"] + entry["once_min"]
            entry["plan_all_h"] = round(minutes / 60, 1)
        out[path] = entry
    return {"counts": counts, "paths": out}


def markdown(report: dict[str, Any]) -> list[str]:
    """The before/after sections of report.md."""
    from palbench import image_path

    lines = []
    if "paths" in report:
        r = report["paths"]
        title = "before (--baseline) and after" if len(r["paths"]) > 1 else "this tree"
        lines += ["", f"## The image path, {title}", ""]
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
        lines += ["", f"## Projected Food101 hours per tree; {what}", ""]
        lines += md_table(
            [
                "tree",
                "tune min",
                "extract min",
                "once per dataset min",
                "protocol h",
                "plan all h",
            ],
            [
                [
                    path,
                    p["tune_min"],
                    p["extract_min"],
                    p.get("once_min", 0.0),
                    p["protocol_h"],
                    p.get("plan_all_h", "–"),
                ]
                for path, p in plan["paths"].items()
            ],
        )
    return lines


def md_table(header: list[str], rows: list[list[Any]]) -> list[str]:
    """A Markdown table: the header, its rule, one line per row."""
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(str(v) for v in row) + " |" for row in rows),
    ]
