"""A SLURM task's clone of the project (palpaper/cluster.py), without SLURM:
which of the project's DVC cache settings it takes over."""

from __future__ import annotations

import configparser
import subprocess
from pathlib import Path

from palpaper.cluster import prepare_clone
from palpaper.experiments import _tool


def _project(path: Path) -> str:
    """A git and DVC repository at `path` with one commit; its commit id."""
    path.mkdir()
    env = {
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    for args in (
        ["git", "init", "-q"],
        [_tool("dvc"), "init", "-q"],
        ["git", "commit", "-q", "-m", "init"],
    ):
        subprocess.run(args, cwd=path, check=True, env={**env, "PATH": "/usr/bin:/bin"})
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=path, capture_output=True, text=True
    ).stdout.strip()


def _local_config(clone: Path) -> dict[str, dict[str, str]]:
    parser = configparser.ConfigParser()
    parser.read(clone / ".dvc" / "config.local")
    return {s: dict(parser[s]) for s in parser.sections()}


def test_a_project_without_cache_settings_gives_a_clone_on_its_cache(
    tmp_path: Path,
) -> None:
    """`dvc config cache.type` prints nothing and exits 0 when unset (DVC
    3.67): the clone must not be given an empty cache.type."""
    origin = tmp_path / "origin"
    head = _project(origin)
    clone = tmp_path / "cells" / "a"
    prepare_clone(origin, clone, head, [])
    assert _local_config(clone) == {
        "cache": {"dir": str((origin / ".dvc" / "cache").resolve())}
    }
    assert not list(clone.parent.glob("*.tmp*"))  # made under a temporary name


def test_the_group_cache_settings_go_to_the_clone(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    head = _project(origin)
    shared = tmp_path / "shared-cache"
    dvc = _tool("dvc")
    for key, value in (
        ("cache.dir", str(shared)),
        ("cache.type", "symlink"),
        ("cache.shared", "group"),
    ):
        subprocess.run([dvc, "config", "--local", key, value], cwd=origin, check=True)
    clone = tmp_path / "cells" / "a"
    prepare_clone(origin, clone, head, [])
    assert _local_config(clone) == {
        "cache": {"dir": str(shared), "type": "symlink", "shared": "group"}
    }
