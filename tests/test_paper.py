"""`pal-paper`: the grids' cells, the rendered tables, the collector's errors.

The collector is run as a user types it, on a git repository whose finished
experiments are refs made by hand (as DVC stores them): no pipeline runs here.
`test_dvc_pipeline.py` runs a grid through DVC's queue end to end.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import committed, committed_params, pal_paper

from palpaper.collect import labelled
from palpaper.grids import RESULTS
from palpaper.overrides import Cell, make_cell
from palpaper.render import build, row_name
from palpaper.table import cell

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PARAMS = committed_params()
FOOD = yaml.safe_load(committed("configs/food101.yaml"))


def test_a_cell_keeps_only_the_keys_it_changes() -> None:
    c = make_cell(PARAMS, {"solve.eta": 1.0, "solve.width": 546})
    assert c.overrides == (("solve.width", 546),)  # eta 1.0 is the committed one
    assert c.name == "width=546"
    assert make_cell(PARAMS, {"data.missing_rate": 0.7}).name == "base"
    c = make_cell(PARAMS, {"pipelines.main": ["pal"], "prompt.layers": [2, 3]})
    assert c.name == "main=pal+layers=2-3"
    assert c.set_args == ["-S", "pipelines.main=[pal]", "-S", "prompt.layers=[2,3]"]
    assert c.describe() == "pipelines.main=[pal] prompt.layers=[2,3]"


def test_results_share_their_common_cells() -> None:
    missing = {c.key: c.cell for c in RESULTS["missing"].columns(PARAMS, [0])}
    steps = {c.key: c.cell for c in RESULTS["steps"].columns(PARAMS, [0])}
    assert len(missing) == 15 and len(steps) == 3
    assert steps["both-0.1"] == missing["both-0.1"]
    # both run pipelines.main and the paper's prompt baselines in every cell
    every = [*PARAMS["pipelines"]["main"], *PARAMS["pipelines"]["baselines"]]
    assert (
        steps["both-0.7"]
        == missing["both-0.7"]
        == Cell((("pipelines.main", every), ("protocol.runs", [0])))
    )
    # the type first, then the rate and the runs; the eight methods' list is
    # cut, its digest (of the whole name) keeps the name unique
    whole = f"text+rate=0.3+runs=0+main={'-'.join(every)}"
    digest = hashlib.sha256(whole.encode()).hexdigest()[:6]
    assert missing["text-0.3"].name == f"text+rate=0.3+runs=0+main_{digest}"


@pytest.mark.parametrize(
    "source", ["params.yaml", "configs/food101.yaml", "configs/n24news.yaml"]
)
def test_every_experiment_name_fits_40_characters(source: str) -> None:
    params = yaml.safe_load(committed(source))
    cells = {
        col.cell.describe(): col.cell
        for r in RESULTS.values()
        for runs in (None, [0], [0, 1, 2])
        for cite in ((False, True) if r.cites and source != "params.yaml" else (False,))
        for col in r.columns(params, runs, cite)
    }
    names = {c.name for c in cells.values()}
    assert len(names) == len(cells)  # one name per cell
    assert max(len(f"{'0' * 7}-{n}") for n in names) <= 40


def test_tables_1_2_run_acil_and_pal_whatever_main_a_rehearsal_committed() -> None:
    # the README's CPU smoke commits pipelines.main: [pal]; Tables 1-2's cells
    # still run ACIL (the frozen variant) and the five baselines beside PAL
    params = {**FOOD, "pipelines": {**FOOD["pipelines"], "main": ["pal"]}}
    cell = RESULTS["missing"].columns(params, None)[0].cell
    every = ["pal", "frozen", *FOOD["pipelines"]["baselines"]]
    assert cell.value(params, "pipelines.main") == every
    # the committed main comes first and is not repeated
    assert RESULTS["steps"].columns(FOOD, None)[0].cell.value(
        FOOD, "pipelines.main"
    ) == ["pal", "init", "frozen", *FOOD["pipelines"]["baselines"]]


def test_cells_are_chosen_by_name_or_by_column_key() -> None:
    from palpaper.overrides import GridError
    from palpaper.running import select_cells

    missing = {c.key: c.cell for c in RESULTS["missing"].columns(PARAMS, [0])}
    up = {c.key: c.cell for c in RESULTS["upsampling"].columns(PARAMS, [0])}
    # a column's key stands for its cell, in each result that has the key
    got = select_cells(
        ["missing", "upsampling"], PARAMS, [0], ["text-0.1", "8k-1"], None
    )
    assert got == [missing["text-0.1"], up["8k-1"]]
    name = missing["image-0.5"].name
    assert select_cells(["missing"], PARAMS, [0], [name, "image-0.5"], None) == [
        missing["image-0.5"]
    ]
    # both-0.1 is a column of missing and of steps: one cell, run once
    assert select_cells(["missing", "steps"], PARAMS, [0], ["both-0.1"], None) == [
        missing["both-0.1"]
    ]
    with pytest.raises(GridError, match=r"^--cells: no cell '8k-1' in missing "):
        select_cells(["missing"], PARAMS, [0], ["8k-1"], None)


def test_the_grids_follow_the_dataset() -> None:
    demo = [c.cell.name for c in RESULTS["upsampling"].columns(PARAMS, None)]
    assert demo == ["width=546", "base", "eta=0.5", "eta=0.1", "width=1365"]
    food = [c.cell.name for c in RESULTS["upsampling"].columns(FOOD, None)]
    assert food == ["width=8000", "base", "eta=0.5", "eta=0.1", "width=20000"]
    ks = [
        c.cell.value(FOOD, "data.tasks") for c in RESULTS["tasks"].columns(FOOD, None)
    ]
    assert ks == [5, 10, 20, 50]
    ks = [
        c.cell.value(PARAMS, "data.tasks")
        for c in RESULTS["tasks"].columns(PARAMS, None)
    ]
    assert all(PARAMS["demo"]["n_classes"] % k == 0 for k in ks)


def stat(mean: float, std: float | None) -> dict:
    return {"mean": mean, "std": std, "runs": []}


def metrics(acc: float, runs: list[int]) -> dict:
    """A report's metrics.json whose numbers follow from `acc`."""
    std = None if len(runs) == 1 else 1.5
    row = {
        "acc": stat(acc, std),
        "fg": stat(acc / 10, std),
        "acc_by_task": {"first": stat(acc - 2, std), "later": stat(acc + 2, std)},
        "step_accuracy": [stat(acc + 10, std), stat(acc, std)],
    }
    # each row's label and paper name, as the report writes them from params
    names = {
        "pal": {"label": "PAL (prompts + AL)", "paper": "PAL"},
        "bp": {"label": "w/o AL module (BP head)", "paper": "w/o AL module"},
        "frozen": {
            "label": "w/o prompt module (ACIL on frozen features)",
            "paper": {"missing": "ACIL", "ablation": "w/o prompt module"},
        },
        "init": {"label": "prompts at init, never trained + AL"},
        **{
            v: {"label": f"{name}, BP head", "paper": name}
            for v, name in (
                ("map", "MAP"),
                ("msp", "MSP"),
                ("l2p", "L2P"),
                ("dualprompt", "DualPrompt"),
                ("rebq", "RebQ"),
            )
        },
    }
    return {"runs": runs, "vary": [], **{k: {**row, **v} for k, v in names.items()}}


