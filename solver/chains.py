"""Every (variant, run) chain of a pipeline in one process: `pal-solver solve
--pipeline NAME` and `pal-solver evaluate --pipeline NAME` (the analytic stage,
DESIGN §2).

Only the analytic stages import this module: it reads protocol.runs and the
pipeline's variant list, on which no per-run stage may depend.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from palcore.errors import PalError, ParamsError
from palcore.params import (
    ProtocolParams,
    Source,
    load_section,
    section_value,
    shown,
)
from palcore.variants import pipeline_variants
from solver.shard_readers import open_features


def pipeline_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--pipeline NAME`: every (variant, run) chain of a pipeline in one process."""
    return click.option(
        "--pipeline",
        metavar="NAME",
        default=None,
        help="Every chain of pipeline NAME in one process: for each variant "
        "listed in params pipelines.NAME and each run of protocol.runs, the "
        "folders <variant>/<run> below the input and output folders. Not with "
        "--run or --variant.",
    )(fn)


def chains(params_file: Source, pipeline: str) -> list[tuple[Source, str]]:
    """The (params source, "<variant>/<run>") of every chain of `pipeline`,
    variant by variant in table order, runs in protocol order; `params_file`
    is the command's `Source` (its run and variant must not be set)."""
    if params_file.run is not None or params_file.variant is not None:
        raise ParamsError("--pipeline does not combine with --run or --variant")
    names = pipeline_variants(params_file.path, pipeline)
    protocol = load_section(params_file.path, "protocol", ProtocolParams)
    return [
        (Source(params_file.path, run, name), f"{name}/{run}")
        for name in names
        for run in protocol.runs
    ]


def check_chain_steps(params_file: Source, pipeline: str, features: str | Path) -> None:
    """`check_steps` over every chain's folder below `features` (opened and
    validated by `open_features`)."""
    found = []
    for src, chain in chains(params_file, pipeline):
        where = Path(features) / chain
        found.append((src, chain, where, len(open_features(where))))
    check_steps(found)


def check_steps(found: list[tuple[Source, str, Path, int]]) -> None:
    """Refuse chains (params source, "<variant>/<run>", folder, number of
    steps found there) whose steps do not cover `data.tasks` (when the params
    set it) or differ from the other chains': a step missing, e.g. a deleted
    step folder, is found before anything is written."""
    for source, chain, where, n_steps in found:
        tasks = section_value(source, "data", "tasks")
        if tasks is None:
            continue
        if isinstance(tasks, bool) or not isinstance(tasks, int):
            raise ParamsError(
                f"{source.path}: data.tasks must be an integer, got {shown(tasks)}"
            )
        if n_steps != tasks:
            raise PalError(
                f"{where}: chain {chain} has {n_steps} steps, but data.tasks is "
                f"{tasks} (a step is missing: rerun its `pal extract`, or "
                "`dvc repro`)"
            )
    _, first, _, n_first = found[0]
    for _, chain, where, n_steps in found[1:]:
        if n_steps != n_first:
            raise PalError(
                f"{where}: chain {chain} has {n_steps} steps, but chain {first} "
                f"has {n_first} (a step is missing: rerun its `pal extract`)"
            )
