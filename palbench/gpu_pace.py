"""palbench/gpu_check.py's `pace` part: each method's steady step on the card,
before (`--baseline`) and after, their features compared, J tunings side by
side, and the card's entry of palpaper/costs.yaml written from it.

1. palbench/pace.py on each tree (one process each, the same photos and random
   ViLT): per method samples/s at batch 4 and at the fill batch, host syncs,
   kernels and the GPU's busy share per step, peak memory, FLOPs per sample,
   and one extract batch's features (the baseline tree: features, rate and
   syncs only); after's against before's: the least per-row cosine and the
   argmax agreement of each method's features, the part failing where a
   cosine is below COSINE_MIN;
2. packing: J = 1, 2, 4 processes of this tree, each PAL's step at batch 4,
   warmed up, then stepping together for `seconds` (files in a barrier
   folder start them); the card's samples/s at J over that at 1;
3. `card.yaml`: the card's entry (palpaper/costs.yaml's schema, `pal-paper
   plan --card card.yaml` reads it), status measured, with the tree's commit.
   What this part does not measure (the loader's first-batch wait per task,
   extract's start-up) it takes from the costs.yaml card named by `--like`,
   and its basis line says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from palbench.gpu_paths import tree_env

ROOT = Path(__file__).resolve().parents[1]
PACE = ["-m", "palbench.pace"]
SCALES = {  # pace.py's arguments per gpu_check scale
    "full": dict(config="vilt-b32", steps=1000, fill=32, photos=512, seconds=3.0),
    "smallest": dict(config="tiny", steps=3, fill=8, photos=24, seconds=0.3),
}
PACK_SECONDS = {"full": 12.0, "smallest": 1.0}
COSINE_MIN = 0.9999  # per row, after's features against before's (bf16 on a card)
INHERITED = ("first_batch_s", "extract_startup_s")
# graphs a Food101 task captures: 12 image-token counts (bench/batch_shapes.py
# at 4d75434)
# x 4 text buckets its titles reach (16-40 tokens, losses.text_bucket), est.
GRAPHS_PER_TASK = 48


def _pace(tree: Path, out: Path, work: Path, args: dict, extra=()) -> str | None:
    """palbench/pace.py with `tree` first on PYTHONPATH; None, or its last line
    of error."""
    cmd = [sys.executable, *PACE, "--out", str(out), "--workdir", str(work)]
    cmd += [f"--{k}={v}" for k, v in args.items()] + list(extra)
    r = subprocess.run(
        cmd, env=tree_env(tree), cwd=work, capture_output=True, text=True
    )
    (out / "pace.log").write_text(r.stdout + r.stderr)
    if r.returncode:
        return (r.stderr.strip().splitlines() or ["no output"])[-1]
    return None


def compare(before: Path, after: Path, methods: list[str]) -> dict[str, Any]:
    """Per method: the least per-row cosine of after's features against
    before's, and the share of rows whose argmax dimension agrees."""
    import torch

    out = {}
    for m in methods:
        a, b = torch.load(after / f"{m}.pt"), torch.load(before / f"{m}.pt")
        cos = torch.nn.functional.cosine_similarity(a, b, dim=1)
        out[m] = {
            "cosine_min": round(float(cos.min()), 6),
            "argmax_equal": float((a.argmax(1) == b.argmax(1)).float().mean()),
        }
    return out


def packing(work: Path, args: dict, jobs: tuple[int, ...], seconds: float) -> dict:
    """samples/s of J PAL tunings side by side, for each J of `jobs`: their
    sum, the factor over J = 1 and the slowest start-up."""
    result: dict[str, Any] = {}
    one = None
    for j in jobs:
        barrier = work / f"pack-{j}"
        barrier.mkdir(parents=True, exist_ok=True)
        procs = []
        for i in range(j):
            extra = ["--worker", str(i), "--barrier", str(barrier)]
            cmd = [sys.executable, *PACE, "--out", str(barrier)]
            cmd += ["--workdir", str(work)] + [f"--{k}={v}" for k, v in args.items()]
            procs.append(subprocess.Popen(cmd + extra, env=tree_env(ROOT), cwd=work))
        while len(list(barrier.glob("ready-*"))) < j:
            if any(p.poll() not in (None, 0) for p in procs):
                raise RuntimeError(f"pace: a packing worker of J = {j} failed")
            time.sleep(0.05)
        (barrier / "go").write_text("")
        if any(p.wait() for p in procs):
            raise RuntimeError(f"pace: a packing worker of J = {j} failed")
        rows = [
            json.loads((barrier / f"worker-{i}.json").read_text()) for i in range(j)
        ]
        total = sum(r["samples_per_s"] for r in rows)
        one = one or total
        result[str(j)] = {
            "samples_per_s": round(total, 1),
            "factor": round(total / one, 3),
            "startup_s": max(r["startup_s"] for r in rows),
        }
    return result


