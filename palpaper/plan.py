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

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from palpaper.grids import RESULTS, Cell, GridError, Result, cited_variants, get
from palpaper.notes import listed
from palpaper.packaged import package_yaml, published
from palpaper.workers import wall_hours

FREE_KEYS = {"pipelines.main", "protocol.runs"}
DTYPE_BYTES = {"float64": 8, "float32": 4}
CARD_ENV = "PAL_PAPER_CARD"  # the card a GPU is priced as (NAME or PATH)
MEMORY_SHARE = 0.9  # of a card's memory that its J tunings may take
CARD_KEYS = (
    "name",
    "memory_gib",
    "status",
    "commit",
    "basis",
    "steps",
    "tune_startup_s",
    "first_batch_s",
    "capture_s_per_task",
    "frozen_rows_per_s",
    "extract_startup_s",
    "extract_per_s",
    "tune_per_s",
    "tuning_gib",
    "packing",
)
RATES = ("frozen_rows_per_s", "extract_per_s")  # > 0: divided by
SECONDS = ("tune_startup_s", "first_batch_s", "capture_s_per_task", "extract_startup_s")
# the whole paper: Food101's results, N24News's Table 2 and its step figure
# (the paper gives N24News no other result: palpaper/published.yaml)
PAPER = (
    ("configs/food101.yaml", tuple(RESULTS)),
    ("configs/n24news.yaml", ("missing", "steps")),
)


def costs() -> dict[str, Any]:
    return package_yaml("costs.yaml")


def methods() -> tuple[str, ...]:
    """Every prompt method a card prices (pipeline.params' MethodName)."""
    from typing import get_args

    from pipeline.params import MethodName

    return get_args(MethodName)


@dataclass(frozen=True)
class Card:
    """A card's figures (one entry of costs.yaml's `cards`, or a card file),
    checked; `where` names it in lines and errors."""

    where: str
    entry: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.entry[key]

    def status(self) -> str:
        """What its figures are: measured where, or projected from what."""
        e = self.entry
        if e["status"] == "measured":
            return f"measured on {e['name']} at {e['commit']}, {e['steps']} steps"
        return f"projected from {e['basis']}"

    def slots(self, gib: float, memory: float | None = None) -> int:
        """J: the most tunings of `gib` GiB each that `packing` has a figure
        for and 90 % of the card's memory (or `memory` GiB, a card torch
        sees) holds; 1 at least: a cell runs."""
        memory = self.entry["memory_gib"] if memory is None else memory
        if memory is None:  # not recorded: packing names J = 1 only
            return 1
        fits = [j for j in self.entry["packing"] if j * gib <= MEMORY_SHARE * memory]
        return max(fits, default=1)

    def largest(self, methods: Sequence[str]) -> float:
        """GiB of the largest tuning of `methods` (0 for none)."""
        return max((float(self.entry["tuning_gib"][m]) for m in methods), default=0.0)


def check_card(entry: Any, where: str) -> Card:
    """A card entry with every key of CARD_KEYS, a rate and a memory for each
    prompt method, and J = 1 in its packing; else one line naming `where`."""
    if not isinstance(entry, Mapping):
        raise GridError(f"{where}: a card entry (a mapping of {', '.join(CARD_KEYS)})")
    for key in CARD_KEYS:
        if key not in entry:
            raise GridError(f"{where}: no key '{key}'")
    if entry["status"] not in ("measured", "projected"):
        raise GridError(
            f"{where}: status is measured or projected, got '{entry['status']}'"
        )
    for key in RATES:
        _number(entry[key], where, key, positive=True)
    for key in SECONDS:
        _number(entry[key], where, key)
    for key, positive in (("tune_per_s", True), ("tuning_gib", False)):
        table = entry[key]
        if not isinstance(table, Mapping):
            raise GridError(f"{where}: {key}: a number for each prompt method")
        for method in methods():
            if method not in table:
                raise GridError(
                    f"{where}: no key '{key}.{method}' (every prompt method: "
                    f"{', '.join(methods())})"
                )
            _number(table[method], where, f"{key}.{method}", positive)
    packing = entry["packing"]
    if not isinstance(packing, Mapping) or 1 not in packing:
        raise GridError(f"{where}: packing needs J = 1 (one tuning alone): 1: 1.0")
    for j, factor in packing.items():
        if not isinstance(j, int) or isinstance(j, bool) or j < 1:
            raise GridError(f"{where}: packing: J is a whole number ≥ 1, got {j!r}")
        _number(factor, where, f"packing.{j}", positive=True)
    if entry["memory_gib"] is None:
        if set(packing) != {1}:
            raise GridError(
                f"{where}: memory_gib is empty, so packing names J = 1 only"
            )
    else:
        _number(entry["memory_gib"], where, "memory_gib", positive=True)
    return Card(where, entry)


