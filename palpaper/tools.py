"""git and DVC as subprocesses: found beside this Python, run with its
scripts folder on PATH, a failure one `ExperimentError` line with the
command's message whole."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from palcore.errors import PalError


class ExperimentError(PalError):
    """git or DVC refused, or a cell has no usable result."""


def find_tool(name: str) -> str:
    """The command `name`: beside this Python (the venv) first, then PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        raise ExperimentError(f"'{name}' not found: install the project (README)")
    return found


def tool_env() -> dict[str, str]:
    """The environment of DVC and its queue workers: this Python's scripts
    folder first on PATH, so the stages' `pal` and `pal-solver` are found as
    in the shell that runs `dvc repro` (pal-paper may run unactivated)."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    scripts = Path(sys.executable).parent
    if (scripts / "pal").exists():
        env["PATH"] = os.pathsep.join([str(scripts), env.get("PATH", "")])
    return env


def run_tool(args: Sequence[str], cwd: Path, detached: bool = False) -> str:
    """Run a git or DVC command; a failure is an `ExperimentError` with its
    message whole (`failure_message`).

    `detached`: the command leaves processes behind (DVC's queue workers),
    so its output goes to a file they may keep open, not a pipe to wait on.
    """
    with tempfile.TemporaryFile(mode="w+") as log_file:
        out = log_file if detached else subprocess.PIPE
        try:
            proc = subprocess.run(
                list(args),
                cwd=cwd,
                env=tool_env(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT if detached else subprocess.PIPE,
                text=True,
            )
        except FileNotFoundError:
            raise ExperimentError(f"'{args[0]}' not found") from None
        if detached:
            log_file.seek(0)
            stdout, stderr = log_file.read(), ""
        else:
            stdout, stderr = proc.stdout, proc.stderr
    if proc.returncode != 0:
        what = " ".join(Path(args[0]).name if i == 0 else a for i, a in enumerate(args))
        raise ExperimentError(f"{what}: {failure_message(stderr or stdout)}")
    return stdout


def failure_message(output: str) -> str:
    """A failed command's message, whole, on one line: DVC's from its first
    `ERROR` line on (the message may wrap over several lines), else the
    last line."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    if not lines:
        return "(no output)"
    start = next(
        (i for i, line in enumerate(lines) if line.startswith("ERROR")), len(lines) - 1
    )
    return " ".join(lines[start:])
