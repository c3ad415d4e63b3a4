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

Run (CPU):  .venv/bin/python bench/solver.py            (about 15-25 minutes)
            .venv/bin/python bench/solver.py --quick    (seconds; smoke test)
Run (GPU):  PYTHONPATH=. python3 bench/solver.py --device cuda --widths 4096,8192,15000
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from solver.rls import upsampling_matrix  # noqa: E402
from solver.shards import open_features  # noqa: E402
from solver.synthetic import make_features  # noqa: E402
from solver.weights import WeightsFile, weights_name  # noqa: E402

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
import solver.cli, solver.solve, solver.rls, solver.backend
solver.cli.main()
"""


def run_cli(args: list[str], hwm: Path) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one `pal-solver ARGS…` process."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(ROOT), env.get("PYTHONPATH")])
    )
    cmd = [sys.executable, "-c", _HWM_WRAPPER, str(hwm), *args]
    with tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            err.seek(0)
            raise RuntimeError(f"pal-solver {' '.join(args)} failed:\n"
                               f"{err.read().decode()}")  # fmt: skip
    kb, pool = hwm.read_text().split()
    run_cli.gpu_pool_bytes = int(pool)  # the last run's, for the GPU table
    return wall, int(kb) * 1024


def run_solve(
    features: Path,
    out: Path,
    width: int,
    method: str,
    device: str,
    etas: tuple[float, ...],
    batch_rows: int,
) -> tuple[float, int]:
    """Wall seconds and peak RSS bytes of one `pal-solver solve` process."""
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


def best_solve(repeat: int, *args: object) -> tuple[float, int]:
    """Best wall time and largest peak RSS over `repeat` runs."""
    runs = [run_solve(*args) for _ in range(repeat)]
    return min(r[0] for r in runs), max(r[1] for r in runs)


# ---------------------------------------------------------------- kernels


class Kernels:
    """The floor's kernels on one device: GEMM, SYRK, Cholesky + solves."""

    def __init__(self, device: str) -> None:
        self.device = device
        if device == "cuda":
            import cupy as cp
            import cupy.cublas
            import cupyx.scipy.linalg

            self.xp, self._cublas = cp, cupy.cublas
            self._trsm = cupyx.scipy.linalg.solve_triangular
        else:
            from scipy.linalg import blas, lapack

            self.xp, self._blas, self._lapack = np, blas, lapack
        self.gram_kernel = "syrk"

    def sync(self) -> None:
        if self.device == "cuda":
            self.xp.cuda.Device().synchronize()

    def asarray(self, a: np.ndarray) -> object:
        return self.xp.asarray(a)

    def host(self, a: object) -> np.ndarray:
        return self.xp.asnumpy(a) if self.device == "cuda" else np.asarray(a)

    def zeros_sym(self, d: int) -> object:
        if self.device == "cuda":
            return self.xp.zeros((d, d))
        return np.zeros((d, d), order="F")

    def syrk(self, G: object, H: object) -> None:
        """G (lower) += HᵀH over all rows of H (n, d)."""
        if self.device == "cuda":
            if self.gram_kernel == "gemm":
                self._cublas.gemm("T", "N", H, H, out=G, beta=1.0)
            else:
                self._cublas.syrk("T", H, out=G, beta=1.0, lower=True)
        else:
            self._blas.dsyrk(1.0, H.T, beta=1.0, c=G, trans=0, lower=1, overwrite_c=1)

    def chol_solve(self, M: object, Q: object) -> object:
        """Factor M = L Lᵀ (lower triangle read) and solve M W = Q."""
        if self.device == "cuda":
            L = self.xp.linalg.cholesky(M)
            Z = self._trsm(L, Q, lower=True)
            return self._trsm(L, Z, lower=True, trans="T")
        L, info = self._lapack.dpotrf(M, lower=1, clean=0, overwrite_a=1)
        assert info == 0
        W, info = self._lapack.dpotrs(L, Q, lower=1)
        assert info == 0
        return W


def timed(k: Kernels, fn, repeat: int) -> tuple[float, object]:
    best, out = math.inf, None
    for _ in range(repeat):
        k.sync()
        start = time.perf_counter()
        out = fn()
        k.sync()
        best = min(best, time.perf_counter() - start)
    return best, out


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


