"""Tables 1-2's baselines: the notes on the paper's numbers (published.yaml's
`notes:` and `fg_forms:`) and the route `--baselines cited`, which runs PAL,
ACIL and PAL's own rows and takes the five compared methods from the paper.

The notes are checked against the numbers of the committed published.yaml
(read by the package's loader); the tables are rendered from hand-made
metrics, the collector run on hand-made experiments (as tests/test_paper.py
does): no pipeline runs here.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import committed, committed_params
from test_paper import fake_experiment, git, metrics, paper

from palpaper.grids import CITED, RESULTS, cited_variants
from palpaper.notes import cell_notes, fg_forms, form_text
from palpaper.packaged import published
from palpaper.render import build

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FOOD = yaml.safe_load(committed("configs/food101.yaml"))
PUB = published()["missing"]["food101"]
KEYS = [c.key for c in RESULTS["missing"].columns(FOOD, None)]
B70, B90 = KEYS.index("both-0.7"), KEYS.index("both-0.9")
SUP = "⁰¹²³⁴⁵⁶⁷⁸⁹,"


def test_the_papers_odd_numbers_hold_in_the_committed_yaml() -> None:
    acc, fg = PUB["acc"], PUB["fg"]
    # MAP at 70 % both is the baseline of RebQ's paper (its abstract: 20.00
    # AP and 75.95 forgetting before RebQ, 50.92 and 8.56 with it)
    assert (acc["MAP"][B70], fg["MAP"][B70]) == (20.00, 75.95)
    # RebQ there: RebQ's own forgetting, but 59.92 where RebQ reports 50.92
    assert (acc["RebQ"][B70], fg["RebQ"][B70]) == (59.92, 8.56)
    # the rows that repeat a value between 70 % both and 90 % both
    assert {m for m, v in acc.items() if v[B70] == v[B90]} == {"L2P", "DualPrompt"}
    assert {m for m, v in fg.items() if v[B70] == v[B90]} == {"L2P"}
    assert (acc["L2P"][B70], fg["L2P"][B70]) == (24.62, 5.66)
    assert acc["DualPrompt"][B70] == 40.69
    assert (fg["DualPrompt"][B70], fg["DualPrompt"][B90]) == (7.26, 7.29)
    # the notes name exactly those values, and each quotes the values it names
    notes = cell_notes("missing", "food101")
    assert [set(n.cells) for n in notes] == [
        {("MAP", "acc", "both-0.7"), ("MAP", "fg", "both-0.7")},
        {("RebQ", "acc", "both-0.7")},
        {("L2P", m, k) for m in ("acc", "fg") for k in ("both-0.7", "both-0.9")},
        {("DualPrompt", "acc", k) for k in ("both-0.7", "both-0.9")},
    ]
    for note in notes:
        for method, metric, key in note.cells:
            assert f"{PUB[metric][method][KEYS.index(key)]:.2f}" in note.text
    assert "50.92" in notes[1].text and "7.26 and 7.29" in notes[3].text
    assert cell_notes("missing", "n24news") == cell_notes("missing", "demo") == []


def test_each_published_row_records_the_fg_form_it_may_use() -> None:
    for dataset in ("food101", "n24news"):
        forms = fg_forms("missing", dataset)
        assert set(forms) == set(published()["missing"][dataset]["fg"])
        assert forms["ACIL"] == forms["PAL"] == "maximum"
    food, news = fg_forms("missing", "food101"), fg_forms("missing", "n24news")
    assert {food[m] for m in CITED} == {"diagonal"}  # taken from RebQ's paper?
    assert {news[m] for m in CITED} == {"unknown"}
    assert form_text("diagonal").startswith("may be diagonal (RebQ's code), if ")
    assert form_text("maximum").startswith("maximum (PAL), the form the paper ")
    assert fg_forms("missing", "demo") == {}


def _cells(line: str) -> list[str]:
    """A Markdown table line's cells."""
    return [c.strip() for c in line.strip("|").split("|")]


