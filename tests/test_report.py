"""`pal-solver report`: mean ± std over hand-built runs, its files and errors;
and how a run and an ablation variant read the params (`palcore.params.Source`)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import committed

from palcore.errors import ParamsError
from palcore.params import ProtocolParams, Source, load_section
from palcore.variants import VariantRow, pipeline_variants
from solver.cli import main
from solver.params import SolveParams
from solver.report import (
    ReportError,
    build,
    headline_json,
    mean_std,
    protocol_report,
    table_md,
    write_report,
)


def metrics(acc: float, *, bp: dict | None = None) -> dict:
    """A metrics.json of 2 steps whose numbers all follow from `acc`."""
    m = {
        "acc": acc,
        "fg": acc / 10,
        "fg_diag": acc / 20,
        "aia": acc + 1,
        "last": acc - 1,
        "matrix": [[acc + 2], [acc + 1, acc - 1]],
        "step_accuracy": [acc + 2, acc],
        "acc_by_task": {"first": acc + 1, "later": acc - 1},
        "acc_by_missing": {
            "complete": acc + 5,
            "image_missing": acc - 5,
            "text_missing": None if acc < 0 else acc - 3,
        },
    }
    if bp is not None:
        m["bp"] = bp
    return m


def write_runs(root: Path, variant: str, accs: list[float], with_bp=False) -> None:
    for run, acc in enumerate(accs):
        folder = root / variant / str(run)
        folder.mkdir(parents=True)
        bp = metrics(acc / 2) if with_bp else None
        (folder / "metrics.json").write_text(json.dumps(metrics(acc, bp=bp)))


DVC = Path(sys.executable).parent / "dvc"
# the params rows of the reported variants: PAL's declares its BP head's row
ROWS = {
    "pal": VariantRow(
        "PAL (prompts + AL)",
        {},
        paper="PAL",
        bp=VariantRow("w/o AL module (BP head)", {}, paper="w/o AL module"),
    ),
    "frozen": VariantRow(
        "w/o prompt module", {}, paper={"missing": "ACIL", "ablation": "w/o prompt"}
    ),
}


@pytest.fixture
def evaluations(tmp_path: Path) -> Path:
    root = tmp_path / "evaluate"
    write_runs(root, "pal", [60.0, 62.0, 67.0], with_bp=True)
    write_runs(root, "frozen", [50.0, 50.0, 50.0])
    return root


def test_mean_and_sample_std_in_closed_form() -> None:
    assert mean_std([60.0, 62.0, 67.0]) == pytest.approx((63.0, math.sqrt(13.0)))
    assert mean_std([5.0]) == (5.0, None)  # one run: no spread


def test_report_rows_means_and_stds(evaluations: Path) -> None:
    report = build(evaluations, ["pal", "frozen"], ProtocolParams(runs=(0, 1, 2)), ROWS)
    assert list(report["rows"]) == ["pal", "bp", "frozen"]  # bp: PAL's BP head
    pal, bp, frozen = (report["rows"][k] for k in ("pal", "bp", "frozen"))
    assert pal["acc"] == {
        "mean": 63.0,
        "std": round(math.sqrt(13.0), 6),
        "runs": [60.0, 62.0, 67.0],
    }
    assert pal["fg"]["mean"] == pytest.approx(6.3)
    assert bp["acc"]["mean"] == 31.5 and bp["acc"]["std"] == round(math.sqrt(13) / 2, 6)
    assert frozen["last"] == {"mean": 49.0, "std": 0.0, "runs": [49.0] * 3}
    assert pal["step_accuracy"] == [
        {"mean": 65.0, "std": round(math.sqrt(13.0), 6)},
        {"mean": 63.0, "std": round(math.sqrt(13.0), 6)},
    ]
    assert pal["matrix"] == [[65.0], [64.0, 62.0]]
    assert pal["acc_by_missing"]["image_missing"]["mean"] == 58.0
    assert pal["acc_by_task"]["first"]["mean"] == 64.0
    assert pal["acc_by_task"]["later"] == {
        "mean": 62.0,
        "std": round(math.sqrt(13.0), 6),
        "runs": [59.0, 61.0, 66.0],
    }


def test_report_files_and_table(evaluations: Path, tmp_path: Path) -> None:
    report = build(evaluations, ["pal", "frozen"], ProtocolParams(runs=(0, 1, 2)), ROWS)
    out = tmp_path / "results"
    write_report(out, report)
    assert sorted(p.name for p in out.iterdir()) == [
        "accuracy_matrix.csv",
        "accuracy_matrix.pdf",
        "accuracy_matrix.png",
        "headline",
        "metrics.json",
        "step_accuracy.csv",
        "step_accuracy.pdf",
        "step_accuracy.png",
        "step_accuracy_rows.csv",
        "table.csv",
        "table.md",
    ]
    lines = (out / "table.md").read_text().splitlines()
    assert lines[0] == (
        "Accuracy (%) of each variant, mean ± sample std over 3 runs (0, 1, 2); "
        "run r adds r to the seeds of: class order, missing tables, prompt init "
        "and batch order, up-sampling."
    )
    assert lines[4] == (
        "| PAL (prompts + AL) | 63.00 ± 3.61 | 6.30 ± 0.36 | 3.15 ± 0.18 | "
        "64.00 ± 3.61 | 62.00 ± 3.61 | 68.00 ± 3.61 | 58.00 ± 3.61 | 60.00 ± 3.61 | "
        "64.00 ± 3.61 | 62.00 ± 3.61 |"
    )
    assert lines[5].startswith("| w/o AL module (BP head) | 31.50 ± 1.80 |")
    assert lines[6].startswith("| w/o prompt module | 50.00 ± 0.00 |")
    csv = (out / "step_accuracy.csv").read_text().splitlines()
    assert csv[0] == "step,pal_mean,pal_std,bp_mean,bp_std,frozen_mean,frozen_std"
    assert csv[2] == "2,63.0000,3.6056,31.5000,1.8028,50.0000,0.0000"
    assert (out / "step_accuracy_rows.csv").read_text().splitlines() == [
        "step,row,label,mean,std",
        "1,pal,PAL (prompts + AL),65.0000,3.6056",
        "2,pal,PAL (prompts + AL),63.0000,3.6056",
        "1,bp,w/o AL module (BP head),33.5000,1.8028",
        "2,bp,w/o AL module (BP head),31.5000,1.8028",
        "1,frozen,w/o prompt module,52.0000,0.0000",
        "2,frozen,w/o prompt module,50.0000,0.0000",
    ]
    assert (out / "accuracy_matrix.csv").read_text() == (
        "step,task_01,task_02\n1,65.0000,\n2,64.0000,62.0000\n"
    )
    m = json.loads((out / "metrics.json").read_text())
    assert m["runs"] == [0, 1, 2] and m["pal"]["acc"]["mean"] == 63.0
    # each row's label, and its paper name where params give one
    assert {r: (m[r]["label"], m[r].get("paper")) for r in ("pal", "bp", "frozen")} == {
        "pal": ("PAL (prompts + AL)", "PAL"),
        "bp": ("w/o AL module (BP head)", "w/o AL module"),
        "frozen": ("w/o prompt module", {"missing": "ACIL", "ablation": "w/o prompt"}),
    }
    # DVC's metrics: a flat file per row, the headline results at 2 decimals
    heads = {p.stem: json.loads(p.read_text()) for p in (out / "headline").iterdir()}
    assert sorted(heads) == ["bp", "frozen", "pal"]
    assert heads["pal"]["acc"] == 63.0 and heads["pal"]["acc_std"] == 3.61
    for row, flat in heads.items():
        assert flat == {
            **{k: round(m[row][k]["mean"], 2) for k in ("acc", "fg", "aia", "last")},
            **{
                f"{k}_std": round(m[row][k]["std"], 2)
                for k in ("acc", "fg", "aia", "last")
            },
        }
    first = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    write_report(out, report)
    again = {p: p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert again == first  # same bytes
    # a row the report no longer has loses its headline file
    write_report(out, build(evaluations, ["frozen"], ProtocolParams(runs=(0, 1, 2))))
    assert sorted(p.name for p in (out / "headline").iterdir()) == ["frozen.json"]


def test_one_run_has_no_spread(evaluations: Path) -> None:
    report = build(evaluations, ["frozen"], ProtocolParams(runs=(1,)))
    assert report["rows"]["frozen"]["acc"] == {
        "mean": 50.0,
        "std": None,
        "runs": [50.0],
    }
    flat = json.loads(headline_json(report["rows"]["frozen"]))
    assert flat["acc"] == 50.0 and flat["acc_std"] is None
    assert table_md(report).splitlines()[0] == (
        "Accuracy (%) of each variant, one run (1), no spread; run r adds r to the "
        "seeds of: class order, missing tables, prompt init and batch order, "
        "up-sampling."
    )


def test_cli_writes_the_report_and_names_a_missing_run(
    evaluations: Path, tmp_path: Path
) -> None:
    params = tmp_path / "params.yaml"
    rows = {v: {"label": f"the {v} row", "changes": {}} for v in ("pal", "frozen")}
    rows["pal"]["bp"] = {"label": "the BP head's row"}
    params.write_text(
        yaml.safe_dump({"protocol": {"runs": [0, 1, 2, 3]}, "ablation": rows})
    )
    args = ["report", "--evaluations", str(evaluations), "--variants", "pal,frozen"]
    args += ["--out", str(tmp_path / "out"), "--params", str(params)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 1
    missing = evaluations / "pal" / "3" / "metrics.json"
    assert result.output == f"Error: {missing}: not found (run 3 not evaluated)\n"
    assert not (tmp_path / "out").exists()  # nothing half-written
    params.write_text(
        yaml.safe_dump({"protocol": {"runs": [0, 1, 2]}, "ablation": rows})
    )
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    table = (tmp_path / "out" / "table.md").read_text().splitlines()
    # every label from params, the BP head's from ablation.pal.bp
    assert [row.split(" | ")[0] for row in table[4:]] == [
        "| the pal row",
        "| the BP head's row",
        "| the frozen row",
    ]
    m = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert [m[r]["label"] for r in ("pal", "bp", "frozen")] == [
        "the pal row",
        "the BP head's row",
        "the frozen row",
    ]
    assert "paper" not in m["pal"]  # absent from params: absent here


def test_a_row_of_head_bp_reports_its_bp_metrics(
    evaluations: Path, tmp_path: Path
) -> None:
    """`head: bp`: the variant's row holds the BP metrics evaluate wrote for
    it, as PAL's own `bp` row does from the same runs."""
    protocol = ProtocolParams(runs=(0, 1, 2))
    rows = {**ROWS, "init": VariantRow("BP baseline", {}, paper="MAP", head="bp")}
    write_runs(evaluations, "init", [60.0, 62.0, 67.0], with_bp=True)
    report = build(evaluations, ["pal", "init"], protocol, rows)
    assert list(report["rows"]) == ["pal", "bp", "init"]
    assert report["rows"]["init"] == report["rows"]["bp"]  # the same BP runs
    assert report["rows"]["init"]["acc"] == {
        "mean": 31.5,
        "std": round(math.sqrt(13) / 2, 6),
        "runs": [30.0, 31.0, 33.5],
    }
    assert report["labels"]["init"] == "BP baseline"
    assert report["paper"]["init"] == "MAP"
    with pytest.raises(
        ReportError,
        match=r"^variant frozen reports its BP head \(head: bp\), but run 0's "
        r"metrics hold no bp \(its test shards have no bp_logits\)$",
    ):
        build(evaluations, ["frozen"], protocol, {"frozen": rows["init"]})


