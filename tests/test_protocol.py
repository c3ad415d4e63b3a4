"""Class order, task split and missing tables (DESIGN §6)."""

from __future__ import annotations

import numpy as np
import pytest

from palcore.errors import ParamsError
from pipeline.data import protocol


def test_class_order_is_a_seeded_permutation_of_the_sorted_names():
    names = [f"c{i:02d}" for i in range(30)]
    order = protocol.class_order(list(reversed(names)), seed=3)
    assert sorted(order) == names
    assert order == protocol.class_order(names, seed=3)  # input order does not matter
    perm = np.random.default_rng(3).permutation(30)
    assert order == [names[i] for i in perm]
    assert order != protocol.class_order(names, seed=4)


def test_task_sizes_even_and_contiguous_labels():
    sizes = protocol.task_sizes(100, 10)
    assert sizes == [10] * 10
    tasks = protocol.task_of_label(sizes)
    assert tasks[:10] == [1] * 10 and tasks[90:] == [10] * 10
    assert all(a <= b for a, b in zip(tasks, tasks[1:], strict=False))


def test_task_sizes_uneven_is_an_error_unless_allowed():
    with pytest.raises(
        ParamsError, match=r"data.tasks: 3 does not divide the 100 classes"
    ):
        protocol.task_sizes(100, 3)
    assert protocol.task_sizes(100, 3, allow_uneven=True) == [34, 33, 33]


def test_more_tasks_than_classes():
    with pytest.raises(ParamsError, match=r"data.tasks: 5 tasks for 4 classes"):
        protocol.task_sizes(4, 5, allow_uneven=True)


@pytest.mark.parametrize("n", [1, 7, 10, 33, 60])
@pytest.mark.parametrize("rate", [0.0, 0.3, 0.5, 0.7, 1.0])
@pytest.mark.parametrize("mtype", ["none", "text", "image", "both"])
def test_missing_table_exact_counts(n, rate, mtype):
    codes = protocol.missing_table(np.zeros(n, np.int8), mtype, rate, 0, 1, "train")
    m = int(n * rate)
    expected = {
        "none": (n, 0, 0),
        "text": (n - m, m, 0),
        "image": (n - m, 0, m),
        "both": (n - m, m - m // 2, m // 2),
    }[mtype]
    assert codes.dtype == np.int8
    assert tuple(np.bincount(codes, minlength=3)) == expected


def test_missing_table_is_seeded_per_task_and_split():
    zeros = np.zeros(50, np.int8)
    table = protocol.missing_table(zeros, "both", 0.7, 0, 2, "test")
    assert np.array_equal(
        table, protocol.missing_table(zeros, "both", 0.7, 0, 2, "test")
    )
    others = [
        protocol.missing_table(zeros, "both", 0.7, 1, 2, "test"),  # data.seed
        protocol.missing_table(zeros, "both", 0.7, 0, 3, "test"),  # task
        protocol.missing_table(zeros, "both", 0.7, 0, 2, "train"),  # split
    ]
    for other in others:
        assert not np.array_equal(table, other)
        assert np.array_equal(
            np.bincount(other, minlength=3), np.bincount(table, minlength=3)
        )


def test_missing_table_matches_the_documented_draw():
    n, rate = 20, 0.7
    codes = protocol.missing_table(np.zeros(n, np.int8), "both", rate, 5, 4, "val")
    perm = np.random.default_rng([5, 4, 1]).permutation(n)
    m = int(n * rate)
    expected = np.zeros(n, np.int8)
    expected[perm[: m // 2]] = 2
    expected[perm[m // 2 : m]] = 1
    assert np.array_equal(codes, expected)


def test_naturally_missing_samples_count_toward_the_table():
    natural = np.zeros(20, np.int8)
    natural[[0, 1]] = 2  # two images absent
    natural[5] = 1  # one text absent
    codes = protocol.missing_table(natural, "both", 0.5, 0, 1, "train")
    assert codes[[0, 1, 5]].tolist() == [2, 2, 1]  # natural codes kept
    assert np.bincount(codes, minlength=3).tolist() == [10, 5, 5]  # still int(20*0.5)
    # more natural missing than the table asks for: all kept, nothing added
    codes = protocol.missing_table(natural, "text", 0.0, 0, 1, "train")
    assert np.bincount(codes, minlength=3).tolist() == [17, 1, 2]
    codes = protocol.missing_table(natural, "none", 0.9, 0, 1, "train")
    assert np.array_equal(codes, natural)


def test_bad_rate_and_type():
    with pytest.raises(
        ParamsError, match=r"data.missing_rate: must lie in \[0, 1\], got 1.5"
    ):
        protocol.missing_targets(10, "both", 1.5)
    with pytest.raises(ParamsError, match=r"data.missing_type: unknown type 'audio'"):
        protocol.missing_targets(10, "audio", 0.5)
