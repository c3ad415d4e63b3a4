"""The scenes of tests/test_faults.py: each function injects one fault into a
scratch folder (a copy of a stage's inputs, or its unfinished work) and
returns the `Case`: the command a user runs next and what must hold after it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import h5py
import pytest
import torch
from click.testing import CliRunner

from pipeline import params as pparams
from pipeline.cli import main as pal
from pipeline.stages.extract import extract
from solver.cli import main as pal_solver

D = 12  # synthetic feature width
SOLVE = """\
solve: {eta: 1.0, width: 48, seed: 0, method: gram, device: cpu, batch_rows: 50}
evaluate: {device: cpu, batch_rows: 50}
"""
CHAINS = (
    SOLVE
    + """\
data: {tasks: 3}
protocol: {runs: [0, 1], vary: [upsampling]}
ablation: {pal: {label: PAL, changes: {}}}
pipelines: {main: [pal]}
"""
)
BOMB = """\
a: &a [0, 0, 0, 0, 0, 0, 0, 0, 0, 0]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]
solve: {width: *h}
"""  # 10^8 zeros once expanded


@dataclass
class Scene:
    """A scratch folder and the references a fault is compared with."""

    root: Path
    tuned: tuple[Path, Path, Path]  # params, prepare, tune folder (clean run)
    extracted: Path  # a clean extract of `tuned`
    features: Path  # synthetic features, 3 steps
    solved: Path  # a clean solve of `features` (folder with weights.h5)


@dataclass
class Case:
    """The command a user runs after the fault, and what to check."""

    tool: Callable
    args: list
    survive: list[Path] = field(default_factory=list)  # files kept byte for byte
    absent: list[Path] = field(default_factory=list)  # nothing written there
    recovered: tuple[Path, Path] | None = None  # (output, clean reference)


# ------------------------------------------------------------ building blocks


def flip_byte(path: Path, offset: int | None = None) -> None:
    """Change one byte (the middle one by default); the size stays."""
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def dead_pid() -> int:
    """The id of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def interrupted_extract(scene: Scene, out: Path) -> None:
    """`pal extract` stopped when it reaches step 3 (steps 1-2 finished)."""
    import pipeline.stages.extract as module

    params, prepare, tune_dir = scene.tuned
    real = module._extract_step

    def stop(model, step, *args, **kwargs):
        if step == 3:
            raise KeyboardInterrupt
        return real(model, step, *args, **kwargs)

    with mock.patch.object(module, "_extract_step", stop):
        with pytest.raises(KeyboardInterrupt):
            extract(prepare, tune_dir, out, pparams.load(params, "extract"))


def interrupted_tune(scene: Scene, out: Path) -> None:
    """`pal tune` stopped when it reaches task 3 (steps 1-2 finished)."""
    import pipeline.stages.tune as module

    params, prepare, _ = scene.tuned
    real = module.train_task

    def stop(model, task, *args, **kwargs):
        if task == 3:
            raise KeyboardInterrupt
        return real(model, task, *args, **kwargs)

    load = pparams.load
    with mock.patch.object(module, "train_task", stop):
        with pytest.raises(KeyboardInterrupt):
            sections = [load(params, s) for s in ("model", "prompt", "tune")]
            module.tune(prepare, out, *sections, timings=scene.root / "t.jsonl")


def extract_args(scene: Scene, out: Path, prepare: Path | None = None) -> list:
    params, clean_prepare, tune_dir = scene.tuned
    return ["extract", "--params", params, "--prepare", prepare or clean_prepare,
            "--tune", tune_dir, "--out", out]  # fmt: skip


def edited_prepare(scene: Scene, line: int, edit: Callable[[bytes], bytes]) -> Path:
    """A copy of the prepare folder with line `line` of samples.jsonl edited."""
    folder = scene.root / "prepare"
    shutil.copytree(scene.tuned[1], folder)
    path = folder / "samples.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    lines[line - 1] = edit(lines[line - 1])
    path.write_bytes(b"".join(lines))
    return folder


def chains(scene: Scene) -> Path:
    """Features of chains pal/0 and pal/1 (3 steps each) and params for them."""
    for run in ("0", "1"):
        shutil.copytree(scene.features, scene.root / "extract" / "pal" / run)
    (scene.root / "params.yaml").write_text(CHAINS)
    return scene.root / "params.yaml"


# ------------------------------------------------------------ the faults


def partial_shard(damage: Callable[[Path], None]) -> Callable[[Scene], Case]:
    def inject(scene: Scene) -> Case:
        out = scene.root / "extract"
        interrupted_extract(scene, out)
        damage(scene.root / "extract.partial")
        tune = sorted(scene.tuned[2].glob("*.pt"))
        return Case(pal, extract_args(scene, out), survive=tune,
                    recovered=(out, scene.extracted))  # fmt: skip

    return inject


def tune_partial_corrupted(scene: Scene) -> Case:
    out = scene.root / "tune"
    interrupted_tune(scene, out)
    flip_byte(scene.root / "tune.partial" / "step_01.pt")
    params, prepare, clean = scene.tuned
    args = ["tune", "--params", params, "--prepare", prepare, "--out", out,
            "--timings", scene.root / "t.jsonl"]  # fmt: skip
    return Case(pal, args, recovered=(out, clean))


def unsafe_pickle(scene: Scene) -> Case:
    params, prepare, clean = scene.tuned
    tune_dir = scene.root / "tune"
    shutil.copytree(clean, tune_dir)
    torch.save({"hash": print}, tune_dir / "step_02.pt")  # a global: code to run
    out = scene.root / "extract"
    shutil.copytree(scene.extracted, out)
    args = ["extract", "--params", params, "--prepare", prepare, "--tune", tune_dir,
            "--out", out]  # fmt: skip
    return Case(pal, args, survive=sorted(out.rglob("*.h5")),
                absent=[scene.root / "extract.partial"])  # fmt: skip


