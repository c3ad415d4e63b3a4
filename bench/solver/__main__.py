"""Benchmark of `pal-solver solve` against the BLAS floor and ACIL's update.

On synthetic shards (default: D = 768, 20,000 training rows over 10 steps,
100 classes, float64) and for each width d it measures, in one run:

- the wall time of the whole `pal-solver solve` process (a subprocess, so
  start-up, imports, reading and writing count) for `gram` and `woodbury`,
  best of --repeat runs after one warm-up run;
- the BLAS floor at the same sizes, measured in this process: the up-sampling
  GEMM X·W_up over all rows + one SYRK over all rows + per step one Cholesky
  and its triangular solves (the Cholesky taken on the final G + ηI);
- the ratio solve / floor (target for gram: ≤ 1.3 on the 2-core CPU);
- peak memory of each solve process (ru_maxrss from wait4) against the budget
  2.5·d²·8 bytes + one chunk (batch_rows·d·8), above the fixed size of a
  solver process (interpreter, imports, BLAS buffers); and gram's peak for n
  and n/2 rows at an equal chunk size (--mem-chunk rows), which must match:
  memory does not grow with the row count;
- the relative error (Frobenius) of the final W against the joint ridge
  solution computed here from all rows;
- ACIL's reference update in this process: per batch of ≤ 4096 rows within a
  step (batches never span a step), K = inv(I + H R Hᵀ),
  R -= R Hᵀ K H R and W += R Hᵀ (Y − H W) evaluated left to right as ACIL
  writes them, float64, from features already in memory (reading excluded);
  and its time over gram's;
- an η sweep of 5 values in one `pal-solver solve --eta a,b,c,d,e` process
  against five separate solves (5 × the best single gram time).

`--heads` times instead whole solves with `solve.heads` against the solves
without heads (η fixed, and `eta: auto`), with a FLOP model of each head at
this size and Food101's (heads.py).

Run (CPU):  .venv/bin/python bench/solver            (about 15-25 minutes)
            .venv/bin/python bench/solver --heads --widths 2000 --rows 16000
            .venv/bin/python bench/solver --quick    (seconds; smoke test)
Run (GPU):  PYTHONPATH=. python3 bench/solver --device cuda
                --widths 4096,8192,15000   (one command line)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the project, installed or not

import numpy as np  # noqa: E402
from floor import ETA, Floor, Kernels, acil_reference, rel, warm_up  # noqa: E402
from procs import Run, baseline_rss, run_solve  # noqa: E402

from solver.api import Classifier, make_features, weights_name  # noqa: E402
from solver.shard_readers import open_features  # noqa: E402

SWEEP = (0.01, 0.1, 1.0, 10.0, 100.0)


# ---------------------------------------------------------------- data


def make_data(root: Path, rows: int, steps: int, classes: int, dim: int) -> Path:
    per = [rows // steps] * steps
    per[-1] += rows - sum(per)
    cls = [classes // steps] * steps
    cls[-1] += classes - sum(cls)
    return make_features(
        root, per, cls, feature_dim=dim, test_rows=8, bp_logits=False, seed=0
    )


def load_all(features: Path) -> tuple[list[np.ndarray], list[np.ndarray], list[int]]:
    """Per step: X (n_k, D) float32, labels, classes_seen."""
    Xs, ys, seen = [], [], []
    for s in open_features(features):
        X, y, _, _ = s.train.read_all()
        Xs.append(X)
        ys.append(y)
        seen.append(s.classes_seen)
    return Xs, ys, seen


# ---------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--widths", default="4096,8192", help="comma-separated widths d")
    ap.add_argument("--rows", type=int, default=20000, help="training rows in all")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--classes", type=int, default=100)
    ap.add_argument("--dim", type=int, default=768, help="feature dim D")
    ap.add_argument("--batch-rows", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3, help="best of N (solve, floor)")
    ap.add_argument("--acil-repeat", type=int, default=1)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--methods", default="gram,woodbury")
    ap.add_argument("--no-acil", action="store_true")
    ap.add_argument("--no-sweep", action="store_true")
    ap.add_argument("--no-half", action="store_true", help="skip the n vs n/2 runs")
    ap.add_argument("--mem-chunk", type=int, default=500,
                    help="batch rows of the n vs n/2 memory runs")  # fmt: skip
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one run each")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--workdir", type=Path, help="keep shards and weights here")
    ap.add_argument("--heads", action="store_true", help="time solves with "
                    "solve.heads instead, as ratios to the solves without heads, "
                    "at the first of --widths (heads.py)")  # fmt: skip
    ap.add_argument(
        "--sets",
        help="--heads: only these sets (comma-separated: "
        "fixed, fixed+cheap, auto, auto+rules, auto+air, auto+all)",
    )
    ap.add_argument(
        "--features",
        type=Path,
        help="--heads: time on these shards (step_XX/train.h5, as extract "
        "writes) instead of synthetic ones, with their own sizes",
    )
    ap.add_argument(
        "--no-warm-up",
        action="store_true",
        help="--heads: no warm-up run (for sizes of many minutes)",
    )
    a = ap.parse_args()
    if a.quick:
        a.widths, a.rows, a.steps, a.classes, a.repeat = "512", 2000, 4, 20, 1
    return a


@dataclass
class Bench:
    """What every width's measurements share: options, shards, kernels."""

    a: argparse.Namespace
    work: Path
    features: Path  # n rows
    half: Path  # n/2 rows, for the memory runs
    Xs: list[np.ndarray]
    ys: list[np.ndarray]
    seen: list[int]
    k: Kernels
    base_rss: int

    def solve(self, width: int, method: str, etas: tuple[float, ...], name: str,
              data: Path | None = None, rows: int | None = None) -> Run:  # fmt: skip
        """One `pal-solver solve` process into solve-<width>/<name>."""
        out = self.work / f"solve-{width}" / name
        return run_solve(data or self.features, out, width, method, self.a.device,
                         etas, rows or self.a.batch_rows)  # fmt: skip


