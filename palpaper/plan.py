"""`pal-paper plan`: a grid's projected time from its cells' own params on
a card (palpaper/costs.yaml, or a measured card file), and the memory of its
largest solve.

Per (variant, run), a variant's prompt method (its `prompt.method` after its
`ablation` changes) sets the rate its tuning is priced at: a process start-up,
then per task its new loader's first batch and its graph capture, then
epochs × N / rate, where N is the training samples (the dataset's, or classes
× `data.per_class`). A variant that does not train (`tune.epochs: 0`: `init`,
`frozen`) costs its extraction only. An extraction costs its start-up + E /
rate, E = N + test × (K + 1) / 2 the embeddings of K steps (step k embeds the
test samples of tasks 1..k); without prompts (`frozen`, ACIL) its features
are a gather of `pal frozen`'s queries, no forward: its start-up only. The
frozen queries cost once per dataset (`pal frozen`: 3 rows a sample, every
cell reads them from DVC's cache). A grid adds, per cell, the tunings and
extractions `dvc repro` has not made (`tunings`).

The card is filled: J tunings at once, the largest J of the card's `packing`
whose tunings (the largest `tuning_gib` of the grid's methods) fit in 90 % of
its memory. The grid's card-hours are its work / packing[J]; a cell on one of
a card's J slots takes its work × J / packing[J], and the wall time on N cards
places the cells on N × J slots (`wall_hours`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from palpaper.backbone import Scale, backbone_scale, scaled
from palpaper.cards import (  # noqa: F401  (plan's names for its callers)
    CARD_ENV,
    CARD_KEYS,
    MEMORY_SHARE,
    Card,
    card,
    check_card,
    costs,
)
from palpaper.grids import RESULTS, cited_variants
from palpaper.inputs import parse_results, read_params
from palpaper.overrides import Cell, GridError, get
from palpaper.packaged import published
from palpaper.prices import (  # noqa: F401  (plan's names for its callers)
    Variant,
    cell_seconds,
    device_kind,
    extract_seconds,
    frozen_minutes,
    pairs,
    trained_methods,
    tune_seconds,
    tunings,
    unique,
    variant,
)
from palpaper.sizes import Size, caches, dataset_size
from palpaper.solves import largest_solve
from palpaper.workers import wall_hours

# the whole paper: Food101's results (not `heads`, beyond the paper), N24News's
# Table 2 and its step figure (the paper gives N24News no other result:
# palpaper/published.yaml)
PAPER = (
    ("configs/food101.yaml", tuple(r for r in RESULTS if r != "heads")),
    ("configs/n24news.yaml", ("missing", "steps")),
)


@dataclass
class Route:
    """A route's work before packing: per result (id, columns, tunings,
    extractions, hours alone), each new cell's hours alone, the methods its
    tunings train, every cell (for the largest solve)."""

    results: list[tuple[str, int, int, int, float]] = field(default_factory=list)
    cells_h: list[float] = field(default_factory=list)
    methods: list[str] = field(default_factory=list)
    every: list[Cell] = field(default_factory=list)


@dataclass(frozen=True)
class Grid:
    """One dataset's results priced on a card: both routes of the baselines
    where `--baselines cited` applies (cite flag -> route), else the one."""

    dataset: str
    params: Mapping[str, Any]
    ids: tuple[str, ...]
    size: Size
    frozen_h: float
    routes: dict[bool, Route]
    card: Card  # the card's rates scaled to the grid's backbone
    scale: Scale

    def methods(self) -> list[str]:
        return unique(m for r in self.routes.values() for m in r.methods)


@dataclass(frozen=True)
class Packing:
    """J tunings at once on each card (`slots`), at packing[J] (`factor`)
    the samples/s of one alone; `gib` the largest tuning it was chosen for."""

    slots: int
    factor: float
    gib: float

    def card_h(self, hours: float) -> float:
        """Card-hours of `hours` of work done J at a time."""
        return hours / self.factor

    def slot_h(self, hours: float) -> float:
        """Wall time of a cell of `hours` alone on one of a card's J slots."""
        return hours * self.slots / self.factor


def packing(c: Card, methods: Sequence[str]) -> Packing:
    """The card filled with the grid's tunings (`Card.slots`)."""
    gib = c.largest(methods)
    j = c.slots(gib)
    return Packing(j, float(c["packing"][j]), gib)


