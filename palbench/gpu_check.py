"""The GPU path proven in one call: the GPU tests, the solver at the paper's
width, and a Food101-shaped rehearsal of one run of PAL, in one report.

Runs as `python -m palbench.gpu_check` with the project on PYTHONPATH (or
installed) and nothing beyond the runtime packages:
no dvc, no dev extras, no tests/ helpers. In order:

1. pre-flight: imports what it needs and, if anything is missing, says in one
   line which packages and how to bring them (`make wheels`), then stops;
2. `pytest -m gpu tests` (without a GPU they skip: tests/conftest.py);
3. `python -m solver solve` on synthetic features of Food101's training row
   count (61,127 rows of D = 768, 100 classes in 10 steps) at the paper's
   width 15,000, with the backend it ran on (CuPy on a GPU if present);
4. palbench/image_path.py on the same photo batches at ViLT-B/32's sizes:
   tune and extract samples/s, their share of the bf16 peak, host syncs per
   step, bytes per extract batch; with `--baseline`, once on that older tree
   (before) and once on this one (after), and the cosine of their features;
5. palbench/rehearsal.py's run of PAL on a Food101-shaped tree of photo-sized
   JPEGs and a ViLT-B/32-sized random ViLT (the stage commands directly when
   dvc is absent), on the `--baseline` tree first if given, then on this one,
   each with its data wait and projections, and `pal-paper plan all`'s
   tunings and extractions for Food101 priced at each tree's projected
   minutes.
6. (`--parts contracts`) the output contracts' fixture (DESIGN §2,
   `pipeline/stages/contract_runs.py`) on the card: the same code twice,
   then each job against the reference the CPU recorded (`reference/`),
   with the key that moved most in each file that differs: whether bf16
   and CUDA graphs repeat themselves, and what tolerance holds against the
   CPU's outputs.

Before and after are two trees of the project, never a switch in its code:
`--baseline` names a folder holding an older tree (`git archive COMMIT
palcore pipeline solver params.yaml contracts.yaml | tar -x -C DIR`, made
where git is and carried to the card) or a commit, archived here. The benches
call the names of this tree, so a baseline is a commit from the one that
moved the method interface to pipeline/model/method.py on.

After each part it rewrites `report.md` and `report.json` under --out (the
logs of each part beside them), so a run cut short still leaves a report.

    PYTHONPATH=. python3 -m palbench.gpu_check --out "$OUT"              # GPU, ~10 min
    PYTHONPATH=. python3 -m palbench.gpu_check --parts paths,rehearsal \
        --baseline /tmp/older --out "$OUT"
    .venv/bin/python -m palbench.gpu_check --scale smallest --out /tmp/gc  # CPU, ~1 min
"""

from __future__ import annotations

import argparse
import importlib
import os
import platform
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

from palbench import gpu_pace, gpu_paths
from palbench.gpu_parts import (
    cells_check,
    contracts_check,
    gpu_tests,
    rehearsal_check,
    solver_check,
)
from palbench.gpu_report import render, write_report

ROOT = Path(__file__).resolve().parents[1]

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


PARTS = ("tests", "solver", "paths", "rehearsal", "cells", "contracts", "pace")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
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
        "--parts",
        default="tests,solver,paths,rehearsal",
        help="comma-separated subset of tests, solver, paths, rehearsal, cells "
        "(N tunes side by side on one card, after this tree's rehearsal), "
        "contracts (the output contracts' fixture on the card, twice, and "
        "against reference/), pace (each method's steady step before and "
        "after, J tunings side by side; writes card.yaml for pal-paper plan)",
    )
    ap.add_argument(
        "--baseline",
        help="the before of paths and rehearsal: a folder holding an "
        "older tree of the project (git archive COMMIT palcore pipeline solver "
        "params.yaml contracts.yaml), or a commit to archive",
    )
    ap.add_argument(
        "--units",
        help="contracts: only the jobs of these units (e.g. tune.pal,extract.pal); "
        "default: every job",
    )
    ap.add_argument(
        "--jobs",
        default="1,2,4",
        help="cells and pace: the numbers of tunes run side by side, in order",
    )
    ap.add_argument(
        "--runner",
        choices=("auto", "dvc", "direct"),
        default="auto",
        help="the rehearsal's: dvc repro, or the stage commands (auto: dvc when "
        "it is on PATH; the baseline's always direct)",
    )
    ap.add_argument(
        "--train",
        type=int,
        help="the rehearsal's training photos per class (default: the scale's; "
        "more makes its steady rates steadier)",
    )
    ap.add_argument(
        "--eager",
        dest="cuda_graphs",
        action="store_false",
        help="the rehearsal tunes without CUDA graphs (tune.cuda_graphs: false)",
    )
    ap.add_argument(
        "--like",
        default="h200",
        help="pace: the palpaper/costs.yaml card whose unmeasured figures "
        "(first-batch wait, extract start-up) card.yaml takes",
    )
    ap.add_argument(
        "--commit",
        help="pace: the commit of this tree, for card.yaml (default: git's HEAD)",
    )
    ap.add_argument("--workdir", type=Path, help="scratch folder (default: a temp one)")
    return ap.parse_args(argv)


