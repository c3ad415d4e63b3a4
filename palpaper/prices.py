"""What one (variant, run) of a cell costs on a card: a tuning priced at its
prompt method's rate, an extraction, the frozen queries once per dataset,
and which tunings and extractions a cell adds to what `dvc repro` made
(palpaper/plan.py's module docstring has the formulas)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from palpaper.cards import Card
from palpaper.grids import RESULTS, Result
from palpaper.overrides import Cell, GridError, get
from palpaper.sizes import Size

FREE_KEYS = {"pipelines.main", "protocol.runs"}


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
            found = unique([*found, *(v.method for v in kinds if v.epochs != 0)])
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
    cell: Cell, params: Mapping[str, Any], v: Variant, c: Card, size: Size
) -> float:
    """One tuning of variant `v` in the cell alone on the card: its start-up,
    per task the new loader's first batch and the graph capture, then the
    steady steps at its method's rate."""
    k = int(cell.value(params, "data.tasks"))
    train, _ = _samples(cell, params, size)
    t = c["tune_startup_s"] + k * (c["first_batch_s"] + c["capture_s_per_task"])
    return t + v.epochs * train / c.tune_rate(v.method)


def extract_seconds(
    cell: Cell, params: Mapping[str, Any], v: Variant, c: Card, size: Size
) -> float:
    """One extraction: its start-up and every step's embeddings; without
    prompts (ACIL, `frozen`) the features are a gather of `pal frozen`'s
    queries (no forward), so its start-up only."""
    if not v.prompts:
        return c["extract_startup_s"]
    k = int(cell.value(params, "data.tasks"))
    train, _ = _samples(cell, params, size)
    seed = int(_value(cell, params, "data.class_order_seed", 0))
    embeddings = train + size.tested(k, seed, _cap(cell, params))
    return c["extract_startup_s"] + embeddings / c.extract_rate(v.method)


def cell_seconds(
    r: Result, cell: Cell, params: Mapping[str, Any], c: Card, size: Size
) -> float:
    """The work a cell adds, one process alone on the card: seconds."""
    total = 0.0
    for name in pairs(r, cell, params):
        v = variant(params, cell, name)
        if v.epochs != 0:
            total += tune_seconds(cell, params, v, c, size)
        total += extract_seconds(cell, params, v, c, size)
    return total


def frozen_minutes(params: Mapping[str, Any], c: Card, size: Size) -> float:
    """Minutes of the frozen-queries stage, once per dataset: every sample in
    its three states (complete, text missing, image missing)."""
    train, test = _samples(Cell(()), params, size)
    return 3 * (train + test) / c["frozen_rows_per_s"] / 60


def _samples(cell: Cell, params: Mapping[str, Any], size: Size) -> tuple[float, float]:
    """(training, test) samples of the cell: the dataset's, or at most
    `data.per_class` of each class and split."""
    cap = _cap(cell, params)
    return size.total("train", cap), size.total("test", cap)


def _cap(cell: Cell, params: Mapping[str, Any]) -> int | None:
    per_class = _value(cell, params, "data.per_class", None)
    return None if per_class is None else int(per_class)


def _value(cell: Cell, params: Mapping[str, Any], key: str, default: Any) -> Any:
    try:
        return cell.value(params, key)
    except GridError:  # a params file without it: the pipeline's default
        return default


def unique(items: Iterable[str]) -> list[str]:
    """`items` without repeats, in first-seen order."""
    out: list[str] = []
    for item in items:
        out += [item] if item not in out else []
    return out