def test_cells_with_the_papers_numbers_beside() -> None:
    assert cell(stat(72.0, 0.5), 72.59) == "72.00 ± 0.50 (72.59)"
    assert cell(stat(72.0, None), None) == "72.00"
    assert cell(None, 4.92) == "– (4.92)"
    r = RESULTS["upsampling"]
    cols = r.columns(FOOD, None)
    data = {c.key: metrics(70.0 + i, [0, 1, 2]) for i, c in enumerate(cols)}
    table = build(r, cols, data, "food101", "pal-paper run upsampling")
    assert table.markdown().splitlines() == [
        "Table 4 of the paper: Up-sampling width and regularisation η; "
        "UPMC-Food101, mean ± sample std over 3 runs per cell (0, 1, 2). In "
        "parentheses: the paper's UPMC-Food101 numbers. Made by `pal-paper run "
        "upsampling`.",
        "",
        "| Width and η | Acc | FG |",
        "|---|---|---|",
        "| 8000 (8k), η 1 | 70.00 ± 1.50 (71.85) | 7.00 ± 1.50 (6.50) |",
        "| 15000 (15k), η 1 | 71.00 ± 1.50 (72.59) | 7.10 ± 1.50 (4.92) |",
        "| 15000 (15k), η 0.5 | 72.00 ± 1.50 (72.45) | 7.20 ± 1.50 (4.00) |",
        "| 15000 (15k), η 0.1 | 73.00 ± 1.50 (67.54) | 7.30 ± 1.50 (5.29) |",
        "| 20000 (20k), η 1 | 74.00 ± 1.50 (72.39) | 7.40 ± 1.50 (4.43) |",
    ]
    assert table.csv().splitlines()[:2] == [
        "Width and η,Acc mean,Acc std,Acc paper,FG mean,FG std,FG paper",
        '"8000 (8k), η 1",70.0000,1.5000,71.8500,7.0000,1.5000,6.5000',
    ]


def test_tables_1_2_in_the_papers_layout() -> None:
    r = RESULTS["missing"]
    cols = r.columns(FOOD, None)
    data = {c.key: metrics(60.0, [0, 1, 2]) for c in cols}
    lines = build(r, cols, data, "food101", "pal-paper run missing").markdown()
    lines = lines.splitlines()
    assert lines[2] == (
        "| Metric | Method | 10% text missing | 10% image missing | 10% both | "
        "30% text missing | 30% image missing | 30% both | 50% text missing | "
        "50% image missing | 50% both | 70% text missing | 70% image missing | "
        "70% both | 90% text missing | 90% image missing | 90% both |"
    )
    # the seven methods in the paper's order, each by its paper name (params
    # `paper`) with the paper's Table 1 row beside every cell
    names = [line.split(" | ")[1] for line in lines[4:11]]
    assert names == ["MAP", "MSP", "L2P", "DualPrompt", "RebQ", "ACIL", "PAL"]
    assert lines[4].startswith("| Acc | MAP | 60.00 ± 1.50 (20.66) |")
    assert lines[8].endswith("| 60.00 ± 1.50 (54.67) |")  # RebQ, 90 % both
    assert lines[9].startswith("| Acc | ACIL | 60.00 ± 1.50 (78.62) |")
    assert lines[10].startswith(
        "| Acc | PAL | 60.00 ± 1.50 (82.45) | 60.00 ± 1.50 (84.66) | "
        "60.00 ± 1.50 (83.50) | 60.00 ± 1.50 (76.80) |"
    )
    assert lines[10].endswith("| 60.00 ± 1.50 (69.69) |")
    # rows the paper has not: by their label, no number beside
    assert lines[11].startswith("| Acc | w/o AL module | 60.00 ± 1.50 |")
    assert lines[12].startswith("| Acc | prompts at init, never trained + AL | 60.00")
    # an FG line of the paper's rows carries the note on its FG form
    # (tests/test_paper_cited.py checks the notes)
    assert lines[13].startswith("| FG | MAP⁵ | 6.00 ± 1.50 (82.50) |")
    assert lines[19].endswith("| 6.00 ± 1.50 (5.32) |")  # FG, PAL, 90 % both
    table_end = 4 + 2 * len(r.rows)
    assert lines[table_end] == "" and lines[table_end + 1].startswith("¹ ")
    assert len(lines) == table_end + 2 * 6  # six notes, a blank line before each


