"""palbench/gpu_check.py's parts, each run as its own process or call with its
log under --out: the GPU tests, the solver at a scale, and a rehearsal of one
run of PAL (palbench/rehearsal.py)."""

from __future__ import annotations

import json
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
            cmd,
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
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
    cmd = [
        sys.executable,
        "-m",
        "pytest",
        "-m",
        "gpu",
        "tests",
        "-q",
        "-rs",
        "-p",
        "no:cacheprovider",
    ]
    code, wall, text = run_logged(cmd, out / "gpu_tests.log", timeout)
    lines = [
        x
        for x in text.splitlines()
        if re.search(
            r"\d+ (passed|failed|skipped|"
            r"deselected|error)",
            x,
        )
    ]
    summary = lines[-1].strip("= ") if lines else "no summary (see gpu_tests.log)"
    # exit 5: every test deselected or none collected
    return {"exit": code, "wall_s": round(wall, 1), "summary": summary}


def solver_check(
    out: Path,
    work: Path,
    device: str,
    rows: int,
    classes: int,
    steps: int,
    dim: int,
    width: int,
    timeout: float,
) -> dict[str, Any]:
    """`python -m solver solve` on synthetic features; the backend it used."""
    from solver.api import make_features

    per = [rows // steps] * steps
    per[-1] += rows - sum(per)
    start = time.perf_counter()
    features = make_features(
        work / "features",
        per,
        classes // steps,
        feature_dim=dim,
        test_rows=8,
        n_steps=steps,
        bp_logits=False,
        seed=0,
    )
    made = time.perf_counter() - start
    params = work / "solve.yaml"
    params.write_text(
        f"solve: {{eta: 1.0, width: {width}, seed: 0, method: gram, "
        f"device: {device}, dtype: float64, batch_rows: 4096}}\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "solver",
        "solve",
        "--params",
        str(params),
        "--features",
        str(features),
        "--out",
        str(work / "solve"),
    ]
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
    out: Path,
    work: Path,
    device: str,
    epochs: int,
    runner: str,
    graphs: bool,
    *,
    tree: Path = ROOT,
    log_name: str = "rehearsal.log",
    **scale: Any,
) -> dict[str, Any]:
    """palbench/rehearsal.py's one run of PAL with the code of `tree`; its log
    copied to --out/log_name."""
    from palbench import rehearsal

    start = time.perf_counter()
    try:
        result = rehearsal.rehearse(
            work,
            device=device,
            epochs=epochs,
            runner=runner,
            cuda_graphs=graphs,
            tree=tree,
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


def cells_check(
    out: Path, work: Path, jobs: tuple[int, ...], timeout: float
) -> dict[str, Any]:
    """Several cells on one card, as `pal-paper run -j N` puts them there: N
    copies of the rehearsal's tune (in `work`, after the new path's rehearsal:
    its prepare, pixel cache and frozen queries) started together, for each N
    of `jobs`. Per N: the exit, the wall time, training samples a second over
    the N (all their epochs over the wall, and over the slowest one's steady
    epochs), and each process's GPU memory peak. The GPU image has no dvc, so
    the tunes are the stage command itself, not DVC's queue."""
    import json

    from palbench import rehearsal

    tune = dict(rehearsal.stage_commands(sys.executable))["tune"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    rows: dict[int, dict[str, Any]] = {}
    text = []
    for n in jobs:
        cmds = [_tune_copy(tune, f"j{n}-{i}") for i in range(n)]
        start = time.perf_counter()
        procs = [
            subprocess.Popen(
                c,
                cwd=work,
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            for c in cmds
        ]
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
        wall = time.perf_counter() - start
        text += [f"$ {' '.join(c)}\n{o}" for c, o in zip(cmds, outs, strict=True)]
        epochs = [
            [json.loads(x) for x in (work / f"logs/tune-j{n}-{i}.jsonl").open()]
            if (work / f"logs/tune-j{n}-{i}.jsonl").exists()
            else []
            for i in range(n)
        ]
        samples = sum(e["samples"] for log in epochs for e in log)
        busy = max((sum(e["seconds"] for e in log) for log in epochs), default=0.0)
        peak = re.compile(r"tune: GPU memory peak ([\d.]+) GiB")
        peaks = [float(m) for o in outs for m in peak.findall(o)]
        rows[n] = {
            "exit": max(p.returncode for p in procs),
            "wall_s": round(wall, 1),
            "samples_per_s": round(samples / wall, 2),
            "steady_samples_per_s": round(samples / busy, 2) if busy else None,
            "gpu_peak_gib_each": max(peaks) if peaks else None,
        }
    (out / "cells.log").write_text("".join(text))
    one = rows[jobs[0]]["samples_per_s"]
    for r in rows.values():
        r["speedup"] = round(r["samples_per_s"] / one, 2) if one else None
    return {"exit": max(r["exit"] for r in rows.values()), "jobs": rows}


def _tune_copy(tune: list[str], name: str) -> list[str]:
    """The rehearsal's tune command writing to its own folder and timings."""
    cmd = list(tune)
    cmd[cmd.index("--out") + 1] = f"data/tune-{name}"
    return [*cmd, "--timings", f"logs/tune-{name}.jsonl"]


def contracts_check(
    out: Path, work: Path, device: str, units: list[str] | None
) -> dict[str, Any]:
    """The output contracts' fixture on `device` (DESIGN §2): the same code
    twice (does the card repeat itself?), then each job against the
    reference the CPU recorded (`reference/`), judged by the rule for the
    same output (`_compared`)."""
    from pipeline.stages import contract_proof as proof
    from pipeline.stages import contract_runs as runs

    start = time.perf_counter()
    jobs = runs.selected(units) if units else runs.jobs()
    if device != "cpu":  # one card: a 2-rank extract would need a second
        jobs = [j for j in jobs if not j.name.endswith("-2rank")]
    inputs = work / "inputs"
    report: dict[str, Any] = {"exit": 0, "device": device, "jobs": len(jobs)}
    try:
        runs.build_inputs(ROOT, inputs, ROOT / proof.REFERENCE / proof.WEIGHTS)
        first = runs.Version(ROOT, work / "first", device)
        runs.run_version(first, runs.with_needs(jobs), inputs)
        again = runs.Version(ROOT, work / "again", device)
        runs.run_version(again, jobs, inputs, first)
        report["repeat"] = _compared(jobs, first.work, again.work)
        report["reference"] = _compared(jobs, first.work, None)
    except RuntimeError as exc:
        report.update(exit=1, error=str(exc))
    report["wall_s"] = round(time.perf_counter() - start, 1)
    (out / "contracts.log").write_text(json.dumps(report, indent=1) + "\n")
    return report


def _compared(jobs: list[Any], a: Path, b: Path | None) -> dict[str, Any]:
    """The jobs whose outputs in `a` and `b` (None: the reference) are the
    same by the CPU's rule (`pipeline.sameness.RTOL`), those within the
    card's (`GPU_RTOL`: bf16 autocast and CUDA graphs), and per job beyond
    it each file that is not the same with the key that moved most."""
    from pipeline.sameness import GPU_RTOL, compare_leaves, folder_leaves
    from pipeline.stages.contract_proof import reference_leaves

    same, within, differ = [], [], {}
    for job in jobs:
        mine = folder_leaves(a / job.name)
        other = reference_leaves(job.name) if b is None else folder_leaves(b / job.name)
        if not compare_leaves(mine, other):
            same.append(job.name)
        elif not (files := compare_leaves(mine, other, GPU_RTOL)):
            within.append(job.name)
        else:
            differ[job.name] = [str(d) for d in files]
    return {"identical": same, "within_gpu_rtol": within, "differ": differ}
    if a.suffix == ".h5":
        import h5py
        import numpy as np

        worst = 0.0
        with h5py.File(a) as fa, h5py.File(b) as fb:
            names: list[str] = []
            fa.visititems(lambda n, o: names.append(n) if hasattr(o, "dtype") else None)
            for name in names:
                x = fa[name][()]
                if name in fb and np.issubdtype(x.dtype, np.floating):
                    diff = np.abs(x.astype(np.float64) - fb[name][()]).max(initial=0)
                    worst = max(worst, float(diff))
        return worst
    if a.suffix == ".pt":
        import torch

        def tensors(obj: Any) -> list[Any]:
            if isinstance(obj, torch.Tensor):
                return [obj] if obj.is_floating_point() else []
            if isinstance(obj, dict):
                return [t for v in obj.values() for t in tensors(v)]
            return []

        ta = tensors(torch.load(a, map_location="cpu", weights_only=False))
        tb = tensors(torch.load(b, map_location="cpu", weights_only=False))
        if len(ta) != len(tb):
            return None
        return max(
            (
                (x.double() - y.double()).abs().max().item()
                for x, y in zip(ta, tb, strict=True)
            ),
            default=0.0,
        )
    return None
