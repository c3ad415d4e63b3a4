"""A backbone given as a hub id: `pal backbone --link`, `pal check`'s line,
and `dvc repro` depending on the cached snapshot through the link.

The HF cache is a folder laid out as huggingface_hub lays it out
(`models--<org>--<name>/snapshots/<commit>/`, `refs/main`), holding a tiny
random ViLT in the hub's file layout; nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import committed

from pipeline.fakes.trees import make_food101_tree, make_hub_vilt

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
HUB_ID = "dandelin/vilt-b32-mlm"


def fake_cache(cache: Path, commit: str = "0123abcd") -> Path:
    repo = cache / "models--dandelin--vilt-b32-mlm"
    snapshot = repo / "snapshots" / commit
    make_hub_vilt(snapshot)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def pal(cwd: Path, cache: Path, *args: str) -> subprocess.CompletedProcess:
    """`pal` as typed in a fresh shell, with the HF cache at `cache`."""
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/tmp"),
        "HF_HUB_CACHE": str(cache),
        "DVC_NO_ANALYTICS": "1",
    }
    return subprocess.run(
        [str(BIN / "pal"), *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_link_makes_a_folder_of_the_cached_snapshot(tmp_path: Path) -> None:
    snapshot = fake_cache(tmp_path / "hub")
    r = pal(tmp_path, tmp_path / "hub", "backbone", HUB_ID, "--link", "models/vilt")
    assert r.returncode == 0, r.stderr
    link = tmp_path / "models/vilt"
    assert link.is_symlink() and link.resolve() == snapshot.resolve()
    assert sorted(p.name for p in link.iterdir()) == sorted(
        p.name for p in snapshot.iterdir()
    )
    assert (
        "INFO pipeline.stages.hub: backbone: models/vilt -> snapshot 0123abcd of "
        f"{HUB_ID}; set model.backbone: models/vilt"
    ) in r.stderr.splitlines()
    # a newer snapshot: the link moves to it
    newer = fake_cache(tmp_path / "hub", commit="4567cdef")
    r = pal(tmp_path, tmp_path / "hub", "backbone", HUB_ID, "--link", "models/vilt")
    assert r.returncode == 0, r.stderr
    assert link.resolve() == newer.resolve()


def test_link_errors_are_one_line(tmp_path: Path) -> None:
    fake_cache(tmp_path / "hub")
    r = pal(tmp_path, tmp_path / "hub", "backbone", "nobody/nothing", "--link", "m")
    assert r.returncode == 1
    assert r.stderr.strip() == (
        "Error: 'nobody/nothing': not in the local HF cache (on a machine with "
        "internet: `huggingface-cli download nobody/nothing`, then copy the cache "
        "or the folder here)"
    )
    (tmp_path / "m").mkdir()
    r = pal(tmp_path, tmp_path / "hub", "backbone", HUB_ID, "--link", "m")
    assert r.returncode == 1
    assert (
        r.stderr.strip() == "Error: m: exists and is no link; remove it or pick another"
    )


@pytest.fixture
def food_project(tmp_path: Path) -> Path:
    """The pipeline file, the Food101 preset on CPU, a tiny Food101 tree."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "dvc.yaml").write_text(committed("dvc.yaml"))  # not the workspace's
    params = yaml.safe_load(committed("configs/food101.yaml"))
    params["tune"]["device"] = params["extract"]["device"] = "cpu"
    params["tune"].update(epochs=1, num_workers=0)
    params["extract"]["num_workers"] = 0
    params["prompt"].update(pool_size=10, layers=[0, 1])
    params["data"]["tasks"] = 2
    params["protocol"]["runs"] = [0]
    params["pipelines"]["main"] = ["frozen"]
    params["model"]["backbone"] = HUB_ID
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    make_food101_tree(project / "data/raw/food101", classes=5, train=2, test=1)
    return project


def test_check_names_the_link_for_a_hub_id(food_project: Path, tmp_path: Path) -> None:
    fake_cache(tmp_path / "hub")
    r = pal(food_project, tmp_path / "hub", "check")
    assert r.returncode == 1
    assert "(1 training sample)" in r.stderr  # the dropped class, one line of INFO
    assert [x for x in r.stderr.splitlines() if x.startswith("Error")] == [
        "Error: params.yaml: model.backbone 'dandelin/vilt-b32-mlm' is a hub id, "
        "and `dvc repro` needs a folder (the stages' dependency): run `pal "
        "backbone dandelin/vilt-b32-mlm --link models/vilt-b32-mlm` and set "
        "model.backbone: models/vilt-b32-mlm"
    ]


@pytest.mark.slow  # a real `dvc repro` of one tune stage
def test_dvc_repro_depends_on_the_snapshot_through_the_link(tmp_path: Path) -> None:
    from scratch_project import make_scratch_project

    if shutil.which("git") is None:
        pytest.skip("git not installed")
    cache = tmp_path / "hub"
    fake_cache(cache)
    project = tmp_path / "project"
    params = yaml.safe_load(committed("configs/food101.yaml"))
    params["tune"].update(device="cpu", epochs=1, num_workers=0)
    params["extract"].update(device="cpu", num_workers=0)
    params["prompt"].update(pool_size=10, layers=[0, 1])
    params["data"]["tasks"] = 2
    params["protocol"]["runs"] = [0]
    params["pipelines"]["main"] = ["frozen"]
    params["model"]["backbone"] = "models/vilt"
    env = make_scratch_project(project, params)
    env.update(HF_HUB_CACHE=str(cache))
    make_food101_tree(project / "data/raw/food101", classes=5, train=2, test=1)
    r = pal(project, cache, "backbone", HUB_ID, "--link", "models/vilt")
    assert r.returncode == 0, r.stderr

    def dvc(*args: str) -> str:
        out = subprocess.run(
            [str(BIN / "dvc"), *args],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        return out.stdout + out.stderr

    out = dvc("repro", "tune@frozen-0")
    assert "Running stage 'tune@frozen-0'" in out
    assert "Could not reach" not in out  # offline, quietly
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    deps = {d["path"]: d for d in lock["stages"]["tune@frozen-0"]["deps"]}
    assert deps["models/vilt"]["md5"].endswith(".dir")
    assert deps["models/vilt"]["nfiles"] == len(
        list((project / "models/vilt").iterdir())
    )
    assert "didn't change" in dvc("repro", "tune@frozen-0")
    # the dataset's chain alone: not the demo stage
    status = dvc("status", "--with-deps", "evaluate")
    stages = {
        line[:-1]
        for line in status.splitlines()
        if line.endswith(":") and line[0] != "\t"
    }
    assert stages == {"extract@frozen-0", "solve", "evaluate"}, status
    # another snapshot behind the link: the stage is out of date
    snap = cache / "models--dandelin--vilt-b32-mlm/snapshots"
    newer = fake_cache(cache, commit="4567cdef")
    config = (snap / "0123abcd/config.json").read_text()
    (newer / "config.json").write_text(config.replace("{", '{"unused_key": 1, ', 1))
    assert (
        pal(project, cache, "backbone", HUB_ID, "--link", "models/vilt").returncode == 0
    )
    assert "modified:           models/vilt" in dvc("status", "tune@frozen-0")
