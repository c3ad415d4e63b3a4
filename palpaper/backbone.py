"""How a cell's backbone scales a card's rates.

A card's rates (palpaper/costs.yaml) were measured with ViLT-B/32, the
presets' backbone. A cell with another backbone (the demo's tiny ViLT, a
researcher's own) runs at those rates times the ratio of a ViLT-B/32 sample's
multiply-adds to its own: per layer and token 4h² (attention projections) +
2hI (MLP) + 2Th (attention over T tokens), T = `model.max_text_len` + the
image's patches + 2. Small models do not reach this rate (start-up and
data loading weigh more), so a scaled price is a floor, and plan says so.

The backbone's sizes come from its `config.json` when `model.backbone` is a
folder holding one, else from the demo's params for the demo's folder before
`pal demo` wrote it; anything else (a hub id) is ViLT-B/32's own sizes.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palpaper.cards import Card
from palpaper.overrides import GridError, get


@dataclass(frozen=True)
class Shape:
    """The sizes of a ViLT that set its multiply-adds a sample."""

    hidden: int
    layers: int
    intermediate: int
    patches: int

    def macs(self, text_len: int) -> float:
        h, tokens = self.hidden, text_len + self.patches + 2
        per_token = 4 * h * h + 2 * h * self.intermediate + 2 * tokens * h
        return float(self.layers * tokens * per_token)


VILT_B32 = Shape(hidden=768, layers=12, intermediate=3072, patches=144)
REFERENCE_TEXT_LEN = 40  # the presets' model.max_text_len
DEMO_BACKBONE = "data/demo/vilt"  # where `pal demo` writes its tiny ViLT


@dataclass(frozen=True)
class Scale:
    """A card rate's factor for a cell's backbone, and what it was read from
    (None: ViLT-B/32 itself, the rates as measured)."""

    factor: float
    source: str | None


def backbone_scale(params: Mapping[str, Any]) -> Scale:
    """The factor the card's rates take for the backbone `params` name."""
    text_len = int(_get(params, "model.max_text_len", REFERENCE_TEXT_LEN))
    shape, source = _shape(params)
    reference = VILT_B32.macs(REFERENCE_TEXT_LEN)
    factor = reference / shape.macs(text_len)
    if source is None and abs(factor - 1.0) < 1e-12:
        return Scale(1.0, None)
    return Scale(factor, source or "ViLT-B/32 at its model.max_text_len")


def _shape(params: Mapping[str, Any]) -> tuple[Shape, str | None]:
    folder = Path(str(_get(params, "model.backbone", "")))
    config = folder / "config.json"
    if config.is_file():
        try:
            c = json.loads(config.read_text(encoding="utf-8"))
            shape = Shape(
                int(c["hidden_size"]),
                int(c["num_hidden_layers"]),
                int(c["intermediate_size"]),
                (int(c["image_size"]) // int(c["patch_size"])) ** 2,
            )
        except (ValueError, KeyError, TypeError):
            raise GridError(f"{config}: not a ViLT config (hidden_size, …)") from None
        if shape == VILT_B32:
            return shape, None
        return shape, f"{config}"
    if folder.as_posix() == DEMO_BACKBONE:  # `pal demo` has not written it yet
        d = params.get("demo") or {}
        side = int(d.get("image_size", 64)) // int(d.get("patch_size", 8))
        shape = Shape(
            int(d.get("hidden_size", 64)),
            int(d.get("num_layers", 4)),
            int(d.get("intermediate_size", 128)),
            side * side,
        )
        return shape, "the demo's params"
    return VILT_B32, None


def _get(params: Mapping[str, Any], key: str, default: Any) -> Any:
    try:
        return get(params, key)
    except GridError:
        return default


RATES = ("tune_per_s", "extract_per_s", "frozen_rows_per_s")


def scaled(c: Card, scale: Scale) -> Card:
    """Card `c` with every samples-a-second rate times `scale.factor`."""
    if scale.source is None:
        return c

    def times(rate: Any) -> Any:
        if isinstance(rate, Mapping):
            return {k: float(v) * scale.factor for k, v in rate.items()}
        return float(rate) * scale.factor

    entry = {k: times(v) if k in RATES else v for k, v in c.entry.items()}
    return Card(c.where, entry)