def floor(
    k: Kernels, X: np.ndarray, y: np.ndarray, seen: list[int], width: int, repeat: int
) -> dict[str, object]:
    """Time GEMM + one SYRK over all rows + one (Cholesky + solves) per step."""
    xp = k.xp
    W_up = k.asarray(upsampling_matrix(X.shape[1], width, 0))
    X64 = k.asarray(X.astype(np.float64))
    t_gemm, H = timed(k, lambda: X64 @ W_up, repeat)
    xp.maximum(H, 0, out=H)
    G = k.zeros_sym(width)

    def syrk() -> None:
        G.fill(0)
        k.syrk(G, H)

    t_syrk = {}
    kernels = ("syrk", "gemm") if k.device == "cuda" else ("syrk",)
    for kernel in kernels:
        k.gram_kernel = kernel
        t_syrk[kernel], _ = timed(k, syrk, repeat)
    k.gram_kernel = min(t_syrk, key=t_syrk.get)
    syrk()
    C = int(seen[-1])
    Y = xp.zeros((len(y), C))
    Y[xp.arange(len(y)), k.asarray(y)] = 1.0
    Q = H.T @ Y
    H = None  # free the (n, d) block before the factorisations
    M = k.zeros_sym(width)

    def factor_and_solve(c: int) -> object:
        # cuSOLVER is handed the full symmetric matrix, LAPACK reads the lower half
        M[...] = xp.tril(G) + xp.tril(G, -1).T if k.device == "cuda" else G
        M[xp.arange(width), xp.arange(width)] += ETA
        k.sync()
        start = time.perf_counter()
        W = k.chol_solve(M, Q[:, :c])
        k.sync()
        return time.perf_counter() - start, W

    t_chol = 0.0
    for c in seen:  # one Cholesky + solves per step, each best of `repeat`
        runs = [factor_and_solve(c) for _ in range(repeat)]
        t_chol += min(r[0] for r in runs)
        W_joint = runs[-1][1]
    return {
        "gemm_s": t_gemm,
        "syrk_s": t_syrk[k.gram_kernel],
        "syrk_kernels_s": t_syrk,
        "chol_s": t_chol,
        "floor_s": t_gemm + t_syrk[k.gram_kernel] + t_chol,
        "W_joint": k.host(W_joint),
    }


def acil_reference(
    k: Kernels,
    Xs: list[np.ndarray],
    ys: list[np.ndarray],
    seen: list[int],
    width: int,
    batch: int = 4096,
) -> tuple[float, np.ndarray]:
    """ACIL's RecursiveLinear.fit as written, per ≤ 4096-row batch within a step."""
    xp = k.xp
    W_up = k.asarray(upsampling_matrix(Xs[0].shape[1], width, 0))
    d = width
    k.sync()
    start = time.perf_counter()
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
    return time.perf_counter() - start, k.host(W)


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
        chunk = a.batch_rows * width * 8
        budget = 2.5 * width * width * 8 + chunk
        run_solve(features, out / "warm", width, "gram", a.device, (ETA,), a.batch_rows)
        fl = floor(k, X, y, seen, width, a.repeat)
        row: dict[str, object] = {
            "width": width,
            "budget_bytes": budget,
            "baseline_rss_bytes": base_rss,
            **{key: v for key, v in fl.items() if key != "W_joint"},
        }
        for method in methods:
            wall, rss = best_solve(
                a.repeat, features, out / method, width, method, a.device, (ETA,),
                a.batch_rows,
            )  # fmt: skip
            W = WeightsFile(out / method / "weights.h5").W(a.steps)
            row[method] = {
                "wall_s": wall,
                "ratio_to_floor": wall / fl["floor_s"],
                "peak_rss_bytes": rss,
                "rss_over_budget": rss / budget,
                "rel_err_vs_joint": rel(W, fl["W_joint"]),
                "gpu_pool_bytes": run_cli.gpu_pool_bytes,
            }
            print(f"  d={width} {method}: {wall:.2f} s, floor {fl['floor_s']:.2f} s, "
                  f"peak {rss / 2**20:.0f} MiB", flush=True)  # fmt: skip
        if not a.no_half and "gram" in methods:
            for key, data in (("n", features), ("half", half)):
                _, rss = run_solve(
                    data, out / f"mem-{key}", width, "gram", a.device, (ETA,),
                    a.mem_chunk,
                )  # fmt: skip
                row["gram"][f"peak_rss_{key}_rows_chunk{a.mem_chunk}_bytes"] = rss
        if not a.no_acil:
            runs = [
                acil_reference(k, Xs, ys, seen, width) for _ in range(a.acil_repeat)
            ]
            t_acil = min(r[0] for r in runs)
            row["acil"] = {
                "in_process_s": t_acil,
                "rel_err_vs_joint": rel(runs[-1][1], fl["W_joint"]),
                "over_gram_process": t_acil / row["gram"]["wall_s"]
                if "gram" in methods
                else None,
            }
            print(f"  d={width} acil: {t_acil:.2f} s", flush=True)
        if not a.no_sweep and "gram" in methods:
            wall, rss = best_solve(
                a.repeat, features, out / "sweep", width, "gram", a.device, SWEEP,
                a.batch_rows,
            )  # fmt: skip
            errs = []
            for eta in SWEEP:
                W = WeightsFile(out / "sweep" / weights_name(eta, True)).W(a.steps)
                if eta == ETA:
                    errs.append(rel(W, fl["W_joint"]))
            row["sweep"] = {
                "etas": list(SWEEP),
                "wall_s": wall,
                "five_separate_s": 5 * row["gram"]["wall_s"],
                "ratio": wall / (5 * row["gram"]["wall_s"]),
                "peak_rss_bytes": rss,
                "rel_err_eta1_vs_joint": errs[0],
            }
            print(f"  d={width} sweep x5: {wall:.2f} s", flush=True)
        results.append(row)
    print_table(results, a)
    if a.json:
        a.json.write_text(json.dumps(results, indent=2, sort_keys=True) + "\n")


