"""The paper's run rehearsed: a UPMC-Food101-shaped tree, a ViLT in the hub's
layout, the food101 preset, one run of PAL (prepare, tune, extract, solve,
evaluate), per-stage figures.

In a scratch folder it builds

- `data/raw/food101/`: the titles-CSV layout (images/{train,test}/<class>/,
  texts/{train,test}_titles.csv) with `--classes` classes (101 as the real one;
  the last has one training photo fewer and is dropped) of photo-sized JPEGs
  and titles of the real length (pipeline/fakes/trees.py);
- `models/vilt-b32-mlm/`: random weights in the hub layout (`pytorch_model.bin`
  with the MLM head, old preprocessor config, tokenizer files), of ViLT-B/32's
  sizes (`--config vilt-b32`) or a tiny one (`--config tiny`: 8 layers of width
  128, 32-px images, for CPU);

installs configs/food101.yaml as params.yaml with only the scale knobs changed
(dataset size, backbone path, `tune.epochs`, `solve.width`, the device and the
loader workers this machine has), then runs the stages of one run of PAL:
with `--runner dvc`, `dvc repro evaluate@pal-0` in a scratch copy of the
project; with `--runner direct`, the stage commands of dvc.yaml one after the
other (`python -m pipeline …`, `python -m solver …`), which needs neither dvc
nor an installed project. `auto` (the default) takes dvc when it is on PATH.
Every command's output is kept in the scratch folder's logs/rehearsal.log.

It prints per stage: wall time, the part of it that is start-up, the steady
samples/s, the share of graphed steps, the GPU memory peak and the time spent
waiting for data; then projects one run of PAL and the preset's protocol on
the full Food101 and N24News from the start-ups and the steady rates.

    .venv/bin/python -m palbench.rehearsal --config tiny --classes 21 --epochs 1 \\
        --width 1024                       # smallest scale, CPU, ~1 minute
    python3 -m palbench.rehearsal --config vilt-b32 --classes 101 --train 12 --test 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the project importable without installing it

from palbench.rehearsal_figures import analyse, markdown  # noqa: E402
from pipeline.fakes.trees import make_food101_tree, make_hub_vilt  # noqa: E402

BACKBONE = "models/vilt-b32-mlm"


def stage_commands(python: str) -> list[tuple[str, list[str]]]:
    """One run of PAL, as dvc.yaml's stages prepare@0 … evaluate@pal-0 run it,
    with the stages a dataset runs once (the pixel cache and the frozen
    queries), which tune and extract then read."""
    pal, solver = [python, "-m", "pipeline"], [python, "-m", "solver"]
    chain = ["--variant", "pal"]
    read = ["--pixels", "data/pixels", "--frozen", "data/frozen"]
    return [
        ("prepare", [*pal, "prepare", "--run", "0", "--out", "data/prepare/0"]),
        ("pixels", [*pal, "pixels", "--out", "data/pixels"]),
        ("frozen", [*pal, "frozen", "--pixels", "data/pixels", "--out", "data/frozen"]),
        (
            "tune",
            [
                *pal,
                "tune",
                "--run",
                "0",
                *chain,
                "--prepare",
                "data/prepare/0",
                "--out",
                "data/tune/pal/0",
                *read,
            ],
        ),
        (
            "extract",
            [
                *pal,
                "extract",
                *chain,
                "--prepare",
                "data/prepare/0",
                "--tune",
                "data/tune/pal/0",
                "--out",
                "data/extract/pal/0",
                *read,
            ],
        ),
        (
            "solve",
            [
                *solver,
                "solve",
                "--run",
                "0",
                *chain,
                "--features",
                "data/extract/pal/0",
                "--out",
                "data/solve/pal/0",
            ],
        ),
        (
            "evaluate",
            [
                *solver,
                "evaluate",
                "--run",
                "0",
                *chain,
                "--features",
                "data/extract/pal/0",
                "--solve",
                "data/solve/pal/0",
                "--out",
                "data/evaluate/pal/0",
            ],
        ),
    ]


def rehearsal_params(
    config: str, epochs: int, width: int, device: str, workers: int, graphs: bool
) -> dict[str, Any]:
    """configs/food101.yaml with only the scale knobs changed, one run."""
    params = yaml.safe_load((ROOT / "configs" / "food101.yaml").read_text())
    params["data"]["root"] = "data/raw/food101"
    params["model"]["backbone"] = BACKBONE
    tune_workers = min(workers, params["tune"]["num_workers"])
    params["tune"].update(
        epochs=epochs, device=device, num_workers=tune_workers, cuda_graphs=graphs
    )
    params["extract"].update(device=device, num_workers=workers)
    params["solve"].update(width=width, device=device)
    params["protocol"] = {"runs": [0]}
    return params


def run_direct(work: Path, env: dict[str, str], log: list[str]) -> dict[str, float]:
    """Each stage command in turn; returns its wall seconds by stage."""
    wall = {}
    for name, cmd in stage_commands(sys.executable):
        log.append(f"$ {' '.join(cmd)}\n")
        start = time.perf_counter()
        proc = subprocess.run(
            cmd,
            cwd=work,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        wall[name] = time.perf_counter() - start
        log.append(proc.stdout)
        if proc.returncode != 0:
            raise StageFailed(name, proc.returncode)
    return wall


def run_dvc(work: Path, env: dict[str, str], log: list[str]) -> dict[str, float]:
    """`dvc repro evaluate@pal-0`; a stage's wall time runs from its
    "Running stage" line to the next one's."""
    starts: dict[str, float] = {}
    proc = subprocess.Popen(
        ["dvc", "repro", "evaluate@pal-0"],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        log.append(line)
        m = re.match(r"Running stage '(\w+)(?:@[^']*)?'", line)
        if m:
            starts[m.group(1)] = time.perf_counter()
    end = time.perf_counter()
    if proc.wait() != 0:
        raise StageFailed("dvc repro", proc.returncode)
    names = list(starts)
    return {
        s: (starts[names[i + 1]] if i + 1 < len(names) else end) - starts[s]
        for i, s in enumerate(names)
    }


class StageFailed(Exception):
    def __init__(self, stage: str, code: int) -> None:
        super().__init__(f"{stage} failed (exit {code})")


def scratch_folder(
    work: Path, params: dict[str, Any], runner: str, tree: Path = ROOT
) -> dict[str, str]:
    """Make `work` a project folder with `params`; returns the stages'
    environment. The dvc runner gets a committed copy of the project (dvc.yaml
    and all), the direct runner only params.yaml, and `tree` (the project's
    code the stages run) on PYTHONPATH."""
    if runner == "dvc":
        sys.path.insert(0, str(ROOT / "tests"))
        from scratch_project import make_scratch_project

        return make_scratch_project(work, params)
    work.mkdir(parents=True, exist_ok=True)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return dict(os.environ, PYTHONPATH=str(tree), HF_HUB_OFFLINE="1")


def run_logged(
    work: Path, env: dict[str, str], runner: str
) -> tuple[dict[str, float], str]:
    """(wall seconds per stage, the stages' output), the output also kept in
    logs/rehearsal.log; a failed stage raises SystemExit naming that file."""
    log: list[str] = []
    log_file = work / "logs" / "rehearsal.log"
    try:
        wall = (run_dvc if runner == "dvc" else run_direct)(work, env, log)
    except StageFailed as exc:
        log_file.parent.mkdir(exist_ok=True)
        log_file.write_text("".join(log))
        tail = "".join(log).splitlines()[-30:]
        raise SystemExit(
            f"rehearsal: {exc} (whole output in {log_file}):\n" + "\n".join(tail)
        ) from None
    log_file.parent.mkdir(exist_ok=True)
    log_file.write_text("".join(log))
    return wall, "".join(log)


def rehearse(
    work: Path,
    *,
    config: str = "tiny",
    classes: int = 21,
    train: int = 6,
    test: int = 2,
    epochs: int = 1,
    width: int = 15000,
    device: str = "auto",
    runner: str = "auto",
    cuda_graphs: bool = True,
    tree: Path = ROOT,
) -> dict[str, Any]:
    """Build the scratch folder in `work`, run one run of PAL with the code of
    `tree` (an older tree of the project: the direct runner only), return the
    figures (`analyse`) with the set-up. Raises SystemExit naming the log on
    a failed stage."""
    if runner == "auto":
        runner = "dvc" if shutil.which("dvc") and tree == ROOT else "direct"
    if runner == "dvc" and not shutil.which("dvc"):
        raise SystemExit("rehearsal: --runner dvc, but there is no dvc on PATH")
    if runner == "dvc" and tree != ROOT:
        raise SystemExit("rehearsal: another tree runs with --runner direct only")
    cores = os.cpu_count() or 1
    workers = max(0, min(15, cores - 1))
    params = rehearsal_params(config, epochs, width, device, workers, cuda_graphs)
    env = scratch_folder(work, params, runner, tree)
    start = time.perf_counter()
    photos = make_food101_tree(work / "data/raw/food101", classes, train, test, cores)
    make_hub_vilt(work / BACKBONE, layers=8, hidden=128, full_size=config == "vilt-b32")
    setup_s = time.perf_counter() - start
    print(
        f"# rehearsal in {work}: {classes} classes, {photos} photos, {config}, "
        f"epochs {epochs}, width {width}, device {device}, {workers} loader "
        f"workers, {runner} runner (data and model built in {setup_s:.0f} s)",
        flush=True,
    )
    wall, text = run_logged(work, env, runner)
    result = analyse(work, params, text, wall)
    result["setup"] = {
        "config": config,
        "classes": classes,
        "photos": photos,
        "width": width,
        "device": device,
        "loader_workers": workers,
        "runner": runner,
        "cuda_graphs": cuda_graphs,
        "tree": str(tree),
    }
    acc = json.loads((work / "data/evaluate/pal/0/metrics.json").read_text())
    result["accuracy"] = acc.get("acc")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", choices=("tiny", "vilt-b32"), default="tiny")
    ap.add_argument("--classes", type=int, default=21, help="one is dropped")
    ap.add_argument("--train", type=int, default=6, help="training photos per class")
    ap.add_argument("--test", type=int, default=2, help="test photos per class")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--width", type=int, default=15000, help="solve.width")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument("--runner", choices=("auto", "dvc", "direct"), default="auto")
    ap.add_argument(
        "--eager",
        dest="cuda_graphs",
        action="store_false",
        help="tune.cuda_graphs: false (the preset replays CUDA graphs)",
    )
    ap.add_argument("--workdir", type=Path)
    a = ap.parse_args()
    work = a.workdir or Path(tempfile.mkdtemp(prefix="pal-rehearsal-"))
    kw = {k: v for k, v in vars(a).items() if k != "workdir"}
    print("\n".join(markdown(rehearse(work, **kw))))


if __name__ == "__main__":
    main()