def preflight(parts: list[str]) -> dict[str, Any] | None:
    """The versions this check runs on, or None after one line on stderr:
    an unknown part, a missing package or one older than the project runs on."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        print(
            f"gpu_check: --parts: unknown part {sorted(unknown)[0]!r}", file=sys.stderr
        )
        return None
    missing = missing_packages()
    if missing:
        print(missing_line(missing), file=sys.stderr)
        return None
    info = versions()
    old = [
        f"{k} {info[k]} (known to work from {v})"
        for k, v in OLDEST.items()
        if _older(info[k], v)
    ]
    if old:
        joined = ", ".join(old)
        print(f"gpu_check: older than the project supports: {joined}", file=sys.stderr)
        return None
    return info


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    parts = a.parts.split(",")
    info = preflight(parts)
    if info is None:
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
    baseline = gpu_paths.baseline_tree(a.baseline, work)
    if baseline is not None:
        report["baseline"] = str(baseline)
    run_parts(a, parts, report, work, scale, baseline)
    print(render(report))
    keys = ("tests", "solver", "paths", "rehearsal", "rehearsal_before", "cells")
    failed = [
        p
        for p in (*keys, "contracts", "pace")
        if p in report and report[p]["exit"] not in (0, 5)
    ]
    return 1 if failed else 0


def run_parts(
    a: argparse.Namespace,
    parts: list[str],
    report: dict[str, Any],
    work: Path,
    scale: dict[str, dict[str, Any]],
    baseline: Path | None,
) -> None:
    """Each part asked for, in order, into `report`; the report rewritten after each."""
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
        report["paths"] = gpu_paths.paths_check(
            work / "paths", a.device, a.scale, baseline
        )
        print(f"gpu_check: paths: exit {report['paths']['exit']}", flush=True)
        write_report(a.out, report)
    if "rehearsal" in parts:
        for name, tree in gpu_paths.trees(baseline):
            key = gpu_paths.REHEARSALS[name]
            log = "rehearsal.log" if name == "after" else f"rehearsal-{name}.log"
            runner = a.runner if name == "after" else "direct"
            report[key] = rehearsal_check(
                a.out,
                work / f"rehearsal-{name}",
                a.device,
                a.epochs,
                runner,
                a.cuda_graphs,
                tree=tree,
                log_name=log,
                **scale["rehearsal"],
            )
            r = report[key]
            print(
                f"gpu_check: rehearsal ({name}: {tree}): exit {r['exit']}, "
                f"{r['wall_s']} s",
                flush=True,
            )
            write_report(a.out, report)
        report["plan"] = gpu_paths.priced(report, gpu_paths.plan_counts())
        write_report(a.out, report)
    if "cells" in parts:
        jobs = tuple(int(j) for j in a.jobs.split(","))
        report["cells"] = cells_check(a.out, work / "rehearsal-after", jobs, 600)
        r = report["cells"]
        rates = ", ".join(
            f"-j {n}: {j['samples_per_s']} samples/s" for n, j in r["jobs"].items()
        )
        print(f"gpu_check: cells: exit {r['exit']}, {rates}", flush=True)
        write_report(a.out, report)
    if "contracts" in parts:
        device = a.device
        if device == "auto":
            device = "cuda" if info_has_gpu() else "cpu"
        units = a.units.split(",") if a.units else None
        report["contracts"] = contracts_check(a.out, work / "contracts", device, units)
        r = report["contracts"]
        print(f"gpu_check: contracts: exit {r['exit']}, {r['wall_s']} s", flush=True)
        write_report(a.out, report)
    if "pace" in parts:
        report["pace"] = pace_part(a, work, baseline)
        print(f"gpu_check: pace: exit {report['pace']['exit']}", flush=True)
        write_report(a.out, report)


def pace_part(a: argparse.Namespace, work: Path, baseline: Path | None) -> dict:
    """palbench/gpu_pace.py's part, its card.yaml copied to --out."""
    import shutil

    import yaml

    costs = yaml.safe_load((ROOT / "palpaper" / "costs.yaml").read_text())
    cards = costs.get("cards") or {}
    commit = a.commit or gpu_pace.head_commit()
    jobs = tuple(int(j) for j in a.jobs.split(","))
    r = gpu_pace.pace_check(
        work / "pace", a.device, a.scale, baseline, cards.get(a.like, {}), commit, jobs
    )
    if "card_file" in r:
        shutil.copy(r["card_file"], a.out / "card.yaml")
    return r


def info_has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


if __name__ == "__main__":
    sys.exit(main())
