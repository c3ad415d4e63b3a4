"""`pal check`: every problem of the params file, paths, devices and data in
one line each, before `dvc repro`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import yaml
from click.testing import CliRunner
from helpers import committed

from pipeline.cli import main
from pipeline.fakes.trees import make_food101_tree, make_hub_vilt

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """The committed pipeline files and params in an empty folder (no data/
    yet): never the workspace's, which a user's experiment may have changed."""
    for rel in ("dvc.yaml", "params.yaml"):
        (tmp_path / rel).write_text(committed(rel))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def check(*args):
    return CliRunner().invoke(main, ["check", *args])


def test_the_demo_params_are_ready(project):
    r = check()
    assert r.exit_code == 0, r.output
    assert r.stdout == (
        "data: demo, made by the demo stage\nparams.yaml: ready for dvc repro\n"
    )


def test_every_mistake_is_one_line(project):
    text = (project / "params.yaml").read_text()
    text = text.replace("  epochs: 3", "  epoch: 3").replace("  eta: 1.0", "  eta: -1")
    (project / "params.yaml").write_text(text.replace("\nprotocol:", "\nprotocl:"))
    r = check()
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        "Error: params.yaml: unknown section 'protocl' (did you mean 'protocol'?)",
        "Error: params.yaml: unknown key 'tune.epoch' (did you mean 'tune.epochs'?)",
        "Error: params.yaml: solve.eta must be > 0 and finite, got -1.0",
        "Error: params.yaml: missing section 'protocol'",
        "Error: params.yaml: 'protocol.vary' is missing (dvc.yaml declares it)",
        "Error: params.yaml: 'tune.epochs' is missing (dvc.yaml declares it)",
        "Error: params.yaml: 'protocol' is missing (dvc.yaml declares it)",
    ]


def test_a_solve_wider_than_the_memory_is_refused_before_any_stage(project):
    """A width whose 2 × width² float64 exceed this machine's memory (the
    width chosen from it, so the test holds on any host): one line with the
    figure, here and in `pal-solver solve` (tests/test_solver_cli.py);
    `--solve-memory` checks it against another machine's."""
    import math
    import os

    ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    width = 1000 * math.ceil(1.3 * math.sqrt(ram / 16) / 1000)
    text = (project / "params.yaml").read_text()
    (project / "params.yaml").write_text(
        text.replace("  width: 1024", f"  width: {width}")
    )
    cpu, gpu = 2 * width**2 * 8 / 2**30, 4 * width**2 * 8 / 2**30
    assert cpu > ram / 2**30
    r = check()
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        f"Error: params.yaml: solve.width {width}: the solve holds about "
        f"{cpu:.1f} GiB (2 × {width}² float64), but this machine's memory is "
        f"{ram / 2**30:.1f} GiB: lower solve.width"
    ]
    # solve.device auto: on a GPU CuPy's Cholesky copies, 4 × d² in all
    r = check("--solve-memory", f"{1.1 * gpu:.1f}")
    assert r.exit_code == 0, r.output
    r = check("--solve-memory", f"{gpu / 2:.1f}")
    assert r.stderr.splitlines() == [
        f"Error: params.yaml: solve.width {width}: the solve holds about "
        f"{gpu:.1f} GiB (4 × {width}² float64), but the memory given "
        f"(--solve-memory) is {gpu / 2:.1f} GiB: lower solve.width"
    ]


def test_a_variant_and_a_pipeline_list_are_checked(project):
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["ablation"]["init"]["changes"]["tune"] = {"epochs": -1}
    params["pipelines"]["main"].append("wide")
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = check()
    assert r.exit_code == 1
    known = ", ".join(sorted(params["ablation"]))  # every row the params hold
    assert r.stderr.splitlines() == [
        f"Error: params.yaml: unknown variant 'ablation.wide' (known: {known})",
        "Error: params.yaml: tune.epochs must be >= 0, got -1",
    ]


