"""What `pal-paper`'s commands are given, read and checked where it enters:
the params file the grids read, RESULT… names, --runs, --shard, --cells and
--baselines. A wrong value is a `GridError` or `ParamsError` line."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from palcore.errors import ParamsError
from palcore.paramsfile import read_params_file
from palpaper.grids import RESULTS, check_cite, result
from palpaper.overrides import GridError, get

# the keys the grids read beyond the ones they change
REQUIRED = (
    "data.dataset",
    "solve.width",
    "pipelines.main",
    "protocol.runs",
    "ablation",
)


def read_params(path: Path, text: str | None = None) -> dict[str, Any]:
    """The params file (or its `text` at a commit), with the keys grids read."""
    if text is None:
        params = read_params_file(path)
    else:
        try:
            params = yaml.safe_load(text)
        except yaml.YAMLError:
            raise ParamsError(f"{path}: not valid YAML") from None
    for key in REQUIRED:
        try:
            get(params, key)
        except GridError:
            raise ParamsError(f"{path}: no key '{key}'") from None
    return params


def parse_results(names: Sequence[str]) -> list[str]:
    """RESULT…: the results' ids; none or `all`: every result."""
    if not names or list(names) == ["all"]:
        return list(RESULTS)
    return [result(n).id for n in names]


def parse_runs(text: str | None) -> list[int] | None:
    """--runs R[,R…]: the run ids; None when not given."""
    if text is None:
        return None
    try:
        runs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise GridError(f"--runs: run ids separated by commas, got '{text}'") from None
    if not runs:
        raise GridError("--runs: name at least one run id")
    return runs


def parse_shard(text: str) -> slice:
    """K/N: the slice of every N-th cell from the K-th."""
    try:
        k, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise GridError(f"--shard: K/N such as 1/4, got '{text}'") from None
    if not 1 <= k <= n:
        raise GridError(f"--shard: K must be 1 to N, got '{text}'")
    return slice(k - 1, None, n)


def parse_cells(text: str | None) -> list[str] | None:
    """--cells NAME[,NAME…]: the names given, blanks dropped."""
    return None if text is None else [c.strip() for c in text.split(",") if c.strip()]


def parse_baselines(baselines: str, ids: Sequence[str], params: dict[str, Any]) -> bool:
    """--baselines: True for `cited`, once `check_cite` passed."""
    if baselines != "cited":
        return False
    check_cite(ids, params)
    return True
