"""A SLURM task's clone of the project and its cell (palpaper/cluster.py),
without SLURM: which of the project's DVC cache settings the clone takes
over, and a try after one that a signal stopped."""

from __future__ import annotations

import configparser
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from palpaper.cluster import Stop, exp_ref, has_ref, prepare_clone, run_cell
from palpaper.tools import find_tool

GIT_ENV = {
    "PATH": "/usr/bin:/bin",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.com",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.com",
}


def _git(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(
        ["git", *args], cwd=cwd, env=GIT_ENV, check=True, capture_output=True
    )
    return proc.stdout.decode().strip()


def _project(path: Path, stage: bool = False) -> str:
    """A git and DVC repository at `path`, committed; its commit id.
    `stage`: with params.yaml (x: 1) and a stage `evaluate` that copies it
    to out.txt."""
    path.mkdir()
    _git(["init", "-q"], path)
    subprocess.run([find_tool("dvc"), "init", "-q"], cwd=path, check=True)
    if stage:
        (path / "params.yaml").write_text("x: 1\n")
        add = [find_tool("dvc"), "stage", "add", "-q", "-n", "evaluate", "-p", "x"]
        add += ["-o", "out.txt", "cp params.yaml out.txt"]
        subprocess.run(add, cwd=path, check=True)
    _git(["add", "-A"], path)
    _git(["commit", "-q", "-m", "init"], path)
    return _git(["rev-parse", "HEAD"], path)


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
    assert [p.name for p in clone.parent.iterdir()] == ["a"]  # renamed into place


def test_the_group_cache_settings_go_to_the_clone(tmp_path: Path) -> None:
    origin = tmp_path / "origin"
    head = _project(origin)
    shared = tmp_path / "shared-cache"
    dvc = find_tool("dvc")
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


@pytest.fixture
def stop() -> Iterator[Stop]:
    """A `Stop`, this process's SIGUSR1 and SIGTERM handlers put back after."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    yield Stop()
    for sig, handler in kept.items():
        signal.signal(sig, handler)


def test_a_try_after_a_stopped_one_runs_its_cell_once(
    tmp_path: Path, stop: Stop, capfd: pytest.CaptureFixture[str]
) -> None:
    """A `dvc exp run` stopped between queueing its experiment and taking it
    off the queue leaves the entry in the clone's workspace stash (here put
    there as DVC's own queue puts it); the next try clears it, so the cell
    runs once and its experiment is the next try's."""
    origin = tmp_path / "origin"
    head = _project(origin, stage=True)
    clone = tmp_path / "cells" / "a"
    prepare_clone(origin, clone, head, [])
    stale = (
        "from dvc.repo import Repo; "
        "Repo('.').experiments.workspace_queue.put("
        "params={'params.yaml': ['x=2']}, targets=['evaluate'], name='a')"
    )
    python = str(Path(find_tool("dvc")).with_name("python"))
    subprocess.run([python, "-c", stale], cwd=clone, check=True, capture_output=True)
    assert _git(["for-each-ref", "--format=%(refname)", "refs/exps"], clone) == (
        "refs/exps/stash"
    )
    assert run_cell(clone, "a", ["-S", "x=2"], stop) == 0
    out = capfd.readouterr()
    assert (out.out + out.err).count("Reproducing experiment 'a'") == 1, out
    ref = exp_ref(head, "a")
    assert has_ref(clone, ref)
    assert _git(["show", f"{ref}:params.yaml"], clone) == "x: 2"
    assert (clone / "out.txt").read_text() == "x: 2\n"  # the stage ran on it
    assert not _git(["for-each-ref", "refs/exps/stash"], clone)  # queue empty


def test_a_try_after_a_stopped_one_clears_its_lock_files(
    tmp_path: Path, stop: Stop, caplog: pytest.LogCaptureFixture
) -> None:
    """A `dvc exp run` killed mid-write leaves git's and dulwich's lock files
    (`.git/index.lock`, `.git/objects/xx/<object>.lock`); git and DVC refuse
    to go on ("File exists"). The next try deletes them, says so, and runs."""
    origin = tmp_path / "origin"
    head = _project(origin, stage=True)
    clone = tmp_path / "cells" / "a"
    prepare_clone(origin, clone, head, [])
    stale = [clone / ".git/index.lock", clone / ".git/objects/42/7561.lock"]
    for path in stale:
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"")
    with caplog.at_level("INFO", logger="palpaper.cluster"):
        assert run_cell(clone, "a", ["-S", "x=3"], stop) == 0
    assert not [p for p in stale if p.exists()]
    assert (
        "cleared what a stopped try left: .git/index.lock, .git/objects/42/7561.lock"
        in caplog.messages
    )
    assert _git(["show", f"{exp_ref(head, 'a')}:params.yaml"], clone) == "x: 3"