def _number(value: Any, where: str, key: str, positive: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or value < 0 or (positive and value == 0):
        word = "a positive number" if positive else "a number ≥ 0"
        raise GridError(f"{where}: {key} is {word}, got {value!r}")


def card(name: str | None, kind: str = "GPU") -> Card:
    """--card NAME|PATH: one of costs.yaml's cards, or a YAML file holding one
    card entry. None: the card of a `kind` device ('GPU': $PAL_PAPER_CARD,
    else h200; 'CPU': cpu)."""
    if name is None:
        name = (os.environ.get(CARD_ENV) or "h200") if kind == "GPU" else "cpu"
    cards = costs()["cards"]
    if name in cards:
        return check_card(cards[name], f"palpaper/costs.yaml {name}")
    path = Path(name)
    if not path.is_file():
        raise GridError(
            f"--card: no card '{name}' (palpaper/costs.yaml has "
            f"{', '.join(cards)}) and no such file"
        )
    try:
        entry = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError):
        raise GridError(f"{name}: not valid YAML") from None
    return check_card(entry, name)


def pairs(r: Result, cell: Cell, params: Mapping[str, Any]) -> list[str]:
    """The variant of each (variant, run) a cell adds to what `dvc repro`
    made."""
    if r.keeps_features:
        return []
    variants = cell.value(params, "pipelines.main")
    run_ids = cell.value(params, "protocol.runs")
    changed = {k for k, _ in cell.overrides} - FREE_KEYS
    if changed:
        return [v for v in variants for _ in run_ids]
    # the committed scenario: new variants or runs only
    old_v = set(get(params, "pipelines.main"))
    old_r = set(get(params, "protocol.runs"))
    return [v for v in variants for x in run_ids if v not in old_v or x not in old_r]


@dataclass(frozen=True)
class Variant:
    """What prices a variant in a cell: its prompt method, whether it has
    prompts, its epochs (its `ablation` changes over the cell's params)."""

    method: str
    prompts: bool
    epochs: int


def variant(params: Mapping[str, Any], cell: Cell, name: str) -> Variant:
    changes = (get(params, "ablation").get(name) or {}).get("changes") or {}
    prompt, tune = changes.get("prompt") or {}, changes.get("tune") or {}

    def value(key: str, default: Any) -> Any:
        try:
            return cell.value(params, key)
        except GridError:  # a params file without it: the pipeline's default
            return default

    return Variant(
        str(prompt.get("method", value("prompt.method", "pal"))),
        bool(prompt.get("enabled", value("prompt.enabled", True))),
        int(tune.get("epochs", value("tune.epochs", 0))),
    )


def trained_methods(
    ids: Sequence[str],
    params: Mapping[str, Any],
    runs: Sequence[int] | None,
    cite: bool = False,
) -> list[str]:
    """The prompt methods the cells of results `ids` train, in order."""
    found: list[str] = []
    for rid in ids:
        for col in RESULTS[rid].columns(params, runs, cite):
            kinds = [
                variant(params, col.cell, v)
                for v in pairs(RESULTS[rid], col.cell, params)
            ]
            found = _unique([*found, *(v.method for v in kinds if v.epochs != 0)])
    return found


