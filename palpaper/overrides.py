"""A cell: one DVC experiment, the committed params plus its overrides.

Its name is made from the overrides that differ from the committed params,
so a cell two results share (the base scenario, a missing rate that both the
tables and the step figure use) is one experiment, run once.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from palcore.errors import PalError


class GridError(PalError):
    """A result, a cell or an option of `pal-paper` that does not exist."""


def get(params: Mapping[str, Any], key: str) -> Any:
    """The value at a dotted key of a params dict."""
    node: Any = params
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise GridError(f"params: no key '{key}'")
        node = node[part]
    return node


def fmt_value(value: Any) -> str:
    """A value as a name part: lists joined with '-', floats in short form."""
    if isinstance(value, (list, tuple)):
        return "-".join(fmt_value(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _flow(value: Any) -> str:
    """A value as `dvc exp run -S key=value` reads it (YAML flow style)."""
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_flow(v) for v in value) + "]"
    if isinstance(value, float):
        return repr(value)
    return str(value)


# a cell's name is at most this long: `<7-char commit>-<name>` fits 40 columns
NAME_CHARS = 32
_LONG_PART = 16  # parts longer than this go last in a name
# the keys the paper's grids vary, shortened in a cell's name (other keys: the
# last part of their dotted key); the missing type's value names itself
_SHORT_KEYS = {"data.missing_rate": "rate", "prompt.pool_size": "pool"}


def _name_order(override: tuple[str, Any]) -> tuple[int, str]:
    """The missing type first, the runs last, the other keys in order."""
    key = override[0]
    return ({"data.missing_type": 0, "protocol.runs": 2}.get(key, 1), key)


def _part(key: str, value: Any) -> str:
    """One override in a cell's name: `rate=0.1`, `layers=2-3`, `text`."""
    if key == "data.missing_type":
        return fmt_value(value)
    return f"{_SHORT_KEYS.get(key, key.rsplit('.', 1)[-1])}={fmt_value(value)}"


@dataclass(frozen=True)
class Cell:
    """One experiment: the overrides (sorted by key) of the committed params."""

    overrides: tuple[tuple[str, Any], ...]

    @property
    def name(self) -> str:
        """A short name of its overrides, at most NAME_CHARS characters (with
        the commit's short hash the experiment's name fits 40): `text+rate=0.1`,
        `width=546`; a longer one (a list of eight methods) keeps its first
        characters and ends in a digest of the whole (`..._3f9a2c`)."""
        if not self.overrides:
            return "base"
        parts = [_part(k, v) for k, v in sorted(self.overrides, key=_name_order)]
        parts.sort(key=lambda part: len(part) > _LONG_PART)  # the long ones last
        whole = "+".join(parts)
        if len(whole) <= NAME_CHARS:
            return whole
        digest = hashlib.sha256(whole.encode()).hexdigest()[:6]
        return f"{whole[: NAME_CHARS - 7].rstrip('+=-')}_{digest}"

    @property
    def set_args(self) -> list[str]:
        """`-S key=value` for each override, as `dvc exp run` takes them."""
        return [a for k, v in self.overrides for a in ("-S", f"{k}={_flow(v)}")]

    def pairs(self) -> list[str]:
        """Its overrides as `key=value`, as `dvc exp run -S` takes them."""
        return [f"{k}={_flow(v)}" for k, v in self.overrides]

    def describe(self) -> str:
        if not self.overrides:
            return "the committed params"
        return " ".join(self.pairs())

    def value(self, params: Mapping[str, Any], key: str) -> Any:
        """The cell's value of `key`: its override, else the committed one."""
        return dict(self.overrides).get(key, get(params, key))


def make_cell(params: Mapping[str, Any], changes: Mapping[str, Any]) -> Cell:
    """The cell of `changes` over `params`: keys equal to params' are dropped."""
    kept = []
    for key, value in sorted(changes.items()):
        if isinstance(value, tuple):
            value = list(value)
        if get(params, key) != value:
            kept.append((key, value))
    return Cell(tuple(kept))