def test_two_rows_of_bp_are_refused(evaluations: Path) -> None:
    write_runs(evaluations, "init", [60.0, 62.0, 67.0], with_bp=True)
    rows = {**ROWS, "init": ROWS["pal"]}
    with pytest.raises(
        ReportError,
        match=r"^two variants' params rows hold bp, the row 'bp': "
        r"pal and init$",
    ):
        build(evaluations, ["pal", "init"], ProtocolParams(runs=(0, 1, 2)), rows)


# ------------------------------------------------ runs and variants of params


def write(tmp_path: Path, **sections) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(sections))
    return path


def test_a_run_adds_its_index_to_the_seeds_it_varies(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        solve={"seed": 5, "width": 64},
        protocol={"runs": [0, 1, 2], "vary": ["upsampling"]},
    )
    assert load_section(path, "solve", SolveParams).seed == 5
    assert load_section(Source(path, run=2), "solve", SolveParams).seed == 7
    path = write(tmp_path, solve={"seed": 5}, protocol={"vary": []})
    assert load_section(Source(path, run=2), "solve", SolveParams).seed == 5


def test_a_variant_overlays_its_keys(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        solve={"seed": 0, "width": 64},
        ablation={
            "pal": {"label": "PAL", "changes": {}},
            "wide": {"label": "wider", "changes": {"solve": {"width": 128}}},
        },
    )
    wide = load_section(Source(path, run=1, variant="wide"), "solve", SolveParams)
    assert (wide.width, wide.seed) == (128, 1)  # all four seeds vary by default
    pal = load_section(Source(path, variant="pal"), "solve", SolveParams)
    assert (pal.width, pal.seed) == (64, 0)
    with pytest.raises(ParamsError) as err:
        load_section(Source(path, variant="tall"), "solve", SolveParams)
    assert str(err.value) == (
        f"{path}: unknown variant 'ablation.tall' (known: pal, wide)"
    )
    bad = {"bad": {"label": "bad", "changes": {"solve": {"width": 0}}}}
    path = write(tmp_path, solve={}, ablation=bad)
    with pytest.raises(ParamsError, match=r"solve\.width must be > 0, got 0$"):
        load_section(Source(path, variant="bad"), "solve", SolveParams)


