"""Options of `pal-solver solve` and `evaluate` that override the `solve:`
section: parsed here so that an error names the option (`--eta`, …)."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click

from palcore import recorded
from palcore.errors import ParamsError
from solver.params import SolveParams, check_etas

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

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
        values.append(eta)
    check_etas(values, "--eta", False)
    return values[0] if len(values) == 1 else tuple(values)


# the params a CLI overrides: SolveParams, or EvaluateParams (its device)
P = TypeVar("P", bound="DataclassInstance")


def apply_overrides(params: P, **raw: str | None) -> P:
    """`params` (a params dataclass) with the CLI's values (strings, None =
    not given) put in.

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


_OVERRIDES = [
    click.option(
        "--eta",
        metavar="X[,X…]|auto",
        help="Ridge regulariser η > 0 [solve.eta]. Several comma-separated "
        "values run a sweep: one pass over the shards, one weights file "
        "per η, named weights-eta<η>.h5. auto: per step, the η of "
        "solve.eta_grid most accurate on held-out rows of the current task.",
    ),
    click.option("--width", metavar="N", help="Up-sampling width d > 0 [solve.width]."),
    click.option(
        "--seed", metavar="N", help="Seed of the up-sampling matrix [solve.seed]."
    ),
    click.option(
        "--method",
        metavar=metavar("method"),
        help="gram: G += HᵀH, Cholesky per step (fast); woodbury: the paper's "
        "RLS update per batch [solve.method].",
    ),
    click.option(
        "--device",
        metavar=metavar("device"),
        help="cpu: NumPy/SciPy; cuda: CuPy; auto: CuPy when a GPU passes a "
        "smoke test, else NumPy [solve.device].",
    ),
    click.option(
        "--dtype",
        metavar=metavar("dtype"),
        help="Accumulation and solve precision [solve.dtype].",
    ),
    click.option(
        "--batch-rows",
        metavar="N",
        help="Rows per streamed chunk and per Woodbury update [solve.batch_rows].",
    ),
]


def override_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--eta --width --seed --method --device --dtype --batch-rows`: the
    `solve:` keys a command line may override (strings, parsed by
    `apply_overrides`)."""
    for option in reversed(_OVERRIDES):
        fn = option(fn)
    return fn


def _require_verified(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        recorded.REQUIRE_VERIFIED = True


def verified_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--verified-only`: refuse shards that no dvc.lock and no MD5SUMS (a
    copy made by `pal-solver export`) records."""
    return click.option(
        "--verified-only",
        is_flag=True,
        expose_value=False,
        callback=_require_verified,
        help="Refuse shards that neither a dvc.lock nor an MD5SUMS seal "
        "(pal-solver export) records; default: read them with a warning.",
    )(fn)