def _marked(lines: list[str]) -> dict[tuple[str, str, str], str]:
    """(method, metric, column key) -> the superscript on its paper number."""
    out = {}
    for line in lines:
        word, method, *values = _cells(line)
        for key, text in zip(KEYS, values, strict=True):
            found = re.search(rf"\d+\.\d\d([{SUP}]+)", text.split("(")[-1])
            if found:  # the method without the FG form's superscript
                out[(method.rstrip(SUP), word.lower(), key)] = found.group(1)
    return out


def test_a_table_marks_the_noted_values_and_prints_the_notes() -> None:
    r = RESULTS["missing"]
    cols = r.columns(FOOD, None)
    data = {c.key: metrics(60.0, [0, 1, 2]) for c in cols}
    table = build(r, cols, data, "food101", "pal-paper run missing")
    md = table.markdown().splitlines()
    end = 4 + 2 * len(r.rows)
    body = md[4:end]
    assert _marked(body) == {
        ("MAP", "acc", "both-0.7"): "¹",
        ("MAP", "fg", "both-0.7"): "¹",
        ("RebQ", "acc", "both-0.7"): "²",
        **{("L2P", m, k): "³" for m in ("acc", "fg") for k in ("both-0.7", "both-0.9")},
        ("DualPrompt", "acc", "both-0.7"): "⁴",
        ("DualPrompt", "acc", "both-0.9"): "⁴",
    }
    assert _cells(body[0])[2 + B70] == "60.00 ± 1.50 (20.00¹)"
    assert _cells(body[12])[2 + B70] == "6.00 ± 1.50 (7.26)"  # FG, DualPrompt
    # the FG form of each paper row's FG line, after its name
    paper_rows = [f"{m}⁵" for m in CITED] + ["ACIL⁶", "PAL⁶"]
    own_rows = ["w/o AL module", "prompts at init, never trained + AL"]
    assert [_cells(x)[1] for x in body[9:]] == paper_rows + own_rows
    notes = cell_notes("missing", "food101")
    assert md[end:] == [
        "",
        f"¹ {notes[0].text}",
        "",
        "² The paper's RebQ cell at 70 % both reads Acc 59.92 where RebQ's paper "
        "reports 50.92 with the same forgetting (8.56): likely a transcription slip.",
        "",
        f"³ {notes[2].text}",
        "",
        f"⁴ {notes[3].text}",
        "",
        "⁵ FG of the paper's MAP, MSP, L2P, DualPrompt and RebQ rows: "
        f"{form_text('diagonal')}.",
        "",
        f"⁶ FG of the paper's ACIL and PAL rows: {form_text('maximum')}.",
    ]
    assert md[0].endswith(
        "In parentheses: the paper's UPMC-Food101 numbers. A superscript refers "
        "to a note on the paper's numbers below. Made by `pal-paper run missing`."
    )
    csv = table.csv().splitlines()
    assert csv[0].endswith(",90% both paper,paper notes")
    assert csv[5].endswith(  # Acc, RebQ: its note on 70 % both
        ",54.6700,[2] 70% both: The paper's RebQ cell at 70 % both reads Acc "
        "59.92 where RebQ's paper reports 50.92 with the same forgetting (8.56): "
        "likely a transcription slip."
    )
    assert csv[8].endswith(",60.0000,1.5000,,")  # w/o AL module: no paper, no note


def test_a_table_without_the_papers_numbers_has_no_notes() -> None:
    params = committed_params()  # the demo
    r = RESULTS["missing"]
    cols = r.columns(params, [0])
    data = {c.key: metrics(60.0, [0]) for c in cols}
    table = build(r, cols, data, "demo", "pal-paper run missing --runs 0")
    md = table.markdown()
    assert table.notes is None and not re.search(f"[{SUP[:-1]}]", md)
    assert len(md.splitlines()) == 4 + 2 * len(r.rows)
    assert not table.csv().splitlines()[0].endswith("paper notes")


