"""bench/gpu_check.py's parts, each run as its own process or call with its
log under --out: the GPU tests, the solver at a scale, and a rehearsal of one
run of PAL (bench/rehearsal.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_logged(
    cmd: list[str], log: Path, timeout: float, cwd: Path = ROOT
) -> tuple[int, float, str]:
    """Run `cmd`, its output to `log`; returns (exit code, wall s, output)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    start = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, timeout=timeout,
        )  # fmt: skip
        code, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        code = 124
        text = (out.decode() if isinstance(out, bytes) else out) + "\n(timed out)\n"
    wall = time.perf_counter() - start
    log.write_text(f"$ {' '.join(cmd)}\n{text}")
    return code, wall, text


def gpu_tests(out: Path, timeout: float) -> dict[str, Any]:
    """`pytest -m gpu tests`: exit code, wall, pytest's summary line."""
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "tests", "-q", "-rs",
           "-p", "no:cacheprovider"]  # fmt: skip
    code, wall, text = run_logged(cmd, out / "gpu_tests.log", timeout)
    lines = [x for x in text.splitlines() if re.search(r"\d+ (passed|failed|skipped|"
             r"deselected|error)", x)]  # fmt: skip
    summary = lines[-1].strip("= ") if lines else "no summary (see gpu_tests.log)"
    # exit 5: every test deselected or none collected
    return {"exit": code, "wall_s": round(wall, 1), "summary": summary}


def solver_check(
    out: Path, work: Path, device: str, rows: int, classes: int, steps: int,
    dim: int, width: int, timeout: float,
) -> dict[str, Any]:  # fmt: skip
    """`python -m solver solve` on synthetic features; the backend it used."""
    from solver.api import make_features

    per = [rows // steps] * steps
    per[-1] += rows - sum(per)
    start = time.perf_counter()
    features = make_features(
        work / "features", per, classes // steps, feature_dim=dim, test_rows=8,
        n_steps=steps, bp_logits=False, seed=0,
    )  # fmt: skip
    made = time.perf_counter() - start
    params = work / "solve.yaml"
    params.write_text(
        f"solve: {{eta: 1.0, width: {width}, seed: 0, method: gram, "
        f"device: {device}, dtype: float64, batch_rows: 4096}}\n"
    )
    cmd = [sys.executable, "-m", "solver", "solve", "--params", str(params),
           "--features", str(features), "--out", str(work / "solve")]  # fmt: skip
    code, wall, text = run_logged(cmd, out / "solver.log", timeout)
    backend = re.search(r"backend: ((?:CuPy|NumPy).*)", text)  # get_backend
    arith = re.search(r"solve: wrote .* in ([\d.]+) s", text)
    return {
        "exit": code,
        "rows": rows,
        "dim": dim,
        "width": width,
        "classes": classes,
        "steps": steps,
        "backend": backend.group(1) if backend else "NumPy (solve.device cpu)",
        "features_made_s": round(made, 1),
        "wall_s": round(wall, 1),
        "solve_s": float(arith.group(1)) if arith else None,
    }


def rehearsal_check(
    out: Path, work: Path, device: str, epochs: int, runner: str, graphs: bool,
    log_name: str = "rehearsal.log", **scale: Any,
) -> dict[str, Any]:  # fmt: skip
    """bench/rehearsal.py's one run of PAL; its log copied to --out/log_name."""
    sys.path.insert(0, str(ROOT / "bench"))
    import rehearsal

    start = time.perf_counter()
    try:
        result = rehearsal.rehearse(
            work,
            device=device,
            epochs=epochs,
            runner=runner,
            cuda_graphs=graphs,
            **scale,
        )
        result["exit"] = 0
    except SystemExit as exc:
        result = {"exit": 1, "error": str(exc).splitlines()[0]}
    result["wall_s"] = round(time.perf_counter() - start, 1)
    log = work / "logs" / "rehearsal.log"
    if log.exists():
        (out / log_name).write_text(log.read_text())
    return result