def test_tables_1_2_of_a_multi_label_dataset_read_f1_fg_diag_and_map() -> None:
    """MM-IMDb's rows (metrics scored by macro F1, `measure`) fill Tables
    1-2's blocks with RebQ's metrics: F1, its forgetting (fg_diag, not the
    paper's max-drop fg) and mAP; the paper has no MM-IMDb numbers beside."""
    mmimdb = yaml.safe_load(committed("configs/mmimdb.yaml"))
    r = RESULTS["missing"]
    cols = r.columns(mmimdb, None)
    data = {}
    for c in cols:
        m = metrics(40.0, [0, 1, 2])
        for row in r.rows:
            m[row] |= {
                "measure": "macro_f1",
                "threshold": 0.3,
                "fg_diag": stat(3.0, 0.5),
                "map": {"acc": stat(55.0, 0.25)},
            }
        data[c.key] = m
    lines = build(r, cols, data, "mmimdb", "pal-paper run missing").markdown()
    lines = lines.splitlines()
    assert lines[0].startswith("Tables 1-2 of the paper: ")
    assert lines[0].endswith(
        "The paper gives no MM-IMDb numbers for this result. "
        "Made by `pal-paper run missing`."
    )
    assert (
        "(0, 1, 2). Multi-label, scored as RebQ scores MM-IMDb: F1 is the macro "
        "F1 of the labels whose score exceeds 0.3 (the ridge's raw score; a BP "
        "head's logit through a sigmoid), FG RebQ's forgetting (fg_diag: a "
        "task's F1 right after it was learnt minus its final F1), mAP the macro "
        "mean average precision. The paper gives"
    ) in lines[0]
    n = len(r.rows)
    words = [line.split(" | ")[0] for line in lines[4 : 4 + 3 * n]]
    assert words == ["| F1"] * n + ["| FG"] * n + ["| mAP"] * n
    assert lines[4].startswith("| F1 | MAP | 40.00 ± 1.50 | 40.00 ± 1.50 |")
    assert lines[4 + n].startswith("| FG | MAP | 3.00 ± 0.50 |")
    assert lines[4 + 2 * n].startswith("| mAP | MAP | 55.00 ± 0.25 |")
    assert lines[4 + 3 * n :] == []  # no paper numbers, so no notes


def test_another_papers_numbers_stand_beside_a_multi_label_grid(monkeypatch) -> None:
    """A dataset's numbers from another paper (published.yaml's `sources`):
    RebQ's on MM-IMDb go in parentheses beside F1 (`acc`) and RebQ's FG
    (`fg_diag`), none beside mAP, and the caption names their source. The
    numbers here are made up; published.yaml records none for MM-IMDb."""
    import palpaper.render as render

    real = render.published()
    cells = [None] * 15
    made_up = {
        "acc": {"RebQ": [*cells[:11], 51.5, *cells[12:]]},
        "fg_diag": {"RebQ": [*cells[:11], 6.25, *cells[12:]]},
    }
    fake = {
        **real,
        "missing": {**real["missing"], "mmimdb": made_up},
        "sources": {"mmimdb": "RebQ's (its Table 9)"},
    }
    monkeypatch.setattr(render, "published", lambda: fake)
    mmimdb = yaml.safe_load(committed("configs/mmimdb.yaml"))
    r = RESULTS["missing"]
    cols = r.columns(mmimdb, None)
    data = {}
    for c in cols:
        m = metrics(40.0, [0])
        for row in r.rows:
            m[row] |= {
                "measure": "macro_f1",
                "threshold": 0.5,
                "fg_diag": stat(3.0, None),
                "map": {"acc": stat(55.0, None)},
            }
        data[c.key] = m
    md = build(r, cols, data, "mmimdb", "pal-paper run missing").markdown()
    lines = md.splitlines()
    assert "In parentheses: RebQ's (its Table 9) MM-IMDb numbers." in lines[0]
    rows = {tuple(x.split(" | ")[:2]): x.split(" | ") for x in lines[4:]}
    assert rows[("| F1", "RebQ")][13] == "40.00 (51.50)"  # 70 % both
    assert rows[("| F1", "RebQ")][2] == "40.00"  # no number of RebQ's there
    assert rows[("| FG", "RebQ")][13] == "3.00 (6.25)"
    assert rows[("| mAP", "RebQ")][13] == "55.00"
    assert rows[("| F1", "PAL")][13] == "40.00"