def test_protocol_params_are_checked(tmp_path: Path) -> None:
    path = write(tmp_path, solve={}, protocol={"runs": [0, 0]})
    with pytest.raises(ParamsError) as err:
        load_section(Source(path, run=1), "solve", SolveParams)
    assert str(err.value) == (
        f"{path}: protocol.runs must be distinct ids >= 0, got [0, 0]"
    )
    path = write(tmp_path, protocol={"vary": ["weather"]})
    with pytest.raises(ParamsError, match=r"protocol\.vary\[0\] must be one of"):
        load_section(path, "protocol", ProtocolParams)


def test_source_options_round_trip() -> None:
    assert Source(Path("p.yaml"), 2, "init").args() == [
        "--params",
        "p.yaml",
        "--run",
        "2",
        "--variant",
        "init",
    ]
    assert Source(Path("p.yaml")).args() == ["--params", "p.yaml"]


def test_bad_run_params_are_one_line(tmp_path: Path) -> None:
    """A seed that is no integer is named by its section's own check; a
    variant row that is not a label and its changes is named too."""
    path = write(tmp_path, solve={"seed": "x"}, ablation={"bad": [1, 2]})
    with pytest.raises(ParamsError) as err:
        load_section(Source(path, run=1), "solve", SolveParams)
    assert str(err.value) == f"{path}: solve.seed must be an integer, got 'x'"
    rows = (
        ([1, 2], "ablation.bad must hold a label and the changes it makes: "
                 "{label: TEXT, changes: {section: {key: value}}}"),
        ({"label": "b", "changes": {}, "lable": "c"},
         "ablation.bad.lable: unknown key (did you mean 'label'?)"),
        ({"label": "b", "changes": {}, "head": "ridge"},
         "ablation.bad.head must be one of analytic, bp, got 'ridge'"),
        ({"label": "b", "changes": {}, "paper": ""},
         "ablation.bad.paper must be a text, got ''"),
        ({"label": "b", "changes": {}, "paper": [1]},
         "ablation.bad.paper must be a text or map result ids to texts, got [1]"),
        ({"label": "b", "changes": {}, "paper": {"ablation": 3}},
         "ablation.bad.paper.ablation must be a text, got 3"),
        ({"label": "b", "changes": {}, "bp": {"paper": "x"}},
         "ablation.bad.bp must hold a label: {label: TEXT, paper: TEXT}"),
        ({"label": "b", "changes": {}, "bp": {"label": "x", "head": "bp"}},
         "ablation.bad.bp.head: unknown key (known: label, paper)"),
        ({"label": "", "changes": {}}, "ablation.bad.label must be a text, got ''"),
        ({"label": "b", "changes": [1]},
         "ablation.bad.changes must map sections to the keys it changes"),
        ({"label": "b", "changes": {"protocol": {"runs": [0]}}},
         "ablation.bad.changes.protocol must be a mapping of keys of a stage's "
         "section"),
    )  # fmt: skip
    for row, message in rows:
        path = write(tmp_path, solve={}, ablation={"bad": row})
        with pytest.raises(ParamsError) as err:
            load_section(Source(path, variant="bad"), "solve", SolveParams)
        assert str(err.value) == f"{path}: {message}"


