"""`pal-solver show`: a report's metrics as a table of at most 120 columns."""

from __future__ import annotations

import json

from click.testing import CliRunner
from helpers import committed

from solver.cli import main


def _report(tmp_path, folder="results/demo/ablation"):
    for name in ("metrics.json", "table.csv"):
        (tmp_path / name).write_text(committed(f"{folder}/{name}"), encoding="utf-8")
    return tmp_path


def test_the_ablations_ten_rows_fit_in_120_columns_in_table_order(tmp_path):
    r = CliRunner().invoke(main, ["show", str(_report(tmp_path))])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= 120
    head = lines.index(next(x for x in lines if x.lstrip().startswith("Acc")))
    assert lines[head].split() == [
        *("Acc", "FG", "AIA", "Last", "complete", "image", "missing", "text"),
        "missing",
    ]
    rows = [line.split()[0] for line in lines[head + 1 : head + 11]]
    assert rows == [
        *("pal", "bp", "init", "frozen", "no_recon", "shared", "vector", "input"),
        *("fast", "first"),
    ]
    assert " ".join(lines[head + 1].split()) == (
        "pal 53.00 ± 0.66 19.90 ± 3.96 67.68 ± 2.23 47.92 ± 3.82 84.17 ± 2.89 "
        "39.76 ± 0.41 39.52 ± 3.60"
    )
    assert "bp: w/o AL module (BP head)" in lines
    assert "mean ± sample std over 3 runs (0, 1, 2)" in " ".join(lines[:head])


def test_a_narrow_width_leaves_out_the_right_columns_and_names_them(tmp_path):
    r = CliRunner().invoke(main, ["show", "--columns", "80", str(_report(tmp_path))])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "(not shown at 80 columns: image missing, text missing)" in lines


def test_a_file_that_is_no_report_is_one_line(tmp_path):
    (tmp_path / "metrics.json").write_text('{"acc": 1}', encoding="utf-8")
    r = CliRunner().invoke(main, ["show", str(tmp_path / "metrics.json")])
    assert r.exit_code == 1
    assert r.output == (
        f"Error: {tmp_path / 'metrics.json'}: not a report's metrics.json (no 'runs')\n"
    )
    r = CliRunner().invoke(main, ["show", str(tmp_path / "none.json")])
    assert r.output == f"Error: {tmp_path / 'none.json'}: no such metrics file\n"


def test_a_row_of_the_wrong_shape_is_one_line_naming_its_key(tmp_path):
    """A value of the wrong type, a row that is not one, `runs` as a string:
    each one line naming the key, never a traceback or a row left out."""
    import json

    good = json.loads(committed("results/demo/metrics.json"))
    path = tmp_path / "metrics.json"
    cases = {
        "pal.acc": ({"pal": {**good["pal"], "acc": "53.0"}}, "'pal.acc' is '53.0'"),
        "row": ({"extra": {"label": "x"}}, "'extra' is not a report row (no 'acc')"),
        "group": (
            {"pal": {**good["pal"], "acc_by_missing": [1]}},
            "'pal.acc_by_missing' is [1], not a mapping",
        ),
        "runs": ({"runs": "0,1,2"}, "'runs' is '0,1,2', not a list of run numbers"),
    }
    for name, (change, line) in cases.items():
        path.write_text(json.dumps({**good, **change}), encoding="utf-8")
        r = CliRunner().invoke(main, ["show", str(path)])
        assert r.exit_code == 1, name
        assert r.output.startswith(f"Error: {path}: {line}"), (name, r.output)
        assert "Traceback" not in r.output and len(r.output.splitlines()) == 1


def test_a_multi_label_report_shows_f1_fg_diag_and_map(tmp_path):
    """Rows scored by macro F1 (`measure`): F1 in Acc's place, RebQ's
    forgetting (FG_diag) and mAP beside it, the threshold in the title; the
    BP head's row reads the same columns."""
    from palcore.params import ProtocolParams
    from palcore.variants import VariantRow
    from solver.report import build, write_report

    def run_metrics(f1: float) -> dict:
        m = {
            "acc": f1,
            "fg": 4.0,
            "fg_diag": 2.0 + f1 / 100,
            "aia": f1 + 1,
            "last": f1 - 1,
            "matrix": [[f1], [f1, f1]],
            "step_accuracy": [f1, f1],
            "acc_by_task": {"first": f1, "later": f1},
            "acc_by_missing": {
                "complete": f1 + 5,
                "image_missing": f1 - 5,
                "text_missing": f1,
            },
            "measure": "macro_f1",
            "threshold": 0.3,
        }
        m["map"] = {k: m[k] + 20 for k in ("acc", "fg", "fg_diag", "aia", "last")}
        return m

    for run, f1 in enumerate([40.0, 44.0]):
        folder = tmp_path / "evaluate" / "pal" / str(run)
        folder.mkdir(parents=True)
        (folder / "metrics.json").write_text(
            json.dumps({**run_metrics(f1), "bp": run_metrics(f1 - 20)})
        )
    spec = {"pal": VariantRow("PAL", {}, bp=VariantRow("BP head", {}))}
    report = build(tmp_path / "evaluate", ["pal"], ProtocolParams(runs=(0, 1)), spec)
    write_report(tmp_path / "results", report)
    r = CliRunner().invoke(main, ["show", str(tmp_path / "results")])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    head = lines.index(next(x for x in lines if x.lstrip().startswith("F1")))
    assert " ".join(lines[:head]).startswith(
        f"{tmp_path / 'results' / 'metrics.json'}: macro F1 (%, scores > 0.3) "
        "and macro mAP (%), mean ± sample std over 2 runs"
    )
    assert lines[head].split() == [
        *("F1", "FG", "FG_diag", "AIA", "Last", "mAP", "complete", "image"),
        "missing",
    ]
    assert "(not shown at 120 columns: text missing)" in lines
    assert " ".join(lines[head + 1].split()[:19]) == (
        "pal 42.00 ± 2.83 4.00 ± 0.00 2.42 ± 0.03 43.00 ± 2.83 41.00 ± 2.83 "
        "62.00 ± 2.83"
    )
    assert lines[head + 2].split()[0] == "bp"
    bp = lines[head + 2].split()
    assert (bp[1], bp[7], bp[16]) == ("22.00", "2.22", "42.00")  # F1, FG_diag, mAP
