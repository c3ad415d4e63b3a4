"""`pal-paper plan`: a grid's projected time from its cells' own params on
the device they name, and the memory of its largest solve.

Per (variant, run) a trained tune costs start-up + epochs × N / rate + a
graph capture per task, and an extraction start-up + a loader start per step
+ E / rate, where N is the training samples (the dataset's, or classes ×
`data.per_class`) and E = N + test × (K + 1) / 2 the embeddings of K steps
(step k embeds the test samples of tasks 1..k); the rates are measured
(costs.yaml). The frozen queries cost once per dataset (`pal frozen`: 3 rows
a sample, every cell reads them from DVC's cache). A grid adds, per cell, the
tunings and extractions `dvc repro` has not made (`tunings`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from palpaper.grids import RESULTS, Cell, GridError, Result, cited_variants, get
from palpaper.notes import listed
from palpaper.packaged import package_yaml, published
from palpaper.workers import wall_hours

FREE_KEYS = {"pipelines.main", "protocol.runs"}
DTYPE_BYTES = {"float64": 8, "float32": 4}


def costs() -> dict[str, Any]:
    return package_yaml("costs.yaml")


def tunings(r: Result, cell: Cell, params: Mapping[str, Any]) -> tuple[int, int]:
    """(trained tunings, extractions) a cell adds to what `dvc repro` made."""
    if r.keeps_features:
        return 0, 0
    variants = cell.value(params, "pipelines.main")
    run_ids = cell.value(params, "protocol.runs")
    changed = {k for k, _ in cell.overrides} - FREE_KEYS
    if not changed:  # the committed scenario: new variants or runs only
        old_v = set(get(params, "pipelines.main"))
        old_r = set(get(params, "protocol.runs"))
        pairs = [
            (v, x)
            for v in variants
            for x in run_ids
            if v not in old_v or x not in old_r
        ]
    else:
        pairs = [(v, x) for v in variants for x in run_ids]
    trained = sum(
        1
        for v, _ in pairs
        if (get(params, "ablation").get(v, {}).get("changes") or {})
        .get("tune", {})
        .get("epochs")
        != 0
    )
    return trained, len(pairs)


def device_kind(params: Mapping[str, Any]) -> str:
    """'GPU' or 'CPU': where tune runs (`auto`: a GPU when torch sees one)."""
    from pipeline.model.device import auto_device

    return "GPU" if auto_device(str(get(params, "tune.device"))) == "cuda" else "CPU"


def minutes(
    cell: Cell, params: Mapping[str, Any], rates: Mapping[str, float], size: Mapping
) -> tuple[float, float]:
    """(tune, extract) minutes per (variant, run) of the cell's params."""
    k = int(cell.value(params, "data.tasks"))
    epochs = int(cell.value(params, "tune.epochs"))
    train, test = _samples(cell, params, size)
    t = rates["tune_startup_s"] + epochs * train / rates["tune_per_s"]
    t += k * rates["capture_s_per_task"]
    embeddings = train + test * (k + 1) / 2
    e = rates["extract_startup_s"] + k * rates["extract_s_per_step"]
    e += embeddings / rates["extract_per_s"]
    return t / 60, e / 60


def frozen_minutes(
    params: Mapping[str, Any], rates: Mapping[str, float], size: Mapping
) -> float:
    """Minutes of the frozen-queries stage, once per dataset: every sample in
    its three states (complete, text missing, image missing)."""
    train, test = _samples(Cell(()), params, size)
    return 3 * (train + test) / rates["frozen_rows_per_s"] / 60


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