def main() -> None:
    a = parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="pal-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    if a.heads:
        import heads  # bench/solver/

        features = a.features or make_data(
            work / "extract", a.rows, a.steps, a.classes, a.dim
        )
        heads.run(a, work, features)
        return
    features = make_data(work / "extract", a.rows, a.steps, a.classes, a.dim)
    half = make_data(work / "extract-half", a.rows // 2, a.steps, a.classes, a.dim)
    Xs, ys, seen = load_all(features)
    k = Kernels(a.device)
    warm_up(k)
    b = Bench(a, work, features, half, Xs, ys, seen, k, baseline_rss())
    print(
        f"# solver bench: {platform.node()}, {os.cpu_count()} CPUs, device {a.device}"
        f"{' (' + gpu_name() + ')' if a.device == 'cuda' else ''}, "
        f"n={sum(len(y) for y in ys)} rows / {a.steps} steps, C={seen[-1]}, "
        f"D={a.dim}, eta={ETA}, batch_rows={a.batch_rows}, best of {a.repeat}, "
        f"load {os.getloadavg()[0]:.1f}, "
        f"fixed RSS (interpreter, imports, BLAS buffers) {b.base_rss / 2**20:.0f} MiB",
        flush=True,
    )
    results = []
    for width in [int(w) for w in a.widths.split(",")]:
        results.append(measure_width(b, width))
        print_table(results, a)
        if a.json:
            a.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def measure_width(b: Bench, width: int) -> dict[str, object]:
    """Every measurement at one width d: the solves against the floor, their
    memory and error, the η sweep and ACIL's update."""
    a, methods = b.a, b.a.methods.split(",")
    b.solve(width, "gram", (ETA,), "warm")
    floor = Floor(b.k, np.concatenate(b.Xs), np.concatenate(b.ys), b.seen, width)
    runs: dict[str, list[Run]] = {m: [] for m in methods}
    sweep_runs: list[Run] = []
    for i in range(a.repeat):  # interleaved: floor and solves share the load
        floor.measure()
        for method in methods:
            runs[method].append(b.solve(width, method, (ETA,), method))
            print(f"  d={width} {method} run {i + 1}: "
                  f"{runs[method][-1].wall:.2f} s", flush=True)  # fmt: skip
        if not a.no_sweep and "gram" in methods:
            sweep_runs.append(b.solve(width, "gram", SWEEP, "sweep"))
            print(f"  d={width} sweep run {i + 1}: {sweep_runs[-1].wall:.2f} s",
                  flush=True)  # fmt: skip
    fl = floor.best()
    print(f"  d={width} floor: {fl['floor'].wall:.2f} s", flush=True)
    budget = 2.5 * width * width * 8 + a.batch_rows * width * 8
    row: dict[str, object] = {
        "width": width,
        "budget_bytes": budget,
        "fixed_rss_bytes": b.base_rss,
        "floor": {p: asdict(r) for p, r in fl.items()},
        "gpu_gram_kernels_s": floor.syrk_kernels,
    }
    out = b.work / f"solve-{width}"
    for method in methods:
        best = Run.best(runs[method])
        W = Classifier(out / method / "weights.h5").W(a.steps)
        row[method] = {
            **asdict(best),
            "wall_over_floor": best.wall / fl["floor"].wall,
            "cpu_over_floor": best.cpu / fl["floor"].cpu,
            "rss_above_fixed_over_budget": (best.rss - b.base_rss) / budget,
            "rel_err_vs_joint": rel(W, floor.W_joint),
        }
    if not a.no_half and "gram" in methods:
        row["gram"]["rss_equal_chunk"] = {
            key: b.solve(width, "gram", (ETA,), f"mem-{key}", data, a.mem_chunk).rss
            for key, data in (("n_rows", b.features), ("half_rows", b.half))
        }
    if sweep_runs:
        row["sweep"] = sweep_row(Run.best(sweep_runs), row["gram"], out, a.steps,
                                 floor.W_joint)  # fmt: skip
    if not a.no_acil:
        row["acil"] = acil_row(b, width, row.get("gram"), floor.W_joint)
    return row


def sweep_row(best: Run, gram: dict, out: Path, steps: int, W_joint: np.ndarray
              ) -> dict[str, object]:  # fmt: skip
    """The 5-η sweep in one process against five separate gram solves."""
    W = Classifier(out / "sweep" / weights_name(ETA, True)).W(steps)
    return {
        **asdict(best),
        "etas": list(SWEEP),
        "wall_over_five_separate": best.wall / (5 * gram["wall"]),
        "cpu_over_five_separate": best.cpu / (5 * gram["cpu"]),
        "rel_err_eta1_vs_joint": rel(W, W_joint),
    }


def acil_row(b: Bench, width: int, gram: dict | None, W_joint: np.ndarray
             ) -> dict[str, object]:  # fmt: skip
    """ACIL's reference update, best of --acil-repeat, against gram's solve."""
    acil = [acil_reference(b.k, b.Xs, b.ys, b.seen, width)
            for _ in range(b.a.acil_repeat)]  # fmt: skip
    best = Run.best([r[0] for r in acil])
    row = {**asdict(best), "rel_err_vs_joint": rel(acil[-1][1], W_joint)}
    if gram is not None:
        row["over_gram_wall"] = best.wall / gram["wall"]
        row["over_gram_cpu"] = best.cpu / gram["cpu"]
    print(f"  d={width} acil: {best.wall:.2f} s", flush=True)
    return row


def gpu_name() -> str:
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def print_table(results: list[dict], a: argparse.Namespace) -> None:
    """One markdown table: times (wall / CPU), ratios, memory, error."""
    mib = 2**20
    print()
    print("| d | run | wall s | CPU s | floor wall s (GEMM + SYRK + K·chol) | "
          "floor CPU s | ratio wall / CPU | peak RSS MiB: total, above fixed "
          "(budget) | rel. err vs joint |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        f = r["floor"]
        fl_wall = (f"{f['floor']['wall']:.2f} ({f['gemm']['wall']:.2f} + "
                   f"{f['syrk']['wall']:.2f} + {f['chol']['wall']:.2f})")  # fmt: skip
        fl_cpu = f"{f['floor']['cpu']:.2f}"
        budget = r["budget_bytes"] / mib
        for m in ("gram", "woodbury"):
            if m not in r:
                continue
            x = r[m]
            above = (x["rss"] - r["fixed_rss_bytes"]) / mib
            peak = f"{x['rss'] / mib:.0f}, {above:.0f} ({budget:.0f})"
            if "rss_equal_chunk" in x:
                e = x["rss_equal_chunk"]
                peak += (f"; chunk {a.mem_chunk}: n rows {e['n_rows'] / mib:.0f}, "
                         f"n/2 rows {e['half_rows'] / mib:.0f}")  # fmt: skip
            if x.get("gpu_pool"):
                peak += f"; GPU pool {x['gpu_pool'] / mib:.0f}"
            print(f"| {r['width']} | {m} (process) | {x['wall']:.2f} | "
                  f"{x['cpu']:.2f} | {fl_wall} | {fl_cpu} | "
                  f"{x['wall_over_floor']:.2f} / {x['cpu_over_floor']:.2f} | {peak} | "
                  f"{x['rel_err_vs_joint']:.1e} |")  # fmt: skip
        if "sweep" in r:
            x = r["sweep"]
            g = r["gram"]
            print(f"| {r['width']} | gram, 5-η sweep (process) | {x['wall']:.2f} | "
                  f"{x['cpu']:.2f} | 5 separate: {5 * g['wall']:.2f} | "
                  f"{5 * g['cpu']:.2f} | {x['wall_over_five_separate']:.2f} / "
                  f"{x['cpu_over_five_separate']:.2f} | {x['rss'] / mib:.0f} | "
                  f"{x['rel_err_eta1_vs_joint']:.1e} |")  # fmt: skip
        if "acil" in r:
            x = r["acil"]
            ratio = ""
            if "over_gram_wall" in x:
                ratio = f"{x['over_gram_wall']:.2f} / {x['over_gram_cpu']:.2f} × gram"
            print(f"| {r['width']} | ACIL update (in-process, no I/O) | "
                  f"{x['wall']:.2f} | {x['cpu']:.2f} | | | {ratio} | | "
                  f"{x['rel_err_vs_joint']:.1e} |")  # fmt: skip
        if r.get("gpu_gram_kernels_s"):
            ks = ", ".join(f"{n} {t:.3f} s" for n, t in r["gpu_gram_kernels_s"].items())
            print(f"| {r['width']} | Gram kernel on the GPU: {ks} | | | | | | | |")


if __name__ == "__main__":
    main()
