"""The cards `pal-paper plan` prices a grid on: costs.yaml's entries, or a
card file of `palbench/gpu_check.py --parts pace`, checked key by key (one line
naming the file and key where one is wrong), and how many tunings a card
holds at once.

A card's figures are measured (on that card, at a commit, over `steps`
steady steps) or projected (from another measurement, as its `basis` says);
`Card.status` says which in the first line of every plan.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from palpaper.overrides import GridError
from palpaper.packaged import package_yaml

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
RATES = ("frozen_rows_per_s",)  # > 0: divided by
SECONDS = ("tune_startup_s", "first_batch_s", "capture_s_per_task", "extract_startup_s")


def costs() -> dict[str, Any]:
    return package_yaml("costs.yaml")


def methods() -> tuple[str, ...]:
    """The prompt methods a card must price: the paper's, in its order
    (`pipeline.params.PAPER_METHODS`, those palbench/pace.py measures); a
    method added since is priced by the cards that name it."""
    from pipeline.params import PAPER_METHODS

    return PAPER_METHODS


@dataclass(frozen=True)
class Card:
    """A card's figures (one entry of costs.yaml's `cards`, or a card file),
    checked; `where` names it in lines and errors."""

    where: str
    entry: Mapping[str, Any]

    def __getitem__(self, key: str) -> Any:
        return self.entry[key]

    def extract_rate(self, method: str) -> float:
        """samples/s of `method`'s extraction: `extract_per_s`, one number for
        every method or one per method (PAL's for a method it has none for)."""
        rate = self.entry["extract_per_s"]
        if not isinstance(rate, Mapping):
            return float(rate)
        return float(rate[self.priced_as(method)])

    def tune_rate(self, method: str) -> float:
        """samples/s of one tuning of `method` alone (PAL's for a method the
        card has no figure for: a new one)."""
        return float(self.entry["tune_per_s"][self.priced_as(method)])

    def priced_as(self, method: str) -> str:
        """The method whose figures price `method`: itself where the card
        measured it, else PAL (a method added after the card was made)."""
        return method if method in self.entry["tune_per_s"] else "pal"

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
        gib = self.entry["tuning_gib"]
        return max((float(gib[self.priced_as(m)]) for m in methods), default=0.0)


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
    per_method: tuple[tuple[str, bool], ...]
    if isinstance(entry["extract_per_s"], Mapping):
        per_method = (("tune_per_s", True), ("extract_per_s", True))
    else:
        _number(entry["extract_per_s"], where, "extract_per_s", positive=True)
        per_method = (("tune_per_s", True),)
    for key, positive in (*per_method, ("tuning_gib", False)):
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
