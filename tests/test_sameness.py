"""The rule for "the same output" (DESIGN §2): exact values equal, floats to
RTOL of their scale, derived seals aside; and the contract fixture under
other CPU kinds' code paths: the same code is the same output on each, PAL's
joint embedding scaled by 1.001 is not."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import PAL_JOINT

from pipeline.sameness import CPU_PATHS, RTOL, compare_folders
from pipeline.stages import contract_runs as runs

ROOT = Path(__file__).resolve().parents[1]


def _h5(path: Path, features: np.ndarray, labels: np.ndarray, seal: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f["features"] = features
        f["labels"] = labels
        f.attrs["sha256"] = seal
        f.attrs["params"] = '{"seed": 0}'


def _pair(tmp_path: Path) -> tuple[Path, Path, np.ndarray]:
    x = np.random.default_rng(0).normal(size=(8, 4)).astype(np.float32)
    for name in ("a", "b"):
        _h5(tmp_path / name / "step_01/train.h5", x, np.arange(8), name)
        (tmp_path / name / "contract.json").write_text(name)
        (tmp_path / name / "step_01/SHA256SUMS").write_text(name)
    return tmp_path / "a", tmp_path / "b", x


def test_floats_within_rtol_of_their_scale_are_the_same(tmp_path: Path) -> None:
    a, b, x = _pair(tmp_path)
    scale = float(np.abs(x).max())
    y = x.copy()
    y[0, 0] += 0.5 * RTOL * scale
    _h5(b / "step_01/train.h5", y, np.arange(8), "other seal")
    assert compare_folders(a, b) == []  # seals and stamps are derived
    y[0, 0] += 2 * RTOL * scale
    _h5(b / "step_01/train.h5", y, np.arange(8), "b")
    (diff,) = compare_folders(a, b)
    assert (diff.file, diff.key) == ("step_01/train.h5", "features")
    assert diff.size == pytest.approx(2.5 * RTOL, rel=1e-3)


def test_integers_strings_and_names_are_exact(tmp_path: Path) -> None:
    a, b, x = _pair(tmp_path)
    _h5(b / "step_01/train.h5", x, np.arange(8)[::-1], "b")
    assert [str(d) for d in compare_folders(a, b)] == ["step_01/train.h5:labels"]
    _h5(b / "step_01/train.h5", x, np.arange(8), "b")
    (b / "step_01/test.h5").write_bytes(b"")
    assert [str(d) for d in compare_folders(a, b)] == ["step_01/test.h5"]


def test_checkpoints_and_logs_compare_by_kind(tmp_path: Path) -> None:
    w = torch.randn(3, 5)
    logs = [{"epoch": 1, "ce": 0.6931}]
    for name, bump, epoch in (("a", 0.0, 1), ("b", 1e-6, 1), ("c", 1e-2, 2)):
        folder = tmp_path / name
        folder.mkdir()
        state = {"W": w + bump, "step": torch.tensor(3)}
        torch.save({"state": state, "hash": name}, folder / "step_01.pt")
        logs[0] = {"epoch": epoch, "ce": 0.6931 + bump}
        (folder / "log.jsonl").write_text("\n".join(map(json.dumps, logs)) + "\n")
    a, b, c = (tmp_path / n for n in "abc")
    assert compare_folders(a, b) == []
    assert [str(d).split(" ")[0] for d in compare_folders(a, c)] == [
        "log.jsonl:[0].epoch",
        "step_01.pt:state.W",
    ]


def test_nan_must_stand_where_it_stood(tmp_path: Path) -> None:
    a, b, x = _pair(tmp_path)
    y = x.copy()
    y[1, 1] = np.nan
    _h5(a / "step_01/train.h5", y, np.arange(8), "a")
    assert [str(d) for d in compare_folders(a, b)] == ["step_01/train.h5:features"]
    _h5(b / "step_01/train.h5", y, np.arange(8), "b")
    assert compare_folders(a, b) == []


JOBS = ("frozen/demo", "tune/pal", "extract/pal")


@pytest.mark.slow
def test_the_fixture_is_the_same_on_every_path_and_an_edit_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PAL's frozen, tune and extract jobs under each emulated CPU kind
    (`CPU_PATHS`): the same code makes the same outputs as the native path's;
    PAL's joint embedding × 1.001 makes other ones, under every kind."""
    edited = tmp_path / "edited"
    for rel in ("palcore", "pipeline", "solver"):
        shutil.copytree(ROOT / rel, edited / rel)
    for name in ("params.yaml", "contracts.yaml", "contracts.lock"):
        shutil.copy(ROOT / name, edited / name)
    pal = edited / "pipeline/methods/pal.py"
    assert PAL_JOINT in pal.read_text()
    pal.write_text(pal.read_text().replace(PAL_JOINT, PAL_JOINT + " * 1.001"))

    todo = [j for j in runs.jobs() if j.name in JOBS or j.name == "pixels/demo"]
    runs.build_inputs(ROOT, tmp_path / "inputs")
    native = runs.Version(ROOT, tmp_path / "native")
    runs.run_version(native, todo, tmp_path / "inputs", native, None)
    for kind, env in CPU_PATHS.items():
        with monkeypatch.context() as m:
            for key, value in env.items():
                m.setenv(key, value)
            same = runs.Version(ROOT, tmp_path / kind)
            other = runs.Version(edited, tmp_path / f"{kind}-edited")
            runs.run_version(same, todo, tmp_path / "inputs", native, None)
            runs.run_version(other, todo[2:], tmp_path / "inputs", native, None)
        for job in JOBS:
            got = compare_folders(native.work / job, same.work / job)
            assert got == [], (kind, job, got)
        for job in ("tune/pal", "extract/pal"):
            moved = compare_folders(native.work / job, other.work / job)
            assert moved, (kind, job)