def price(
    ids: Sequence[str],
    params: Mapping[str, Any],
    runs: Sequence[int] | None,
    where: str,
    c: Card,
) -> Grid:
    """Results `ids` of a params file (`where` names it) priced on card `c`."""
    dataset = str(get(params, "data.dataset"))
    size = dataset_size(params, where)
    scale = backbone_scale(params)
    c = scaled(c, scale)
    cites = (False, True) if _cites(ids, dataset) else (False,)
    routes = {cite: _route(ids, params, runs, cite, c, size) for cite in cites}
    frozen_h = frozen_minutes(params, c, size) / 60
    return Grid(dataset, params, tuple(ids), size, frozen_h, routes, c, scale)


def plan_report(
    ids: Sequence[str],
    params: Mapping[str, Any],
    runs: Sequence[int] | None,
    where: str,
    cards: int = 1,
    card_name: str | None = None,
) -> dict[str, Any]:
    """What `pal-paper plan` prints (as text or `--json`): the card, and the
    dataset's grid priced on it; `where` names the params file, the wall time
    is on `cards` cards of `card_name` (--card; None: the card tune.device
    implies). Where a result runs the baselines (Tables 1-2, steps) and Tables
    1-2 have the paper's numbers for the dataset, both routes: the baselines
    measured (the default) and cited (`--baselines cited`)."""
    c = card(card_name, device_kind(params) if card_name is None else "GPU")
    grid = price(ids, params, runs, where, c)
    pack = packing(c, grid.methods())
    return {
        "card": _card_report(c, pack, grid.methods(), cards),
        "datasets": [_grid_report(grid, c, pack, cards, where)],
    }


def paper_report(
    presets: Sequence[tuple[str, Mapping[str, Any]]],
    runs: Sequence[int] | None,
    cards: int = 1,
    card_name: str | None = None,
) -> dict[str, Any]:
    """`pal-paper plan paper`: each of PAPER's params files (path, params)
    with its results, then the whole paper per route: the card-hours (the
    sum of the datasets') and the wall time of every cell on `cards` cards."""
    kind = device_kind(presets[0][1]) if card_name is None else "GPU"
    c = card(card_name, kind)
    grids = [
        price(ids, params, runs, path, c)
        for (path, params), (_, ids) in zip(presets, PAPER, strict=True)
    ]
    methods = unique(m for g in grids for m in g.methods())
    pack = packing(c, methods)
    paper = {}
    for cite in (False, True):
        routes = [g.routes.get(cite, g.routes[False]) for g in grids]
        frozen = sum(g.frozen_h for g in grids)
        cells_h = [h for r in routes for h in r.cells_h]
        paper[ROUTE_NAMES[cite]] = _totals(cells_h, frozen, pack, cards)
    return {
        "card": _card_report(c, pack, methods, cards),
        "datasets": [
            _grid_report(grid, c, pack, cards, path)
            for (path, _), grid in zip(presets, grids, strict=True)
        ],
        "paper": paper,
    }


def named_report(
    names: Sequence[str],
    params_file: Path,
    runs: Sequence[int] | None,
    cards: int = 1,
    card_name: str | None = None,
) -> dict[str, Any]:
    """`pal-paper plan RESULT…`'s report: `paper`, named alone, prices the
    whole paper (PAPER's params files, `paper_report`); other names the
    results on `params_file` (`plan_report`)."""
    if "paper" in names:
        if list(names) != ["paper"]:
            raise GridError(
                f"plan: paper (the whole paper) is named alone, got {' '.join(names)}"
            )
        presets = [(path, read_params(Path(path))) for path, _ in PAPER]
        return paper_report(presets, runs, cards, card_name)
    params = read_params(params_file)
    ids = parse_results(names)
    return plan_report(ids, params, runs, str(params_file), cards, card_name)


ROUTE_NAMES = {False: "measured", True: "cited"}


def _card_report(
    c: Card, pack: Packing, methods: Sequence[str], cards: int
) -> dict[str, Any]:
    """The card, where its figures come from, and J: the grid's largest
    tuning in 90 % of its memory, among the J the card has a figure for."""
    return {
        "name": c["name"],
        "file": c.where,
        "figures": c.status(),
        "cards": cards,
        "memory_gib": c["memory_gib"],
        "tunings_at_once": pack.slots,
        "packing_factor": pack.factor,
        "largest_tuning_gib": pack.gib,
        "methods": list(methods),
        "at_pal_rates": [m for m in methods if c.priced_as(m) != m],
        "packing_figures_for": sorted(c["packing"]),
    }