def tunings(r: Result, cell: Cell, params: Mapping[str, Any]) -> tuple[int, int]:
    """(trained tunings, extractions) a cell adds to what `dvc repro` made."""
    added = pairs(r, cell, params)
    trained = sum(variant(params, cell, v).epochs != 0 for v in added)
    return trained, len(added)


def device_kind(params: Mapping[str, Any]) -> str:
    """'GPU' or 'CPU': where tune runs (`auto`: a GPU when torch sees one)."""
    from pipeline.model.device import auto_device

    return "GPU" if auto_device(str(get(params, "tune.device"))) == "cuda" else "CPU"


def tune_seconds(
    cell: Cell, params: Mapping[str, Any], v: Variant, c: Card, size: Mapping
) -> float:
    """One tuning of variant `v` in the cell alone on the card: its start-up,
    per task the new loader's first batch and the graph capture, then the
    steady steps at its method's rate."""
    k = int(cell.value(params, "data.tasks"))
    train, _ = _samples(cell, params, size)
    t = c["tune_startup_s"] + k * (c["first_batch_s"] + c["capture_s_per_task"])
    return t + v.epochs * train / c["tune_per_s"][v.method]


def extract_seconds(
    cell: Cell, params: Mapping[str, Any], v: Variant, c: Card, size: Mapping
) -> float:
    """One extraction: its start-up and every step's embeddings; without
    prompts (ACIL, `frozen`) the features are a gather of `pal frozen`'s
    queries (no forward), so its start-up only."""
    if not v.prompts:
        return c["extract_startup_s"]
    k = int(cell.value(params, "data.tasks"))
    train, test = _samples(cell, params, size)
    return c["extract_startup_s"] + (train + test * (k + 1) / 2) / c["extract_per_s"]


def cell_seconds(
    r: Result, cell: Cell, params: Mapping[str, Any], c: Card, size: Mapping
) -> float:
    """The work a cell adds, one process alone on the card: seconds."""
    total = 0.0
    for name in pairs(r, cell, params):
        v = variant(params, cell, name)
        if v.epochs != 0:
            total += tune_seconds(cell, params, v, c, size)
        total += extract_seconds(cell, params, v, c, size)
    return total


def frozen_minutes(params: Mapping[str, Any], c: Card, size: Mapping) -> float:
    """Minutes of the frozen-queries stage, once per dataset: every sample in
    its three states (complete, text missing, image missing)."""
    train, test = _samples(Cell(()), params, size)
    return 3 * (train + test) / c["frozen_rows_per_s"] / 60


def _samples(cell: Cell, params: Mapping[str, Any], size: Mapping) -> tuple[int, int]:
    """(training, test) samples of the cell: the dataset's, or at most
    `data.per_class` of each class and split."""
    per_class = cell.value(params, "data.per_class") if _has(params) else None
    train, test = size["train"], size["test"]
    if per_class is not None:
        train = min(train, size["classes"] * per_class)
        test = min(test, size["classes"] * per_class)
    return train, test


def _has(params: Mapping[str, Any]) -> bool:
    return "per_class" in (params.get("data") or {})


