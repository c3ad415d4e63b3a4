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

Run (CPU):  .venv/bin/python bench/solve_speed.py            (about 15-25 minutes)
            .venv/bin/python bench/solve_speed.py --quick    (seconds; smoke test)
Run (GPU):  PYTHONPATH=. python3 bench/solve_speed.py --device cuda
                --widths 4096,8192,15000   (one command line)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from solver.api import (  # noqa: E402
    Classifier,
    get_backend,
    make_features,
    upsampling_matrix,
    weights_name,
)
from solver.shards import open_features  # noqa: E402

ETA = 1.0
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


# ---------------------------------------------------------------- processes

# Runs `pal-solver ARGS…` in this very process and, at exit, writes its own peak
# RSS (VmHWM, kB) to a file. ru_maxrss of a child is no use here: on Linux it
# carries the parent's (this benchmark's) high-water mark over through exec.
_HWM_WRAPPER = """
import atexit, sys
def _hwm(path=sys.argv[1]):
    with open("/proc/self/status") as f:
        kb = next(line.split()[1] for line in f if line.startswith("VmHWM"))
    pool = 0  # CuPy's pool keeps what it ever held: about the peak on the GPU
    if "cupy" in sys.modules:
        pool = sys.modules["cupy"].get_default_memory_pool().total_bytes()
    with open(path, "w") as f:
        f.write(f"{kb} {pool}")
atexit.register(_hwm)
sys.argv = ["pal-solver", *sys.argv[2:]]
import solver.cli, solver.api
solver.cli.main()
"""


@dataclass(frozen=True)
class Run:
    """One measured run: wall and CPU seconds (all threads), peak memory."""

    wall: float
    cpu: float
    rss: int = 0  # peak RSS bytes of the process
    gpu_pool: int = 0  # bytes held by CuPy's memory pool at exit

    @staticmethod
    def best(runs: list[Run]) -> Run:
        """Best time over runs (wall and CPU each), largest memory."""
        return Run(
            min(r.wall for r in runs),
            min(r.cpu for r in runs),
            max(r.rss for r in runs),
            max(r.gpu_pool for r in runs),
        )


def run_cli(args: list[str], hwm: Path) -> Run:
    """Measure one `pal-solver ARGS…` process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    cmd = [sys.executable, "-c", _HWM_WRAPPER, str(hwm), *args]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(proc.pid, 0)  # CPU times of this child only
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"pal-solver {' '.join(args)} failed:\n"
                               f"{err.read().decode()}")  # fmt: skip
    kb, pool = hwm.read_text().split()
    return Run(wall, usage.ru_utime + usage.ru_stime, int(kb) * 1024, int(pool))


def run_solve(
    features: Path,
    out: Path,
    width: int,
    method: str,
    device: str,
    etas: tuple[float, ...],
    batch_rows: int,
) -> Run:
    """Measure one `pal-solver solve` process."""
    out.parent.mkdir(parents=True, exist_ok=True)
    params = out.parent / "params.yaml"
    params.write_text(
        "solve:\n  eta: 1.0\n  width: 8\n  seed: 0\n  method: gram\n"
        "  device: cpu\n  dtype: float64\n  batch_rows: 4096\n"
    )
    args = [
        "solve", "--features", str(features), "--out", str(out),
        "--params", str(params), "--eta", ",".join(f"{e:g}" for e in etas),
        "--width", str(width), "--method", method, "--device", device,
        "--batch-rows", str(batch_rows),
    ]  # fmt: skip
    return run_cli(args, out.parent / f"hwm-{out.name}.txt")


_BASELINE = """
import numpy as np, solver.cli, solver.solve, solver.rls, solver.backend
from scipy.linalg import blas, lapack
a = np.random.default_rng(0).random((2048, 2048))
a @ a  # NumPy's OpenBLAS and SciPy's each keep per-thread work buffers
g = blas.dsyrk(1.0, a)
g[np.arange(2048), np.arange(2048)] += 2048.0
lapack.dpotrf(g)
del a, g
with open("/proc/self/status") as f:
    print(next(line.split()[1] for line in f if line.startswith("VmRSS")))
