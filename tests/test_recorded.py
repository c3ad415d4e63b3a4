"""Readers check every file they read from a DVC output against the md5 DVC
recorded for it (`palcore.recorded`): a bit flipped with the mtime kept ends
the reading command with one line, and nothing is written. Here the project
is laid out by hand as DVC lays it out (a lock, a folder output and its
manifest in the cache); tests/test_dvc_pipeline.py does it with DVC.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml
from click.testing import CliRunner
from helpers import flip_keeping_mtime

from palcore.errors import ShardError
from palcore.recorded import (
    DamagedError,
    cache_dir,
    check_content,
    md5_of,
    recorded_md5,
)
from solver.api import make_features
from solver.shard_readers import open_features

OUT = "data/extract/pal/0"


def _project(tmp_path: Path, cache: str | None = None) -> Path:
    """A project whose dvc.lock records a folder output of synthetic shards,
    its manifest in the cache (`cache`: a `cache.dir` of .dvc/config)."""
    root = tmp_path / "project"
    (root / ".dvc").mkdir(parents=True)
    if cache is not None:
        (root / ".dvc" / "config").write_text(f"[cache]\n    dir = {cache}\n")
    make_features(root / OUT, n_steps=2, rows_per_step=30, test_rows=10)
    files = sorted(p for p in (root / OUT).rglob("*") if p.is_file())
    listing = [
        {"md5": md5_of(p), "relpath": p.relative_to(root / OUT).as_posix()}
        for p in files
    ]
    text = json.dumps(listing)

    md5 = hashlib.md5(text.encode()).hexdigest() + ".dir"
    obj = cache_dir(root) / "files" / "md5" / md5[:2] / md5[2:]
    obj.parent.mkdir(parents=True)
    obj.write_text(text)
    lock = {
        "schema": "2.0",
        "stages": {
            "extract@pal-0": {
                "cmd": "pal extract",
                "outs": [{"path": OUT, "hash": "md5", "md5": md5}],
            }
        },
    }
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    return root


def test_the_recorded_md5_is_the_manifests(tmp_path: Path) -> None:
    root = _project(tmp_path, cache="../shared-cache")
    assert cache_dir(root) == (root / "shared-cache").resolve()
    shard = root / OUT / "step_02" / "train.h5"
    rec = recorded_md5(shard)
    assert (rec.path, rec.stage, rec.out) == (
        f"{OUT}/step_02/train.h5",
        "extract@pal-0",
        OUT,
    )
    assert rec.md5 == md5_of(shard)
    assert recorded_md5(tmp_path / "elsewhere.h5") is None  # outside a project
    check_content(shard)  # matches: nothing raised
    assert len(open_features(root / OUT)) == 2


def test_a_bit_flipped_with_its_mtime_kept_is_one_line(tmp_path: Path) -> None:
    root = _project(tmp_path)
    shard = root / OUT / "step_02" / "train.h5"
    flip_keeping_mtime(shard)
    line = (
        f"{shard}: its bytes differ from the md5 that dvc.lock recorded when "
        "stage extract@pal-0 wrote it (damaged since): `pal verify --stage "
        "extract@pal-0` checks its cache copy and names the repair"
    )
    with pytest.raises(DamagedError) as err:
        open_features(root / OUT)
    assert str(err.value) == line
    # the solver's command: that line, exit 1, no weights written
    from solver.cli import main

    out = tmp_path / "solve"
    result = CliRunner().invoke(
        main,
        [
            "solve",
            "--features",
            str(root / OUT),
            "--out",
            str(out),
            "--eta",
            "1",
            "--width",
            "64",
            "--device",
            "cpu",
        ],
    )
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == f"Error: {line}"
    assert not out.exists() or not any(out.rglob("*.h5"))


def test_a_shard_rewritten_as_float16_is_refused(tmp_path: Path) -> None:
    """stored_dtype says what extract wrote: float16 features under a float32
    attr are a rewrite, whether a lock records the file or not."""
    out = make_features(tmp_path / "features", n_steps=1, rows_per_step=20)
    path = out / "step_01" / "train.h5"
    with h5py.File(path, "a") as f:
        f.attrs["stored_dtype"] = "float32"
        x = f["features"][()]
        del f["features"]
        f["features"] = x.astype(np.float16)
    with pytest.raises(ShardError) as err:
        open_features(out)
    assert str(err.value) == (
        f"{path}: features are float16 but attr stored_dtype says float32 "
        "(rewritten since extract): rerun its `pal extract`"
    )


def test_a_copy_outside_the_project_is_not_checked(tmp_path: Path) -> None:
    """Only what a lock records is checked by check_content: a copy elsewhere
    is the readers' seal check (below)."""
    root = _project(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(root / OUT, copy)
    flip_keeping_mtime(copy / "step_01" / "test.h5")
    check_content(copy / "step_01" / "test.h5")  # no lock above it: nothing raised


def test_a_partial_beside_a_complete_output_goes_with_its_first_good_read(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A stopped run's `<out>.partial/`, left when DVC restored the output
    from its run-cache (no stage code runs then): the first reader that finds
    the output matching its lock removes it, and says so."""
    root = _project(tmp_path)
    partial = root / f"{OUT}.partial"
    shutil.copytree(root / OUT / "step_01", partial / "step_01")
    damaged = _project(tmp_path / "other")
    flip_keeping_mtime(damaged / OUT / "step_01" / "train.h5")
    kept = damaged / f"{OUT}.partial"
    kept.mkdir()
    with pytest.raises(DamagedError):
        open_features(damaged / OUT)
    assert kept.is_dir()  # a damaged output keeps it: its rerun may resume
    with caplog.at_level("INFO", logger="palcore.recorded"):
        assert len(open_features(root / OUT)) == 2
    assert not partial.exists()
    assert caplog.messages == [
        f"removed {OUT}.partial: the unfinished work of an earlier run of stage "
        "extract@pal-0, whose output is complete (DVC restored it from its cache)"
    ]


def test_a_copy_is_checked_by_the_readers_seal_or_named_unverifiable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The readers' check of a copy with no lock above it: the seal of
    `pal-solver export`, else unverifiable (an error under --verified-only)."""
    from palcore import recorded

    root = _project(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(root / OUT, copy)
    monkeypatch.setattr(recorded, "REQUIRE_VERIFIED", True)
    with pytest.raises(recorded.UnverifiedError, match="cannot verify its shards"):
        recorded.check_features(copy / "step_01" / "test.h5")


def test_pal_verify_says_what_it_cannot_check(tmp_path: Path) -> None:
    """A folder output whose manifest left the cache is a damage with its
    repair (never a silent skip); no lock, or one that is not YAML, is one
    line naming it."""
    from palcore.errors import PalError
    from pipeline.stages.verify import read_lock, unlisted

    root = _project(tmp_path)
    stages = {"extract@pal-0": set()}
    assert unlisted(root, stages) == []
    md5 = read_lock(root)["extract@pal-0"]["outs"][0]["md5"]
    (cache_dir(root) / "files" / "md5" / md5[:2] / md5[2:]).unlink()
    (damage,) = unlisted(root, stages)
    assert damage.line() == (
        f"{OUT} (stage extract@pal-0): its manifest {md5} is not in DVC's cache, "
        "so none of its files can be checked: `dvc fetch extract@pal-0` from a "
        "remote, or `dvc repro -f -s extract@pal-0`"
    )
    (root / "dvc.lock").write_text("stages: [\n")
    with pytest.raises(PalError) as err:
        read_lock(root)
    assert str(err.value) == (
        f"{root / 'dvc.lock'}: not a lock DVC wrote (line 2): `git checkout dvc.lock`"
    )
    (root / "dvc.lock").unlink()
    with pytest.raises(PalError, match="dvc.lock: not found: no output is recorded"):
        read_lock(root)


def test_a_cache_false_folder_is_checked_whole_by_its_hash(tmp_path: Path) -> None:
    """DVC keeps no manifest of a `cache: false` folder (the report's
    headline/, in git): pal verify hashes its files' manifest as DVC does and
    compares it with the lock's, here the hash `dvc commit` recorded."""
    import subprocess

    from pipeline.stages.verify import folder_md5, unlisted

    folder = "results/demo/headline"
    root = tmp_path / "project"
    (root / ".dvc").mkdir(parents=True)
    committed = yaml.safe_load(
        subprocess.run(
            ["git", "show", "HEAD:dvc.lock"], capture_output=True, text=True, check=True
        ).stdout
    )
    (out,) = [o for o in committed["stages"]["evaluate"]["outs"] if o["path"] == folder]
    (root / folder).mkdir(parents=True)
    listed = subprocess.run(
        ["git", "ls-tree", "--name-only", f"HEAD:{folder}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    for name in listed:
        blob = subprocess.run(
            ["git", "show", f"HEAD:{folder}/{name}"], capture_output=True, check=True
        ).stdout
        (root / folder / name).write_bytes(blob)
    lock = {"schema": "2.0", "stages": {"evaluate": {"cmd": "x", "outs": [out]}}}
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    stages = {"evaluate": {folder}}
    assert folder_md5(root / folder) == out["md5"]
    assert unlisted(root, stages) == []
    (root / folder / "pal.json").write_text("{}\n")
    (damage,) = unlisted(root, stages)
    assert damage.line() == (
        f"{folder} (stage evaluate): its files are not the ones dvc.lock records "
        "(a `cache: false` folder, checked whole by its hash): `git checkout -- "
        f"{folder}`, or `dvc repro -f -s evaluate`"
    )
    # a cached folder without its manifest is still named unverifiable
    assert "is not in DVC's cache" in unlisted(root, {"evaluate": set()})[0].line()
