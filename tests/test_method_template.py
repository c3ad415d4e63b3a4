"""A new prompt method is one file: docs/method_template.py copied into a
copy of the project as pipeline/methods/toy.py is a method, its contract
units start by the raise the guard names, and `pal tune` and `pal extract`
run it on the demo's tiny CPU settings, with no other file of pipeline/
changed (docs/USAGE.md, "Add a method")."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import h5py
import pytest
import torch
import yaml
from scratch_project import BIN, ROOT, TINY, make_scratch_project

from pipeline.params import DemoParams


def _run(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*args], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )


def _pal(root: Path, env: dict[str, str], *args: str) -> None:
    done = _run(root, env, str(BIN / "pal"), *args)
    assert done.returncode == 0, done.stderr[-2000:]


def _shapes(path: Path) -> dict[str, tuple[int, ...]]:
    """The shape of each dataset of an HDF5 file, by its path in the file."""
    shapes: dict[str, tuple[int, ...]] = {}

    def visit(name: str, obj: object) -> None:  # None: visit on
        if isinstance(obj, h5py.Dataset):
            shapes[name] = obj.shape

    with h5py.File(path, "r") as f:
        f.visititems(visit)
    return shapes


@pytest.mark.slow
def test_the_template_is_a_method_from_its_file_alone(tmp_path: Path) -> None:
    root = tmp_path / "project"
    env = make_scratch_project(root, TINY)
    shutil.copy(ROOT / "docs" / "method_template.py", root / "pipeline/methods/toy.py")
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["prompt"]["method"] = "toy"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    stamp = ("contracts", "stamp", "--out", "data/contracts")
    refused = _run(root, env, str(BIN / "pal"), *stamp)
    assert refused.returncode == 1 and refused.stderr == (
        "Error: contracts.yaml: no version for 'extract.toy' (a new method's "
        "outputs): `pal contracts raise tune.toy extract.toy` starts them at 1 "
        '(docs/USAGE.md, "Add a method")\n'
    )
    # pal tune alone stops before any work, in the same one line
    tune_args = ("tune", "--run", "0", "--prepare", "data/prepare/0")
    early = _run(root, env, str(BIN / "pal"), *tune_args, "--out", "data/tune/toy")
    assert early.returncode == 1 and early.stderr == refused.stderr.replace(
        "'extract.toy'", "'tune.toy'"
    )
    assert not (root / "data/tune/toy").exists()
    _pal(root, env, "contracts", "raise", "tune.toy", "extract.toy")
    _pal(root, env, *stamp)
    _pal(root, env, "demo")
    _pal(root, env, "prepare", "--run", "0", "--out", "data/prepare/0")
    prepare = ("--prepare", "data/prepare/0")
    _pal(root, env, "tune", "--run", "0", *prepare, "--out", "data/tune/toy")
    out = "data/extract/toy"
    _pal(root, env, "extract", *prepare, "--tune", "data/tune/toy", "--out", out)

    tune, D = root / "data/tune/toy", DemoParams().hidden_size
    ckpts = [torch.load(tune / f"step_0{k}.pt", weights_only=False) for k in (1, 2)]
    assert [c["params"]["prompt"]["method"] for c in ckpts] == ["toy", "toy"]
    first, last = (c["state"]["prompts.P"] for c in ckpts)
    assert first.shape == (2, 4, D) and first.abs().sum() > 0  # (J, L, D)
    assert torch.equal(first, last)  # trained in task 1, frozen after
    log = [json.loads(line) for line in (tune / "log.jsonl").open()]
    assert [e["task"] for e in log] == [1, 2]
    for folder in (tune, root / out):
        made = json.loads((folder / "contract.json").read_text())
        assert (made["method"], made["method_version"]) == ("toy", 1)
    n_test = TINY["demo"]["test_per_class"] * TINY["demo"]["n_classes"]
    for k, step in enumerate(("step_01", "step_02"), 1):
        shapes = _shapes(root / out / step / "test.h5")
        features = {name: s for name, s in shapes.items() if name.endswith("/features")}
        assert sum(s[0] for s in features.values()) == n_test * k // 2, shapes
        assert {s[1] for s in features.values()} == {D}

    status = _run(root, env, "git", "status", "--porcelain").stdout.splitlines()
    assert [s for s in status if s[3:].startswith("pipeline/")] == [
        "?? pipeline/methods/toy.py"
    ]
    assert sorted(status) == [
        " M contracts.yaml",
        " M params.yaml",
        "?? pipeline/methods/toy.py",
    ]
