"""Fault injection: the faults a long run meets, in one table (DESIGN §2, Faults).

Each row injects one fault into a scratch copy of a stage's inputs or of its
unfinished work (`<out>.partial/`; the scenes live in fault_scenes.py), then
runs the command a user runs next, in process. It checks the one line that
command prints about the fault, its exit status, that the files named as
surviving keep their bytes, that a failed command writes nothing, and, for a
fault a rerun recovers from, that the recovered output has the bytes of an
uninterrupted run.

Classes covered: truncation, corruption, wrong shape, missing step, killed
process, hostile params, hostile text, hostile paths, stale temporary files,
wrong provenance (a features folder mixing chains).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fault_runs
import pytest
from click.testing import CliRunner
from fault_scenes import (
    BOMB,
    SOLVE,
    Case,
    D,
    Scene,
    captions_surrogate,
    empty_task,
    files_listing,
    flip_byte,
    hostile_params,
    missing_step,
    mixed_chains,
    other_class_name,
    other_width,
    oversized_width,
    pal,
    pal_solver,
    partial_shard,
    predict_symlink_out,
    samples_line,
    sealed_copy_bit_rot,
    shard_bit_rot,
    shard_float16,
    shard_truncated,
    stale_temp,
    stamp_into_a_data_folder,
    state_corrupted,
    truncate,
    tune_partial_corrupted,
    unsafe_pickle,
)

from pipeline import params as pparams
from pipeline.stages.extract import extract
from solver.synthetic import make_features


@dataclass(frozen=True)
class Fault:
    name: str
    kind: str
    inject: Callable[[Scene], Case]
    line: str  # regex of the one line the command prints about the fault
    code: int  # exit status


SEAL_DAMAGED = "does not match the sha256 written with it \\(damaged\\)"
RECOMPUTED = "; discarding the step and computing it again"
FAULTS = [
    Fault(
        "extract .partial shard truncated (after a kill)",
        "truncation",
        partial_shard(truncate("step_01/train.h5")),
        rf"extract\.partial/step_01: train\.h5 {SEAL_DAMAGED}{RECOMPUTED}",
        0,
    ),
    Fault(
        "extract .partial shard, one byte changed",
        "corruption",
        partial_shard(lambda p: flip_byte(p / "step_02" / "test.h5")),
        rf"extract\.partial/step_02: test\.h5 {SEAL_DAMAGED}{RECOMPUTED}",
        0,
    ),
    Fault(
        "extract killed between a step's writes (no seal)",
        "killed process",
        partial_shard(lambda p: (p / "step_02" / "SHA256SUMS").unlink()),
        r"extract\.partial/step_02: train\.h5 without the seal of a finished "
        rf"step{RECOMPUTED}",
        0,
    ),
    Fault(
        "extract .partial step deleted",
        "missing step",
        partial_shard(lambda p: shutil.rmtree(p / "step_01")),
        r"reused steps 2 of an interrupted run",
        0,
    ),
    Fault(
        "tune .partial checkpoint, one byte changed",
        "corruption",
        tune_partial_corrupted,
        r"tune\.partial/step_01\.pt: .*; tuning again from step 1 on$",
        0,
    ),
    Fault(
        "tune checkpoint holding a pickled global",
        "hostile input",
        unsafe_pickle,
        r"^Error: .*/step_02\.pt: not a readable tune checkpoint \(WeightsUnpickler"
        r" error: Unsupported global: GLOBAL print was not an allowed global by "
        r"default\); rerun `pal tune`$",
        1,
    ),
    Fault(
        "samples.jsonl line not UTF-8",
        "hostile text",
        samples_line(lambda b: b.replace(b"photo", b"ph\xffto")),
        r"^Error: .*/samples\.jsonl:2: not UTF-8 text \(byte \d+ of the line\)$",
        1,
    ),
    Fault(
        "samples.jsonl text with a lone surrogate",
        "hostile text",
        samples_line(lambda b: b.replace(b"photo", b"ph\\udcffto"), "tune"),
        r"^Error: .*/samples\.jsonl:2: text holds \\udcff at character 5, not "
        r"valid Unicode$",
        1,
    ),
    Fault(
        "samples.jsonl class_name not class_order[label]",
        "corruption",
        samples_line(other_class_name),
        r"^Error: .*/samples\.jsonl:2: class_name 'green dog' is not "
        r"class_order\[0\] 'red cat' \(tasks\.json\)$",
        1,
    ),
    Fault(
        "captions.json caption with a lone surrogate",
        "hostile text",
        captions_surrogate,
        r"^Error: .*/captions\.json: sample 1 \('s0'\): text holds \\udcff at "
        r"character 11, not valid Unicode$",
        1,
    ),
    Fault(
        "solver state, one byte of G changed",
        "corruption",
        state_corrupted,
        r"^Error: .*/state\.h5: solver state does not match the sha256 written "
        r"with it \(damaged\); solve without --state to start from step 1$",
        1,
    ),
    Fault(
        "shard truncated",
        "truncation",
        shard_truncated,
        r"^Error: .*/step_02/train\.h5: truncated or not an HDF5 file",
        1,
    ),
    Fault(
        "a chain's last step folder deleted",
        "missing step",
        missing_step,
        r"^Error: .*/extract/pal/1: chain pal/1 has 2 steps, but data\.tasks is 3 "
        r"\(a step is missing: rerun its `pal extract`, or `dvc repro`\)$",
        1,
    ),
    Fault(
        "a chain's weights solved at another width",
        "wrong shape",
        other_width,
        r"^Error: .*/solve/pal/1/weights\.h5: weights of width 64, but "
        r"solve\.width is 48 \(rerun `pal-solver solve`\)$",
        1,
    ),
    Fault(
        "temporary weights file of a killed solve",
        "stale temp file",
        stale_temp,
        r"removed .*/solve/\.weights\.h5\.tmp\.\d+, left by a writer that was "
        r"killed$",
        0,
    ),
    Fault(
        "YAML anchor bomb in params (solve)",
        "hostile params",
        hostile_params(BOMB),
        r"^Error: .*/params\.yaml: line 2: YAML aliases \(\*name\) are not "
        r"allowed in params; write the value out$",
        1,
    ),
    Fault(
        "YAML anchor bomb in params (check)",
        "hostile params",
        hostile_params(BOMB, pal),
        r"params\.yaml: line 2: YAML aliases \(\*name\) are not allowed in "
        r"params; write the value out$",
        1,
    ),
    Fault(
        "a 10000-item list for an integer",
        "hostile params",
        hostile_params(SOLVE.replace("width: 48", f"width: {[0] * 10_000}")),
        r"^Error: .*/params\.yaml: solve\.width must be an integer, got "
        r"\[0, 0, 0, 0, 0, 0, \.\.\.\]$",
        1,
    ),
    Fault(
        "shard bit flipped, its mtime kept (DVC sees no change)",
        "bit rot",
        shard_bit_rot,
        r"^Error: .*/data/extract/pal/0/step_02/train\.h5: its bytes differ from "
        r"the md5 that dvc\.lock recorded when stage extract@pal-0 wrote it "
        r"\(damaged since\): `pal verify --stage extract@pal-0` checks its cache "
        r"copy and names the repair$",
        1,
    ),
    Fault(
        "shard features rewritten as float16",
        "wrong dtype",
        shard_float16,
        r"^Error: .*/step_02/train\.h5: features are float16 but attr "
        r"stored_dtype says float32 \(rewritten since extract\): rerun its "
        r"`pal extract`$",
        1,
    ),
    Fault(
        "a task without test samples (N24News missing a section)",
        "empty task",
        empty_task,
        r"^Error: data \(class_order_seed 0\): task \d+ has no test samples "
        r"\(its classes: Section 07\): every task needs both; the dataset's "
        r"test split lacks these classes$",
        1,
    ),
    Fault(
        "solve.width beyond the machine's memory",
        "oversized width",
        oversized_width,
        r"^Error: solve\.width 100000: the solve holds about 149\.0 GiB "
        r"\(2 × 100000² float64\), but this machine's memory is "
        r"[0-9.]+ GiB: lower solve\.width$",
        1,
    ),
    Fault(
        "predict: a symlink in the input folder pointing out",
        "hostile path",
        predict_symlink_out,
        r"in\.jsonl: row 1: image images/.* resolves to .*/elsewhere/photo\.png, "
        r"outside the input's folder \(--allow-outside-paths reads it\) \(not "
        r"predicted\)$",
        0,
    ),
    Fault(
        "contracts stamp --out naming a folder of the user's (data)",
        "hostile path",
        stamp_into_a_data_folder,
        r"^Error: .*/data: holds raw and 2 more that are not contract stamps; "
        r"nothing was deleted: --out names the stamps' own folder \(default "
        r"data/contracts\)$",
        1,
    ),
    Fault(
        "a sealed copy of features, one bit flipped with its mtime kept",
        "corruption",
        sealed_copy_bit_rot,
        r"^Error: .*/elsewhere/features/step_02/train\.h5: its bytes differ from "
        r"the md5 that .*/MD5SUMS lists \(damaged since it was sealed\): copy it "
        r"again from its source$",
        1,
    ),
    Fault(
        "a features folder mixing two runs' steps",
        "wrong provenance",
        mixed_chains,
        r"^Error: .*/mixed/step_02: made under other params than step 1's "
        r"\(tune\.seed: 1 against 0\): the folder mixes runs or variants; keep "
        r"one chain's steps$",
        1,
    ),
    Fault(
        "files listing: a row of an unknown split (check)",
        "bad listing",
        files_listing("unknown split", "check"),
        r"params\.yaml: .*/files/listing\.jsonl line 2: split 'dev' is none of "
        r"train, val, test$",
        1,
    ),
    Fault(
        "files listing: a class without test samples",
        "empty task",
        files_listing("a class with no test sample"),
        r"^Error: .*/files/listing\.jsonl: class 'kind 05' has no test sample; "
        r"every class needs both train and test samples$",
        1,
    ),
    Fault(
        "files listing: an image path climbing out of the root",
        "hostile path",
        files_listing("an image path outside the root"),
        r"^Error: .*/files/listing\.jsonl line 3: image '\.\./elsewhere/photo\.jpg' "
        r"is outside the dataset folder; image paths are relative to it$",
        1,
    ),
    Fault(
        "files listing: an image named but not on disk",
        "missing file",
        files_listing("an image named but not on disk"),
        r"^Error: .*/files/listing\.jsonl line 1: image "
        r"'images/00/c00-train-0\.jpg' is not in .*/files; leave the field empty "
        r"for a sample without an image$",
        1,
    ),
    Fault(
        "files listing: an id listed twice (check)",
        "bad listing",
        files_listing("a duplicate id", "check"),
        r"params\.yaml: .*/files/listing\.jsonl line 3: id 'c00-train-0' is "
        r"listed twice \(first on line 1\)$",
        1,
    ),
    Fault(
        "files listing: a row without its class",
        "bad listing",
        files_listing("a missing column"),
        r"^Error: .*/files/listing\.jsonl line 4: no 'class' \(each row has the "
        r"columns id, image, text, class, split\)$",
        1,
    ),
    Fault(
        "files listing: a row cut short (check)",
        "truncation",
        files_listing("an unreadable row", "check"),
        r"params\.yaml: .*/files/listing\.jsonl line 5: not a JSON object "
        r"\(Expecting property name enclosed in double quotes at column 21\)$",
        1,
    ),
    Fault(
        "files dataset: 12 classes in 5 tasks (check)",
        "bad listing",
        files_listing(None, "check", tasks=5),
        r"params\.yaml: data\.tasks: 5 does not divide the 12 classes evenly "
        r"\(set data\.allow_uneven: true to give the first tasks one class more\)$",
        1,
    ),
]


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
    for source, out in ((features, "solve"), (root / "extract", "weights")):
        args = [
            "solve",
            "--features",
            source,
            "--params",
            root / "params.yaml",
            "--out",
            root / out,
        ]
        assert CliRunner().invoke(pal_solver, [str(a) for a in args]).exit_code == 0
    weights = root / "weights" / "weights.h5"
    return tuned, root / "extract", features, root / "solve", weights


def _digests(folder: Path) -> dict[str, str]:
    return {
        p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault(fault: Fault, references, tmp_path):
    scene = Scene(tmp_path, *references)
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
    if case.repair is not None:  # the repair the line names, then the same command
        case.repair()
        again = CliRunner().invoke(case.tool, [str(a) for a in case.args])
        assert again.exit_code == 0, again.output
    if case.recovered is not None:
        out, clean = case.recovered
        assert _digests(out) == _digests(clean)
        assert not out.with_name(out.name + ".partial").exists()


# ------------------------------------------------------------ met by real runs

FULL = (
    r"^Error: .*/{name}: the disk is full \(it needs about [0-9.]+ [kM]?B; "
    r"[0-9.]+ [kM]?B were free when it began\): free space there and rerun$"
)
RUNS = [
    Fault(
        "pal pixels on a full disk",
        "full disk",
        fault_runs.pixels_full,
        FULL.format(name=r"pixels/pixels\.h5"),
        1,
    ),
    Fault(
        "pal extract on a full disk (step 2 of 2)",
        "full disk",
        fault_runs.extract_full,
        FULL.format(name=r"extract\.partial/step_02/train\.h5"),
        1,
    ),
    Fault(
        "pal-solver solve on a full disk",
        "full disk",
        fault_runs.solve_full,
        FULL.format(name=r"solve/weights\.h5"),
        1,
    ),
    Fault(
        "an image name in pixels.h5 bit-flipped, the names' order kept",
        "corruption",
        fault_runs.pixels_name_damaged,
        r"^Error: sample '.*': cannot read image .*\.png \(.*/pixels/pixels\.h5: "
        r"not a readable pixel cache \(image name (images/.*\.png) reads "
        r"images/.*\.png\); rerun `pal pixels`\)$",
        1,
    ),
    Fault(
        "SIGTERM to a grid of two workers (a batch scheduler's stop)",
        "signal",
        fault_runs.sigterm_grid,
        r"^Error: interrupted: the grid's workers and their cells were stopped; "
        r"finished cells are kept, `pal-paper run upsampling` runs the rest$",
        1,
    ),
]


@pytest.fixture(scope="module")
def made(tmp_path_factory) -> fault_runs.Made:
    """The contracts' fixture inputs and a clean run of pixels, frozen, tune
    and extract on them (~30 s)."""
    return fault_runs.make(tmp_path_factory.mktemp("made"))


def _same(a: Path, b: Path) -> bool:
    if a.is_dir():
        return _digests(a) == _digests(b)
    return a.read_bytes() == b.read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("fault", RUNS, ids=[f.name for f in RUNS])
def test_fault_in_a_real_run(fault: Fault, made, tmp_path):
    disk = fault_runs.Tmpfs(tmp_path / "disk")
    try:
        outcome = fault.inject(made, tmp_path, disk)
        same = [a for a, b in outcome.same if not _same(a, b)]  # before unmounting
    finally:
        disk.close()
    first = outcome.first
    assert first.returncode == fault.code, first.stderr
    assert "Traceback" not in first.stderr + first.stdout
    errors = [x for x in first.stderr.splitlines() if x.startswith("Error")]
    assert len(errors) == 1, first.stderr
    assert re.search(fault.line, errors[0]), errors[0]
    assert errors[0] == first.stderr.strip().splitlines()[-1]  # the last word
    assert outcome.same and same == []


def test_the_table_covers_every_class():
    kinds = {f.kind for f in FAULTS + RUNS}
    assert kinds >= {
        "truncation",
        "corruption",
        "wrong shape",
        "missing step",
        "killed process",
        "hostile params",
        "hostile text",
        "stale temp file",
        "bit rot",
        "wrong dtype",
        "empty task",
        "oversized width",
        "hostile path",
        "full disk",
        "signal",
    }


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
