"""The paper's grids on a dataset laid out as the README says, through DVC's
real queue: a fresh clone, a Food101 tree of photo-sized JPEGs under
`data/raw/food101`, a hub-layout ViLT in the local HF cache linked by `pal
backbone --link`, then the README's "CPU smoke run" and "cpu-grid" blocks
run verbatim (both ignored folders reach every cell's temporary copy); and
MM-IMDb's smoke run and RebQ's cell (docs/USAGE.md, `ci: mmimdb-smoke`) on a
generated MM-IMDb tree."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import committed
from scratch_project import BIN, scratch_env

from pipeline.fakes.trees import make_food101_tree, make_hub_vilt, make_mmimdb_tree

ROOT = Path(__file__).resolve().parents[1]
README = committed("README.md")
LINK = "pal backbone dandelin/vilt-b32-mlm --link models/vilt-b32-mlm"


def block(marker: str, doc: str = "README.md") -> str:
    """The bash block after `<!-- ci: marker -->` in `doc` as committed."""
    text = README if doc == "README.md" else committed(doc)
    found = re.search(rf"<!-- ci: {marker} -->\n```bash\n(.*?)```", text, re.S)
    assert found, f"{doc} has no block marked ci: {marker}"
    return found.group(1)


def hub_cache(cache: Path) -> None:
    """dandelin/vilt-b32-mlm as huggingface_hub caches it: a random ViLT of 8
    layers of width 128, so the preset's prompts (layers 0-7, pools of 128)
    fit it, at 32-px images."""
    repo = cache / "models--dandelin--vilt-b32-mlm"
    make_hub_vilt(repo / "snapshots" / "0123abcd", layers=8, hidden=128)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0123abcd")


def sh(
    project: Path, env: dict[str, str], script: str
) -> subprocess.CompletedProcess[str]:
    """`script` under bash -euo pipefail in `project`; it must succeed."""
    out = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, f"{script}\n{out.stdout}\n{out.stderr}"
    return out


@pytest.mark.slow  # the smoke run, then one cell through DVC's queue
def test_the_readme_route_runs_the_papers_grids_on_a_real_layout(
    tmp_path: Path,
) -> None:
    project, env = linked_clone(tmp_path)
    make_food101_tree(project / "data/raw/food101", classes=11, train=2, test=1)
    assert LINK in " ".join(README.split())  # the README's words, wrapped
    sh(project, env, LINK)
    sh(project, env, block("cpu-smoke"))
    sh(project, env, block("cpu-grid"))

    folder = project / "results/paper/food101"
    departs = (
        "This run departs from the paper's protocol: 10 classes (the paper: 100); "
        "at most 1 sample per class and split (the paper: all); 1 epoch a task "
        "(the paper: 10); width 1024 (the paper: 15000); 1 run (the paper: 3); "
        "tune and extract on CPU (the paper: GPU)."
    )
    numbers = "In parentheses: the paper's UPMC-Food101 numbers. "
    # the missing grid: 1 of 15 cells ran, with the seven methods
    md = (folder / "missing.md").read_text(encoding="utf-8").splitlines()
    assert "Partial: 14 cells not run yet (marked –)." in md[0]
    assert numbers + departs in md[0]
    acc = {c[1]: c for c in (x.split(" | ") for x in md[4:]) if c[0] == "| Acc"}
    methods = ["MAP", "MSP", "L2P", "DualPrompt", "RebQ", "ACIL", "PAL"]
    assert list(acc)[:7] == methods  # the paper's order, then PAL's other rows
    # 10 % text missing is the first column: each method's number, the paper's
    # beside it (Table 1, UPMC-Food101)
    paper = {"MAP": "20.66", "RebQ": "68.67", "ACIL": "78.62", "PAL": "82.45"}
    for method, number in paper.items():
        assert re.fullmatch(rf"\d+\.\d\d \({number}\)", acc[method][2]), method
    # 10 % image missing: not run, marked – (the paper's number still beside)
    assert all(c[3].split(" ")[0] == "–" for c in acc.values())
    # no cell ran the demo, and no temporary copy was left behind
    assert not (project / "data/demo").exists()
    # the cell restored the smoke run's per-dataset stages from DVC's cache
    dvc = [str(BIN / "dvc"), "queue"]
    status = sh_out(project, env, [*dvc, "status"]).split()
    cell = [n for n in status if "-text+rate=0.1+" in n]
    assert len(cell) == 1 and cell[0].startswith(_head(project)), status
    logs = sh_out(project, env, [*dvc, "logs", cell[0]])
    assert "Running stage 'tune@rebq-0'" in logs, logs
    assert "Stage 'pixels' didn't change" in logs and "'demo'" not in logs
    assert sorted(p.name for p in (project / ".dvc/tmp/exps").glob("tmp*")) == []


def linked_clone(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A fresh clone of the project and its environment, with nothing on
    PATH but the venv and the system, and the hub ViLT in its HF cache."""
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    project = tmp_path / "project"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(project)], check=True)
    env = scratch_env(project)
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), PATH=f"{BIN}:/usr/bin:/bin")
    hub_cache(tmp_path / "hub")
    return project, env


