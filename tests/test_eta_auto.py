"""`solve.eta: auto`: η chosen per step on held-out rows of the current task,
fitted without every task's fold, then W_k refitted on all rows — checked
against a closed form in NumPy."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from palcore.params import section_from_mapping
from solver.evaluate import evaluate
from solver.heads import held_out
from solver.params import SolveParams
from solver.rls import upsampling_matrix
from solver.shard_readers import open_features
from solver.solve import solve
from solver.synthetic import make_features
from solver.weights import WeightsFile

WIDTH, GRID, HOLDOUT, SEED = 80, (0.01, 0.3, 3.0, 100.0), 0.25, 4


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("auto")
    return make_features(
        root / "extract", [90, 70, 80], [3, 3, 2], feature_dim=20, noise=1.5
    )


def _closed_form(features: Path) -> tuple[list[float], list[np.ndarray]]:
    """The choices and weights `eta: auto` must give, from scratch."""
    steps = open_features(features)
    W_up = upsampling_matrix(steps[0].feature_dim, WIDTH, SEED)
    Hs, ys, folds, etas, Ws = [], [], [], [], []
    for s in steps:
        X, y, _, _ = s.train.read_all()
        H = np.maximum(X.astype(np.float64) @ W_up, 0)
        held = held_out(np.arange(len(y)), SEED, HOLDOUT)  # ids: index in the task
        folds.append(held)
        C = s.classes_seen
        kept = ~np.concatenate(folds)  # every task's fold left out of the fit
        H_fit = np.concatenate([*Hs, H])[kept]
        y_fit = np.concatenate([*ys, y])[kept]
        accs = []
        for eta in GRID:
            W = np.linalg.solve(
                H_fit.T @ H_fit + eta * np.eye(WIDTH), H_fit.T @ np.eye(C)[y_fit]
            )
            accs.append(np.mean(np.argmax(H[held] @ W, 1) == y[held]))
        best = max(range(len(GRID)), key=lambda i: (accs[i], GRID[i]))
        Hs.append(H)
        ys.append(y)
        H_all, y_all = np.concatenate(Hs), np.concatenate(ys)
        etas.append(GRID[best])
        Ws.append(
            np.linalg.solve(
                H_all.T @ H_all + GRID[best] * np.eye(WIDTH),
                H_all.T @ np.eye(C)[y_all],
            )
        )
    return etas, Ws


def test_auto_matches_the_closed_form(features, tmp_path):
    params = SolveParams(
        eta="auto", eta_grid=GRID, holdout=HOLDOUT, width=WIDTH, seed=SEED,
        device="cpu", batch_rows=32,
    )  # fmt: skip
    (path,) = solve(features, tmp_path / "solve", params)
    weights = WeightsFile(path)
    etas, Ws = _closed_form(features)
    assert weights.eta_by_step == etas
    assert len(set(etas)) > 1  # the data makes the steps choose differently
    for k, W in enumerate(Ws, start=1):
        rel = np.linalg.norm(weights.W(k) - W) / np.linalg.norm(W)
        assert rel <= 1e-9, k
    (metrics,) = evaluate(features, [path], tmp_path / "results")
    assert json.loads(metrics.read_text())["eta_by_step"] == etas


@pytest.mark.parametrize(
    "values, message",
    [
        (
            {"eta": "auto", "method": "woodbury"},
            "solve.eta auto needs solve.method gram",
        ),
        ({"eta": "auto", "holdout": 1.0}, "solve.holdout must lie in (0, 1), got 1.0"),
        ({"eta_grid": []}, "solve.eta_grid must not be an empty list"),
        ({"eta": "often"}, "solve.eta must be a number, got 'often'"),
    ],
)
def test_bad_auto_params_are_one_line(values, message):
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        section_from_mapping(SolveParams, "solve", values)
