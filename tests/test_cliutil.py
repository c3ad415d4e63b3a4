"""The CLI's error plumbing: project errors and Ctrl-C end as one line."""

from __future__ import annotations

import importlib

import click
import pytest
from click.testing import CliRunner

from palcore.cliutil import INTERRUPTED, clean_errors
from palcore.errors import PalError


def _command(exc: BaseException) -> click.Command:
    @click.command()
    @clean_errors
    def cmd() -> None:
        raise exc

    return cmd


def test_a_project_error_is_one_line_and_exit_1():
    r = CliRunner().invoke(_command(PalError("params.yaml: solve.eta must be > 0")))
    assert r.exit_code == 1
    assert r.output == "Error: params.yaml: solve.eta must be > 0\n"


def test_ctrl_c_is_one_line_that_names_the_partial_folders():
    r = CliRunner().invoke(_command(KeyboardInterrupt()))
    assert r.exit_code == 1
    assert r.output == f"Error: {INTERRUPTED}\n"
    assert "<out>.partial/" in INTERRUPTED and "nothing partial" not in INTERRUPTED


@pytest.mark.parametrize(
    "group, args",
    [
        ("pipeline.cli", []),
        ("pipeline.cli", ["prepare"]),
        ("solver.cli", []),
        ("solver.cli", ["report"]),
        ("palpaper.cli", []),
    ],
)
def test_dash_h_is_help_for_every_command_line(group, args):
    main = importlib.import_module(group).main
    short = CliRunner().invoke(main, [*args, "-h"])
    long = CliRunner().invoke(main, [*args, "--help"])
    assert (short.exit_code, long.exit_code) == (0, 0)
    assert short.output == long.output
    assert short.output.startswith("Usage: ")
