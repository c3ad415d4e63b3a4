"""docs/USAGE.md "From an empty folder to a table", run verbatim in a fresh
clone: a generated dataset of one's own (12 classes in the files layout, some
images missing and some texts empty) and a hub-layout ViLT linked as the
README says, then the block marked `ci: own-data`: its branch, `pal check`,
the pipeline on CPU settings, one cell of Tables 1-2, the plan and the SLURM
dry run priced from the listing, and back to the demo with main untouched."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from scratch_project import BIN, scratch_env
from test_paper_dataset import LINK, hub_cache, sh

from pipeline.fakes.trees import make_files_tree

ROOT = Path(__file__).resolve().parents[1]
USAGE = (ROOT / "docs" / "USAGE.md").read_text(encoding="utf-8")


def block(marker: str) -> str:
    found = re.search(rf"<!-- ci: {marker} -->\n```bash\n(.*?)```", USAGE, re.S)
    assert found, f"docs/USAGE.md has no block marked ci: {marker}"
    return found.group(1)


def git(project: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", *args], cwd=project, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


@pytest.mark.slow  # the pipeline on CPU, then one cell of seven methods
def test_own_data_from_an_empty_folder_to_a_table(tmp_path: Path) -> None:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    main = git(project, "rev-parse", "main")
    env = scratch_env(project)
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), PATH=f"{BIN}:/usr/bin:/bin")
    hub_cache(tmp_path / "hub")
    counts = make_files_tree(project / "data/raw/mine", classes=12)
    assert counts["image"] > 0 and counts["text"] > 0
    sh(project, env, LINK)
    out = sh(project, env, block("own-data"))

    # back on main, which no command moved or dirtied
    assert git(project, "branch", "--show-current") == "main"
    assert git(project, "rev-parse", "main") == main
    assert git(project, "status", "--porcelain", "--untracked-files=no") == ""
    # the run and the table are on the dataset's branch
    files = git(project, "ls-tree", "-r", "--name-only", "dataset/mine").split()
    assert "results/files/table.md" in files
    table = git(project, "show", "dataset/mine:results/paper/files/missing.md")
    rows = [r.split(" | ") for r in table.splitlines() if r.startswith("| Acc")]
    methods = ["MAP", "MSP", "L2P", "DualPrompt", "RebQ", "ACIL", "PAL"]
    assert [r[1] for r in rows][:7] == methods
    for r in rows[:7]:  # 10 % text missing ran: a number; 10 % image: not run
        assert re.fullmatch(r"\d+\.\d\d", r[2]), r
        assert r[3] == "–", r
    # the plan priced the dataset from its listing: 12 classes of 4 + 2
    plan = out.stdout.splitlines()
    size = next(line for line in plan if line.strip().startswith("size:"))
    assert size.strip() == (
        "size: 48 training and 24 test samples of 12 classes, from its "
        "listing at data/raw/mine"
    )
    limit = [line for line in plan if line.startswith("#SBATCH --time=")]
    assert limit and int(limit[0].split("=")[1]) > 10, plan
    metrics = json.loads(
        git(project, "show", "dataset/mine:results/files/metrics.json")
    )
    # PAL alone (its analytic and its BP head), one run, an accuracy after
    # each of the 4 steps
    assert (list(metrics), metrics["runs"]) == (["bp", "pal", "runs", "vary"], [0])
    assert len(metrics["pal"]["step_accuracy"]) == 4
