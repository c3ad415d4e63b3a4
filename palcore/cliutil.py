"""CLI plumbing for `pal` and `pal-solver`: logging, clean errors, lazy commands."""

from __future__ import annotations

import functools
import importlib
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from palcore.errors import PalError
from palcore.params import DEFAULT_PARAMS, Source

log = logging.getLogger(__name__)


def setup_logging(verbose: bool = False) -> None:
    """Configure the root logger once: `LEVEL name: message` on stderr."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )


# Ctrl-C: every output is written under a temporary name and renamed, so
# what was renamed is whole; tune and extract keep their sealed steps in
# `<out>.partial/` (pipeline/stages/resume.py), which the same command picks up.
INTERRUPTED = (
    "interrupted; outputs already renamed into place are complete, nothing "
    "half-written was kept, and the steps tune and extract finished wait in "
    "<out>.partial/ for the same command to resume"
)


def clean_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn project errors (bad input) into one line on stderr and exit 1; log
    the command's wall time when it succeeds.

    Unexpected exceptions (bugs) keep their traceback.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            out = fn(*args, **kwargs)
            ctx = click.get_current_context(silent=True)
            name = ctx.command_path if ctx is not None else fn.__name__
            log.debug("%s: done in %.1f s", name, time.perf_counter() - start)
            return out
        except PalError as exc:
            raise click.ClickException(str(exc)) from None
        except KeyboardInterrupt:
            raise click.ClickException(INTERRUPTED) from None

    return wrapper


class LazyGroup(click.Group):
    """A click group whose subcommands are imported only when invoked.

    `lazy` maps a command name to `"module:attribute"`, so `--help` of the group
    stays fast and does not import torch.
    """

    def __init__(self, *args: Any, lazy: dict[str, tuple[str, str]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._lazy = lazy  # name -> ("module:attr", one-line help)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(super().list_commands(ctx)) | set(self._lazy))

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in self._lazy:
            target, _ = self._lazy[name]
            module, attr = target.split(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)

    def format_commands(
        self, ctx: click.Context, formatter: click.HelpFormatter
    ) -> None:
        rows = [(name, self._lazy[name][1]) for name in sorted(self._lazy)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def params_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--params FILE` (default params.yaml)."""
    return click.option(
        "--params",
        "params_file",
        default=str(DEFAULT_PARAMS),
        show_default=True,
        type=click.Path(dir_okay=False),
        help="Params file to read the stage's section(s) from.",
    )(fn)


def run_params_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--params FILE --run N --variant NAME`, passed on as one
    `params_file: palcore.params.Source` (the file as that run and ablation
    variant see it)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        kwargs["params_file"] = Source(
            Path(kwargs.pop("params_file")), kwargs.pop("run"), kwargs.pop("variant")
        )
        return fn(*args, **kwargs)

    wrapper = click.option(
        "--variant",
        metavar="NAME",
        default=None,
        help="Read the params as ablation variant NAME sees them: the keys "
        "under ablation.NAME replace the sections' own.",
    )(wrapper)
    wrapper = click.option(
        "--run",
        metavar="N",
        type=click.IntRange(min=0),
        default=None,
        help="Read the params as run N of the protocol: N is added to each "
        "seed protocol.vary names.",
    )(wrapper)
    return params_option(wrapper)


def folder_option(
    flag: str, default: str | None, help: str, dest: str | None = None
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--<flag> DIR`: a stage's input or output folder (default shown in
    --help; None: the option is off unless given); `dest` names the parameter
    when it differs from the flag."""
    names = [f"--{flag}", dest] if dest else [f"--{flag}"]
    return click.option(
        *names,
        default=default,
        show_default=default is not None,
        metavar="DIR",
        type=click.Path(file_okay=False),
        help=help,
    )


def file_option(
    flag: str, default: str | None, help: str
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """`--<flag> FILE`: an input or output file of a command (default shown in
    --help; None: the option is off unless given)."""
    return click.option(
        f"--{flag}",
        default=default,
        show_default=default is not None,
        metavar="FILE",
        type=click.Path(dir_okay=False),
        help=help,
    )
