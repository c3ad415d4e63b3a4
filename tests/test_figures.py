"""The figures' style: one per method everywhere, the paper's method on top,
legends outside the data, a paper's column or page wide, a 300-dpi PNG and a
PDF whose bytes repeat."""

from __future__ import annotations

import io

import pytest
from helpers import committed_params
from PIL import Image

from solver.plots import (
    COLUMN_IN,
    DPI,
    PAPER_METHOD,
    STYLES,
    legend_below,
    mean_std_line,
    new_figure,
    paper_style,
    steps_figure,
    style_of,
)

pytest.importorskip("matplotlib")


def report(names: list[str], runs: int = 3) -> dict:
    """A report of `names` whose rows fall by 10 points a step."""
    rows = {
        n: {
            "step_accuracy": [
                {"mean": 90.0 - 10 * k - i, "std": 1.0 if runs > 1 else None}
                for k in range(4)
            ]
        }
        for i, n in enumerate(names)
    }
    return {"rows": rows, "labels": {n: f"the {n} row" for n in names}}


def test_every_variant_has_a_style_of_its_own_and_pal_is_on_top() -> None:
    keys = [*committed_params()["ablation"], "bp"]
    looks = {(style_of(k).color, style_of(k).dash, style_of(k).marker) for k in keys}
    assert len(looks) == len(keys)  # no two methods drawn alike
    assert set(keys) <= set(STYLES)
    pal = style_of(PAPER_METHOD)
    assert pal.z > max(style_of(k).z for k in keys if k != PAPER_METHOD)
    assert pal.width > max(style_of(k).width for k in keys if k != PAPER_METHOD)
    # a variant params do not list: a style by its name, the same each time
    assert style_of("mine") == style_of("mine")


def test_the_legend_is_outside_the_data_pal_first() -> None:
    with paper_style():
        fig = new_figure(COLUMN_IN, 3.0)
        ax = fig.add_subplot()
        for n in ("frozen", "map", PAPER_METHOD, "bp"):
            mean_std_line(ax, report([n])["rows"][n]["step_accuracy"], n, n)
        legend_below(fig, ax)
        fig.canvas.draw()
        (legend,) = fig.legends
        box = legend.get_window_extent()
        assert not box.overlaps(ax.get_window_extent())
        assert box.y1 <= ax.get_window_extent().y0
        assert [t.get_text() for t in legend.get_texts()] == [
            PAPER_METHOD,
            "frozen",
            "bp",
            "map",
        ]


def test_a_report_figure_is_a_column_wide_at_300_dpi_and_repeats() -> None:
    files = steps_figure(report(["pal", "bp", "frozen", "init"]))
    assert sorted(files) == ["step_accuracy.pdf", "step_accuracy.png"]
    with Image.open(io.BytesIO(files["step_accuracy.png"])) as im:
        assert im.size == (round(COLUMN_IN * DPI), round((2.4 + 0.16 * 4) * DPI))
        assert round(im.info["dpi"][0]) == DPI
    pdf = files["step_accuracy.pdf"]
    assert pdf.startswith(b"%PDF-") and b"CreationDate" not in pdf
    assert steps_figure(report(["pal", "bp", "frozen", "init"])) == files
    # one run: no band, the same layout
    assert steps_figure(report(["pal"], runs=1))["step_accuracy.png"][:8] == (
        b"\x89PNG\r\n\x1a\n"
    )


def test_a_pdf_adds_no_line_to_a_stages_log(caplog: pytest.LogCaptureFixture) -> None:
    """fontTools logs each step of subsetting the PDF's font at INFO; a stage
    logs at INFO, so those lines would fill its log."""
    with caplog.at_level("INFO"):
        steps_figure(report(["pal", "bp"]))
    assert [r.name for r in caplog.records if r.name.startswith("fontTools")] == []
