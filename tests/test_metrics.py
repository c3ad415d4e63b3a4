"""Class-incremental metrics on hand-built accuracy matrices."""

import pytest

from solver.metrics import (
    Counts,
    acc,
    forgetting,
    forgetting_diag,
    metrics_from_matrix,
    summarize,
)

# task 1 improves at step 2 (60 -> 90) before dropping to 70 at step 3: FG takes
# the best earlier value (90), FG_diag the value when it was learnt (60)
RISING = [[60.0], [90.0, 80.0], [70.0, 50.0, 85.0]]
FALLING = [[90.0], [70.0, 80.0], [75.0, 60.0, 85.0]]


def test_acc_is_the_mean_of_the_final_row():
    assert acc(RISING) == pytest.approx((70 + 50 + 85) / 3)


def test_fg_takes_the_max_over_earlier_steps_and_differs_from_fg_diag():
    assert forgetting(RISING) == pytest.approx(((90 - 70) + (80 - 50)) / 2)  # 25
    assert forgetting_diag(RISING) == pytest.approx(((60 - 70) + (80 - 50)) / 2)  # 10


def test_fg_equals_fg_diag_when_accuracy_only_falls():
    assert forgetting(FALLING) == pytest.approx(17.5)
    assert forgetting_diag(FALLING) == pytest.approx(17.5)


def test_negative_forgetting_is_kept():
    # a task that only improves shows backward transfer as negative FG
    m = [[50.0], [70.0, 90.0]]
    assert forgetting(m) == pytest.approx(-20.0)
    assert forgetting_diag(m) == pytest.approx(-20.0)


def test_one_step_has_no_forgetting():
    assert metrics_from_matrix([[42.0]], [42.0]) == {
        "acc": 42.0,
        "fg": 0.0,
        "fg_diag": 0.0,
        "aia": 42.0,
        "last": 42.0,
    }


def test_metrics_from_matrix_uses_pooled_accuracies_for_aia():
    m = metrics_from_matrix(RISING, [60.0, 84.0, 69.0])
    assert m["aia"] == pytest.approx(71.0)
    assert m["last"] == 85.0


def test_bad_matrices_are_rejected():
    with pytest.raises(ValueError, match="row 2 of the accuracy matrix has 1 entries"):
        acc([[1.0], [2.0]])
    with pytest.raises(ValueError, match="empty accuracy matrix"):
        forgetting([])
    with pytest.raises(ValueError, match="one pooled accuracy per step"):
        metrics_from_matrix([[1.0]], [])


def test_counts_summary():
    # step 1: task 1 has 3/4; step 2: task 1 2/4, task 2 5/6
    counts = Counts(
        correct=[[3], [2, 5]],
        total=[[4], [4, 6]],
        missing_correct=[4, 3, 0],
        missing_total=[6, 4, 0],
    )
    assert counts.matrix() == [[75.0], [50.0, pytest.approx(83.333333333)]]
    assert counts.pooled() == [75.0, 70.0]  # (2 + 5) / (4 + 6)
    s = summarize(counts)
    assert s["acc"] == round((50 + 500 / 6) / 2, 6)
    assert s["fg"] == 25.0 and s["fg_diag"] == 25.0
    assert s["aia"] == 72.5
    assert s["last"] == 83.333333
    assert s["matrix"] == [[75.0], [50.0, 83.333333]]
    # stability: task 1 after the last step; plasticity: the later tasks' mean
    assert s["acc_by_task"] == {"first": 50.0, "later": 83.333333}
    assert s["acc_by_missing"] == {
        "complete": 66.666667,
        "text_missing": 75.0,
        "image_missing": None,
    }


def test_one_step_has_no_later_tasks():
    s = summarize(Counts(correct=[[3]], total=[[4]]))
    assert s["acc_by_task"] == {"first": 75.0, "later": None}