def _grid_report(
    grid: Grid, c: Card, pack: Packing, cards: int, where: str
) -> dict[str, Any]:
    """A dataset's grid: each route's results and totals, the minutes per
    (variant, run), and the largest solve."""
    params = grid.params
    every = [cell for r in grid.routes.values() for cell in r.every]
    routes = {
        ROUTE_NAMES[cite]: _route_report(route, grid.frozen_h, pack, cards)
        for cite, route in grid.routes.items()
    }
    if True in grid.routes:
        routes["cited"]["not_run"] = cited_names(params, grid.ids)
    return {
        "dataset": grid.dataset,
        "params": where,
        "size": grid.size.report(),
        "backbone": {"rate_factor": grid.scale.factor, "source": grid.scale.source},
        "tune_device": str(get(params, "tune.device")),
        "results": list(grid.ids),
        "routes": routes,
        "minutes": _minutes(grid, grid.card),
        "largest_solve": largest_solve(every, params, grid.size),
        "caches": caches(grid.dataset, grid.size),
    }


def _minutes(grid: Grid, c: Card) -> dict[str, Any]:
    """Minutes per (variant, run) at the committed params: each trained
    method's tuning, an extraction (with prompts, and without: a gather of
    the frozen queries), and the frozen queries once."""
    params, base, size = grid.params, Cell(()), grid.size
    pal = variant(params, base, "")
    methods = grid.methods() or [pal.method]
    epochs = int(get(params, "tune.epochs"))
    return {
        "tune": {
            m: tune_seconds(base, params, Variant(m, True, epochs), c, size) / 60
            for m in methods
        },
        "extract": {
            m: extract_seconds(base, params, Variant(m, True, 0), c, size) / 60
            for m in methods
        },
        "extract_without_prompts": c["extract_startup_s"] / 60,
        "frozen_queries_once": grid.frozen_h * 60,
    }


def _totals(
    cells_h: Sequence[float], frozen_h: float, pack: Packing, cards: int
) -> dict[str, Any]:
    """Card-hours (the frozen queries once), the wall time on the cards, and
    the longest cell: on one of its card's slots (a cluster job's time limit)
    and alone."""
    slot = [pack.slot_h(h) for h in cells_h]
    return {
        "card_hours": frozen_h + sum(pack.card_h(h) for h in cells_h),
        "wall_hours": frozen_h + wall_hours(slot, cards * pack.slots),
        "slots": cards * pack.slots,
        "cells": len(slot),
        "longest_cell_hours": max(slot, default=0.0),
        "longest_cell_alone_hours": max(cells_h, default=0.0),
    }


def _route_report(
    route: Route, frozen_h: float, pack: Packing, cards: int
) -> dict[str, Any]:
    """Each result's cells, tunings, extractions and card-hours, then the
    route's totals (cells shared between results counted once)."""
    return {
        "results": [
            {
                "result": rid,
                "cells": n,
                "tunings": t,
                "extractions": e,
                "card_hours": pack.card_h(hours),
            }
            for rid, n, t, e, hours in route.results
        ],
        **_totals(route.cells_h, frozen_h, pack, cards),
    }


def _cites(ids: Sequence[str], dataset: str) -> bool:
    """Whether `--baselines cited` applies: a result of `ids` runs the
    baselines, and Tables 1-2 have the paper's numbers for `dataset`."""
    tables = published()["missing"]
    return dataset in tables and any(RESULTS[rid].runs_baselines for rid in ids)


def cited_names(params: Mapping[str, Any], ids: Sequence[str]) -> list[str]:
    """The paper's names of the rows `--baselines cited` takes from the paper."""
    names: list[str] = []
    for rid in (r for r in ids if RESULTS[r].runs_baselines):
        for variant_name in RESULTS[rid].rows:
            name = cited_variants(params, rid).get(variant_name)
            names += [name] if name is not None and name not in names else []
    return names


def _route(
    ids: Sequence[str],
    params: Mapping[str, Any],
    runs: Sequence[int] | None,
    cite: bool,
    c: Card,
    size: Size,
) -> Route:
    """The route's cells, each new one priced once (a cell two results share
    counts in the first)."""
    route, seen = Route(), set()
    for rid in ids:
        cols = RESULTS[rid].columns(params, runs, cite)
        hours, t_all, e_all = 0.0, 0, 0
        for col in cols:
            route.every.append(col.cell)
            if col.cell.name in seen:
                continue
            seen.add(col.cell.name)
            added = pairs(RESULTS[rid], col.cell, params)
            kinds = [variant(params, col.cell, v) for v in added]
            route.methods = unique(
                [*route.methods, *(v.method for v in kinds if v.epochs != 0)]
            )
            route.cells_h.append(
                cell_seconds(RESULTS[rid], col.cell, params, c, size) / 3600
            )
            hours += route.cells_h[-1]
            t_all += sum(v.epochs != 0 for v in kinds)
            e_all += len(kinds)
        route.results.append((rid, len(cols), t_all, e_all, hours))
    return route