def test_the_cited_route_runs_pal_acil_and_pals_own_rows_only() -> None:
    r = RESULTS["missing"]
    measured, cited = r.columns(FOOD, None), r.columns(FOOD, None, cite=True)
    # the five compared methods: the params' rows whose paper name is theirs
    rows = FOOD["ablation"]
    five = [v for v in rows if rows[v].get("paper") in CITED]
    assert five == ["map", "msp", "rebq", "l2p", "dualprompt"]
    assert cited_variants(FOOD, "missing") == {v: rows[v]["paper"] for v in five}
    for m, c in zip(measured, cited, strict=True):
        every = m.cell.value(FOOD, "pipelines.main")
        assert c.cell.value(FOOD, "pipelines.main") == [
            v for v in every if v not in five
        ]
        assert c.cell.value(FOOD, "pipelines.main") == ["pal", "init", "frozen"]
        assert c.key == m.key
    # cells of their own: none is a cell of the measured route
    names = [c.cell.name for c in cited]
    assert not set(names) & {c.cell.name for c in measured}
    assert names[0] == "text+rate=0.1"
    # 70 % both is the committed scenario: the one experiment Table 3's
    # stability figure and Table 4's 15k cell read too
    assert names[B70] == "base"
    assert RESULTS["stability"].columns(FOOD, None)[0].cell == cited[B70].cell
    # a rehearsal that committed main [pal] still runs ACIL
    params = {**FOOD, "pipelines": {**FOOD["pipelines"], "main": ["pal"]}}
    col = r.columns(params, [0], cite=True)[0]
    assert col.cell.value(params, "pipelines.main") == ["pal", "frozen"]
    whole = "text+rate=0.1+main=pal-frozen+runs=0"  # 36 characters: cut to 32
    digest = hashlib.sha256(whole.encode()).hexdigest()[:6]
    assert col.cell.name == f"text+rate=0.1+main=pal-fr_{digest}"
    # the per-step figures (no numbers to cite: they leave the five out) read
    # the same cells
    steps = RESULTS["steps"].columns(FOOD, None, cite=True)
    assert [c.cell for c in steps] == [
        cited[KEYS.index(f"both-{rate}")].cell for rate in (0.1, 0.5, 0.7)
    ]


def test_a_cited_table_takes_the_five_rows_from_the_paper_alone() -> None:
    r = RESULTS["missing"]
    cols = r.columns(FOOD, [0], cite=True)
    # the cells' metrics even hold rows of the five (60.00): never shown
    data = {c.key: metrics(60.0, [0]) for c in cols}
    rerun = "pal-paper run missing --runs 0 --baselines cited"
    table = build(r, cols, data, "food101", rerun, (), cited_variants(FOOD, r.id))
    md = table.markdown().splitlines()
    assert md[0] == (
        "Tables 1-2 of the paper: Acc and FG (%) under 15 missing-modality "
        "scenarios, missing in training and test; UPMC-Food101, one run per cell "
        "(run 0), no spread. In parentheses: the paper's UPMC-Food101 numbers. "
        "MAP, MSP, L2P, DualPrompt and RebQ are not run here (`--baselines "
        "cited`): their rows are the paper's numbers, each marked (cited). A "
        "superscript refers to a note on the paper's numbers below. Made by "
        "`pal-paper run missing --runs 0 --baselines cited`."
    )
    assert md[4] == (
        "| Acc | MAP | 20.66 (cited) | 21.53 (cited) | 22.84 (cited) | 16.57 "
        "(cited) | 24.00 (cited) | 20.66 (cited) | 18.18 (cited) | 23.85 (cited) "
        "| 18.66 (cited) | 17.68 (cited) | 22.48 (cited) | 20.00¹ (cited) | "
        "16.92 (cited) | 24.89 (cited) | 18.41 (cited) |"
    )
    assert md[8].startswith("| Acc | RebQ | 68.67 (cited) | 72.46 (cited) |")
    assert _cells(md[8])[2 + B70] == "59.92² (cited)"
    assert md[9].startswith("| Acc | ACIL | 60.00 (78.62) | 60.00 (79.78) |")
    assert md[15] == (
        "| FG | L2P⁵ | 5.80 (cited) | 5.51 (cited) | 6.55 (cited) | 6.53 (cited) "
        "| 4.66 (cited) | 6.87 (cited) | 6.33 (cited) | 4.55 (cited) | 6.17 "
        "(cited) | 5.80 (cited) | 3.99 (cited) | 5.66³ (cited) | 5.60 (cited) | "
        "4.54 (cited) | 5.66³ (cited) |"
    )
    assert md[19].startswith("| FG | PAL⁶ | 6.00 (4.35) | 6.00 (3.74) |")
    cited_lines = [x for x in md[4:22] if _cells(x)[1].rstrip(SUP) in CITED]
    assert len(cited_lines) == 10 and not any("60.00" in x for x in cited_lines)
    assert all(v.endswith("(cited)") for x in cited_lines for v in _cells(x)[2:])
    csv = table.csv().splitlines()
    assert csv[0].startswith("Metric,Method,source,10% text missing mean,")
    assert csv[1].startswith("Acc,MAP,cited from the paper,,,20.6600,,,21.5300,")
    assert csv[6].startswith("Acc,ACIL,measured,60.0000,,78.6200,60.0000,")


