"""Scratch copies of the project for end-to-end runs of the DVC pipeline.

Used by `test_dvc_pipeline.py` and `bench/kill_resume.py`: a copy of the
working tree's code and dvc.yaml (no data, results or dvc.lock) with tiny
params, committed to a fresh git repository, so `dvc repro` runs every stage
in a couple of minutes on 2 cores.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from helpers import committed_params

from pipeline.stages.contract_runs import FIXTURE

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's `dvc` and `pal` live beside python

TINY: dict[str, dict[str, Any]] = {
    "demo": dict(FIXTURE["demo"]),  # the contracts' fixture's tiny demo
    "data": {
        "dataset": "demo",
        "root": "data/demo/dataset",
        "tasks": 2,
        "missing_type": "both",
        "missing_rate": 0.5,
    },
    "pixels": {"enabled": True, "workers": 1},
    "model": {"backbone": "data/demo/vilt"},
    "prompt": {"pool_size": 4, "length": 4, "layers": [0, 1]},
    "tune": {"epochs": 1, "batch_size": 4, "device": "cpu"},
    "extract": {"batch_size": 16, "device": "cpu"},
    "solve": {"eta": 1.0, "width": 256, "seed": 0, "method": "gram", "device": "cpu"},
    "evaluate": {"device": "cpu"},
    "protocol": {"runs": [0, 1]},
}


def scratch_env(path: Path) -> dict[str, str]:
    """The environment for commands in the copy at `path`: the venv first on
    PATH, the copy's code importable, offline, and a git identity."""
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(path),
        DVC_NO_ANALYTICS="1",
        HF_HUB_OFFLINE="1",
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    return env


def complete_params(params: dict[str, Any]) -> dict[str, Any]:
    """`params` with every key of each section present (defaults filled in):
    dvc.yaml declares some sections key by key, and DVC requires those keys."""
    from palcore.params import ProtocolParams
    from pipeline.params import SECTIONS
    from solver.params import EvaluateParams, SolveParams

    classes = {
        **SECTIONS,
        "solve": SolveParams,
        "evaluate": EvaluateParams,
        "protocol": ProtocolParams,
    }
    full = {}
    for section, values in params.items():
        if section not in classes:  # ablation, pipelines: as written
            full[section] = values
            continue
        defaults = dataclasses.asdict(classes[section]())
        merged = {**defaults, **values}
        full[section] = {
            k: list(v) if isinstance(v, tuple) else v for k, v in merged.items()
        }
    return full


def copy_project_files(dst: Path, but: tuple[str, ...] = ()) -> None:
    """Copy the project's tracked and unignored files into `dst`, without
    data/, results/, the lock files and the paths `but` names."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if (
            rel.startswith(("data/", "results/"))
            or rel in ("dvc.lock", *but)
            or not src.is_file()
        ):
            continue
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, target)


def make_scratch_project(dst: Path, params: dict[str, Any]) -> dict[str, str]:
    """Copy the project's tracked and unignored files into `dst` (without
    data/, results/ and the locks), write `params` as params.yaml, commit it
    all to a new git repository; returns `scratch_env(dst)`."""
    copy_project_files(dst)
    project = committed_params()
    # the project's variants and pipelines by default
    params = {
        "ablation": project["ablation"],
        "pipelines": project["pipelines"],
        **params,
    }
    (dst / "params.yaml").write_text(
        yaml.safe_dump(complete_params(params), sort_keys=False)
    )
    env = scratch_env(dst)
    for args in (
        ["git", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-qm", "project"],
    ):
        subprocess.run(args, cwd=dst, env=env, check=True, capture_output=True)
    return env
