"""`pal dataset NAME`: a dataset's run on its own branch, and back with
`pal dataset demo`, in a tiny git + DVC project (one stage reading a param),
the command typed as a user types it: the venv's `pal`, nothing on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

PAL = str(Path(sys.executable).parent / "pal")
ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": os.environ.get("HOME", "/tmp"),
    "DVC_NO_ANALYTICS": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}
COUNT = (
    "import yaml; n = yaml.safe_load(open('params.yaml'))['n']; "
    "open('out.txt', 'w').write(str(n * 2))"
)
DVC_YAML = """stages:
  count:
    cmd: {python} -c "{count}"
    params: [n]
    outs: [out.txt]
  report:
    cmd: mkdir -p results && cp out.txt results/n.txt
    deps: [out.txt]
    outs:
      - results/n.txt:
          cache: false
"""


def run(root: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=root, env=ENV, capture_output=True, text=True)
    if ok:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def dvc(root: Path, *args: str) -> str:
    return run(root, str(Path(sys.executable).parent / "dvc"), *args).stdout


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A git + DVC project on `main` with the demo's run committed (n: 1)
    and a preset configs/tiny.yaml (n: 5)."""
    root = tmp_path / "p"
    root.mkdir()
    run(root, "git", "init", "-q", "-b", "main")
    dvc(root, "init", "-q")
    (root / "dvc.yaml").write_text(DVC_YAML.format(python=sys.executable, count=COUNT))
    (root / "params.yaml").write_text("n: 1\n")
    (root / "configs").mkdir()
    (root / "configs" / "tiny.yaml").write_text("n: 5\n")
    dvc(root, "repro", "-q")
    run(root, "git", "add", "-A")
    run(root, "git", "commit", "-q", "-m", "demo run")
    return root


def head(root: Path, ref: str = "main") -> str:
    return run(root, "git", "rev-parse", ref).stdout.strip()


def clean(root: Path) -> str:
    return run(root, "git", "status", "--porcelain", "--untracked-files=no").stdout


def test_a_dataset_runs_on_its_branch_and_demo_comes_back(project: Path) -> None:
    main = head(project)
    out = run(project, PAL, "dataset", "tiny").stdout
    assert out.splitlines() == [
        "dataset/tiny: new, params.yaml from " + str(project / "configs/tiny.yaml"),
        "on dataset/tiny: `pal check` then `dvc repro` runs its pipeline",
    ]
    assert (project / "params.yaml").read_text() == "n: 5\n"
    assert clean(project) == ""
    dvc(project, "repro", "-q")
    assert (project / "out.txt").read_text() == "10"

    out = run(project, PAL, "dataset", "demo").stdout
    assert out.splitlines()[0] == "dataset/tiny: committed the run's record (2 files)"
    assert run(project, "git", "branch", "--show-current").stdout.strip() == "main"
    assert head(project) == main and clean(project) == ""
    assert (project / "params.yaml").read_text() == "n: 1\n"
    assert (project / "out.txt").read_text() == "2"
    assert "up to date" in dvc(project, "status")

    # back again: the run is there, nothing to rerun
    run(project, PAL, "dataset", "tiny")
    assert (project / "out.txt").read_text() == "10"
    assert "up to date" in dvc(project, "status")
    count = run(project, "git", "rev-list", "--count", "main..dataset/tiny")
    assert count.stdout.strip() == "2"  # its params.yaml, then the run's record
    assert head(project, "main") == main


def test_uncommitted_work_on_main_stops_the_switch(project: Path) -> None:
    (project / "params.yaml").write_text("n: 3\n")
    done = run(project, PAL, "dataset", "tiny", ok=False)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: main: uncommitted changes to params.yaml: "
        "commit or `git stash` them first"
    )
    assert run(project, "git", "branch", "--list", "dataset/*").stdout == ""