"""


def baseline_rss() -> int:
    """Fixed RSS bytes of a solver process: interpreter, imports, BLAS buffers.

    Measured as the resident size after importing the solver and running one
    GEMM, SYRK and Cholesky through both OpenBLAS copies, their arrays freed.
    """
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    out = subprocess.run([sys.executable, "-c", _BASELINE], env=env, check=True,
                         capture_output=True, text=True).stdout  # fmt: skip
    return int(out.split()[-1]) * 1024


# ---------------------------------------------------------------- kernels


class Kernels:
    """The floor's kernels on one device: the solver's own backend
    (`solver.backend`: its SYRK, Cholesky and solves), so the floor times the
    very calls the solver makes."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.backend = get_backend(device)
        self.xp = self.backend.xp

    def sync(self) -> None:
        self.backend.synchronize()

    def asarray(self, a: np.ndarray) -> object:
        return self.backend.asarray(a)

    def host(self, a: object) -> np.ndarray:
        return self.backend.to_host(a)

    def zeros_sym(self, d: int) -> object:
        return self.backend.sym_empty(d, np.float64)

    def syrk(self, G: object, H: object) -> None:
        """G (lower) += HᵀH over all rows of H (n, d)."""
        self.backend.syrk_(G, H.T)

    def chol_solve(self, M: object, Q: object) -> object:
        """Factor M = L Lᵀ (lower triangle read, overwritten) and solve M W = Q."""
        return self.backend.cho_solve(self.backend.cholesky_(M), Q)


def timed(k: Kernels, fn) -> tuple[Run, object]:
    """Wall and CPU (this process, all threads) seconds of fn(), and its result."""
    k.sync()
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    k.sync()
    return Run(time.perf_counter() - wall, time.process_time() - cpu), out


def warm_up(k: Kernels) -> None:
    xp = k.xp
    a = k.asarray(np.random.default_rng(0).random((1024, 1024)))
    for _ in range(3):
        a @ a
        M = k.zeros_sym(512)
        k.syrk(M, a[:, :512])
        M[xp.arange(512), xp.arange(512)] += 1.0
        k.chol_solve(M, k.asarray(np.ones((512, 4))))
    k.sync()


class Floor:
    """The unavoidable BLAS work at the solve's sizes, measured in this process.

    GEMM X·W_up over all rows + one SYRK over all rows + per step one Cholesky
    of G + ηI (the final G) and its two triangular solves with C_k columns.
    `measure()` times every part once; call it between the solve runs so the
    floor and the solves see the same machine load, and keep each part's best.
    """

    def __init__(self, k: Kernels, X: np.ndarray, y: np.ndarray, seen: list[int],
                 width: int) -> None:  # fmt: skip
        xp = self.xp = k.xp
        self.k, self.width, self.seen = k, width, seen
        self.W_up = k.asarray(upsampling_matrix(X.shape[1], width, 0))
        self.X64 = k.asarray(X.astype(np.float64))
        H = xp.maximum(self.X64 @ self.W_up, 0)
        self.G = k.zeros_sym(width)
        k.syrk(self.G, H)
        Y = xp.zeros((len(y), seen[-1]))
        Y[xp.arange(len(y)), k.asarray(y)] = 1.0
        self.Q = H.T @ Y
        self.H = H
        self.M = k.zeros_sym(width)
        self.runs: list[dict[str, Run]] = []
        self.syrk_kernels: dict[str, float] = {}
        if k.device == "cuda":  # cuBLAS syrk or a full GEMM: keep the faster
            for kernel in ("syrk", "gemm"):
                k.backend.gram_kernel = kernel
                self.syrk_kernels[kernel] = min(self._syrk()[0].wall for _ in range(3))
            k.backend.gram_kernel = min(self.syrk_kernels, key=self.syrk_kernels.get)
        self.W_joint = k.host(self._chol(seen[-1])[1])

    def _syrk(self) -> tuple[Run, object]:
        G = self.k.zeros_sym(self.width)
        return timed(self.k, lambda: self.k.syrk(G, self.H))

    def _chol(self, c: int) -> tuple[Run, object]:
        M = self.M
        M[...] = self.G
        self.k.backend.add_diag_(M, ETA)
        return timed(self.k, lambda: self.k.chol_solve(M, self.Q[:, :c]))

    def measure(self) -> None:
        gemm, _ = timed(self.k, lambda: self.X64 @ self.W_up)
        syrk, _ = self._syrk()
        chols = [self._chol(c)[0] for c in self.seen]
        chol = Run(sum(r.wall for r in chols), sum(r.cpu for r in chols))
        self.runs.append({"gemm": gemm, "syrk": syrk, "chol": chol})

    def best(self) -> dict[str, Run]:
        """Per part, the best of the measured runs; 'floor' is their sum."""
        parts = {
            p: Run.best([r[p] for r in self.runs]) for p in ("gemm", "syrk", "chol")
        }
        parts["floor"] = Run(sum(r.wall for r in parts.values()),
                             sum(r.cpu for r in parts.values()))  # fmt: skip
        return parts


