"""The rule for "the same output" (DESIGN §2): exact values equal, floats to
RTOL of their scale, derived seals aside; and the contract fixture under
other CPU kinds' code paths: the same code is the same output on each, PAL's
joint embedding scaled by 1.001 is not."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from helpers import PAL_JOINT

from pipeline.sameness import CHECKPOINT_RTOL, CPU_PATHS, RTOL, compare_folders

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
    """A log's floats to RTOL, its counts exactly; a checkpoint's floats to
    CHECKPOINT_RTOL (Adam's steps), its tensors of integers exactly."""
    w = torch.ones(3, 5)
    for name, bump, epoch in (("a", 0.0, 1), ("b", 5e-3, 1), ("c", 2e-2, 2)):
        folder = tmp_path / name
        folder.mkdir()
        state = {"W": w + bump, "step": torch.tensor(3)}
        torch.save({"state": state, "hash": name}, folder / "step_01.pt")
        log = {"epoch": epoch, "ce": 0.6931 + bump / 100}
        (folder / "log.jsonl").write_text(json.dumps(log) + "\n")
    a, b, c = (tmp_path / n for n in "abc")
    assert CHECKPOINT_RTOL == 1e-2
    assert compare_folders(a, b) == []  # W within 1e-2, ce within 1e-4
    assert [str(d) for d in compare_folders(a, c)] == [
        "log.jsonl:[0].epoch",
        f"step_01.pt:state.W ({2e-2 / 1.02:.1e})",
    ]
    (c / "log.jsonl").write_text(json.dumps({"epoch": 1, "ce": 0.6931 * 1.001}))
    assert [str(d) for d in compare_folders(a, c)][0] == "log.jsonl:[0].ce (1.0e-03)"


def test_nan_must_stand_where_it_stood(tmp_path: Path) -> None:
    a, b, x = _pair(tmp_path)
    y = x.copy()
    y[1, 1] = np.nan
    _h5(a / "step_01/train.h5", y, np.arange(8), "a")
    assert [str(d) for d in compare_folders(a, b)] == ["step_01/train.h5:features"]
    _h5(b / "step_01/train.h5", y, np.arange(8), "b")
    assert compare_folders(a, b) == []


RENAME = (
    "prompts = self(q_t, q_v, text_on=on, image_on=on)\n",
    "chosen = self(q_t, q_v, text_on=on, image_on=on)\n",
)


def _project(where: Path, edits: list[tuple[str, str]]) -> Path:
    """The project's code, contract files and reference, with `edits` of
    PAL's module."""
    for rel in ("palcore", "pipeline", "solver", "reference"):
        shutil.copytree(ROOT / rel, where / rel, ignore=shutil.ignore_patterns("*.pyc"))
    for name in ("params.yaml", "contracts.yaml", "contracts.lock"):
        shutil.copy(ROOT / name, where / name)
    pal = where / "pipeline/methods/pal.py"
    for old, new in edits:
        assert old in pal.read_text()
        pal.write_text(pal.read_text().replace(old, new))
    return where


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(CPU_PATHS))
def test_the_proof_takes_a_refactor_and_refuses_a_change_on_each_kind(
    tmp_path: Path, kind: str
) -> None:
    """Under each emulated CPU kind (`CPU_PATHS`), against the reference
    recorded on another: `pal contracts verify` accepts PAL's module with a
    local renamed, and refuses PAL's joint embedding × 1.001."""
    joint = (PAL_JOINT, PAL_JOINT.replace("prompts", "chosen"))
    refactor = _project(tmp_path / "refactor", [RENAME, joint])
    change = _project(tmp_path / "change", [(PAL_JOINT, PAL_JOINT + " * 1.001")])
    seen = {}
    for root in (refactor, change):
        env = dict(os.environ, PYTHONPATH=str(root), HF_HUB_OFFLINE="1")
        seen[root.name] = subprocess.run(
            [sys.executable, "-m", "pipeline", "contracts", "verify"],
            cwd=root,
            env=env | CPU_PATHS[kind],
            capture_output=True,
            text=True,
        )
    done = seen["refactor"]
    assert done.returncode == 0, done.stderr
    # PAL's and RebQ's (rebq.py imports pal.py) tunings and extracts
    assert "compared with their reference: 7 jobs (tune/pal, tune/rebq," in done.stdout
    done = seen["change"]
    assert done.returncode == 1
    assert done.stderr.startswith(
        "Error: extract.pal: the outputs of the working tree differ from the "
        "reference of extract.pal 1 (extract/pal: step_01/test.h5:"
    )
