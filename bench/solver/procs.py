"""The solver benchmark's (bench/solver) processes: one `pal-solver solve` measured as a
process (wall, CPU of that child only, peak RSS and CuPy's pool), and the
fixed RSS of a solver process (interpreter, imports, BLAS buffers)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

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
import numpy as np, solver.cli, solver.api
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
