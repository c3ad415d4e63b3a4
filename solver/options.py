"""Options of `pal-solver solve` and `evaluate` that override the `solve:`
section: parsed here so that an error names the option (`--eta`, …)."""

from __future__ import annotations

import dataclasses
import math
import typing

from palcore.errors import ParamsError
from solver.params import SolveParams

_FLOAT_OPTIONS = ("eta",)
_INT_OPTIONS = {"width": 1, "seed": 0, "batch_rows": 1}  # option -> minimum
# the choices SolveParams declares (its Literal annotations)
_CHOICES = {
    name: typing.get_args(typing.get_type_hints(SolveParams)[name])
    for name in ("method", "device", "dtype")
}


def metavar(name: str) -> str:
    """`gram|woodbury` for the option of a choice key."""
    return "|".join(_CHOICES[name])


def _option(name: str) -> str:
    return "--" + name.replace("_", "-")


def _parse_etas(text: str) -> float | tuple[float, ...] | str:
    if text.strip() == "auto":
        return "auto"
    values = []
    for item in text.split(","):
        try:
            eta = float(item)
        except ValueError:
            raise ParamsError(f"--eta: {item.strip()!r} is not a number") from None
        if not math.isfinite(eta) or eta <= 0:
            raise ParamsError(f"--eta must be > 0 and finite, got {item.strip()}")
        values.append(eta)
    if len(set(values)) != len(values):
        raise ParamsError(f"--eta lists a value twice: {text}")
    return values[0] if len(values) == 1 else tuple(values)


def apply_overrides(params: SolveParams, **raw: str | None) -> SolveParams:
    """`params` with the CLI's values (strings, None = not given) put in.

    Errors name the option (`--eta`, `--width`, …), in one line.
    """
    values: dict[str, object] = {}
    for name, text in raw.items():
        if text is None:
            continue
        opt = _option(name)
        if name in _FLOAT_OPTIONS:
            values[name] = _parse_etas(text)
        elif name in _INT_OPTIONS:
            try:
                value = int(text)
            except ValueError:
                raise ParamsError(f"{opt} must be an integer, got {text!r}") from None
            low = _INT_OPTIONS[name]
            if value < low:
                raise ParamsError(f"{opt} must be >= {low}, got {value}")
            values[name] = value
        elif name in _CHOICES:
            if text not in _CHOICES[name]:
                raise ParamsError(
                    f"{opt} must be one of {', '.join(_CHOICES[name])}, got {text!r}"
                )
            values[name] = text
        else:
            raise AssertionError(name)
    return dataclasses.replace(params, **values)