def test_a_staged_rename_is_named_by_both_its_paths(project: Path) -> None:
    (project / "notes.txt").write_text("to read\n")
    run(project, "git", "add", "notes.txt")
    run(project, "git", "commit", "-q", "-m", "notes")
    run(project, "git", "mv", "notes.txt", "notes.md")
    done = run(project, PAL, "dataset", "tiny", ok=False)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        "Error: main: uncommitted changes to notes.md, notes.txt: "
        "commit or `git stash` them first"
    )


def test_an_unknown_preset_names_the_presets(project: Path) -> None:
    done = run(project, PAL, "dataset", "imdb", ok=False)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"Error: {project / 'configs/imdb.yaml'}: no such params file "
        "(presets: tiny; --params FILE for your own)"
    )
    assert run(project, "git", "branch", "--show-current").stdout.strip() == "main"


def test_own_params_make_the_branch(project: Path, tmp_path: Path) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text("n: 7\n")
    run(project, PAL, "dataset", "mine", "--params", str(own))
    assert (project / "params.yaml").read_text() == "n: 7\n"
    message = run(project, "git", "log", "-1", "--format=%s").stdout.strip()
    assert message == "mine: params.yaml from mine.yaml"


def test_settings_change_a_new_branch_params_keeping_comments(
    project: Path, tmp_path: Path
) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text("n: 7  # a count\ndata:\n  root: x  # the folder\n  tasks: 5\n")
    args = ["-S", "data.root=data/raw/mine", "-S", "data.tasks=4", "-S", "n=[1, 2]"]
    out = run(project, PAL, "dataset", "mine", "--params", str(own), *args).stdout
    assert (
        out.splitlines()[0] == f"dataset/mine: new, params.yaml from {own}, 3 keys set"
    )
    assert (project / "params.yaml").read_text() == (
        "n: [1, 2] # a count\ndata:\n  root: data/raw/mine # the folder\n  tasks: 4\n"
    )


def test_a_misspelt_setting_is_one_line_and_no_branch(
    project: Path, tmp_path: Path
) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text("data:\n  root: x\n")
    done = run(
        project,
        PAL,
        "dataset",
        "mine",
        "--params",
        str(own),
        "-S",
        "data.rot=y",
        ok=False,
    )
    assert (done.returncode, done.stderr.strip()) == (
        1,
        "Error: -S data.rot=y: mine.yaml has no key 'data.rot' (KEY=VALUE)",
    )
    assert run(project, "git", "branch", "--list", "dataset/*").stdout == ""


def test_leaving_a_branch_without_a_run_commits_nothing(project: Path) -> None:
    """The tiny project's results/ is the demo's; a branch that ran nothing
    leaves with no commit and comes back to main as it was."""
    shutil.rmtree(project / "results")
    run(project, "git", "commit", "-qam", "no results")
    run(project, PAL, "dataset", "tiny")
    out = run(project, PAL, "dataset", "demo").stdout
    assert out.splitlines() == [
        "on main: `pal check` then `dvc repro` runs its pipeline"
    ]
    count = run(project, "git", "rev-list", "--count", "main..dataset/tiny")
    assert count.stdout.strip() == "1"


def test_a_setting_or_a_file_that_is_no_yaml_is_one_line(
    project: Path, tmp_path: Path
) -> None:
    own = tmp_path / "mine.yaml"
    own.write_text("data:\n  root: x\n")
    args = ("dataset", "mine", "--params", str(own), "-S", "data.root=[1")
    done = run(project, PAL, *args, ok=False)
    assert (done.returncode, done.stderr.strip()) == (
        1,
        "Error: -S data.root=[1: '[1' is not a YAML value",
    )
    own.write_text("data: [\n")
    done = run(project, PAL, *args[:4], "-S", "data.root=y", ok=False)
    assert (done.returncode, done.stderr.strip()) == (
        1,
        f"Error: {own}: not valid YAML",
    )
    assert run(project, "git", "branch", "--list", "dataset/*").stdout == ""
