"""Features that travel (DESIGN §3, "Features out of their project"): a copy
made by `pal-solver export` carries MD5SUMS and is verified wherever it is
read; a plain copy is read with one warning, or refused with
--verified-only; a bit flipped in a sealed copy is one line naming it; a
folder whose steps were made under other params (two runs) is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from helpers import flip_keeping_mtime

from palcore import recorded
from solver.cli import main
from solver.synthetic import make_features

PARAMS = "solve:\n  width: 64\n  eta: 1.0\n  seed: 0\n"


@pytest.fixture
def features(tmp_path: Path) -> Path:
    """Synthetic features outside any project (no dvc.lock records them)."""
    return make_features(tmp_path / "made", [40, 30], [2, 2], feature_dim=8)


def _solve(tmp_path: Path, features: Path, *args: str):
    params = tmp_path / "params.yaml"
    params.write_text(PARAMS)
    out = tmp_path / "solve"
    cmd = ["solve", "--features", str(features), "--out", str(out), *args]
    return CliRunner().invoke(main, [*cmd, "--params", str(params)])


@pytest.fixture(autouse=True)
def _fresh_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(recorded, "REQUIRE_VERIFIED", False)
    monkeypatch.setattr(recorded, "_WARNED", set())


def test_an_unsealed_copy_warns_once_or_is_refused(
    tmp_path: Path, features: Path
) -> None:
    done = _solve(tmp_path, features)
    assert done.exit_code == 0, done.output
    warned = [line for line in done.stderr.splitlines() if "WARNING" in line]
    assert warned == [
        f"WARNING palcore.recorded: {features / 'step_01'}: cannot verify "
        "its shards: no dvc.lock records them and no MD5SUMS lists them "
        "(`pal-solver export` copies features with one); so are any others read "
        "unsealed"
    ]
    done = _solve(tmp_path, features, "--verified-only")
    assert done.exit_code == 1
    assert done.stderr.splitlines()[-1] == (
        f"Error: {features / 'step_01'}: cannot verify its shards: no dvc.lock "
        "records them and no MD5SUMS lists them (`pal-solver export` copies "
        "features with one); --verified-only refuses them"
    )


def test_a_sealed_copy_is_verified_and_a_flipped_bit_named(
    tmp_path: Path, features: Path
) -> None:
    held = {p: p.read_bytes() for p in features.rglob("*.h5")}
    copy = tmp_path / "elsewhere" / "features"
    copy.parent.mkdir()
    done = CliRunner().invoke(main, ["export", str(features), str(copy)])
    assert done.exit_code == 0, done.output
    assert done.stdout == (
        f"{copy}: 4 files copied and sealed in MD5SUMS (4 recorded by no lock: "
        "sealed as they are)\n"
    )
    assert len((copy / "MD5SUMS").read_text().splitlines()) == 4
    done = _solve(tmp_path, copy, "--verified-only")
    assert done.exit_code == 0, done.output
    assert "WARNING" not in done.stderr
    shard = copy / "step_02" / "train.h5"
    flip_keeping_mtime(shard)
    done = _solve(tmp_path, copy)
    assert done.exit_code == 1
    assert done.stderr.splitlines()[-1] == (
        f"Error: {shard}: its bytes differ from the md5 that {copy / 'MD5SUMS'} "
        "lists (damaged since it was sealed): copy it again from its source"
    )
    assert {p: p.read_bytes() for p in features.rglob("*.h5")} == held


def test_export_refuses_an_existing_destination_and_a_damaged_source(
    tmp_path: Path, features: Path
) -> None:
    sealed = tmp_path / "sealed"
    assert (
        CliRunner().invoke(main, ["export", str(features), str(sealed)]).exit_code == 0
    )
    done = CliRunner().invoke(main, ["export", str(features), str(sealed)])
    assert done.exit_code == 1
    assert done.stderr == (
        f"Error: {sealed}: already exists (export writes a new folder)\n"
    )
    flip_keeping_mtime(sealed / "step_01" / "test.h5")
    again = tmp_path / "again"
    done = CliRunner().invoke(main, ["export", str(sealed), str(again)])
    assert done.exit_code == 1
    assert done.stderr.startswith(f"Error: {sealed / 'step_01' / 'test.h5'}: its bytes")
    assert not again.exists()


def test_a_folder_mixing_chains_is_refused_naming_the_step(tmp_path: Path) -> None:
    """Steps of two runs (other seeds in their recorded params) in one
    features folder: solve names the first step that differs and the key."""
    import shutil

    import h5py

    a = make_features(tmp_path / "a", [40, 30], [2, 2], feature_dim=8, seed=0)
    b = make_features(tmp_path / "b", [40, 30], [2, 2], feature_dim=8, seed=0)
    for folder, seed in ((a, 0), (b, 1)):
        for shard in folder.rglob("*.h5"):
            with h5py.File(shard, "r+") as f:
                f.attrs["params"] = f'{{"tune": {{"lr": 0.001, "seed": {seed}}}}}'
    mixed = tmp_path / "mixed"
    shutil.copytree(a / "step_01", mixed / "step_01")
    shutil.copytree(b / "step_02", mixed / "step_02")
    assert _solve(tmp_path, a).exit_code == 0
    done = _solve(tmp_path, mixed)
    assert done.exit_code == 1
    assert done.stderr.splitlines()[-1] == (
        f"Error: {mixed / 'step_02'}: made under other params than step 1's "
        "(tune.seed: 1 against 0): the folder mixes runs or variants; keep one "
        "chain's steps"
    )