def test_pipelines_list_known_variants(tmp_path: Path) -> None:
    rows = {"pal": {"label": "PAL", "changes": {}}}
    for lists, message in (
        ({"main": ["pal"]}, None),
        ({"other": ["pal"]}, "unknown pipeline 'pipelines.main' (known: other)"),
        ({"main": []}, "pipelines.main must list at least one variant"),
        ({"main": ["pal", "pal"]}, "pipelines.main lists a variant twice"),
        ({"main": ["pal", "x"]}, "unknown variant 'ablation.x' (known: pal)"),
    ):
        path = write(tmp_path, ablation=rows, pipelines=lists)
        if message is None:
            assert pipeline_variants(path, "main") == ["pal"]
            continue
        with pytest.raises(ParamsError) as err:
            pipeline_variants(path, "main")
        assert str(err.value) == f"{path}: {message}"


def test_a_run_that_is_not_evaluate_output_is_named(tmp_path: Path) -> None:
    for text, message in (
        ("[1]", "not evaluate's metrics (no JSON object)"),
        (json.dumps({**metrics(50.0), "acc": "high"}), "'acc' is not a number: 'high'"),
    ):
        folder = tmp_path / "evaluate" / "pal" / "0"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "metrics.json").write_text(text)
        with pytest.raises(ReportError) as err:
            build(tmp_path / "evaluate", ["pal"], ProtocolParams(runs=(0,)))
        assert str(err.value) == f"{folder / 'metrics.json'}: {message}"


