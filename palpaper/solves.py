"""What a grid's analytic stage holds and costs: its largest solve's Gram
matrix, and with `solve.heads` the heads' FLOPs as a multiple of a plain
solve's (solver.api.solve_flops). No card work: the solve runs where
solve.device says."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from palpaper.overrides import Cell, GridError, get
from palpaper.sizes import Size

DTYPE_BYTES = {"float64": 8, "float32": 4}
FEATURE_DIM = 768  # ViLT-B/32's hidden size: the presets' feature dimension


def largest_solve(
    cells: Sequence[Cell], params: Mapping[str, Any], size: Size
) -> dict[str, Any]:
    """The largest up-sampling width among the cells: its Gram matrix
    (width², solve.dtype) is held once per solve; with `solve.heads`, how
    many times a plain solve's FLOPs the heads' solve takes (no card work)."""
    width = max(int(c.value(params, "solve.width")) for c in cells)
    dtype = str(get(params, "solve.dtype"))
    gb = width * width * DTYPE_BYTES.get(dtype, 8) / 1e9
    device = str(get(params, "solve.device"))
    out = {"width": width, "dtype": dtype, "gram_gb": gb, "device": device}
    cell = max(cells, key=lambda c: len(_heads(c, params)))
    heads = _heads(cell, params)
    if heads:
        from solver.api import solve_flops  # NumPy and matplotlib: not for --help

        flops = solve_flops(
            width,
            round(size.total("train")),
            FEATURE_DIM,
            size.classes,
            int(get(params, "data.tasks")),
            int(get(params, "solve.batch_rows")),
            len(get(params, "solve.eta_grid")),
            auto=str(cell.value(params, "solve.eta")) == "auto",
        )
        out["heads"] = list(heads)
        out["heads_flops_x"] = 1 + sum(flops[h] for h in heads) / flops["solve"]
    return out


def _heads(cell: Cell, params: Mapping[str, Any]) -> tuple[str, ...]:
    try:
        return tuple(cell.value(params, "solve.heads") or ())
    except GridError:  # params without solve.heads: none
        return ()
