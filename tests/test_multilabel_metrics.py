"""Multi-label metrics against sklearn and hand-computed values."""

import re

import numpy as np
import pytest
from sklearn.metrics import average_precision_score, f1_score

from solver.multilabel import macro_f1, macro_map, task_matrix_summary

N_ROWS, N_LABELS = 50, 6


def exact(ref: float) -> object:
    return pytest.approx(ref, rel=0, abs=1e-12)


@pytest.fixture
def Y() -> np.ndarray:
    rng = np.random.default_rng(0)
    return (rng.random((N_ROWS, N_LABELS)) < 0.35).astype(np.int64)


@pytest.fixture
def probs() -> np.ndarray:
    return np.random.default_rng(1).random((N_ROWS, N_LABELS))


@pytest.fixture
def ridge(Y: np.ndarray) -> np.ndarray:
    """Ridge-like scores: near the targets, with values below 0 and above 1."""
    noise = np.random.default_rng(2).normal(0.0, 0.6, (N_ROWS, N_LABELS))
    S = Y + noise
    assert (S < 0).any() and (S > 1).any()
    return S


def test_macro_f1_equals_sklearn(Y, probs):
    ref = 100 * f1_score(Y, probs > 0.5, average="macro", zero_division=0)
    assert macro_f1(Y, probs, 0.5) == exact(ref)


@pytest.mark.parametrize("threshold", [0.0, 0.5])
def test_macro_f1_thresholds_raw_ridge_scores(Y, ridge, threshold):
    ref = 100 * f1_score(Y, ridge > threshold, average="macro", zero_division=0)
    assert macro_f1(Y, ridge, threshold) == exact(ref)


def test_macro_f1_columns_equal_sklearn_on_the_slice(Y, ridge):
    cols = [4, 1, 2]
    ref = 100 * f1_score(
        Y[:, cols], ridge[:, cols] > 0.5, average="macro", zero_division=0
    )
    assert macro_f1(Y, ridge, 0.5, columns=cols) == exact(ref)
    assert macro_f1(Y, ridge, 0.5, columns=cols) != exact(macro_f1(Y, ridge, 0.5))


def test_macro_f1_column_without_positives_or_predictions_scores_zero():
    Y = np.array([[1, 0], [0, 0], [1, 0]])
    S = np.array([[0.9, -1.0], [0.2, -2.0], [-0.3, 0.1]])
    # column 0: TP 1, FP 0, FN 1 -> F1 = 2/3; column 1: 2TP + FP + FN = 0 -> 0
    assert macro_f1(Y, S, 0.5) == exact(100 * (2 / 3 + 0) / 2)
    assert macro_f1(Y, S, 0.5, columns=[1]) == 0.0


def test_macro_map_equals_sklearn_with_tied_scores(Y, ridge):
    S = np.round(ridge, 1)
    assert any(len(np.unique(S[:, col])) < N_ROWS for col in range(N_LABELS))
    ref = 100 * average_precision_score(Y, S, average="macro")
    assert macro_map(Y, S) == exact(ref)
    cols = [0, 3, 5]
    ref_cols = 100 * average_precision_score(Y[:, cols], S[:, cols], average="macro")
    assert macro_map(Y, S, columns=cols) == exact(ref_cols)


def test_macro_map_groups_tied_scores():
    Y = np.array([[1], [0], [1], [0]])
    S = np.array([[0.8], [0.8], [0.4], [0.1]])
    # thresholds 0.8, 0.4, 0.1: (P, R) = (1/2, 1/2), (2/3, 1), (1/2, 1)
    assert macro_map(Y, S) == exact(100 * (0.5 * 0.5 + 0.5 * 2 / 3))


def test_macro_map_leaves_out_columns_without_positives(Y, ridge):
    Y = Y.copy()
    Y[:, 2] = 0
    keep = [0, 1, 3, 4, 5]
    with pytest.warns(UserWarning, match="No positive class found in y_true"):
        sk_per_column = average_precision_score(Y, ridge, average=None)
    assert sk_per_column[2] == 0.0  # sklearn's stand-in for an undefined AP
    ref = 100 * average_precision_score(Y[:, keep], ridge[:, keep], average="macro")
    assert macro_map(Y, ridge) == exact(ref)
    assert macro_map(Y, ridge) == exact(100 * np.mean(sk_per_column[keep]))
    assert macro_map(Y, ridge) > 100 * np.mean(sk_per_column)


def test_macro_map_without_any_positive_column_raises(Y, ridge):
    Y = Y.copy()
    Y[:, [1, 3]] = 0
    with pytest.raises(
        ValueError,
        match=re.escape("no label column has a positive target; mAP is undefined"),
    ):
        macro_map(Y, ridge, columns=[1, 3])


def test_task_matrix_summary_on_a_hand_matrix():
    # entries above the diagonal (99) are not read
    M = [[80.0, 99.0, 99.0], [70.0, 90.0, 99.0], [60.0, 75.0, 85.0]]
    want = {"avg": (60 + 75 + 85) / 3, "fg": ((80 - 60) + (90 - 75)) / 2, "last": 85}
    assert task_matrix_summary(M) == {k: exact(v) for k, v in want.items()}
    assert task_matrix_summary(np.array(M)) == {k: exact(v) for k, v in want.items()}
    assert task_matrix_summary([[80.0], [70.0, 90.0], [60.0, 75.0, 85.0]]) == {
        k: exact(v) for k, v in want.items()
    }


def test_task_matrix_summary_one_step_has_no_forgetting():
    assert task_matrix_summary([[42.0]]) == {"avg": 42.0, "fg": 0.0, "last": 42.0}


@pytest.mark.parametrize(
    "metric", [lambda Y, S: macro_f1(Y, S, 0.0), macro_map], ids=["f1", "map"]
)
def test_shape_mismatch_names_both_shapes(metric):
    Y = np.zeros((4, 3), dtype=int)
    S = np.zeros((4, 2))
    msg = "Y has shape (4, 3) but S has shape (4, 2); one score per target expected"
    with pytest.raises(ValueError, match=re.escape(msg)):
        metric(Y, S)