def test_the_demo_says_there_is_nothing_to_compare() -> None:
    r = RESULTS["stability"]
    cols = r.columns(PARAMS, [0])
    data = {c.key: metrics(50.0, [0]) for c in cols}
    md = build(r, cols, data, "demo", "pal-paper run stability --runs 0").markdown()
    assert md.splitlines() == [
        "Figure (stability and plasticity) of the paper: Accuracy (%) after the "
        "last step on the first task's classes (stability) and on the later "
        "tasks' (plasticity), with and without the AL module; the demo dataset, "
        "one run per cell (run 0), no spread. The paper reports no numbers for "
        "demo: there is nothing to compare, and the cells show what this "
        "pipeline does at its scale. Made by `pal-paper run stability --runs 0`.",
        "",
        "| Method | first task (stability) | later tasks (plasticity) |",
        "|---|---|---|",
        "| PAL | 48.00 | 52.00 |",
        "| w/o AL module | 48.00 | 52.00 |",
    ]


# --- the collector on hand-made experiments -------------------------------


def git(repo: Path, *args: str, stdin: str | None = None) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
    }
    out = subprocess.run(
        ["git", *args],
        cwd=repo,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


def fake_experiment(
    repo: Path,
    base: str,
    cell: Cell,
    m: dict,
    files: dict[str, bytes] | None = None,
    dataset: str = "demo",
    params: bool = True,
) -> None:
    """A commit holding results/<dataset>/metrics.json (and `files` beside
    it) and, as DVC commits it, params.yaml with the cell's overrides (none
    with `params=False`: a ref that only bears the cell's name), under DVC's
    ref for the cell."""
    blobs = {"metrics.json": json.dumps(m).encode(), **(files or {})}
    entries = ""
    for file, data in sorted(blobs.items()):
        entries += f"100644 blob {_blob(repo, data)}\t{file}\n"
    # a folder below the report (the committed ablation copy) is not the report
    sub = git(repo, "mktree", stdin=entries.split("\n")[0] + "\n")
    tree = git(repo, "mktree", stdin=entries + f"040000 tree {sub}\tablation\n")
    for folder in (dataset, "results"):
        tree = git(repo, "mktree", stdin=f"040000 tree {tree}\t{folder}\n")
    if params:
        raw = yaml.safe_load(git(repo, "show", f"{base}:params.yaml"))
        for key, value in cell.overrides:
            *path, last = key.split(".")
            node = raw
            for part in path:
                node = node[part]
            node[last] = list(value) if isinstance(value, tuple) else value
        blob = _blob(repo, yaml.safe_dump(raw).encode())
        listing = git(repo, "ls-tree", tree) + f"\n100644 blob {blob}\tparams.yaml\n"
        tree = git(repo, "mktree", stdin=listing)
    commit = git(repo, "commit-tree", tree, "-p", base, "-m", cell.name)
    ref = f"refs/exps/{base[:2]}/{base[2:]}/{base[:7]}-{cell.name}"
    git(repo, "update-ref", ref, commit)


def _blob(repo: Path, data: bytes) -> str:
    path = repo / ".git" / "blob"
    path.write_bytes(data)  # a file, so that binary bytes go in whole
    return git(repo, "hash-object", "-w", str(path))


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, str]:
    if shutil.which("git") is None:
        pytest.skip("git not installed")
    repo = tmp_path / "project"
    repo.mkdir()
    (repo / "params.yaml").write_text(committed("params.yaml"))
    git(repo, "init", "-q")
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=repo, check=True)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "project")
    return repo, git(repo, "rev-parse", "HEAD")


def paper(repo: Path, *args: str) -> subprocess.CompletedProcess:
    """`pal-paper` as a user types it: nothing on PATH but the system's."""
    env = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return pal_paper(repo, {**env, "DVC_NO_ANALYTICS": "1"}, *args)