def gpu_name() -> str:
    import cupy as cp

    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def print_table(results: list[dict], a: argparse.Namespace) -> None:
    mib = 2**20
    print()
    print("| d | method | solve process s | BLAS floor s (GEMM + SYRK + K×chol) "
          "| ratio | peak RSS MiB (budget) | rel. err vs joint |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for r in results:
        fl = (f"{r['floor_s']:.2f} ({r['gemm_s']:.2f} + {r['syrk_s']:.2f} + "
              f"{r['chol_s']:.2f})")  # fmt: skip
        for m in ("gram", "woodbury"):
            if m not in r:
                continue
            x = r[m]
            extra = (x["peak_rss_bytes"] - r["baseline_rss_bytes"]) / mib
            peak = (f"{x['peak_rss_bytes'] / mib:.0f}, above fixed {extra:.0f} "
                    f"({r['budget_bytes'] / mib:.0f})")  # fmt: skip
            mem = [v for k, v in sorted(x.items()) if k.startswith("peak_rss_")
                   and "_rows_chunk" in k]  # fmt: skip
            if mem:  # sorted keys: half, then n
                peak += (f"; chunk {a.mem_chunk}: n rows {mem[1] / mib:.0f}, "
                         f"n/2 rows {mem[0] / mib:.0f}")  # fmt: skip
            if x.get("gpu_pool_bytes"):
                peak += f"; GPU pool {x['gpu_pool_bytes'] / mib:.0f}"
            print(f"| {r['width']} | {m} | {x['wall_s']:.2f} | {fl} | "
                  f"{x['ratio_to_floor']:.2f} | {peak} | "
                  f"{x['rel_err_vs_joint']:.1e} |")  # fmt: skip
        if "acil" in r:
            x = r["acil"]
            over = x["over_gram_process"]
            print(f"| {r['width']} | ACIL update (in-process, no I/O) | "
                  f"{x['in_process_s']:.2f} | | "
                  f"{'' if over is None else f'{over:.2f}× gram'} | | "
                  f"{x['rel_err_vs_joint']:.1e} |")  # fmt: skip
        if "sweep" in r:
            x = r["sweep"]
            print(f"| {r['width']} | gram, 5-η sweep (one process) | {x['wall_s']:.2f} "
                  f"| 5 separate: {x['five_separate_s']:.2f} | {x['ratio']:.2f} | "
                  f"{x['peak_rss_bytes'] / mib:.0f} | "
                  f"{x['rel_err_eta1_vs_joint']:.1e} |")  # fmt: skip
        if "syrk_kernels_s" in r and len(r["syrk_kernels_s"]) > 1:
            ks = ", ".join(f"{n} {t:.3f} s" for n, t in r["syrk_kernels_s"].items())
            print(f"| {r['width']} | Gram kernel on the GPU | {ks} | | | | |")


if __name__ == "__main__":
    main()
