"""What every cell of a grid needs before it is queued: params that pass
`pal check`, and the inputs DVC's temporary copy of the project lacks.

DVC's queue runs each cell in a temporary copy of the repository
(`.dvc/tmp/exps/tmp…`): a git checkout, into which DVC checks out what it
tracks. A dataset or backbone folder that git ignores and DVC does not track
(the README's `data/raw/<dataset>/`, `models/<backbone>` made by `pal
backbone --link`) is not there; `pal-paper` names such folders to `dvc exp run
--queue --copy-paths`, which copies them into each cell's copy while the cell
runs. Tracked by DVC (`dvc add`, docs/USAGE.md), they are linked from DVC's
cache instead, and nothing is copied.
"""

from __future__ import annotations

import copy
import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from palcore.errors import ParamsError
from palpaper.overrides import Cell, get

log = logging.getLogger(__name__)

INPUT_KEYS = ("data.root", "model.backbone")


def cell_params(params: dict[str, Any], cell: Cell) -> dict[str, Any]:
    """The committed params with the cell's overrides set."""
    out = copy.deepcopy(params)
    for key, value in cell.overrides:
        *parents, last = key.split(".")
        node = out
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def check_cells(root: Path, params: dict[str, Any], cells: Sequence[Cell]) -> None:
    """`pal check` on the committed params.yaml, then on each cell's params:
    raises one error line per problem (each naming its cell) before anything
    is queued. Runs from `root`, where the data and backbone are."""
    from pipeline.stages.check import check_all

    here = Path.cwd()
    os.chdir(root)
    try:
        problems, _ = check_all(Path("params.yaml"))
        if problems:
            raise ParamsError("\nError: ".join(problems))
        listings: dict[Any, Any] = {}
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "params.yaml"
            for c in cells:
                if not c.overrides:
                    continue
                path.write_text(yaml.safe_dump(cell_params(params, c)))
                found, _ = check_all(path, listings)
                problems += [
                    f"cell '{c.name}' ({c.describe()}): "
                    + p.replace(str(path), "params.yaml")
                    for p in found
                ]
    finally:
        os.chdir(here)
    if problems:
        raise ParamsError("\nError: ".join(problems))


def _stage_outputs(root: Path) -> list[str]:
    """The outputs dvc.yaml declares (without `${…}` in them)."""
    path = root / "dvc.yaml"
    if not path.is_file():
        return []
    outs = []
    stages = (yaml.safe_load(path.read_text()) or {}).get("stages") or {}
    for stage in stages.values():
        body = stage.get("do", stage)
        for out in body.get("outs", []) or []:
            text = next(iter(out)) if isinstance(out, dict) else str(out)
            if "${" not in text:
                outs.append(text)
    return outs


def _tracked(root: Path, rel: str) -> bool:
    """Whether a cell's copy of the project has `rel`: git tracks it (or files
    in it), a `.dvc` file tracks it or a folder above it, or a stage makes it."""
    import subprocess

    parts = Path(rel).parts
    dvc_files = [f"{Path(*parts[:i]).as_posix()}.dvc" for i in range(1, len(parts) + 1)]
    listed = subprocess.run(
        ["git", "ls-files", "--", rel, *dvc_files],
        cwd=root,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if listed:
        return True
    return any(rel == o or rel.startswith(o + "/") for o in _stage_outputs(root))


def untracked_inputs(root: Path, params: dict[str, Any]) -> list[str]:
    """`data.root` and `model.backbone` where a cell's temporary copy lacks
    them: relative paths that exist here, tracked by neither git nor DVC.
    (An absolute path is the same folder in every copy; a hub id is no path.)"""
    found = []
    for key in INPUT_KEYS:
        rel = Path(str(get(params, key)))
        if rel.is_absolute() or not (root / rel).exists():
            continue
        rel_text = rel.as_posix().rstrip("/")
        if not _tracked(root, rel_text):
            found.append(rel_text)
    return found


def folder_bytes(path: Path) -> int:
    """Bytes of the files under `path` (links followed, as a copy makes them)."""
    if path.is_file():
        return path.stat().st_size
    total = 0
    for folder, _, files in os.walk(path, followlinks=True):
        for name in files:
            try:
                total += (Path(folder) / name).stat().st_size
            except OSError:
                continue
    return total


def announce_copies(root: Path, paths: Sequence[str]) -> None:
    """One line: what each running cell gets a copy of, and how to avoid it."""
    if not paths:
        return
    sizes = ", ".join(f"{p} ({folder_bytes(root / p) / 1e6:,.0f} MB)" for p in paths)
    log.info(
        "each running cell gets a copy of %s: neither git nor DVC tracks %s; "
        "`dvc add` %s links %s from DVC's cache instead (docs/USAGE.md)",
        sizes,
        "it" if len(paths) == 1 else "them",
        " ".join(paths),
        "it" if len(paths) == 1 else "them",
    )