def test_a_missing_cell_is_one_line_naming_it_and_the_rerun(
    project: tuple[Path, str],
) -> None:
    repo, base = project
    cols = RESULTS["upsampling"].columns(PARAMS, None)
    for i, c in enumerate(cols):
        if c.cell.name != "eta=0.1":
            fake_experiment(repo, base, c.cell, metrics(50.0 + i, [0, 1, 2]))
    out = paper(repo, "collect", "upsampling")
    assert out.returncode == 0, out.stderr  # a partial grid, its missing cell marked
    assert out.stderr.splitlines()[0] == (
        "WARNING palpaper.collect: upsampling: 1 of 5 cells marked – (no finished "
        f"experiment on {base[:7]}: eta=0.1); run them: pal-paper run upsampling "
        "--cells eta=0.1"
    )
    md = (repo / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert "Partial: 1 cell not run yet (marked –)." in md[0]
    assert md[7] == "| 1024 (15k), η 0.1 | – | – |"
    (eta01,) = [c.cell for c in cols if c.cell.name == "eta=0.1"]
    fake_experiment(repo, base, eta01, metrics(60.0, [0, 1, 2]))
    out = paper(repo, "collect", "upsampling")
    assert out.returncode == 0, out.stderr
    md = (repo / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert md[4:] == [
        "| 546 (8k), η 1 | 50.00 ± 1.50 | 5.00 ± 1.50 |",
        "| 1024 (15k), η 1 | 51.00 ± 1.50 | 5.10 ± 1.50 |",
        "| 1024 (15k), η 0.5 | 52.00 ± 1.50 | 5.20 ± 1.50 |",
        "| 1024 (15k), η 0.1 | 60.00 ± 1.50 | 6.00 ± 1.50 |",
        "| 1365 (20k), η 1 | 54.00 ± 1.50 | 5.40 ± 1.50 |",
    ]
    assert sorted(p.name for p in (repo / "results/paper/demo").iterdir()) == [
        "upsampling.csv",
        "upsampling.md",
    ]


def test_a_ref_named_for_a_cell_without_its_params_is_not_that_cell(
    project: tuple[Path, str],
) -> None:
    """A ref bearing a cell's name whose commit lacks the cell's params (a
    copied or hand-made ref) is never rendered as that cell: it is marked –
    and named with its rerun, and status does not call it finished."""
    repo, base = project
    cols = RESULTS["upsampling"].columns(PARAMS, None)
    for i, c in enumerate(cols):
        fake_experiment(repo, base, c.cell, metrics(50.0 + i, [0, 1, 2]), params=i != 4)
    out = paper(repo, "collect", "upsampling")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0].startswith(
        "WARNING palpaper.collect: upsampling: 1 of 5 cells marked – (no finished "
        f"experiment on {base[:7]}: {cols[4].cell.name})"
    )
    md = (repo / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert md[8] == "| 1365 (20k), η 1 | – | – |"


def test_a_damaged_queue_file_is_named_and_finished_cells_still_render(
    project: tuple[Path, str],
) -> None:
    repo, base = project
    cols = RESULTS["upsampling"].columns(PARAMS, None)
    for i, c in enumerate(cols[:4]):
        fake_experiment(repo, base, c.cell, metrics(50.0 + i, [0, 1, 2]))
    damaged = Path(".dvc/tmp/exps/celery/broker/in/task.msg")
    (repo / damaged).parent.mkdir(parents=True)
    (repo / damaged).write_text('{"body": "cut')
    out = paper(repo, "collect", "upsampling")
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines()[0].startswith(
        f"WARNING palpaper.collect: {damaged}: a damaged file in DVC's queue ("
    )
    assert out.stderr.splitlines()[0].endswith(
        f"`rm {damaged}` (finished cells are kept: they are experiments, not "
        "queue files)"
    )
    md = (repo / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert md[4] == "| 546 (8k), η 1 | 50.00 ± 1.50 | 5.00 ± 1.50 |"
    out = paper(repo, "run", "upsampling", "--no-wait")
    assert out.returncode == 1
    (line,) = [x for x in out.stderr.splitlines() if x.startswith("Error")]
    assert line.startswith(f"Error: {damaged}: a damaged file in DVC's queue ("), line
    (repo / damaged).unlink()  # the repair the line names
    out = paper(repo, "collect", "upsampling")
    assert out.returncode == 0 and "damaged" not in out.stderr, out.stderr


def test_figures_are_written_as_png_and_pdf(project: tuple[Path, str]) -> None:
    repo, base = project
    for c in RESULTS["steps"].columns(PARAMS, [0]):
        fake_experiment(repo, base, c.cell, metrics(40.0, [0]))
    out = paper(repo, "collect", "steps", "--runs", "0")
    assert out.returncode == 0, out.stderr
    folder = repo / "results/paper/demo"
    assert (folder / "steps.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (folder / "steps.pdf").read_bytes()[:5] == b"%PDF-"
    md = (folder / "steps.md").read_text().splitlines()
    assert md[2] == "| Scenario | Method | step 1 | step 2 |"
    assert md[4] == "| missing rate 0.1 | MAP | 50.00 | 40.00 |"
    assert md[10] == "| missing rate 0.1 | PAL | 50.00 | 40.00 |"
    first = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert paper(repo, "collect", "steps", "--runs", "0").returncode == 0
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == first  # same bytes


def test_run_refuses_a_dirty_workspace_and_unknown_names(
    project: tuple[Path, str],
) -> None:
    repo, _ = project
    (repo / "params.yaml").write_text((repo / "params.yaml").read_text() + "\n")
    out = paper(repo, "run", "table9")  # the arguments first, then the workspace
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "Error: no result 'table9'; the results: missing, steps, ablation, "
        "prompt, upsampling, tasks, stability, heads"
    )
    out = paper(repo, "run", "upsampling")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "Error: uncommitted changes (params.yaml): the cells are experiments on "
        "HEAD; commit or stash them first"
    )


def test_its_own_rendered_tables_never_block_the_next_run(
    project: tuple[Path, str],
) -> None:
    repo, _ = project
    table = repo / "results/paper/demo/upsampling.md"
    table.parent.mkdir(parents=True)
    table.write_text("an earlier run's table\n")
    git(repo, "add", "results")
    git(repo, "commit", "-qm", "tables")
    table.write_text("this run's table\n")  # what `pal-paper run` rewrites
    # past the workspace check: the next check is the one of --cells
    out = paper(repo, "run", "upsampling", "--cells", "nosuch")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "Error: --cells: no cell 'nosuch' in upsampling (`pal-paper list` names them)"
    )


def test_a_params_file_without_a_key_the_grids_read_is_one_line(tmp_path: Path) -> None:
    params = {k: v for k, v in PARAMS.items() if k != "pipelines"}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(params))
    out = paper(tmp_path, "list", "--params", "p.yaml")
    assert out.returncode == 1
    assert out.stderr.strip() == "Error: p.yaml: no key 'pipelines.main'"
    out = paper(tmp_path, "plan", "all", "--params", "nope.yaml")
    assert out.stderr.strip() == "Error: nope.yaml: params file not found"