def plan_lines(
    ids: Sequence[str],
    params: Mapping[str, Any],
    runs: Sequence[int] | None,
    where: str,
    cards: int = 1,
) -> list[str]:
    """The lines `pal-paper plan` prints; `where` names the params file, and
    the wall time is on `cards` cards. Where a result runs the baselines
    (Tables 1-2, steps) and Tables 1-2 have the paper's numbers for the
    dataset, both routes: the baselines measured (the default) and cited
    (`--baselines cited`), each with its tunings, hours and wall time."""
    dataset = str(get(params, "data.dataset"))
    table = costs()
    if dataset not in table["datasets"]:
        raise GridError(
            f"{where}: no measured size for data.dataset '{dataset}' "
            f"(measured: {', '.join(table['datasets'])})"
        )
    kind = device_kind(params)
    rates, size = table["devices"][kind], table["datasets"][dataset]
    t0, e0 = minutes(Cell(()), params, rates, size)
    f0 = frozen_minutes(params, rates, size)
    lines = [
        f"{dataset}, {rates['name']} (tune.device {get(params, 'tune.device')}): "
        f"tune {t0:.1f} min and extract {e0:.1f} min per (variant, run) at "
        f"the committed params ({rates['source']}); the frozen queries "
        f"{f0:.1f} min once (shared by every cell)"
    ]
    cost = Cost(params, runs, rates, size, cards, f0)
    if not _cites(ids, dataset):
        route, every = _route(ids, cost, cite=False)
        lines += [*route[:-1], largest_solve(every, params), *route[-1:] * (cards > 1)]
        return lines
    names = listed(cited_names(params, ids))
    for cite, words in (
        (
            False,
            "--baselines measured (the default): the five compared methods run too",
        ),
        (True, f"--baselines cited: {names} not run (Tables 1-2 cite the paper)"),
    ):
        route, every = _route(ids, cost, cite)
        lines += [f"  {words}", *("  " + line for line in route)]
    return [*lines, largest_solve(every, params)]


@dataclass(frozen=True)
class Cost:
    """What a route's price reads: the params, --runs, the device's rates,
    the dataset's size, the cards, the frozen queries' minutes."""

    params: Mapping[str, Any]
    runs: Sequence[int] | None
    rates: Mapping[str, float]
    size: Mapping[str, int]
    cards: int
    frozen_min: float


def _cites(ids: Sequence[str], dataset: str) -> bool:
    """Whether `--baselines cited` applies: a result of `ids` runs the
    baselines, and Tables 1-2 have the paper's numbers for `dataset`."""
    tables = published()["missing"]
    return dataset in tables and any(RESULTS[rid].runs_baselines for rid in ids)


def cited_names(params: Mapping[str, Any], ids: Sequence[str]) -> list[str]:
    """The paper's names of the rows `--baselines cited` takes from the paper."""
    names: list[str] = []
    for rid in (r for r in ids if RESULTS[r].runs_baselines):
        for variant in RESULTS[rid].rows:
            name = cited_variants(params, rid).get(variant)
            names += [name] if name is not None and name not in names else []
    return names


def _route(ids: Sequence[str], cost: Cost, cite: bool) -> tuple[list[str], list[Cell]]:
    """A line per result, the total and the wall time on the cards (the last
    line), and every cell (for the largest solve)."""
    params = cost.params
    total, seen, every, cell_hours = cost.frozen_min / 60, set(), [], []
    lines = []
    for rid in ids:
        cols = RESULTS[rid].columns(params, cost.runs, cite)
        hours, t_all, e_all = 0.0, 0, 0
        for c in cols:
            every.append(c.cell)
            if c.cell.name in seen:
                continue
            seen.add(c.cell.name)
            t, e = tunings(RESULTS[rid], c.cell, params)
            tm, em = minutes(c.cell, params, cost.rates, cost.size)
            cell_hours.append((t * tm + e * em) / 60)
            hours += cell_hours[-1]
            t_all, e_all = t_all + t, e_all + e
        total += hours
        lines.append(
            f"  {rid}: {len(cols)} cell{'s' * (len(cols) != 1)}, {t_all} tunings, "
            f"{e_all} extractions: {hours:.1f} h"
        )
    lines.append(
        f"  all of them: {total:.1f} h (cells shared between results and the "
        "frozen queries counted once)"
    )
    wall = cost.frozen_min / 60 + wall_hours(cell_hours, cost.cards)
    lines.append(
        f"  on {cost.cards} card{'s' * (cost.cards != 1)}: {wall:.1f} h wall "
        f"({len(cell_hours)} cells, the longest {max(cell_hours, default=0.0):.1f} h)"
    )
    return lines, every