def largest_solve(cells: Sequence[Cell], params: Mapping[str, Any]) -> str:
    """The line on the largest up-sampling width among the cells: its Gram
    matrix (width², solve.dtype) is held once per solve."""
    width = max(int(c.value(params, "solve.width")) for c in cells)
    dtype = str(get(params, "solve.dtype"))
    gb = width * width * DTYPE_BYTES.get(dtype, 8) / 1e9
    return (
        f"  largest solve: width {width}, a {width} x {width} {dtype} Gram matrix "
        f"of {gb:.1f} GB per solve (solve.device {get(params, 'solve.device')})"
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
    size: Mapping[str, int]
    frozen_h: float
    routes: dict[bool, Route]

    def methods(self) -> list[str]:
        return _unique(m for r in self.routes.values() for m in r.methods)


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
    sizes = costs()["datasets"]
    if dataset not in sizes:
        raise GridError(
            f"{where}: no measured size for data.dataset '{dataset}' "
            f"(measured: {', '.join(sizes)})"
        )
    size = sizes[dataset]
    cites = (False, True) if _cites(ids, dataset) else (False,)
    routes = {cite: _route(ids, params, runs, cite, c, size) for cite in cites}
    frozen_h = frozen_minutes(params, c, size) / 60
    return Grid(dataset, params, tuple(ids), size, frozen_h, routes)


def plan_lines(
    ids: Sequence[str],
    params: Mapping[str, Any],
    runs: Sequence[int] | None,
    where: str,
    cards: int = 1,
    card_name: str | None = None,
) -> list[str]:
    """The lines `pal-paper plan` prints; `where` names the params file, the
    wall time is on `cards` cards of `card_name` (--card; None: the card
    tune.device implies). Where a result runs the baselines (Tables 1-2,
    steps) and Tables 1-2 have the paper's numbers for the dataset, both
    routes: the baselines measured (the default) and cited (`--baselines
    cited`), each with its tunings, hours and wall time."""
    c = card(card_name, device_kind(params) if card_name is None else "GPU")
    grid = price(ids, params, runs, where, c)
    pack = packing(c, grid.methods())
    device = get(params, "tune.device")
    return [
        f"{grid.dataset}, {c['name']} (tune.device {device}; {c.where}): {c.status()}",
        _packing_line(pack, c, grid.methods()),
        *_grid_lines(grid, c, pack, cards),
    ]


def paper_lines(
    presets: Sequence[tuple[str, Mapping[str, Any]]],
    runs: Sequence[int] | None,
    cards: int = 1,
    card_name: str | None = None,
) -> list[str]:
    """`pal-paper plan paper`: each of PAPER's params files (path, params)
    with its results, then the whole paper per route: the card-hours (the
    sum of the datasets') and the wall time of every cell on `cards` cards."""
    kind = device_kind(presets[0][1]) if card_name is None else "GPU"
    c = card(card_name, kind)
    grids = [
        price(ids, params, runs, path, c)
        for (path, params), (_, ids) in zip(presets, PAPER, strict=True)
    ]
    pack = packing(c, _unique(m for g in grids for m in g.methods()))
    lines = [f"the paper, {c['name']} ({c.where}): {c.status()}"]
    lines.append(_packing_line(pack, c, _unique(m for g in grids for m in g.methods())))
    for (path, _), grid in zip(presets, grids, strict=True):
        lines.append(f"  {grid.dataset} ({path}): {', '.join(grid.ids)}")
        lines += ["  " + line for line in _grid_lines(grid, c, pack, cards)]
    for cite, words in ((False, "--baselines measured"), (True, "--baselines cited")):
        routes = [g.routes.get(cite, g.routes[False]) for g in grids]
        frozen = sum(g.frozen_h for g in grids)
        hours = frozen + sum(pack.card_h(h) for r in routes for h in r.cells_h)
        slot = [pack.slot_h(h) for r in routes for h in r.cells_h]
        wall = frozen + wall_hours(slot, cards * pack.slots)
        lines.append(
            f"  the paper, {words}: {hours:.1f} card-hours; on {cards} "
            f"card{'s' * (cards != 1)}: {wall:.1f} h wall ({len(slot)} cells, the "
            f"longest {max(slot, default=0.0):.1f} h)"
        )
    return lines


def _unique(items: Any) -> list[str]:
    out: list[str] = []
    for item in items:
        out += [item] if item not in out else []
    return out


def _packing_line(pack: Packing, c: Card, methods: Sequence[str]) -> str:
    """J, the packing factor and why J: the grid's largest tuning in 90 % of
    the card's memory, among the J the card has a figure for."""
    js = ", ".join(str(j) for j in sorted(c["packing"]))
    if c["memory_gib"] is None:
        why = "its memory not recorded"
    else:
        why = (
            f"{pack.slots} x {pack.gib:g} GiB, the largest tuning of "
            f"{', '.join(methods) or 'none'}, within 90 % of {c['memory_gib']:g} GiB"
        )
    return (
        f"  {pack.slots} tuning{'s' * (pack.slots != 1)} at once a card, at "
        f"{pack.factor:g}x the samples/s of one alone ({why}; packing figures for "
        f"J = {js}): hours below are card-hours, wall times on "
        f"{pack.slots} slot{'s' * (pack.slots != 1)} a card"
    )


def _grid_lines(grid: Grid, c: Card, pack: Packing, cards: int) -> list[str]:
    """A dataset's lines under the card's: the per-(variant, run) minutes, each
    route's results, totals and wall times, and the largest solve."""
    params = grid.params
    lines = [_minutes_line(grid, c)]
    every = [cell for r in grid.routes.values() for cell in r.every]
    if len(grid.routes) == 1:
        lines += _route_lines(grid.routes[False], grid.frozen_h, pack, cards)
        return [*lines, largest_solve(every, params)]
    names = listed(cited_names(params, grid.ids))
    for cite, words in (
        (
            False,
            "--baselines measured (the default): the five compared methods run too",
        ),
        (True, f"--baselines cited: {names} not run (Tables 1-2 cite the paper)"),
    ):
        route = _route_lines(grid.routes[cite], grid.frozen_h, pack, cards)
        lines += [f"  {words}", *("  " + line for line in route)]
    return [*lines, largest_solve(every, params)]


def _minutes_line(grid: Grid, c: Card) -> str:
    """Minutes per (variant, run) at the committed params: each trained
    method's tuning, an extraction (with and without prompts), and the frozen
    queries once."""
    params, base, size = grid.params, Cell(()), grid.size
    pal = variant(params, base, "")
    methods = grid.methods() or [pal.method]
    epochs = int(get(params, "tune.epochs"))
    tunes = ", ".join(
        f"{m} {tune_seconds(base, params, Variant(m, True, epochs), c, size) / 60:.1f}"
        for m in methods
    )
    extract = extract_seconds(base, params, pal, c, size) / 60
    gather = c["extract_startup_s"] / 60
    return (
        f"  per (variant, run) at the committed params: tune {tunes} min; extract "
        f"{extract:.1f} min, without prompts (ACIL) {gather:.1f} min (a gather of "
        f"the frozen queries); the frozen queries {grid.frozen_h * 60:.1f} min "
        "once (shared by every cell)"
    )


def _route_lines(route: Route, frozen_h: float, pack: Packing, cards: int) -> list[str]:
    """A line per result, the total, the wall time on the cards and the
    longest cell (a cluster job's time limit)."""
    lines = [
        f"  {rid}: {n} cell{'s' * (n != 1)}, {t} tunings, {e} extractions: "
        f"{pack.card_h(hours):.1f} h"
        for rid, n, t, e, hours in route.results
    ]
    total = frozen_h + sum(pack.card_h(h) for h in route.cells_h)
    slot = [pack.slot_h(h) for h in route.cells_h]
    wall = frozen_h + wall_hours(slot, cards * pack.slots)
    longest = max(slot, default=0.0)
    alone = max(route.cells_h, default=0.0)
    return [
        *lines,
        f"  all of them: {total:.1f} h (cells shared between results and the "
        "frozen queries counted once)",
        f"  on {cards} card{'s' * (cards != 1)}: {wall:.1f} h wall "
        f"({cards * pack.slots} slot{'s' * (cards * pack.slots != 1)}; "
        f"{len(slot)} cells, the longest "
        f"{longest:.1f} h)",
        f"  a cluster job's time limit needs {longest:.1f} h: the longest cell, "
        f"{pack.slots} at once on its card ({alone:.1f} h alone, as a `pal-paper "
        "submit` task runs it)",
    ]


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
    size: Mapping[str, int],
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
            route.methods = _unique(
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