def acil_reference(
    k: Kernels,
    Xs: list[np.ndarray],
    ys: list[np.ndarray],
    seen: list[int],
    width: int,
    batch: int = 4096,
) -> tuple[Run, np.ndarray]:
    """ACIL's RecursiveLinear.fit as written, per ≤ 4096-row batch within a step."""
    xp = k.xp
    W_up = k.asarray(upsampling_matrix(Xs[0].shape[1], width, 0))
    d = width
    k.sync()
    wall, cpu = time.perf_counter(), time.process_time()
    R = xp.eye(d) / ETA
    W = xp.zeros((d, 0))
    for X_k, y_k, c in zip(Xs, ys, seen, strict=True):
        for lo in range(0, len(y_k), batch):
            X = xp.maximum(k.asarray(X_k[lo : lo + batch].astype(np.float64)) @ W_up, 0)
            if W.shape[1] < c:
                W = xp.concatenate([W, xp.zeros((d, c - W.shape[1]))], axis=1)
            Y = xp.zeros((X.shape[0], c))
            Y[xp.arange(X.shape[0]), k.asarray(y_k[lo : lo + batch])] = 1.0
            K = xp.linalg.inv(xp.eye(X.shape[0]) + X @ R @ X.T)
            R -= R @ X.T @ K @ X @ R
            W += R @ X.T @ (Y - X @ W)
    k.sync()
    run = Run(time.perf_counter() - wall, time.process_time() - cpu)
    return run, k.host(W)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


# ---------------------------------------------------------------- main


