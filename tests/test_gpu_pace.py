"""palbench/gpu_check.py's `pace` part (palbench/gpu_pace.py, palbench/pace.py): each
method's steady step per tree, the features of two trees compared, J
tunings side by side, and the card's entry for `pal-paper plan --card`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from palbench import gpu_check, gpu_pace

ROOT = Path(__file__).resolve().parents[1]

METHODS = ["pal", "rebq", "map", "msp", "l2p", "dualprompt"]


def measured(card: str | None = "NVIDIA H100 80GB HBM3") -> dict:
    rates = dict(
        zip(METHODS, [400.0, 380.0, 900.0, 700.0, 1000.0, 1100.0], strict=True)
    )
    return {
        "card": card,
        "memory_gib": 79.1 if card else None,
        "config": "vilt-b32",
        "steps": 1000,
        "frozen_rows_per_s": 3000.0,
        "methods": {
            m: {
                "samples_per_s": r,
                "extract_per_s": 2 * r,
                "capture_s_per_graph": 0.2 + i / 100,
                "tuning_gib": 3.5,
            }
            for i, (m, r) in enumerate(rates.items())
        },
    }


def test_the_card_entry_holds_the_measured_rates_and_the_like_cards_rest():
    pack = {"1": {"factor": 1.0, "startup_s": 20.5}, "2": {"factor": 1.7}}
    like = {"name": "one NVIDIA H200", "first_batch_s": 3.6, "extract_startup_s": 24.1}
    card = gpu_pace.card_entry(measured(), pack, like, "abc1234", "full")
    assert card["name"] == "one NVIDIA H100 80GB HBM3"
    assert card["status"] == "measured" and card["commit"] == "abc1234"
    assert card["memory_gib"] == 79.1 and card["steps"] == 1000
    assert card["tune_per_s"] == {
        "pal": 400.0,
        "rebq": 380.0,
        "map": 900.0,
        "msp": 700.0,
        "l2p": 1000.0,
        "dualprompt": 1100.0,
    }
    assert card["extract_per_s"] == {m: 2 * r for m, r in card["tune_per_s"].items()}
    assert card["tuning_gib"] == dict.fromkeys(METHODS, 3.5)
    assert card["packing"] == {1: 1.0, 2: 1.7}
    assert card["tune_startup_s"] == 20.5
    # the slowest method's capture (dualprompt's 0.25 s) for 48 graphs a task
    assert card["capture_s_per_task"] == 12.0
    assert (card["first_batch_s"], card["extract_startup_s"]) == (3.6, 24.1)
    assert card["basis"].endswith(
        "first_batch_s, extract_startup_s from one NVIDIA H200"
    )


def test_features_of_two_trees_compare_by_the_least_row_cosine(tmp_path):
    before, after = tmp_path / "b", tmp_path / "a"
    before.mkdir()
    after.mkdir()
    x = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 4.0]])
    torch.save(x, before / "pal.pt")
    torch.save(x * 2, after / "pal.pt")  # the same directions
    y = x.clone()
    y[2] = torch.tensor([4.0, 3.0])  # cos 24/25 with [3, 4]; argmax moves
    torch.save(x, before / "map.pt")
    torch.save(y, after / "map.pt")
    got = gpu_pace.compare(before, after, ["pal", "map"])
    assert got["pal"] == {"cosine_min": 1.0, "argmax_equal": 1.0}
    assert got["map"] == {"cosine_min": 0.96, "argmax_equal": pytest.approx(2 / 3)}


def test_pace_measures_each_method_as_pal_tune_steps_it(tmp_path):
    """palbench/pace.py on the CPU: the static step a GPU replays for the graphable
    methods, every figure present, features saved per method."""
    cmd = [
        *(sys.executable, "-m", "palbench.pace", "--config", "tiny"),
        *("--device", "cpu", "--steps", "2", "--fill", "8", "--photos", "24"),
        *("--seconds", "0.1", "--static", "--methods", "pal,map"),
        *("--out", str(tmp_path)),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
    got = json.loads((tmp_path / "pace.json").read_text())
    assert list(got["methods"]) == ["pal", "map"]
    assert got["card"] is None and got["steps"] == 2
    for m, v in got["methods"].items():
        assert v["samples_per_s"] > 0 and v["fill_samples_per_s"] > 0
        assert v["kernels_per_step"] > 100 and v["busy_share"] is None
        assert v["flops_per_sample"] > v["extract_flops_per_sample"] > 1e5
        assert v["extract_per_s"] > 0
        features = torch.load(tmp_path / f"{m}.pt")
        assert features.shape == (16, 32) and features.dtype == torch.float32
        # the static step a GPU replays: no op that would sync
        assert v["graphed"] is True and v["syncs_per_step"] == 0
    assert got["frozen_rows_per_s"] > 0


@pytest.mark.slow
def test_the_pace_part_writes_a_card_and_finds_equal_features(tmp_path):
    """gpu_check --parts pace against the committed tree: the same code, so
    each method's features agree to the last row; card.yaml written."""
    baseline = gpu_check.gpu_paths.baseline_tree("HEAD", tmp_path)
    out = tmp_path / "out"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    cmd = [
        *(sys.executable, "-m", "palbench.gpu_check", "--parts", "pace"),
        *("--scale", "smallest", "--device", "cpu", "--out", str(out)),
        *("--jobs", "1,2", "--baseline", str(baseline), "--commit", "abc1234"),
        *("--workdir", str(tmp_path / "work")),
    ]
    r = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads((out / "report.json").read_text())
    pace = report["pace"]
    assert pace["exit"] == 0
    assert sorted(pace["features"]) == sorted(METHODS)
    for m in METHODS:
        assert pace["features"][m]["cosine_min"] >= 0.99999
        assert pace["features"][m]["argmax_equal"] == 1.0
    assert sorted(pace["packing"]) == ["1", "2"]
    assert pace["packing"]["1"]["factor"] == 1.0
    card = yaml.safe_load((out / "card.yaml").read_text())
    assert card["commit"] == "abc1234" and card["status"] == "measured"
    assert sorted(card["tune_per_s"]) == sorted(METHODS)
    assert "## Pace" in (out / "report.md").read_text()
    # what `pal-paper plan --card card.yaml` reads: every key checked
    from palpaper.cards import card as read_card

    checked = read_card(str(out / "card.yaml"))
    assert (
        checked.status()
        == "measured on this machine's CPU (a dry run) at abc1234, 3 steps"
    )