@pytest.mark.slow  # the smoke run, then RebQ's cell through DVC's queue
def test_mmimdb_smoke_run_and_rebqs_cell_render_f1_fg_and_map(
    tmp_path: Path,
) -> None:
    """USAGE's MM-IMDb block verbatim on a generated tree (120 train, 10 dev,
    60 test films): `data.per_class: 1` keeps a test film in every task, the
    smoke run's table reads F1 with mAP's columns, and the grid's 70 % both
    cell gives the seven methods an F1, an FG and an mAP each (the
    baselines' from their BP heads), every other cell marked –."""
    project, env = linked_clone(tmp_path)
    make_mmimdb_tree(project / "data/raw/mmimdb", train=120, val=10, test=60)
    sh(project, env, LINK)
    script = block("mmimdb-smoke", "docs/USAGE.md")
    smoke = block("cpu-smoke").split("\n", 1)[1]  # the README's line, after its branch
    assert smoke in script
    sh(project, env, script)

    table = (project / "results/mmimdb/table.md").read_text(encoding="utf-8")
    header = table.splitlines()[2]
    assert header.startswith("|  | F1 | FG | FG_diag | AIA | Last |")
    assert header.endswith("| mAP | mAP FG | mAP FG_diag | mAP AIA | mAP Last |")
    tasks = project / "data/prepare/0/samples.jsonl"
    rows = [json.loads(line) for line in tasks.read_text().splitlines()]
    test_tasks = {r["task"] for r in rows if r["split"] == "test"}
    assert test_tasks == {1, 2, 3, 4, 5}

    md = (project / "results/paper/mmimdb/missing.md").read_text(encoding="utf-8")
    lines = md.splitlines()
    assert "Partial: 14 cells not run yet (marked –)." in lines[0]
    assert "Multi-label, scored as RebQ scores MM-IMDb" in lines[0]
    assert lines[2].split(" | ")[13] == "70% both"  # RebQ's cell, the 12th
    methods = ["MAP", "MSP", "L2P", "DualPrompt", "RebQ", "ACIL", "PAL"]
    for word in ("F1", "FG", "mAP"):
        block_rows = [x.split(" | ") for x in lines[4:]]
        cells = {c[1]: c[2:] for c in block_rows if c[0] == f"| {word}"}
        assert list(cells)[:7] == methods, word
        for method in methods:
            values = [*cells[method][:-1], cells[method][-1].removesuffix(" |")]
            assert re.fullmatch(r"\d+\.\d\d", values[11]), (word, method, values)
            assert values[:11] + values[12:] == ["–"] * 14, (word, method, values)


def sh_out(project: Path, env: dict[str, str], args: list[str]) -> str:
    return subprocess.run(
        args, cwd=project, env=env, capture_output=True, text=True
    ).stdout


def _head(project: Path) -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short=7", "HEAD"],
        cwd=project,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
