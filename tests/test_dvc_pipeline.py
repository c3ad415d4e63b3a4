"""The DVC pipeline end to end, with real `dvc` in a temporary git repository.

A copy of the project (code, dvc.yaml) with tiny params runs `dvc repro`; then
a change to `solve.eta` must rerun only `solve` and `evaluate`, reusing the
cached features, and a second `dvc repro` must do nothing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from scratch_project import BIN, TINY, make_scratch_project

pytestmark = pytest.mark.slow  # a real `dvc repro` of every stage: about 1.5 minutes

STAGES = ("demo", "prepare", "tune", "extract", "solve", "evaluate")


def _run(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(args)} failed:\n{out}"
    return out


def _ran(output: str) -> set[str]:
    return {s for s in STAGES if f"Running stage '{s}'" in output}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    path = tmp_path_factory.mktemp("pipeline")
    env = make_scratch_project(path, TINY)
    out = _run([str(BIN / "dvc"), "repro"], path, env)
    assert _ran(out) == set(STAGES), out
    return path, env


def test_repro_writes_results(repo: tuple[Path, dict[str, str]]) -> None:
    path, _ = repo
    for name in (
        "metrics.json",
        "accuracy_matrix.csv",
        "step_accuracy.csv",
        "step_accuracy.png",
    ):
        assert (path / "results" / name).stat().st_size > 0, name
    for step in ("step_01", "step_02"):
        assert (path / "data/extract" / step / "train.h5").is_file()
    assert (path / "data/solve/weights.h5").is_file()


def test_second_repro_runs_nothing(repo: tuple[Path, dict[str, str]]) -> None:
    path, env = repo
    out = _run([str(BIN / "dvc"), "repro"], path, env)
    assert _ran(out) == set(), out
    assert "Data and pipelines are up to date." in out


def test_eta_change_reruns_only_the_analytic_stages(
    repo: tuple[Path, dict[str, str]],
) -> None:
    path, env = repo
    params = yaml.safe_load((path / "params.yaml").read_text())
    params["solve"]["eta"] = 0.1
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    status = _run([str(BIN / "dvc"), "status"], path, env)
    # stage names are the unindented "name:" lines of `dvc status`
    changed = {
        line[:-1]
        for line in status.splitlines()
        if line.endswith(":") and not line[:1].isspace()
    }
    assert changed <= {"solve", "evaluate"} and "solve" in changed, status

    before = (path / "data/extract/step_01/train.h5").read_bytes()
    out = _run([str(BIN / "dvc"), "repro"], path, env)
    assert _ran(out) == {"solve", "evaluate"}, out
    assert (path / "data/extract/step_01/train.h5").read_bytes() == before


def test_queued_grid_reuses_cached_features(repo: tuple[Path, dict[str, str]]) -> None:
    path, env = repo
    dvc = str(BIN / "dvc")
    _run(["git", "add", "-A"], path, env)
    _run(["git", "commit", "-qm", "eta 0.1"], path, env)
    _run(
        [
            dvc,
            "exp",
            "run",
            "--queue",
            "-S",
            "solve.eta=0.5,2",
            "-S",
            "solve.width=128,256",
        ],
        path,
        env,
    )
    out = _run([dvc, "exp", "run", "--run-all"], path, env)
    assert out.count("Running stage 'solve'") == 4, out
    assert "Running stage 'extract'" not in out and "Running stage 'tune'" not in out
    table = _run(
        [
            dvc,
            "exp",
            "show",
            "--csv",
            "--drop",
            ".*",
            "--keep",
            "^solve.eta$|^solve.width$|^acc$",
        ],
        path,
        env,
    )
    rows = [line.split(",") for line in table.strip().splitlines()[1:]]
    # rows: the workspace, HEAD (eta 0.1, width 256), then the four experiments
    grid = {(r[-2], r[-1]): float(r[0]) for r in rows}
    for point in [("0.5", "128"), ("0.5", "256"), ("2", "128"), ("2", "256")]:
        assert 0.0 <= grid[point] <= 100.0, table
    assert len(rows) == 6, table


def test_shared_cache_lets_a_clone_skip_every_stage(
    repo: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    path, env = repo
    dvc = str(BIN / "dvc")
    _run(["git", "checkout", "-q", "--", "."], path, env)
    clone = tmp_path / "clone"
    _run(["git", "clone", "-q", str(path), str(clone)], tmp_path, env)
    _run([dvc, "cache", "dir", "--local", str(path / ".dvc" / "cache")], clone, env)
    out = _run([dvc, "repro"], clone, dict(env, PYTHONPATH=str(clone)))
    assert _ran(out) == set(), out
    assert (clone / "data/extract/step_02/test.h5").is_file()
