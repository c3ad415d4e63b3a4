"""What `pal-paper list` and `plan` print, no line over 100 columns.

`plan`: the answer first (card-hours and wall time), then each route's
table, the minutes per (variant, run), and where the figures come from at the
end (`--json` prints the report itself: `plan.plan_report`,
`plan.paper_report`). `list`: each result's cells, the overrides all its cells
share said once.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from palpaper.grids import Column, Result
from palpaper.notes import listed

COLUMNS = 100
_ROUTE_WORDS = {
    "measured": "--baselines measured (the default): the five compared methods run too",
    "cited": "--baselines cited: {names} not run (Tables 1-2 cite the paper)",
}


def plan_text(report: Mapping[str, Any]) -> list[str]:
    """The lines `pal-paper plan` prints for a report of one dataset or of
    the whole paper."""
    card = report["card"]
    lines: list[str] = []
    if "paper" in report:
        lines += _answer("the paper", report["paper"], card)
        for grid in report["datasets"]:
            results = ", ".join(grid["results"])
            lines += ["", f"{grid['dataset']} ({grid['params']}): {results}"]
            lines += _grid_lines(grid, card)
    else:
        (grid,) = report["datasets"]
        lines += _answer(f"{grid['dataset']} ({grid['params']})", grid["routes"], card)
        lines += _grid_lines(grid, card)
    lines += ["", *_card_lines(card)]
    return [w for line in lines for w in _wrap(line)]


def _answer(
    what: str, routes: Mapping[str, Mapping[str, Any]], card: Mapping[str, Any]
) -> list[str]:
    """The first lines: card-hours and wall time, the default route first."""
    n = card["cards"]
    first = routes["measured"]
    lines = [
        f"{what}: {first['card_hours']:.1f} card-hours, {first['wall_hours']:.1f} h "
        f"wall on {n} card{'s' * (n != 1)}"
    ]
    if "cited" in routes:
        cited = routes["cited"]
        lines.append(
            f"  with --baselines cited: {cited['card_hours']:.1f} card-hours, "
            f"{cited['wall_hours']:.1f} h wall"
        )
    return lines


def _grid_lines(grid: Mapping[str, Any], card: Mapping[str, Any]) -> list[str]:
    """A dataset's routes, its largest solve and its minutes per (variant, run)."""
    size = grid["size"]
    lines = [
        f"  size: {size['train']} training and {size['test']} test samples of "
        f"{size['classes']} classes, from {size['source']}"
    ]
    backbone = grid["backbone"]
    if backbone["source"] is not None:
        lines.append(
            f"  backbone: the card's rates x {backbone['rate_factor']:.1f}, "
            "ViLT-B/32's multiply-adds a sample over this one's "
            f"({backbone['source']}); a floor: a small model does not "
            "reach the card's FLOP rate"
        )
    routes = grid["routes"]
    for name, route in routes.items():
        if len(routes) > 1:
            words = _ROUTE_WORDS[name].format(names=listed(route.get("not_run", [])))
            lines.append(f"  {words}")
        lines += _route_lines(route, card)
    solve = grid["largest_solve"]
    lines.append(
        f"  largest solve: width {solve['width']}, a {solve['dtype']} Gram matrix of "
        f"{solve['gram_gb']:.1f} GB (solve.device {solve['device']})"
    )
    lines.append(_cache_line(grid["caches"]))
    if "heads" in solve:
        lines.append(
            f"  solve.heads ({', '.join(solve['heads'])}): {solve['heads_flops_x']:.2f}"
            "x the same solve's FLOPs without heads, on the solve's device, "
            "no card work"
        )
    return [*lines, *_minutes_lines(grid["minutes"])]


def _cache_line(c: Mapping[str, Any]) -> str:
    """The frozen queries' and the pixel cache's size, once per dataset."""
    pixels = (
        "no size a photo recorded for the pixel cache"
        if c["pixels_gb"] is None
        else f"the pixel cache about {c['pixels_gb']:.1f} GB "
        f"({c['photo_bytes'] / 1e3:.0f} KB a photo: {c['photo_source']})"
    )
    return (
        f"  caches for {c['samples']} train and test samples: the frozen queries "
        f"{c['frozen_gb']:.2f} GB (3 x 2 x 768 float32 a sample); {pixels}"
    )