def card_entry(measured: dict, pack: dict, like: dict, commit: str, scale: str) -> dict:
    """The card's entry of palpaper/costs.yaml from the after tree's figures,
    the packing and the `--like` card's entry for what is not measured."""
    methods = measured["methods"]
    card = measured["card"]
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "name": f"one {card}" if card else "this machine's CPU (a dry run)",
        "memory_gib": measured["memory_gib"] or round(ram, 1),
        "status": "measured",
        "commit": commit,
        "basis": (
            f"palbench/gpu_check.py --parts pace ({scale}): {measured['steps']} steady "
            f"steps a method at batch 4 after the captures, random {measured['config']}"
            f" ViLT, Food101-shaped photo batches; capture_s_per_task for "
            f"{GRAPHS_PER_TASK} graphs a task (est.); {', '.join(INHERITED)} from "
            f"{like.get('name', 'none')}"
        ),
        "steps": measured["steps"],
        "tune_startup_s": pack["1"]["startup_s"],
        "first_batch_s": like.get("first_batch_s", 0.0),
        "capture_s_per_task": round(
            GRAPHS_PER_TASK
            * max(m.get("capture_s_per_graph", 0.0) for m in methods.values()),
            1,
        ),
        "frozen_rows_per_s": measured["frozen_rows_per_s"],
        "extract_startup_s": like.get("extract_startup_s", pack["1"]["startup_s"]),
        "extract_per_s": {m: v["extract_per_s"] for m, v in methods.items()},
        "tune_per_s": {m: v["samples_per_s"] for m, v in methods.items()},
        "tuning_gib": {m: v.get("tuning_gib", 0.0) for m, v in methods.items()},
        "packing": {int(j): p["factor"] for j, p in pack.items()},
    }


def head_commit() -> str:
    """This tree's commit (git's HEAD), or 'unknown' where git or .git is absent
    (a copied tree: pass gpu_check --commit)."""
    try:
        r = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
    except OSError:
        return "unknown"
    return r.stdout.strip() if r.returncode == 0 else "unknown"


def pace_check(
    work: Path,
    device: str,
    scale: str,
    baseline: Path | None,
    like: dict,
    commit: str,
    jobs: tuple[int, ...] = (1, 2, 4),
) -> dict[str, Any]:
    """The part (module docstring) into `work`; {'exit': 1, 'error': line}
    where a step fails, with what was measured before it."""
    import yaml

    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    args = dict(SCALES[scale], device=device)
    start = time.perf_counter()
    result: dict[str, Any] = {"exit": 0, "trees": {}}
    trees = ([("before", baseline)] if baseline else []) + [("after", ROOT)]
    for name, tree in trees:
        out = work / f"pace-{name}"
        out.mkdir(parents=True, exist_ok=True)
        extra = ["--static"] * (device == "cpu") + ["--lite"] * (name == "before")
        error = _pace(tree, out, work, args, extra)
        if error:
            result.update(exit=1, error=f"{name} ({tree}): {error}")
            return result
        result["trees"][name] = json.loads((out / "pace.json").read_text())
    after = result["trees"]["after"]
    if baseline:
        methods = [
            m for m in after["methods"] if m in result["trees"]["before"]["methods"]
        ]
        result["features"] = compare(work / "pace-before", work / "pace-after", methods)
        moved = [
            f"{m} (cosine {f['cosine_min']})"
            for m, f in result["features"].items()
            if f["cosine_min"] < COSINE_MIN
        ]
        if moved:
            result.update(
                exit=1,
                error=f"features moved beyond cosine {COSINE_MIN}: {', '.join(moved)}",
            )
    try:
        pack_args = {
            k: v for k, v in args.items() if k in ("config", "device", "photos")
        }
        result["packing"] = packing(work, pack_args, jobs, PACK_SECONDS[scale])
    except RuntimeError as exc:
        result.update(exit=1, error=str(exc))
        return result
    result["card"] = card_entry(after, result["packing"], like, commit, scale)
    card_file = work / "card.yaml"
    card_file.write_text(yaml.safe_dump(result["card"], sort_keys=False))
    result["card_file"] = str(card_file)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    return result


def markdown(result: dict[str, Any]) -> list[str]:
    """The part's tables as Markdown lines."""
    after = result["trees"].get("after")
    if after is None:
        return [f"pace: {result.get('error', 'nothing measured')}"]
    before = result["trees"].get("before", {}).get("methods", {})
    feats = result.get("features", {})
    lines = [
        f"{after['config']} sizes on {after['card'] or 'the CPU'}, "
        f"{after['steps']} steady steps a method at batch 4 "
        f"(fill: batch {after['fill']}).",
        "",
        "| method | graphed | samples/s | before | fill samples/s | syncs/step "
        "| kernels/step | GPU busy | GiB | GF/sample | features cos ≥ |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for m, v in after["methods"].items():
        b = before.get(m, {}).get("samples_per_s", "–")
        cos = feats.get(m, {}).get("cosine_min", "–")
        busy = "–" if v.get("busy_share") is None else f"{100 * v['busy_share']:.0f} %"
        lines.append(
            f"| {m} | {v['graphed']} | {v['samples_per_s']} | {b} "
            f"| {v['fill_samples_per_s']} | {v['syncs_per_step']} "
            f"| {v['kernels_per_step']:.0f} | {busy} | {v.get('tuning_gib', '–')} "
            f"| {v['flops_per_sample'] / 1e9:.2f} | {cos} |"
        )
    pack = result.get("packing", {})
    lines += [
        "",
        "Tunings side by side: "
        + "; ".join(
            f"J = {j}: {p['samples_per_s']} samples/s ({p['factor']}x)"
            for j, p in pack.items()
        ),
    ]
    return lines