# --- before queuing, and after a killed worker ---------------------------------


def test_run_checks_every_cell_before_queuing_anything(
    project: tuple[Path, str],
) -> None:
    """A committed typo stops `pal-paper run` at once in one line; so does a
    cell whose params the backbone cannot take, each line naming its cell."""
    from pipeline.fakes.trees import make_hub_vilt

    repo, _ = project
    text = (repo / "params.yaml").read_text()
    (repo / "params.yaml").write_text(text.replace("  epochs: 3", "  epoch: 3"))
    git(repo, "commit", "-qam", "typo")
    out = paper(repo, "run", "upsampling")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "Error: params.yaml: unknown key 'tune.epoch' (did you mean 'tune.epochs'?)"
    )
    make_hub_vilt(repo / "models/vilt")  # 2 layers of hidden size 32, not in git
    text = text.replace("  backbone: data/demo/vilt", "  backbone: models/vilt")
    (repo / "params.yaml").write_text(text)
    git(repo, "commit", "-qam", "a backbone of 2 layers")
    out = paper(repo, "run", "prompt")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        "Error: cell 'main=pal+layers=3' (pipelines.main=[pal] prompt.layers=[3]): "
        "params.yaml: prompt.layers [3]: layer 3 is beyond the backbone's 2 layers "
        "(0..1) (model.backbone 'models/vilt')",
        "Error: cell 'main=pal+layers=2-3' (pipelines.main=[pal] prompt.layers="
        "[2,3]): params.yaml: prompt.layers [2, 3]: layer 2 is beyond the "
        "backbone's 2 layers (0..1) (model.backbone 'models/vilt')",
        "Error: cell 'main=pal+layers=0-1-2-3' (pipelines.main=[pal] prompt.layers="
        "[0,1,2,3]): params.yaml: prompt.layers [0, 1, 2, 3]: layer 2 is beyond the "
        "backbone's 2 layers (0..1) (model.backbone 'models/vilt')",
        "Error: cell 'main=pal+pool=40' (pipelines.main=[pal] prompt.pool_size"
        "=40): params.yaml: prompt.pool_size 40 exceeds the hidden size 32: "
        "orthogonal keys need pool_size ≤ 32 (model.backbone 'models/vilt')",
    ]
    assert not (repo / ".dvc/tmp/exps/celery").exists()  # nothing was queued


def test_ctrl_c_stops_the_workers_or_says_how_to() -> None:
    """Ctrl-C stops DVC's queue and the pinned workers (`Repo.stop`); where
    that fails, the line says the workers may go on and how to stop them.
    tests/test_paper_gpus.py interrupts a real grid."""
    from palpaper import running
    from palpaper.tools import ExperimentError

    class Stops:
        stopped = 0

        def stop(self) -> None:
            self.stopped += 1

    class Refuses:
        def stop(self) -> None:
            raise ExperimentError("dvc queue stop --kill: no queue")

    repo = Stops()
    line = running.interrupted(repo, "pal-paper run upsampling --runs 0")  # type: ignore[arg-type]
    assert repo.stopped == 1
    assert line == (
        "interrupted: the grid's workers and their cells were stopped; finished "
        "cells are kept, `pal-paper run upsampling --runs 0` runs the rest"
    )
    line = running.interrupted(Refuses(), "pal-paper run tasks")  # type: ignore[arg-type]
    assert line == (
        "interrupted; DVC's queue workers may go on with the grid (`dvc queue "
        "status`): `dvc queue stop --kill` stops them, and `pal-paper run tasks` "
        "resumes the grid"
    )


def test_a_killed_tasks_temporary_copy_is_removed(project: tuple[Path, str]) -> None:
    """DVC's info file of a task names its temporary copy; a worker killed
    mid-cell leaves that folder, which the next run removes (only it)."""
    from palpaper.experiments import Repo

    repo, _ = project
    exps = repo / ".dvc/tmp/exps"
    for task, name in (("aaa", "abc1234-eta=0.1"), ("bbb", "abc1234-eta=0.5")):
        (exps / f"tmp{task}" / "data").mkdir(parents=True)
        (exps / f"tmp{task}" / "data" / "blob").write_bytes(b"x" * 100)
        info = exps / "run" / task / f"{task}.run"
        info.parent.mkdir(parents=True)
        info.write_text(
            json.dumps({"name": name, "root_dir": str(exps / f"tmp{task}")})
        )
    outside = repo / "elsewhere"
    outside.mkdir()
    info = exps / "run" / "ccc" / "ccc.run"
    info.parent.mkdir(parents=True)
    info.write_text(json.dumps({"name": "abc1234-eta=0.1", "root_dir": str(outside)}))
    removed = Repo(repo).remove_copies("abc1234-eta=0.1")
    assert removed == [(exps / "tmpaaa").resolve()]
    assert sorted(p.name for p in exps.glob("tmp*")) == ["tmpbbb"]
    assert outside.is_dir()  # never a folder outside .dvc/tmp/exps


