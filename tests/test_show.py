"""`pal-solver show`: a report's metrics as a table of at most 120 columns."""

from __future__ import annotations

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