def test_a_preset_names_its_missing_data_backbone_and_gpu(project):
    shutil.copy(ROOT / "configs" / "food101.yaml", project / "params.yaml")
    r = check()
    assert r.exit_code == 1
    lines = r.stderr.splitlines()
    assert lines[:2] == [
        "Error: params.yaml: data.root 'data/raw/food101' is no folder",
        "Error: params.yaml: model.backbone 'models/vilt-b32-mlm': no such folder, "
        "and no hub model of that id in the local HF cache",
    ]
    if not torch.cuda.is_available():
        assert lines[2:] == [
            f"Error: params.yaml: {key} is 'cuda' but torch sees no CUDA GPU here; "
            "for a CPU run set tune.device and extract.device to cpu (or auto), see "
            "the README's CPU smoke run"
            for key in ("tune.device", "extract.device")
        ]


def test_a_preset_with_its_data_in_place_is_ready(project):
    params = yaml.safe_load((ROOT / "configs" / "food101.yaml").read_text())
    params["tune"]["device"] = params["extract"]["device"] = "cpu"
    params["prompt"].update(layers=[0, 1], pool_size=32)  # the tiny ViLT's sizes
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    make_food101_tree(project / "data/raw/food101", classes=11, train=2, test=1)
    make_hub_vilt(project / "models/vilt-b32-mlm")
    r = check()
    assert r.exit_code == 0, r.output
    assert r.stdout == (
        "data: food101, 10 classes in 10 tasks; 10 test, 20 train\n"
        "backbone: models/vilt-b32-mlm, 2 layers, hidden 32, text positions 40\n"
        "params.yaml: ready for dvc repro\n"
    )


def test_the_backbone_and_the_data_are_checked_against_the_prompts_and_tasks(
    project,
):
    """The preset's prompts (layers 0-7, pools of 128) on a 2-layer ViLT of
    hidden size 32, and 10 tasks of 7 classes: every problem in one line
    each, before tune would meet them one at a time."""
    params = yaml.safe_load((ROOT / "configs" / "food101.yaml").read_text())
    params["tune"]["device"] = params["extract"]["device"] = "cpu"
    params["model"]["max_text_len"] = 80
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    make_food101_tree(project / "data/raw/food101", classes=8, train=2, test=1)
    make_hub_vilt(project / "models/vilt-b32-mlm")
    r = check()
    assert r.exit_code == 1
    assert r.stderr.splitlines()[-2:] == [
        "Error: params.yaml: data.tasks: 10 tasks for 7 classes; every task needs "
        "at least one class",
        "Error: params.yaml: prompt.layers [0, 1, 2, 3, 4, 5, 6, 7]: layer 2 is "
        "beyond the backbone's 2 layers (0..1) (model.backbone "
        "'models/vilt-b32-mlm')",
    ]
    params["data"]["tasks"] = 7
    params["prompt"]["layers"] = [0, 1]
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = check()
    assert r.exit_code == 1
    assert r.stderr.splitlines()[1:] == [  # after the reader's INFO line
        "Error: params.yaml: prompt.pool_size 128 exceeds the hidden size 32: "
        "orthogonal keys need pool_size ≤ 32 (model.backbone 'models/vilt-b32-mlm')"
    ]
    params["prompt"]["pool_size"] = 32
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = check()
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1] == (
        "backbone: models/vilt-b32-mlm, 2 layers, hidden 32, text positions 40, "
        "stretched to model.max_text_len 80"
    )


def test_a_read_only_dvc_cache_is_named_before_any_stage(project, tmp_path):
    """A cache DVC cannot write (here a read-only mount, as a shared cache
    often is) is known before the stages' work, not after it."""
    import subprocess

    cache = tmp_path / "ro-cache"
    cache.mkdir()
    (project / ".dvc").mkdir()
    (project / ".dvc" / "config").write_text(f"[cache]\n    dir = {cache}\n")
    assert check().exit_code == 0
    mounted = subprocess.run(
        ["mount", "--bind", "-o", "ro", str(cache), str(cache)], capture_output=True
    )
    if mounted.returncode:
        pytest.skip("cannot mount a read-only folder here (needs root)")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(cache)], check=True)
        r = check()
    finally:
        subprocess.run(["umount", str(cache)], check=True)
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        f"Error: DVC's cache {cache} is not writable: no stage's output could be "
        'kept (`dvc cache dir` chooses another; docs/USAGE.md, "Sharing the '
        'feature cache")'
    ]
