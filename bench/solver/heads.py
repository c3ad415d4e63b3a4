"""`solve.heads` against the plain solve: whole `pal-solver solve` processes.

On the benchmark's synthetic shards, one run times (best of --repeat, after
a warm-up) a solve with no heads, then with the cheap heads (ridge, ncm,
lda and ridge_all: the all-task η rule), then with AIR, then with all six,
each as a ratio to the plain solve measured in the same run. Beside each it
prints the heads' own state (heads.h5's state_bytes), the process's peak
RSS, and a FLOP model of what each head adds, at the run's size and at
Food101's (E = 15,000, 61,127 training rows, D = 768, 100 classes, 10
steps, 4,096-row chunks).

Run: .venv/bin/python bench/solver --heads --widths 2000 --rows 16000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import h5py
from procs import Run, run_cli  # bench/solver/

from solver.api import solve_flops

SETS = {
    "none": (),
    "light": ("ridge", "ncm", "lda"),
    "cheap": ("ridge", "ncm", "lda", "ridge_all"),
    "+air": ("ridge", "ncm", "lda", "ridge_all", "air"),
    "all": ("ridge", "ncm", "lda", "ridge_all", "air", "dsal"),
}
FOOD101 = {"E": 15000, "n": 61127, "D": 768, "C": 100, "steps": 10, "chunk": 4096}


def _params(path: Path, heads: tuple[str, ...]) -> Path:
    path.write_text(
        "solve:\n  eta: 1.0\n  width: 8\n  seed: 0\n  method: gram\n"
        f"  device: cpu\n  dtype: float64\n  heads: {json.dumps(list(heads))}\n"
    )
    return path


def run(a: argparse.Namespace, work: Path, features: Path) -> None:
    """Time each head set in whole solve processes; print the table."""
    width = int(a.widths.split(",")[0])
    runs: dict[str, Run] = {}
    state: dict[str, int] = {}
    for name, heads in SETS.items():
        out = work / f"heads-{name}"
        params = _params(work / f"params-{name}.yaml", heads)
        args = ["solve", "--features", str(features), "--out", str(out),
                "--params", str(params), "--width", str(width),
                "--device", a.device, "--batch-rows", str(a.batch_rows)]  # fmt: skip
        hwm = work / f"hwm-heads-{name}.txt"
        runs[name] = Run.best([run_cli(args, hwm) for _ in range(a.repeat + 1)][1:])
        if heads:
            with h5py.File(out / "heads.h5") as f:
                state[name] = int(f.attrs["state_bytes"])
    print(f"solve.heads at width {width}, {a.rows} rows, {a.steps} steps, D "
          f"{a.dim}, {a.classes} classes ({a.device}; best of {a.repeat})")  # fmt: skip
    print(
        f"{'heads':8s} {'wall s':>8s} {'x none':>7s} {'state MiB':>10s} {'RSS MiB':>8s}"
    )
    for name, r in runs.items():
        ratio = r.wall / runs["none"].wall
        mib = state.get(name, 0) / 2**20
        print(f"{name:8s} {r.wall:8.2f} {ratio:7.2f} {mib:10.1f} {r.rss / 2**20:8.0f}")
    here = {"E": width, "n": a.rows, "D": a.dim, "C": a.classes,
            "steps": a.steps, "chunk": a.batch_rows}  # fmt: skip
    for label, size in (("this run", here), ("Food101", FOOD101)):
        f = solve_flops(**size)
        parts = ", ".join(
            f"{k} {v / f['solve']:.2f}" for k, v in f.items() if k != "solve"
        )
        cheap = sum(f[h] for h in SETS["cheap"]) / f["solve"] + 1
        every = sum(f[h] for h in SETS["all"]) / f["solve"] + 1
        print(f"FLOPs, {label}: solve {f['solve']:.2e}; each head's share of it: "
              f"{parts}; cheap set {cheap:.2f}x, all six {every:.2f}x")  # fmt: skip
