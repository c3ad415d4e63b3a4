"""Solver state: solve steps 1–3, keep the state, delete their shards, absorb
steps 4–5 — the weights equal a solve over every step's shards."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from click.testing import CliRunner

from palcore.errors import ShardError
from solver.cli import main
from solver.params import SolveParams
from solver.solve import solve
from solver.state import load_state
from solver.synthetic import make_features
from solver.weights import WeightsError, WeightsFile

WIDTH = 96


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("state")
    return make_features(
        root / "extract", [60, 50, 70, 40, 55], [3, 2, 3, 2, 2], feature_dim=24
    )


def _steps(features: Path, dst: Path, steps: range) -> Path:
    for k in steps:
        shutil.copytree(features / f"step_{k:02d}", dst / f"step_{k:02d}")
    return dst


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.mark.parametrize("method", ["gram", "woodbury"])
def test_state_round_trip_equals_a_full_solve(features, tmp_path, method):
    params = SolveParams(eta=0.5, width=WIDTH, method=method, device="cpu")
    (full,) = solve(features, tmp_path / "full", params)
    early = _steps(features, tmp_path / "early", range(1, 4))
    state = tmp_path / "state.h5"
    solve(early, tmp_path / "first", params, save_state=state)
    shutil.rmtree(early)  # the old shards are gone
    late = _steps(features, tmp_path / "late", range(4, 6))
    (resumed,) = solve(late, tmp_path / "resumed", params, state=state)
    a, b = WeightsFile(full), WeightsFile(resumed)
    assert b.n_steps == 5 and b.classes_seen == a.classes_seen
    for k in range(1, 6):
        assert _rel(b.W(k), a.W(k)) <= 1e-9, k
    info = load_state(state).info
    assert (info.step, info.classes_seen, info.n_rows) == (3, 8, 180)
    with h5py.File(state, "r") as f:
        square = [
            n
            for n in f
            if isinstance(f[n], h5py.Dataset) and f[n].shape == (WIDTH, WIDTH)
        ]
    assert len(square) == 1  # G, or R for the one η: 8·d² bytes


def test_gram_state_serves_another_eta(features, tmp_path):
    """G and Q do not depend on η: a gram state absorbs later steps for any η;
    the weights file then starts at the first new step."""
    base = SolveParams(eta=0.5, width=WIDTH, device="cpu")
    other = SolveParams(eta=3.0, width=WIDTH, device="cpu")
    (full,) = solve(features, tmp_path / "full", other)
    state = tmp_path / "state.h5"
    solve(_steps(features, tmp_path / "early", range(1, 4)), tmp_path / "a", base,
          save_state=state)  # fmt: skip
    late = _steps(features, tmp_path / "late", range(4, 6))
    (resumed,) = solve(late, tmp_path / "b", other, state=state)
    b = WeightsFile(resumed, partial=True)
    assert (b.first_step, b.n_steps) == (4, 5)
    assert _rel(b.W(5), WeightsFile(full).W(5)) <= 1e-9
    line = (
        f"{resumed}: holds steps 4..5 only (solved from a state with another eta); "
        "evaluating needs the weights of every step"
    )
    with pytest.raises(WeightsError, match=f"^{re.escape(line)}$"):
        WeightsFile(resumed)


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--width", "64", "state from width 96, but this solve has width 64"),
        ("--seed", "3", "state from seed 0, but this solve has seed 3"),
        (
            "--method",
            "woodbury",
            "state from method gram, but this solve has method woodbury",
        ),  # fmt: skip
    ],
)
def test_a_state_from_other_settings_is_refused(
    features, tmp_path, option, value, message
):
    state = tmp_path / "state.h5"
    params = SolveParams(eta=0.5, width=WIDTH, device="cpu")
    solve(_steps(features, tmp_path / "early", range(1, 4)), tmp_path / "a", params,
          save_state=state)  # fmt: skip
    late = _steps(features, tmp_path / "late", range(4, 6))
    r = CliRunner().invoke(
        main,
        ["solve", "--features", str(late), "--out", str(tmp_path / "b"),
         "--state", str(state), "--eta", "0.5", "--width", str(WIDTH),
         "--device", "cpu", option, value],
    )  # fmt: skip
    assert r.exit_code == 1
    assert r.output.strip().splitlines() == [f"Error: {state}: {message}"]
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())


def test_a_state_with_no_later_steps_is_one_line(features, tmp_path):
    state = tmp_path / "state.h5"
    params = SolveParams(eta=0.5, width=WIDTH, device="cpu")
    early = _steps(features, tmp_path / "early", range(1, 4))
    solve(early, tmp_path / "a", params, save_state=state)
    line = (
        f"{early}: no step folders after step 3 (the solver state already holds "
        "steps 1..3)"
    )
    with pytest.raises(ShardError, match=f"^{re.escape(line)}$"):
        solve(early, tmp_path / "b", params, state=state)