def _env() -> dict[str, str]:
    home = os.environ.get("HOME", "/tmp")
    return {"PATH": "/usr/bin:/bin", "HOME": home, "DVC_NO_ANALYTICS": "1"}


def _project(folder: Path, params: str) -> str:
    """A git repository (and DVC's) committing `params` as params.yaml."""
    folder.mkdir()
    (folder / "params.yaml").write_text(params)
    git(folder, "init", "-q")
    subprocess.run([str(BIN / "dvc"), "init", "-q"], cwd=folder, check=True)
    git(folder, "add", "-A")
    git(folder, "commit", "-qm", "project")
    return git(folder, "rev-parse", "HEAD")


def test_cited_needs_the_papers_numbers_one_line(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    _project(demo, committed("params.yaml"))
    line = (
        "Error: --baselines cited: the paper has no numbers for data.dataset "
        "'demo' (Tables 1-2 give food101 and n24news); nothing to cite: run the "
        "baselines (--baselines measured)"
    )
    for args in (
        ["run", "missing"],
        ["collect", "missing"],
        ["list"],
        ["status", "missing"],
        ["submit", "missing", "--dry-run"],
    ):
        out = paper(demo, *args, "--baselines", "cited")
        assert (out.returncode, out.stderr.strip()) == (1, line), args
    assert not (demo / "results").exists()
    food = tmp_path / "food"
    _project(food, committed("configs/food101.yaml"))
    out = paper(food, "run", "upsampling", "--baselines", "cited")
    assert (out.returncode, out.stderr.strip()) == (
        1,
        "Error: --baselines cited: upsampling runs no baseline (missing, Tables "
        "1-2, and steps do)",
    )
    out = paper(food, "list", "--baselines", "cited")
    assert out.returncode == 0, out.stderr
    listed = out.stdout.splitlines()
    assert listed[0] == "missing: Tables 1-2; 15 columns"  # no override shared
    assert listed[1].split() == [
        "text-0.1",
        "text+rate=0.1",
        "data.missing_rate=0.1",
        "data.missing_type=text",
    ]
    assert listed[1 + B70].split() == [
        "both-0.7",
        "base",
        "(the",
        "committed",
        "params)",
    ]
    assert max(len(x) for x in listed) <= 100
    out = paper(food, "list", "--baselines", "cited", "--json")
    columns = json.loads(out.stdout)["missing"]["columns"]
    assert columns[0] == {
        "key": "text-0.1",
        "label": "10% text missing",
        "cell": "text+rate=0.1",
        "overrides": {"data.missing_rate": 0.1, "data.missing_type": "text"},
    }
    assert columns[B70]["overrides"] == {}


def test_collect_renders_the_cited_route_from_its_own_cells(tmp_path: Path) -> None:
    if subprocess.run(["git", "--version"], capture_output=True).returncode:
        pytest.skip("git not installed")
    repo = tmp_path / "project"
    base = _project(repo, committed("configs/food101.yaml"))
    cited = RESULTS["missing"].columns(FOOD, None, cite=True)
    for c in cited[1:]:  # 10 % text missing not run yet
        m = metrics(60.0, [0, 1, 2])
        fake_experiment(repo, base, c.cell, m, dataset="food101")
    # the measured route's cell of 10 % text missing (its five measured at
    # 99.00): another experiment, which the cited route never reads
    measured = RESULTS["missing"].columns(FOOD, None)[0]
    m = metrics(99.0, [0, 1, 2])
    fake_experiment(repo, base, measured.cell, m, dataset="food101")
    out = paper(repo, "collect", "missing", "steps", "--baselines", "cited")
    assert out.returncode == 0, out.stderr
    first = cited[0].cell.name
    assert out.stderr.splitlines()[0] == (
        "WARNING palpaper.collect: missing: 1 of 15 cells marked – (no finished "
        f"experiment on {base[:7]}: {first}); run them: pal-paper run missing "
        f"--baselines cited --cells {first}"
    )
    md = (repo / "results/paper/food101/missing.md").read_text().splitlines()
    assert "Partial: 1 cell not run yet (marked –)." in md[0]
    assert md[0].endswith("Made by `pal-paper run missing --baselines cited`.")
    assert md[4].startswith("| Acc | MAP | 20.66 (cited) | 21.53 (cited) |")
    assert md[9].startswith("| Acc | ACIL | – (78.62) | 60.00 ± 1.50 (79.78) |")
    assert not any("99.00" in x for x in md)
    csv = (repo / "results/paper/food101/missing.csv").read_text().splitlines()
    assert csv[1].startswith("Acc,MAP,cited from the paper,,,20.6600,")
    # the per-step figures: the same cells, the five left out
    steps = (repo / "results/paper/food101/steps.md").read_text().splitlines()
    assert steps[0].endswith(
        "The paper gives no UPMC-Food101 numbers for this result. MAP, MSP, L2P, "
        "DualPrompt and RebQ are not run here (`--baselines cited`), and the "
        "paper gives no numbers of theirs for this result: they are left out. "
        "Made by `pal-paper run steps --baselines cited`."
    )
    assert [_cells(x)[1] for x in steps[4:8]] == [
        "w/o prompt module (ACIL on frozen features)",
        "PAL",
        "w/o AL module",
        "prompts at init, never trained + AL",
    ]
    assert len(steps) == 4 + 3 * 4
    png = (repo / "results/paper/food101/steps.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_status_names_each_cells_experiment_within_100_columns(
    tmp_path: Path,
) -> None:
    food = tmp_path / "food"
    head = _project(food, committed("configs/food101.yaml"))[:7]
    out = paper(food, "status", "missing", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    cells = [c.cell for c in RESULTS["missing"].columns(FOOD, None)]
    assert report["commit"] == head
    assert report["counts"] == {"not submitted": 15}
    assert [r["experiment"] for r in report["cells"]] == [
        f"{head}-{c.name}" for c in cells
    ]
    assert max(len(r["experiment"]) for r in report["cells"]) <= 40
    assert {(r["state"], r["detail"], r["log"]) for r in report["cells"]} == {
        ("not submitted", "", "")
    }
    lines = paper(food, "status", "missing").stdout.splitlines()
    assert lines[0] == f"15 cells on {head}: 15 not submitted"
    assert lines[1:] == [f"  {c.name}: not submitted" for c in cells]
    assert max(len(x) for x in lines) <= 100


def test_a_cells_log_is_on_a_line_of_its_own() -> None:
    from palpaper.slurm_state import status_lines

    log = ".dvc/tmp/slurm/20261129-001500-abcdef0/task-11.out"
    report = {
        "commit": "abcdef0",
        "counts": {"waiting": 1, "finished": 1},
        "cells": [
            {
                "cell": "eta=0.5",
                "state": "waiting",
                "detail": "job 42_11, pending: Resources",
                "log": log,
            },
            {"cell": "base", "state": "finished", "detail": "", "log": ""},
        ],
        "collect": {"job": "43", "state": "pending", "log": "x/collect.out"},
    }
    assert status_lines(report) == [
        "2 cells on abcdef0: 1 waiting, 1 finished",
        "  eta=0.5: waiting (job 42_11, pending: Resources)",
        f"    log {log}",
        "  base: finished",
        "  tables: collect job 43 pending",
        "    log x/collect.out",
    ]
