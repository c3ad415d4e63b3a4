"""Fault injection: the faults a long run meets, in one table (DESIGN §2, Faults).

Each row injects one fault into a scratch copy of a stage's inputs or of its
unfinished work (`<out>.partial/`), then runs the command a user runs next,
in process. It checks the one line that command prints about the fault, its
exit status, that the files named as surviving keep their bytes, that a
failed command writes nothing, and, for a fault a rerun recovers from, that
the recovered output has the bytes of an uninterrupted run.

Classes covered: truncation, corruption, wrong shape, missing step, killed
process, hostile params, hostile text, stale temporary files.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
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
from pipeline.extract import extract
from solver.cli import main as pal_solver
from solver.synthetic import make_features

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


@dataclass(frozen=True)
class Fault:
    name: str
    kind: str
    inject: Callable[[Scene], Case]
    line: str  # regex of the one line the command prints about the fault
    code: int  # exit status


# ------------------------------------------------------------ helpers


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
    import pipeline.extract as module

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
    import pipeline.tune as module

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


SEAL_DAMAGED = "does not match the sha256 written with it \\(damaged\\)"
RECOMPUTED = "; discarding the step and computing it again"
FAULTS = [
    Fault("extract .partial shard truncated (after a kill)", "truncation",
          partial_shard(truncate("step_01/train.h5")),
          rf"extract\.partial/step_01: train\.h5 {SEAL_DAMAGED}{RECOMPUTED}", 0),
    Fault("extract .partial shard, one byte changed", "corruption",
          partial_shard(lambda p: flip_byte(p / "step_02" / "test.h5")),
          rf"extract\.partial/step_02: test\.h5 {SEAL_DAMAGED}{RECOMPUTED}", 0),
    Fault("extract killed between a step's writes (no seal)", "killed process",
          partial_shard(lambda p: (p / "step_02" / "SHA256SUMS").unlink()),
          r"extract\.partial/step_02: train\.h5 without the seal of a finished "
          rf"step{RECOMPUTED}", 0),
    Fault("extract .partial step deleted", "missing step",
          partial_shard(lambda p: shutil.rmtree(p / "step_01")),
          r"reused steps 2 of an interrupted run", 0),
    Fault("tune .partial checkpoint, one byte changed", "corruption",
          tune_partial_corrupted,
          r"tune\.partial/step_01\.pt: .*; tuning again from step 1 on$", 0),
    Fault("tune checkpoint holding a pickled global", "hostile input",
          unsafe_pickle,
          r"^Error: .*/step_02\.pt: not a readable tune checkpoint \(WeightsUnpickler"
          r" error: Unsupported global: GLOBAL print was not an allowed global by "
          r"default\); rerun `pal tune`$", 1),
    Fault("samples.jsonl line not UTF-8", "hostile text",
          samples_line(lambda b: b.replace(b"photo", b"ph\xffto")),
          r"^Error: .*/samples\.jsonl:2: not UTF-8 text \(byte \d+ of the line\)$", 1),
    Fault("samples.jsonl text with a lone surrogate", "hostile text",
          samples_line(lambda b: b.replace(b"photo", b"ph\\udcffto"), "tune"),
          r"^Error: .*/samples\.jsonl:2: text holds \\udcff at character 5, not "
          r"valid Unicode$", 1),
    Fault("samples.jsonl class_name not class_order[label]", "corruption",
          samples_line(other_class_name),
          r"^Error: .*/samples\.jsonl:2: class_name 'green dog' is not "
          r"class_order\[0\] 'red cat' \(tasks\.json\)$", 1),
    Fault("captions.json caption with a lone surrogate", "hostile text",
          captions_surrogate,
          r"^Error: .*/captions\.json: sample 1 \('s0'\): text holds \\udcff at "
          r"character 11, not valid Unicode$", 1),
    Fault("solver state, one byte of G changed", "corruption", state_corrupted,
          r"^Error: .*/state\.h5: solver state does not match the sha256 written "
          r"with it \(damaged\); solve without --state to start from step 1$", 1),
    Fault("shard truncated", "truncation", shard_truncated,
          r"^Error: .*/step_02/train\.h5: truncated or not an HDF5 file", 1),
    Fault("a chain's last step folder deleted", "missing step", missing_step,
          r"^Error: .*/extract/pal/1: chain pal/1 has 2 steps, but data\.tasks is 3 "
          r"\(a step is missing: rerun its `pal extract`, or `dvc repro`\)$", 1),
    Fault("a chain's weights solved at another width", "wrong shape", other_width,
          r"^Error: .*/solve/pal/1/weights\.h5: weights of width 64, but "
          r"solve\.width is 48 \(rerun `pal-solver solve`\)$", 1),
    Fault("temporary weights file of a killed solve", "stale temp file",
          stale_temp,
          r"removed .*/solve/\.weights\.h5\.tmp\.\d+, left by a writer that was "
          r"killed$", 0),
    Fault("YAML anchor bomb in params (solve)", "hostile params",
          hostile_params(BOMB),
          r"^Error: .*/params\.yaml: line 2: YAML aliases \(\*name\) are not "
          r"allowed in params; write the value out$", 1),
    Fault("YAML anchor bomb in params (check)", "hostile params",
          hostile_params(BOMB, pal),
          r"params\.yaml: line 2: YAML aliases \(\*name\) are not allowed in "
          r"params; write the value out$", 1),
    Fault("a 10000-item list for an integer", "hostile params",
          hostile_params(SOLVE.replace("width: 48", f"width: {[0] * 10_000}")),
          r"^Error: .*/params\.yaml: solve\.width must be an integer, got "
          r"\[0, 0, 0, 0, 0, 0, \.\.\.\]$", 1),
]  # fmt: skip


# ------------------------------------------------------------ the test


@pytest.fixture(scope="module")
def references(tuned, tmp_path_factory):
    """The clean outputs the faults are compared with, made once."""
    params, prepare, tune_dir = tuned
    root = tmp_path_factory.mktemp("references")
    extract(prepare, tune_dir, root / "extract", pparams.load(params, "extract"))
    features = make_features(
        root / "features", [80, 60, 70], [2, 2, 2], feature_dim=D, test_rows=15, seed=4
    )
    (root / "params.yaml").write_text(SOLVE)
    args = ["solve", "--features", features, "--params", root / "params.yaml",
            "--out", root / "solve"]  # fmt: skip
    assert CliRunner().invoke(pal_solver, [str(a) for a in args]).exit_code == 0
    return tuned, root / "extract", features, root / "solve"


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault(fault: Fault, references, tmp_path):
    tuned, extracted, features, solved = references
    scene = Scene(tmp_path, tuned, extracted, features, solved)
    case = fault.inject(scene)
    kept = {p: p.read_bytes() for p in case.survive}
    result = CliRunner().invoke(case.tool, [str(a) for a in case.args])
    lines = result.output.splitlines()
    assert result.exit_code == fault.code, result.output
    assert "Traceback" not in result.output
    if fault.code:
        assert isinstance(result.exception, SystemExit | None)
        errors = [line for line in lines if line.startswith("Error")]
        if case.tool is pal and case.args[0] == "check":
            errors = [line for line in lines if "params.yaml" in line]
        assert len(errors) == 1, result.output
        assert re.search(fault.line, errors[0]), errors[0]
    else:
        assert len([line for line in lines if re.search(fault.line, line)]) == 1, (
            result.output
        )
    for path, data in kept.items():
        assert path.read_bytes() == data, path
    for path in case.absent:
        assert not path.exists(), path
    if case.recovered is not None:
        out, clean = case.recovered
        assert _digests(out) == _digests(clean)
        assert not out.with_name(out.name + ".partial").exists()


def test_the_table_covers_every_class():
    kinds = {f.kind for f in FAULTS}
    assert kinds >= {"truncation", "corruption", "wrong shape", "missing step",
                     "killed process", "hostile params", "hostile text",
                     "stale temp file"}  # fmt: skip


def test_dvc_ignores_the_temporary_names():
    """A temporary file left by a killed writer is never part of an output:
    the committed .dvcignore matches the name `palcore.outputs` gives it."""
    import pathspec

    from palcore.outputs import temp_path

    root = Path(__file__).resolve().parents[1]
    text = (
        subprocess.run(
            ["git", "show", "HEAD:.dvcignore"], cwd=root, capture_output=True, text=True
        ).stdout
        or (root / ".dvcignore").read_text()
    )
    spec = pathspec.PathSpec.from_lines("gitignore", text.splitlines())
    tmp = temp_path(Path("data/solve/pal/0/weights.h5"))
    assert tmp.name == f".weights.h5.tmp.{os.getpid()}"
    assert spec.match_file(tmp.as_posix())
    assert not spec.match_file("data/solve/pal/0/weights.h5")
