"""`solve.heads` against the solve without heads: whole `pal-solver solve`
processes.

On the benchmark's synthetic shards, one run times (best of --repeat, after
a warm-up unless --no-warm-up) these solves:

- `fixed`: η 1, no heads (the plain solve);
- `fixed+cheap`: η 1 with ridge, ncm and lda;
- `auto`: `solve.eta: auto` (the current task's η rule), no heads;
- `auto+rules`: auto with ridge, ncm, lda and ridge_all: the joint ridge with
  the cheap heads and both η rules, which read one η path;
- `auto+air`: the same and AIR (omitted with --sets);
- `auto+all`: the same, AIR and DS-AL: every head.

Each is printed as a ratio to `fixed` and, for the auto sets, to `auto`,
beside its FLOPs as the same ratio (`solver.api.solve_flops`), the heads'
own state (heads.h5's state_bytes) and the process's peak RSS; then the FLOP
model of each head at the run's size and at Food101's (E = 15,000, 61,127
training rows, D = 768, 100 classes, 10 steps, 4,096-row chunks).

Run: .venv/bin/python bench/solver --heads --widths 2000 --rows 16000
     .venv/bin/python bench/solver --heads --widths 1024 --features data/extract/pal/0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import h5py
from procs import Run, run_cli  # bench/solver/

from solver.api import solve_flops
from solver.shard_readers import open_features

CHEAP = ("ridge", "ncm", "lda")
SETS = {  # name: (solve.eta, solve.heads)
    "fixed": ("1.0", ()),
    "fixed+cheap": ("1.0", CHEAP),
    "auto": ("auto", ()),
    "auto+rules": ("auto", (*CHEAP, "ridge_all")),
    "auto+air": ("auto", (*CHEAP, "ridge_all", "air")),
    "auto+all": ("auto", (*CHEAP, "ridge_all", "air", "dsal")),
}
FOOD101 = {"E": 15000, "n": 61127, "D": 768, "C": 100, "steps": 10, "chunk": 4096}


def _params(path: Path, eta: str, heads: tuple[str, ...]) -> Path:
    path.write_text(
        f"solve:\n  eta: {eta}\n  width: 8\n  seed: 0\n  method: gram\n"
        f"  device: cpu\n  dtype: float64\n  heads: {json.dumps(list(heads))}\n"
    )
    return path


def _time(a: argparse.Namespace, work: Path, features: Path, name: str) -> Run:
    eta, heads = SETS[name]
    out = work / f"heads-{name}"
    params = _params(work / f"params-{name}.yaml", eta, heads)
    args = ["solve", "--features", str(features), "--out", str(out),
            "--params", str(params), "--width", a.widths.split(",")[0],
            "--device", a.device, "--batch-rows", str(a.batch_rows)]  # fmt: skip
    hwm = work / f"hwm-heads-{name}.txt"
    warm = 0 if a.no_warm_up else 1
    return Run.best([run_cli(args, hwm) for _ in range(a.repeat + warm)][warm:])


def _flops_x(size: dict[str, int], name: str, over: str) -> float:
    """FLOPs of a set over those of the set `over` (a set without heads)."""
    eta, heads = SETS[name]
    f = solve_flops(**size, auto=eta == "auto")
    g = solve_flops(**size, auto=SETS[over][0] == "auto")
    return (f["solve"] + sum(f[h] for h in heads)) / g["solve"]


def run(a: argparse.Namespace, work: Path, features: Path) -> None:
    """Time each set in whole solve processes; print the table."""
    names = a.sets.split(",") if a.sets else list(SETS)
    runs = {name: _time(a, work, features, name) for name in names}
    state = {}
    for name in names:
        if SETS[name][1]:
            with h5py.File(work / f"heads-{name}" / "heads.h5") as f:
                state[name] = int(f.attrs["state_bytes"])
    if a.features:  # real shards: their own sizes
        steps = open_features(features)
        a.rows = sum(st.train.n_rows for st in steps)
        a.steps, a.classes = len(steps), steps[-1].classes_seen
        a.dim = steps[0].feature_dim
    width = int(a.widths.split(",")[0])
    here = {"E": width, "n": a.rows, "D": a.dim, "C": a.classes,
            "steps": a.steps, "chunk": a.batch_rows}  # fmt: skip
    warm = "no warm-up" if a.no_warm_up else "after a warm-up"
    print(f"solve.heads at width {width}, {a.rows} rows, {a.steps} steps, "
          f"D {a.dim}, {a.classes} classes ({a.device}; best of {a.repeat}, "
          f"{warm})")  # fmt: skip
    print(f"{'set':12s} {'wall s':>8s} {'x fixed':>8s} {'x auto':>7s} "
          f"{'FLOPs x fixed':>14s} {'FLOPs x auto':>13s} {'state MiB':>10s} "
          f"{'RSS MiB':>8s}")  # fmt: skip
    for name, r in runs.items():
        auto = SETS[name][0] == "auto"
        x_fixed = r.wall / runs["fixed"].wall if "fixed" in runs else float("nan")
        x_auto = r.wall / runs["auto"].wall if auto and "auto" in runs else float("nan")
        f_fixed = _flops_x(here, name, "fixed")
        f_auto = _flops_x(here, name, "auto") if auto else float("nan")
        mib = state.get(name, 0) / 2**20
        print(f"{name:12s} {r.wall:8.1f} {x_fixed:8.2f} {x_auto:7.2f} "
              f"{f_fixed:14.2f} {f_auto:13.2f} {mib:10.1f} "
              f"{r.rss / 2**20:8.0f}")  # fmt: skip
    for label, size in (("this run", here), ("Food101", FOOD101)):
        f = solve_flops(**size)
        parts = ", ".join(
            f"{k} {v / f['solve']:.3f}" for k, v in f.items() if k != "solve"
        )
        rules = _flops_x(size, "auto+rules", "auto")
        every = _flops_x(size, "auto+all", "auto")
        print(f"FLOPs, {label}: fixed solve {f['solve']:.2e}, each head's share "
              f"beside it: {parts}; beside eta auto: rules {rules:.2f}x, "
              f"every head {every:.2f}x")  # fmt: skip