def main() -> None:
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
    a = ap.parse_args()
    if a.quick:
        a.widths, a.rows, a.steps, a.classes, a.repeat = "512", 2000, 4, 20, 1
    widths = [int(w) for w in a.widths.split(",")]
    methods = a.methods.split(",")

    work = a.workdir or Path(tempfile.mkdtemp(prefix="pal-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    features = make_data(work / "extract", a.rows, a.steps, a.classes, a.dim)
    half = make_data(work / "extract-half", a.rows // 2, a.steps, a.classes, a.dim)
    Xs, ys, seen = load_all(features)
    X, y = np.concatenate(Xs), np.concatenate(ys)
    k = Kernels(a.device)
    warm_up(k)
    base_rss = baseline_rss()
    print(
        f"# solver bench: {platform.node()}, {os.cpu_count()} CPUs, device {a.device}"
        f"{' (' + gpu_name() + ')' if a.device == 'cuda' else ''}, "
        f"n={len(y)} rows / {a.steps} steps, C={seen[-1]}, D={a.dim}, eta={ETA}, "
        f"batch_rows={a.batch_rows}, best of {a.repeat}, "
        f"load {os.getloadavg()[0]:.1f}, "
        f"fixed RSS (interpreter, imports, BLAS buffers) {base_rss / 2**20:.0f} MiB",
        flush=True,
    )
    results = []
    for width in widths:
        out = work / f"solve-{width}"

        def solve_run(
            method: str,
            etas: tuple[float, ...],
            name: str,
            data: Path = features,
            rows: int = a.batch_rows,
            out: Path = out,
            width: int = width,
        ) -> Run:
            return run_solve(data, out / name, width, method, a.device, etas, rows)

        solve_run("gram", (ETA,), "warm")
        floor = Floor(k, X, y, seen, width)
        runs: dict[str, list[Run]] = {m: [] for m in methods}
        sweep_runs: list[Run] = []
        for i in range(a.repeat):  # interleaved: floor and solves share the load
            floor.measure()
            for method in methods:
                runs[method].append(solve_run(method, (ETA,), method))
                print(f"  d={width} {method} run {i + 1}: "
                      f"{runs[method][-1].wall:.2f} s", flush=True)  # fmt: skip
            if not a.no_sweep and "gram" in methods:
                sweep_runs.append(solve_run("gram", SWEEP, "sweep"))
                print(f"  d={width} sweep run {i + 1}: {sweep_runs[-1].wall:.2f} s",
                      flush=True)  # fmt: skip
        fl = floor.best()
        print(f"  d={width} floor: {fl['floor'].wall:.2f} s", flush=True)
        budget = 2.5 * width * width * 8 + a.batch_rows * width * 8
        row: dict[str, object] = {
            "width": width,
            "budget_bytes": budget,
            "fixed_rss_bytes": base_rss,
            "floor": {p: asdict(r) for p, r in fl.items()},
            "gpu_gram_kernels_s": floor.syrk_kernels,
        }
        for method in methods:
            best = Run.best(runs[method])
            W = Classifier(out / method / "weights.h5").W(a.steps)
            row[method] = {
                **asdict(best),
                "wall_over_floor": best.wall / fl["floor"].wall,
                "cpu_over_floor": best.cpu / fl["floor"].cpu,
                "rss_above_fixed_over_budget": (best.rss - base_rss) / budget,
                "rel_err_vs_joint": rel(W, floor.W_joint),
            }
        if not a.no_half and "gram" in methods:
            row["gram"]["rss_equal_chunk"] = {
                key: solve_run("gram", (ETA,), f"mem-{key}", data, a.mem_chunk).rss
                for key, data in (("n_rows", features), ("half_rows", half))
            }
        if sweep_runs:
            best = Run.best(sweep_runs)
            gram = row["gram"]
            W = Classifier(out / "sweep" / weights_name(ETA, True)).W(a.steps)
            row["sweep"] = {
                **asdict(best),
                "etas": list(SWEEP),
                "wall_over_five_separate": best.wall / (5 * gram["wall"]),
                "cpu_over_five_separate": best.cpu / (5 * gram["cpu"]),
                "rel_err_eta1_vs_joint": rel(W, floor.W_joint),
            }
        if not a.no_acil:
            acil = [
                acil_reference(k, Xs, ys, seen, width) for _ in range(a.acil_repeat)
            ]
            best = Run.best([r[0] for r in acil])
            row["acil"] = {
                **asdict(best),
                "rel_err_vs_joint": rel(acil[-1][1], floor.W_joint),
            }
            if "gram" in methods:
                row["acil"]["over_gram_wall"] = best.wall / row["gram"]["wall"]
                row["acil"]["over_gram_cpu"] = best.cpu / row["gram"]["cpu"]
            print(f"  d={width} acil: {best.wall:.2f} s", flush=True)
        del floor
        results.append(row)
        print_table(results, a)
        if a.json:
            a.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


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