def _route_lines(route: Mapping[str, Any], card: Mapping[str, Any]) -> list[str]:
    """The route's table (a row per result, then the total), its wall time and
    its longest cell."""
    rows = [("result", "cells", "tunings", "extractions", "card-hours")]
    for r in route["results"]:
        rows.append(
            (
                r["result"],
                str(r["cells"]),
                str(r["tunings"]),
                str(r["extractions"]),
                f"{r['card_hours']:.1f}",
            )
        )
    rows.append(("all", str(route["cells"]), "", "", f"{route['card_hours']:.1f}"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    table = [
        "    "
        + "  ".join(
            cell.ljust(w) if i == 0 else cell.rjust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    ]
    table[-1] += "  (shared cells, frozen queries once)"
    slots = route["slots"]
    return [
        *table,
        f"    wall on {card['cards']} card{'s' * (card['cards'] != 1)}: "
        f"{route['wall_hours']:.1f} h ({slots} slot{'s' * (slots != 1)})",
        f"    longest cell: {route['longest_cell_hours']:.1f} h, "
        f"{card['tunings_at_once']} at once on its card "
        f"({route['longest_cell_alone_hours']:.1f} h alone): a cluster task's limit",
    ]


def _minutes_lines(minutes: Mapping[str, Any]) -> list[str]:
    def each(by_method: Mapping[str, float]) -> str:
        return ", ".join(f"{m} {v:.1f}" for m, v in by_method.items())

    return [
        "  minutes per (variant, run) at the committed params:",
        f"    tune {each(minutes['tune'])}",
        f"    extract {each(minutes['extract'])}; without prompts (ACIL) "
        f"{minutes['extract_without_prompts']:.1f}, a gather of the frozen queries",
        f"    the frozen queries {minutes['frozen_queries_once']:.1f}, once (shared by "
        "every cell)",
    ]


def _card_lines(card: Mapping[str, Any]) -> list[str]:
    """Where the figures come from: the card, its packing and why that J."""
    j = card["tunings_at_once"]
    if card["memory_gib"] is None:
        why = "its memory not recorded"
    else:
        methods = ", ".join(card["methods"]) or "none"
        why = (
            f"{j} x {card['largest_tuning_gib']:g} GiB, the largest tuning of "
            f"{methods}, within 90 % of {card['memory_gib']:g} GiB"
        )
    js = ", ".join(str(n) for n in card["packing_figures_for"])
    lines = [
        f"card: {card['name']} ({card['file']}): {card['figures']}",
        f"  {j} tuning{'s' * (j != 1)} at once a card, at {card['packing_factor']:g}x "
        f"the samples/s of one alone ({why}; packing figures for J = {js}); hours "
        "are card-hours",
    ]
    if card.get("at_pal_rates"):
        lines.append(
            f"  {', '.join(card['at_pal_rates'])}: no figures on this card, priced "
            "at PAL's rates and memory"
        )
    return lines


def _wrap(line: str, hang: int = 2) -> Sequence[str]:
    """A line within COLUMNS, its continuation indented `hang` past its own."""
    if len(line) <= COLUMNS:
        return [line]
    indent = " " * (len(line) - len(line.lstrip()) + hang)
    return textwrap.wrap(
        line, COLUMNS, subsequent_indent=indent, break_on_hyphens=False
    )


def list_report(
    listing: Mapping[str, tuple[Result, Sequence[Column]]],
) -> dict[str, Any]:
    """`pal-paper list --json`: per result, where it is in the paper and its
    columns (key, label, cell name, overrides)."""
    return {
        name: {
            "paper": r.paper,
            "title": r.title,
            "columns": [
                {
                    "key": c.key,
                    "label": c.label,
                    "cell": c.cell.name,
                    "overrides": dict(c.cell.overrides),
                }
                for c in cols
            ],
        }
        for name, (r, cols) in listing.items()
    }


def list_lines(listing: Mapping[str, tuple[Result, Sequence[Column]]]) -> list[str]:
    """Per result: a line with where it is in the paper and the overrides
    every cell of it shares, then a line per column: its key, its cell's
    name (an experiment's, after the commit's hash) and its own overrides."""
    lines: list[str] = []
    for name, (r, cols) in listing.items():
        shared = (
            set.intersection(*(set(c.cell.pairs()) for c in cols)) if cols else set()
        )
        n = len(cols)
        head = f"{name}: {r.paper}; {n} column{'s' * (n != 1)}"
        every = [p for p in cols[0].cell.pairs() if p in shared] if cols else []
        if every:
            head += "; every cell: " + " ".join(every)
        lines += _wrap(head, hang=4)  # its continuation apart from the cells
        key_w = max(len(c.key) for c in cols)
        name_w = max(len(c.cell.name) for c in cols)
        for c in cols:
            own = [p for p in c.cell.pairs() if p not in shared]
            if not c.cell.overrides:
                own = ["(the committed params)"]
            row = f"  {c.key.ljust(key_w)}  {c.cell.name.ljust(name_w)}"
            lines += _wrap(f"{row}  {' '.join(own)}".rstrip())
    return lines
