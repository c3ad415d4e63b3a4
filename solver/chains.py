"""Every (variant, run) chain of a pipeline in one process: `pal-solver solve
--variants` and `pal-solver evaluate --variants` (the analytic stage, DESIGN §2).

Only the analytic stages import this module: it reads protocol.runs, which no
per-run stage may depend on.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import click

from solver.errors import ParamsError
from solver.params import ProtocolParams, Source, load_section


def variants_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--variants NAME[,NAME…]`: every (variant, run) chain in one process."""
    return click.option(
        "--variants",
        metavar="NAME[,NAME…]",
        default=None,
        help="Every chain in one process: for each variant (a row of params "
        "`ablation`) and each run of protocol.runs, the folders "
        "<variant>/<run> below the input and output folders. Not with --run "
        "or --variant.",
    )(fn)


def chains(params_file: Any, variants: str) -> list[tuple[Any, str]]:
    """The (params source, "<variant>/<run>") of every chain `--variants` names,
    variant by variant, runs in protocol order; `params_file` is the command's
    `Source` (its run and variant must not be set)."""
    if params_file.run is not None or params_file.variant is not None:
        raise ParamsError("--variants does not combine with --run or --variant")
    names = [v.strip() for v in variants.split(",") if v.strip()]
    if not names:
        raise ParamsError("--variants: name at least one variant")
    protocol = load_section(params_file.path, "protocol", ProtocolParams)
    return [
        (Source(params_file.path, run, name), f"{name}/{run}")
        for name in names
        for run in protocol.runs
    ]