def test_a_caption_says_how_the_run_departs_from_the_papers_protocol() -> None:
    """Beside the paper's numbers, the caption and the CSV name each way the
    run differs from the paper's protocol; what the result varies (Table 4's
    width) is no departure, and the paper's own settings say nothing."""
    from palpaper.departures import departures

    smoke = yaml.safe_load(yaml.safe_dump(FOOD))
    smoke["data"].update(tasks=5, per_class=1)
    smoke["tune"].update(device="cpu", epochs=1)
    smoke["solve"]["width"] = 1024
    r = RESULTS["upsampling"]
    cols = r.columns(smoke, [0])
    data = {c.key: metrics(5.0, [0]) for c in cols}
    departs = departures(smoke, cols, [0], classes=10)
    assert departs == [
        "5 tasks (the paper: 10)",
        "10 classes (the paper: 100)",
        "at most 1 sample per class and split (the paper: all)",
        "1 epoch a task (the paper: 10)",
        "1 run (the paper: 3)",
        "tune and extract on CPU (the paper: GPU)",
    ]
    table = build(r, cols, data, "food101", "pal-paper run upsampling", departs)
    assert table.markdown().splitlines()[0] == (
        "Table 4 of the paper: Up-sampling width and regularisation η; "
        "UPMC-Food101, one run per cell (run 0), no spread. In parentheses: the "
        "paper's UPMC-Food101 numbers. This run departs from the paper's "
        "protocol: " + "; ".join(departs) + ". Made by `pal-paper run upsampling`."
    )
    csv = table.csv().splitlines()
    assert csv[0].endswith(",departs from the paper's protocol")
    assert csv[1] == (
        '"546 (8k), η 1",5.0000,,71.8500,0.5000,,6.5000,' + "; ".join(departs)
    )
    # the paper's protocol itself: nothing to say; a width off the paper's in
    # a result that does not vary it is a departure
    assert departures(FOOD, cols, [0, 1, 2], classes=100) == []
    tasks = RESULTS["tasks"].columns(smoke, [0])
    assert "width 1024 (the paper: 15000)" in departures(smoke, tasks, [0], 10)
    assert "5 tasks (the paper: 10)" not in departures(smoke, tasks, [0], 10)


def test_collect_names_the_rev_the_cells_ran_on(project: tuple[Path, str]) -> None:
    """Cells finished on a commit that HEAD has moved past: the hint names
    `--rev` with that commit, and `collect --rev` renders them."""
    repo, base = project
    for i, c in enumerate(RESULTS["upsampling"].columns(PARAMS, None)):
        if i != 4:
            fake_experiment(repo, base, c.cell, metrics(50.0, [0, 1, 2]))
    (repo / "notes.txt").write_text("a later commit\n")
    git(repo, "add", "notes.txt")
    git(repo, "commit", "-qm", "later")
    head = git(repo, "rev-parse", "HEAD")
    out = paper(repo, "collect", "upsampling")
    assert out.returncode == 1
    lacking = ",".join(c.cell.name for c in RESULTS["upsampling"].columns(PARAMS, None))
    assert out.stderr.splitlines()[:2] == [
        f"WARNING palpaper.collect: upsampling: 5 of 5 cells marked – (no finished "
        f"experiment on {head[:7]}: {lacking.replace(',', ', ')}); run them: "
        f"pal-paper run upsampling --cells {lacking} (4 of them finished on "
        f"{base[:7]}, not {head[:7]}: `pal-paper collect upsampling --rev "
        f"{base[:7]}` renders those)",
        f"Error: upsampling: none of its 5 cells finished on {head[:7]}; nothing "
        "written (run: pal-paper run upsampling)",
    ]
    out = paper(repo, "collect", "upsampling", "--rev", base[:7])
    assert out.returncode == 0, out.stderr
    md = (repo / "results/paper/demo/upsampling.md").read_text().splitlines()
    assert "Partial: 1 cell not run yet (marked –)." in md[0]
    assert md[8] == "| 1365 (20k), η 1 | – | – |"


def test_table_3s_cell_runs_the_whole_ablation_and_its_report_is_kept(
    project: tuple[Path, str],
) -> None:
    """Table 3's one cell runs pipelines.main's variants, then
    pipelines.ablation's, in one experiment; collect renders Table 3 from it
    and copies what its evaluate stage wrote to results/demo/ (every file
    there, bytes whole) into results/demo/ablation/; a later run is not
    refused for that copy."""
    repo, base = project
    (col,) = RESULTS["ablation"].columns(PARAMS, None)
    every = [*PARAMS["pipelines"]["main"], *PARAMS["pipelines"]["ablation"]]
    assert every[:3] == ["pal", "init", "frozen"] and len(every) == 9
    assert col.cell == Cell((("pipelines.main", every),))
    m = metrics(50.0, [0, 1, 2]) | {"shared": {}, "vector": {}}
    m["shared"] = m["vector"] = m["pal"]
    png = b"\x89PNG\r\n\x1a\n\x00\xff\r\n"  # bytes a text read would mangle
    report = {"table.md": b"| the cell's table |\n", "step_accuracy.png": png}
    fake_experiment(repo, base, col.cell, m, report)
    out = paper(repo, "collect", "ablation")
    assert out.returncode == 0, out.stderr
    kept = repo / "results/demo/ablation"
    assert {p.name: p.read_bytes() for p in kept.iterdir()} == {
        "metrics.json": json.dumps(m).encode(),
        **report,
    }
    assert f"ablation: the cell's report in {kept} (3 files)" in out.stderr
    md = (repo / "results/paper/demo/ablation.md").read_text().splitlines()
    assert md[4] == "| PAL | 50.00 ± 1.50 | 5.00 ± 1.50 |"
    (repo / "results/demo/table.md").write_text("make run's table\n")
    git(repo, "add", "results")
    git(repo, "commit", "-qm", "the reports")
    (kept / "table.md").write_text("another run's table\n")  # what run rewrites
    out = paper(repo, "run", "ablation", "--cells", "nosuch")  # past the check
    assert out.stderr.strip() == (
        "Error: --cells: no cell 'nosuch' in ablation (`pal-paper list` names them)"
    )
    (repo / "results/demo/table.md").write_text("not pal-paper's\n")
    out = paper(repo, "run", "ablation")
    assert out.stderr.strip() == (
        "Error: uncommitted changes (results/demo/table.md): the cells are "
        "experiments on HEAD; commit or stash them first"
    )