def test_a_row_records_width_and_eta_and_refuses_mixed_runs(tmp_path: Path) -> None:
    """Each row carries the width and η its runs were solved with; runs of one
    row solved otherwise, or rows with other step counts, are one error."""
    root = tmp_path / "evaluate"
    write_runs(root, "pal", [60.0, 62.0])
    write_runs(root, "short", [50.0, 50.0])
    write_runs(root, "wide", [50.0, 50.0])
    for variant, run in [("pal", 0), ("pal", 1), ("wide", 0), ("wide", 1)]:
        path = root / variant / str(run) / "metrics.json"
        m = json.loads(path.read_text())
        width = 512 if (variant, run) == ("wide", 1) else 1024
        path.write_text(json.dumps({**m, "width": width, "eta": 0.1}))
    protocol = ProtocolParams(runs=(0, 1))
    row = build(root, ["pal"], protocol)["rows"]["pal"]
    assert (row["width"], row["eta"]) == (1024, 0.1)
    with pytest.raises(
        ReportError,
        match=r"^the runs of one row were solved with different width: 1024 and 512$",
    ):
        build(root, ["wide"], protocol)
    for run in (0, 1):
        path = root / "short" / str(run) / "metrics.json"
        m = json.loads(path.read_text())
        m["step_accuracy"] = m["step_accuracy"][:1]
        path.write_text(json.dumps(m))
    with pytest.raises(
        ReportError, match=r"^variant short has 1 steps, but pal has 2$"
    ):
        build(root, ["pal", "short"], protocol)


