"""The GPU path proven in one call: the GPU tests, the solver at the paper's
width, and a Food101-shaped rehearsal of one run of PAL, in one report.

Runs with the project on PYTHONPATH (or not at all installed: it puts the
repository first on sys.path itself) and nothing beyond the runtime packages:
no dvc, no dev extras, no tests/ helpers. In order:

1. pre-flight: imports what it needs and, if anything is missing, says in one
   line which packages and how to bring them (`make wheels`), then stops;
2. `pytest -m gpu tests` (without a GPU they skip: tests/conftest.py);
3. `python -m solver solve` on synthetic features of Food101's training row
   count (61,127 rows of D = 768, 100 classes in 10 steps) at the paper's
   width 15,000, with the backend it ran on (CuPy on a GPU if present);
4. bench/image_path.py: the image path before (`PAL_IMAGE_PATH=legacy`) and
   after on the same photo batches at ViLT-B/32's sizes: tune and extract
   samples/s, their share of the bf16 peak, host syncs per step, bytes per
   extract batch, and the cosine of the features;
5. bench/rehearsal.py's run of PAL on a Food101-shaped tree of photo-sized
   JPEGs and a ViLT-B/32-sized random ViLT (the stage commands directly when
   dvc is absent), once per image path in `--paths` (default: legacy, then
   new), each with its data wait and projections, and `pal-paper plan all`'s
   tunings and extractions for Food101 priced at each path's projected
   minutes.

After each part it rewrites `report.md` and `report.json` under --out (the
logs of each part beside them), so a run cut short still leaves a report.

    PYTHONPATH=. python3 bench/gpu_check.py --out "$OUT"              # GPU, ~10 min
    PYTHONPATH=. python3 bench/gpu_check.py --parts paths,rehearsal --out "$OUT"
    .venv/bin/python bench/gpu_check.py --scale smallest --out /tmp/gc  # CPU, ~1 min
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import gpu_paths  # noqa: E402

# import name -> distribution name: what every part needs (pytest for part 2)
NEEDED = {
    "torch": "torch",
    "transformers": "transformers",
    "tokenizers": "tokenizers",
    "safetensors": "safetensors",
    "numpy": "numpy",
    "scipy": "scipy",
    "h5py": "h5py",
    "click": "click",
    "yaml": "pyyaml",
    "tqdm": "tqdm",
    "PIL": "pillow",
    "matplotlib": "matplotlib",
    "pytest": "pytest",
}
# the oldest versions the project's code is known to run on (bench/README.md)
OLDEST = {"torch": "2.11.0", "transformers": "5.17.0"}

SCALES = {  # rehearsal, then the solver's synthetic features
    "full": {
        "rehearsal": dict(
            config="vilt-b32", classes=101, train=12, test=4, width=15000
        ),
        "solver": dict(rows=61127, classes=100, steps=10, dim=768, width=15000),
    },
    "smallest": {
        "rehearsal": dict(config="tiny", classes=11, train=3, test=2, width=512),
        "solver": dict(rows=2000, classes=100, steps=10, dim=768, width=1024),
    },
}


def missing_packages(needed: dict[str, str] = NEEDED) -> list[str]:
    """Distribution names of the modules in `needed` that do not import."""
    missing = []
    for module, dist in needed.items():
        try:
            importlib.import_module(module)
        except Exception:  # ImportError, or a broken install
            missing.append(dist)
    return missing


def missing_line(missing: list[str]) -> str:
    names = " ".join(missing)
    return (
        f"gpu_check: missing {', '.join(missing)}; on a machine with a registry run "
        f'`make wheels PACKAGES="{names}"`, send wheels/ with the tree (carry it) '
        f"and first run `python3 -m pip install --no-index --find-links wheels {names}`"
    )


def _older(version: str, oldest: str) -> bool:
    def parts(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])

    return parts(version) < parts(oldest)


def versions() -> dict[str, Any]:
    """The software and the card this check ran on."""
    import numpy
    import torch
    import transformers

    from solver.api import cupy_or_reason

    cp, why = cupy_or_reason()
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "numpy": numpy.__version__,
        "cupy": cp.__version__ if cp is not None else f"none ({why})",
        "card": None,
        "gpu_memory_gib": None,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info["card"] = props.name
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


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


def render(report: dict[str, Any]) -> str:
    """report.json's content as Markdown."""
    v = report["versions"]
    card = v["card"] or "no GPU (CPU only)"
    lines = [
        f"# GPU check on {card}",
        "",
        f"Scale `{report['scale']}`, device `{report['device']}`. Python "
        f"{v['python']}, torch {v['torch']} (CUDA {v['cuda']}), transformers "
        f"{v['transformers']}, numpy {v['numpy']}, CuPy {v['cupy']}"
        + (f"; {v['gpu_memory_gib']} GiB of GPU memory." if v["card"] else "."),
    ]
    if "tests" in report:
        t = report["tests"]
        done = f"{t['summary']} (exit {t['exit']}, {t['wall_s']:.0f} s)."
        lines += ["", "## `pytest -m gpu tests`", "", done]
    if "solver" in report:
        s = report["solver"]
        solve_s = f"{s['solve_s']:.1f} s" if s["solve_s"] is not None else "–"
        lines += [
            "",
            f"## Solver: {s['rows']} rows of D = {s['dim']}, width {s['width']}, "
            f"{s['classes']} classes in {s['steps']} steps",
            "",
            f"Ran on {s['backend']}. `python -m solver solve` took "
            f"{s['wall_s']:.1f} s as a process, {solve_s} of it fitting "
            f"(exit {s['exit']}; synthetic features made in "
            f"{s['features_made_s']:.0f} s).",
        ]
    lines += gpu_paths.markdown(report)
    for key, title, log in (
        ("rehearsal_legacy", " (legacy image path)", "rehearsal-legacy.log"),
        ("rehearsal", "", "rehearsal.log"),
    ):
        if key not in report:
            continue
        r = report[key]
        lines += ["", f"## Rehearsal: one run of PAL on a Food101-shaped tree{title}"]
        lines.append("")
        if r["exit"]:
            lines.append(f"Failed: {r['error']} (see {log}).")
        else:
            sys.path.insert(0, str(ROOT / "bench"))
            import rehearsal

            st = r["setup"]
            lines.append(
                f"{st['config']} backbone, {st['classes']} classes, {st['photos']} "
                f"photos, width {st['width']}, {st['loader_workers']} loader "
                f"workers, {st['runner']} runner, CUDA graphs "
                f"{'on' if st['cuda_graphs'] else 'off'}; {r['wall_s']:.0f} s in all, "
                f"accuracy {r['accuracy']} % (random weights)."
            )
            lines += ["", *rehearsal.markdown(r)]
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict[str, Any]) -> None:
    for name, text in (
        ("report.json", json.dumps(report, indent=2) + "\n"),
        ("report.md", render(report)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--out", type=Path, default=Path(os.environ.get("OUT", "gpu_check"))
    )
    ap.add_argument("--scale", choices=tuple(SCALES), default="full")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument(
        "--epochs", type=int, default=1, help="tune.epochs of the rehearsal"
    )
    ap.add_argument(
        "--parts", default="tests,solver,paths,rehearsal",
        help="comma-separated subset of tests, solver, paths, rehearsal",
    )  # fmt: skip
    ap.add_argument(
        "--paths", default="legacy,new",
        help="image paths to rehearse, in order: legacy (PAL_IMAGE_PATH=legacy, "
        "the path before uint8 loading and sync-free padded batches), new",
    )  # fmt: skip
    ap.add_argument("--runner", choices=("auto", "dvc", "direct"), default="auto",
                    help="the rehearsal's: dvc repro, or the stage commands (auto: "
                    "dvc when it is on PATH)")  # fmt: skip
    ap.add_argument(
        "--train", type=int, help="the rehearsal's training photos per class "
        "(default: the scale's; more makes its steady rates steadier)",
    )  # fmt: skip
    ap.add_argument(
        "--eager", dest="cuda_graphs", action="store_false",
        help="the rehearsal tunes without CUDA graphs (tune.cuda_graphs: false)",
    )  # fmt: skip
    ap.add_argument("--workdir", type=Path, help="scratch folder (default: a temp one)")
    a = ap.parse_args(argv)
    parts = a.parts.split(",")
    unknown = set(parts) - {"tests", "solver", "paths", "rehearsal"}
    if unknown:
        print(
            f"gpu_check: --parts: unknown part {sorted(unknown)[0]!r}", file=sys.stderr
        )
        return 2
    missing = missing_packages()
    if missing:
        print(missing_line(missing), file=sys.stderr)
        return 2
    info = versions()
    old = [f"{k} {info[k]} (known to work from {v})" for k, v in OLDEST.items()
           if _older(info[k], v)]  # fmt: skip
    if old:
        print(f"gpu_check: older than the project supports: {', '.join(old)}",
              file=sys.stderr)  # fmt: skip
        return 2
    a.out.mkdir(parents=True, exist_ok=True)
    work = a.workdir or Path(tempfile.mkdtemp(prefix="pal-gpu-check-"))
    scale = {k: dict(v) for k, v in SCALES[a.scale].items()}
    if a.train:
        scale["rehearsal"]["train"] = a.train
    report: dict[str, Any] = {"scale": a.scale, "device": a.device, "versions": info}
    print(
        f"gpu_check: {info['card'] or 'no GPU'}; torch {info['torch']}, "
        f"transformers {info['transformers']}, CuPy {info['cupy']}",
        flush=True,
    )
    write_report(a.out, report)
    if "tests" in parts:
        report["tests"] = gpu_tests(a.out, timeout=300)
        print(f"gpu_check: tests: {report['tests']['summary']}", flush=True)
        write_report(a.out, report)
    if "solver" in parts:
        report["solver"] = solver_check(
            a.out, work / "solver", a.device, timeout=300, **scale["solver"]
        )
        s = report["solver"]
        print(f"gpu_check: solver: {s['backend']}, {s['wall_s']} s", flush=True)
        write_report(a.out, report)
    if "paths" in parts:
        report["paths"] = gpu_paths.paths_check(work / "paths", a.device, a.scale)
        print(f"gpu_check: paths: exit {report['paths']['exit']}", flush=True)
        write_report(a.out, report)
    if "rehearsal" in parts:
        for path in a.paths.split(","):
            key = "rehearsal" if path == "new" else f"rehearsal_{path}"
            log = "rehearsal.log" if path == "new" else f"rehearsal-{path}.log"
            report[key] = gpu_paths.with_path(
                path, rehearsal_check, a.out, work / f"rehearsal-{path}", a.device,
                a.epochs, a.runner, a.cuda_graphs, log_name=log, **scale["rehearsal"],
            )  # fmt: skip
            r = report[key]
            print(f"gpu_check: rehearsal ({path} image path): exit {r['exit']}, "
                  f"{r['wall_s']} s", flush=True)  # fmt: skip
            write_report(a.out, report)
        report["plan"] = gpu_paths.priced(report, gpu_paths.plan_counts())
        write_report(a.out, report)
    print(render(report))
    failed = [p for p in ("tests", "solver", "paths", "rehearsal", "rehearsal_legacy")
              if p in report and report[p]["exit"] not in (0, 5)]  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