def test_rows_are_named_from_the_cells_metrics_or_else_the_params() -> None:
    """A row's name comes from its cell's metrics.json (the report writes each
    row's label and paper name there from params); a cell run before that
    gets them from the params' ablation rows, the BP row from pal's `bp`."""
    r = RESULTS["ablation"]
    (col,) = r.columns(PARAMS, [0])
    old = {
        k: {key: v for key, v in row.items() if key not in ("label", "paper")}
        for k, row in metrics(50.0, [0]).items()
        if isinstance(row, dict)
    }
    old |= {"runs": [0], "vary": [], "shared": old["pal"], "vector": old["pal"]}
    filled = labelled(old, PARAMS)
    rows = PARAMS["ablation"]
    assert filled["pal"]["label"] == rows["pal"]["label"]
    assert filled["bp"]["label"] == rows["pal"]["bp"]["label"]
    assert filled["frozen"]["paper"] == rows["frozen"]["paper"]
    assert "paper" not in filled["init"]
    md = build(r, [col], {col.key: filled}, "demo", "x").markdown().splitlines()
    assert [line.split(" | ")[0] for line in md[4:]] == [
        "| PAL",
        "| w/o prompt module",
        "| w/o AL module",
        "| w/ single prompt pool",
        "| w/ prompt vector",
    ]
    # a label without a paper name is shown as it is; no label: the row's key
    data = {col.key: {"pal": {"label": "the PAL row"}, "bp": {}}}
    assert row_name(data, "pal", "ablation") == "the PAL row"
    assert row_name(data, "bp", "ablation") == "bp"


# --- waiting for the queue ---------------------------------------------------


class _Queue:
    """A stand-in for `experiments.Repo` whose `dvc queue status` answers come
    from a script: one dict (name -> status) per poll; a name in none of a
    poll's lists and not finished is what DVC shows while a worker takes it."""

    def __init__(self, polls: list[dict[str, str]], finished: list[set[str]]):
        self.polls, self.finishes, self.calls = polls, finished, 0

    def exp_name(self, cell) -> str:
        return cell.name

    def finished(self) -> set[str]:
        return self.finishes[min(self.calls, len(self.finishes) - 1)]

    def queue_status(self) -> dict[str, str]:
        self.calls += 1
        return self.polls[min(self.calls - 1, len(self.polls) - 1)]

    def interrupted(self, name: str) -> bool:
        return False

    def start(self, jobs: int, gpus) -> None:
        pass


def test_a_cell_a_worker_is_taking_is_not_lost() -> None:
    """Between `Queued` and `Running` DVC lists a task nowhere for a poll or
    two; the wait goes on. Absent for LOST_POLLS polls in a row, it is lost."""
    from palpaper.experiments import LOST_POLLS, wait
    from palpaper.overrides import Cell
    from palpaper.tools import ExperimentError

    a, b = Cell((("solve.eta", 0.5),)), Cell((("solve.eta", 2),))
    running, queued = {a.name: "Running"}, {a.name: "Queued"}
    polls = [{b.name: "Running", **queued}, {}, queued, {}, {}, running]
    finished = [set(), set(), *[{b.name}] * 4, {a.name, b.name}]
    assert wait(_Queue(polls, finished), [a, b], 1, poll=0) == {
        a.name: "done",
        b.name: "done",
    }
    gone = [{a.name: "Queued"}] + [{}] * LOST_POLLS
    with pytest.raises(ExperimentError) as err:
        wait(_Queue(gone, [set()]), [a], 1, poll=0)
    assert str(err.value) == (
        f"cell '{a.name}' is neither finished nor in DVC's queue (removed by "
        "hand?); run the command again to queue it"
    )
    assert LOST_POLLS == 3


def test_a_dvc_error_is_passed_on_whole_on_one_line() -> None:
    """DVC wraps a long message over several lines after its ERROR: the grid's
    error keeps all of it (it once kept the last line only), on one line."""
    from palpaper.tools import failure_message

    out = (
        "Collecting stages\n"
        "ERROR: Experiment 'abc-eta=0.5' already exists. To override it, use\n"
        "  `--force`, or remove it with `dvc exp remove abc-eta=0.5`.\n"
    )
    assert failure_message(out) == (
        "ERROR: Experiment 'abc-eta=0.5' already exists. To override it, use "
        "`--force`, or remove it with `dvc exp remove abc-eta=0.5`."
    )
    assert (
        failure_message("fatal: not a git repository\n")
        == "fatal: not a git repository"
    )
    assert failure_message("") == "(no output)"