def test_dvc_plots_draw_every_row_of_the_report(
    evaluations: Path, tmp_path: Path
) -> None:
    """The committed dvc.yaml's step plot names no variant: a variant added in
    params (here `wide`) reaches `dvc plots show` with its label, beside PAL's
    rows, at the report's means."""
    repo = tmp_path / "repo"
    repo.mkdir()
    rows = {v: {"label": f"the {v} row", "changes": {}} for v in ("pal", "wide")}
    rows["pal"]["bp"] = {"label": "the BP row"}
    params = {"data": {"dataset": "demo"}, "protocol": {"runs": [0, 1, 2]}}
    (repo / "params.yaml").write_text(yaml.safe_dump({**params, "ablation": rows}))
    write_runs(evaluations, "wide", [70.0, 70.0, 73.0])
    protocol_report(
        [evaluations], ["pal", "wide"], repo / "results/demo", repo / "params.yaml"
    )
    plots = yaml.safe_load(committed("dvc.yaml"))["plots"]
    (repo / "dvc.yaml").write_text(yaml.safe_dump({"plots": plots}))
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([str(DVC), "init", "-q"], cwd=repo, check=True, env=env)
    template = committed(".dvc/plots/rows.json")
    (repo / ".dvc" / "plots").mkdir(exist_ok=True)
    (repo / ".dvc" / "plots" / "rows.json").write_text(template)
    shown = subprocess.run(
        [str(DVC), "plots", "show", "--json"],
        cwd=repo, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    (steps,) = [p for name, p in json.loads(shown.stdout)["data"].items()
                if name.startswith("Accuracy over seen tasks")]  # fmt: skip
    values = steps[0]["content"]["data"]["values"]
    drawn = {(v["label"], int(v["step"])): float(v["mean"]) for v in values}
    assert drawn == {
        ("the pal row", 1): 65.0,
        ("the pal row", 2): 63.0,
        ("the BP row", 1): 33.5,
        ("the BP row", 2): 31.5,
        ("the wide row", 1): 73.0,
        ("the wide row", 2): 71.0,
    }
    assert steps[0]["content"]["encoding"]["color"]["field"] == "label"


def test_a_label_with_a_bar_or_a_line_break_stays_one_cell() -> None:
    """A row label may hold `|` or a line break (pal check accepts both):
    each table keeps one row of as many cells as its header."""
    from palpaper.table import md_cell as paper_cell
    from solver.tables import md_cell

    label = "PAL | prompts\nand AL"
    for cell in (md_cell(label), paper_cell(label)):
        assert cell == "PAL \\| prompts and AL"
        row = f"| {cell} | 1.00 |"
        assert len(row.replace("\\|", "").split("|")) == 4  # 2 cells, 2 ends


def test_multi_label_rows_read_f1_and_add_map_columns(tmp_path: Path) -> None:
    """Runs scored by macro F1 (`measure`) head the first column F1 and join
    mAP's five columns, mean ± std like the others; the CSV names them map_*."""
    root = tmp_path / "evaluate"
    for run, f1 in enumerate([40.0, 44.0]):
        m = metrics(f1)
        m |= {"measure": "macro_f1", "threshold": 0.5, "map": metrics(f1 + 10)}
        folder = root / "pal" / str(run)
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps(m))
    report = build(root, ["pal"], ProtocolParams(runs=(0, 1)), {"pal": ROWS["pal"]})
    row = report["rows"]["pal"]
    assert (row["measure"], row["threshold"]) == ("macro_f1", 0.5)
    assert row["map"]["acc"] == {
        "mean": 52.0,
        "std": round(math.sqrt(8), 6),
        "runs": [50.0, 54.0],
    }
    lines = table_md(report).splitlines()
    assert lines[0].startswith(
        "Macro F1 (%, scores > 0.5) and macro mAP (%) of each variant, "
        "mean ± sample std over 2 runs"
    )
    assert lines[2] == (
        "|  | F1 | FG | FG_diag | AIA | Last | complete | image missing | text missing "
        "| first task | later tasks | mAP | mAP FG | mAP FG_diag | mAP AIA | mAP Last |"
    )
    assert lines[4].endswith(
        "| 52.00 ± 2.83 | 5.20 ± 0.28 | 2.60 ± 0.14 | 53.00 ± 2.83 | 51.00 ± 2.83 |"
    )
    out = tmp_path / "results"
    write_report(out, report)
    header = (out / "table.csv").read_text().splitlines()[0].split(",")
    assert header[-2:] == ["map_last_mean", "map_last_std"] and len(header) == 31


def test_runs_of_one_row_scored_at_different_thresholds_are_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "evaluate"
    for run, threshold in enumerate([0.5, 0.3]):
        m = metrics(40.0) | {
            "measure": "macro_f1",
            "threshold": threshold,
            "map": metrics(50.0),
        }
        folder = root / "pal" / str(run)
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(json.dumps(m))
    with pytest.raises(ReportError) as e:
        build(root, ["pal"], ProtocolParams(runs=(0, 1)))
    assert (
        str(e.value)
        == "the runs of one row were scored with different threshold: 0.5 and 0.3"
    )