def samples_line(edit: Callable[[bytes], bytes], command: str = "extract"):
    def inject(scene: Scene) -> Case:
        prepare = edited_prepare(scene, 2, edit)
        out = scene.root / command
        args = extract_args(scene, out, prepare)
        if command == "tune":
            args = ["tune", "--params", scene.tuned[0], "--prepare", prepare,
                    "--out", out, "--timings", scene.root / "t.jsonl"]  # fmt: skip
        return Case(pal, args, absent=[out, scene.root / f"{command}.partial"])

    return inject


def other_class_name(line: bytes) -> bytes:
    row = json.loads(line)
    return (json.dumps({**row, "class_name": "green dog"}) + "\n").encode()


def captions_surrogate(scene: Scene) -> Case:
    root = scene.root / "dataset"
    root.mkdir()
    samples = [
        {"id": f"s{i}", "split": "train", "class_name": f"c{i % 2}",
         "image": None, "text": "a caption"}
        for i in range(4)
    ]  # fmt: skip
    doc = {"format": "pal-demo", "version": 1, "samples": samples,
           "classes": [{"name": "c0"}, {"name": "c1"}]}  # fmt: skip
    text = json.dumps(doc).replace('"a caption"', '"a caption \\udcff"', 2)
    (root / "captions.json").write_text(text)  # JSON's escape: a lone surrogate
    (scene.root / "params.yaml").write_text(f"data: {{root: {root}, tasks: 1}}\n")
    args = ["prepare", "--params", scene.root / "params.yaml",
            "--out", scene.root / "prepare"]  # fmt: skip
    return Case(pal, args, absent=[scene.root / "prepare"])


def solve_args(scene: Scene, params: Path, out: Path, *more) -> list:
    return ["solve", "--features", scene.features, "--params", params,
            "--out", out, *more]  # fmt: skip


def solved_copy(scene: Scene, params_text: str = SOLVE) -> tuple[Path, Path]:
    out = scene.root / "solve"
    shutil.copytree(scene.solved, out)
    (scene.root / "params.yaml").write_text(params_text)
    return scene.root / "params.yaml", out


def state_corrupted(scene: Scene) -> Case:
    params, out = solved_copy(scene)
    first = scene.root / "first"
    shutil.copytree(scene.features, first)
    shutil.rmtree(first / "step_03")
    state = scene.root / "state.h5"
    args = ["solve", "--features", first, "--params", params,
            "--out", scene.root / "w12", "--save-state", state]  # fmt: skip
    assert CliRunner().invoke(pal_solver, [str(a) for a in args]).exit_code == 0
    with h5py.File(state, "r") as f:
        offset = f["G"].id.get_offset()  # a byte of G's data, not of HDF5's
    flip_byte(state, offset + 8)
    return Case(pal_solver, solve_args(scene, params, out, "--state", state),
                survive=[out / "weights.h5", state])  # fmt: skip


def shard_truncated(scene: Scene) -> Case:
    params, out = solved_copy(scene)
    features = scene.root / "features"
    shutil.copytree(scene.features, features)
    path = features / "step_02" / "train.h5"
    path.write_bytes(path.read_bytes()[:3000])
    args = ["solve", "--features", features, "--params", params, "--out", out]
    return Case(pal_solver, args, survive=[out / "weights.h5"])


def missing_step(scene: Scene) -> Case:
    params = chains(scene)
    shutil.rmtree(scene.root / "extract" / "pal" / "1" / "step_03")
    args = [
        "solve",
        "--pipeline",
        "main",
        "--params",
        params,
        "--features",
        scene.root / "extract",
        "--out",
        scene.root / "solve",
    ]
    return Case(pal_solver, args, absent=[scene.root / "solve"])  # fmt: skip


def other_width(scene: Scene) -> Case:
    params = chains(scene)
    for run in ("0", "1"):
        shutil.copytree(scene.solved, scene.root / "solve" / "pal" / run)
    wide = scene.root / "solve" / "pal" / "1"
    shutil.rmtree(wide)
    (scene.root / "wide.yaml").write_text(SOLVE.replace("width: 48", "width: 64"))
    args = solve_args(scene, scene.root / "wide.yaml", wide)
    assert CliRunner().invoke(pal_solver, [str(a) for a in args]).exit_code == 0
    args = ["evaluate", "--pipeline", "main", "--params", params,
            "--features", scene.root / "extract", "--solve", scene.root / "solve",
            "--out", scene.root / "evaluate"]  # fmt: skip
    return Case(pal_solver, args, absent=[scene.root / "evaluate"])


def stale_temp(scene: Scene) -> Case:
    params, out = solved_copy(scene)
    (out / "weights.h5").unlink()
    (out / f".weights.h5.tmp.{dead_pid()}").write_bytes(b"half a file")
    return Case(pal_solver, solve_args(scene, params, out),
                recovered=(out, scene.solved))  # fmt: skip


def hostile_params(text: str, tool: Callable = pal_solver) -> Callable[[Scene], Case]:
    def inject(scene: Scene) -> Case:
        params, out = solved_copy(scene, text)
        if tool is pal:
            return Case(pal, ["check", "--params", params])
        return Case(pal_solver, solve_args(scene, params, out),
                    survive=[out / "weights.h5"])  # fmt: skip

    return inject


def truncate(name: str) -> Callable[[Path], None]:
    def damage(partial: Path) -> None:
        path = partial / name
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])

    return damage
