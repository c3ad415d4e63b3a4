"""The class-incremental protocol: class order, task split, missing-modality tables.

Class order (DESIGN §3): the class names, sorted, are permuted once by
`numpy.random.default_rng(data.class_order_seed)`; label i is the i-th class of
that order, so task k owns a contiguous label range and the classes seen after
step k are 0..C_k−1.

Tasks: the C classes are split evenly over K = `data.tasks` tasks. When K does
not divide C this is an error, unless `data.allow_uneven` is true; then the
first C mod K tasks get one class more.

Multi-label samples (MM-IMDb; `RawSample.labels`): a sample joins the task
of its class first in the class order, and only that task: each sample is
learnt once, exemplar-free as the single-label datasets are. It is learnt
and scored on its classes of that task (a later task's classes are not
known yet, `Sample.targets`); RebQ scores each task on its own classes'
columns. Its earlier tasks hold none of its classes by construction.

Missing tables (DESIGN §6), one per (task, split), drawn from
`numpy.random.default_rng([data.seed, task, split_code])` with split codes
train 0, val 1, test 2, over the (task, split)'s samples sorted by id, so a
table depends on neither build order nor the other tables. With n samples and
rate r, m = int(n·r) samples are chosen uniformly without replacement; type
`text` gives them code 1, `image` code 2, `both` gives int(m/2) of them code 2
and the rest code 1; `none` leaves every sample complete (code 0). Codes:
0 complete, 1 text missing, 2 image missing; no sample loses both.

Naturally missing samples (the dataset itself lacks their image or text) keep
their code and count toward the chosen set: they fill the quota of their own
code first (targets t1, t2 from m as above), and only the remaining
max(0, t1 − natural_1) + max(0, t2 − natural_2) samples are drawn, uniformly
from the complete samples, first the code-2 share, then the code-1 share. With
no naturally missing sample this is exactly the rule above. When more samples
are naturally missing than the table asks for, all of them stay missing (the
count then exceeds m; `prepare` logs it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from palcore.codes import Missing
from palcore.errors import ParamsError

SPLIT_CODES = {"train": 0, "val": 1, "test": 2}


def class_order(classes: Sequence[str], seed: int) -> list[str]:
    """The class names in label order: sorted, then permuted by `seed`."""
    names = sorted(classes)
    perm = np.random.default_rng(seed).permutation(len(names))
    return [names[i] for i in perm]


def task_sizes(n_classes: int, n_tasks: int, allow_uneven: bool = False) -> list[int]:
    """Classes per task, in task order."""
    if n_tasks > n_classes:
        raise ParamsError(
            f"data.tasks: {n_tasks} tasks for {n_classes} classes; "
            "every task needs at least one class"
        )
    base, extra = divmod(n_classes, n_tasks)
    if extra and not allow_uneven:
        raise ParamsError(
            f"data.tasks: {n_tasks} does not divide the {n_classes} classes evenly "
            "(set data.allow_uneven: true to give the first tasks one class more)"
        )
    return [base + (1 if t < extra else 0) for t in range(n_tasks)]


def empty_tasks(
    samples: Iterable[tuple[str, str]], order: Sequence[str], sizes: Sequence[int]
) -> list[tuple[int, str, list[str]]]:
    """The (task, split, its classes) of every task with no training or no
    test sample, for `samples` given as (class name, split) and the classes in
    label `order`: a class order can put only classes without test samples
    into one task (a dataset whose test split lacks some classes), and every
    step needs both its training and its test samples."""
    task_of = task_of_label(sizes)
    label_of = {name: i for i, name in enumerate(order)}
    seen = {(task_of[label_of[c]], split) for c, split in samples if c in label_of}
    bounds = np.cumsum([0, *sizes])
    return [
        (t, split, list(order[bounds[t - 1] : bounds[t]]))
        for t in range(1, len(sizes) + 1)
        for split in ("train", "test")
        if (t, split) not in seen
    ]


def empty_task_line(task: int, split: str, classes: list[str]) -> str:
    shown = ", ".join(classes[:3]) + (", …" if len(classes) > 3 else "")
    return (
        f"task {task} has no {split} samples (its classes: {shown}): every task "
        f"needs both; the dataset's {split} split lacks these classes"
    )


def placing_class(
    labels: Sequence[str], class_name: str, label_of: Mapping[str, int]
) -> str:
    """The class that places a listed sample in its task: `class_name`, or
    for a multi-label sample the one of its `labels` first in the class
    order (`label_of`: class name -> label), so that it joins the task of
    its earliest class and is learnt once (module doc)."""
    return min(labels, key=label_of.__getitem__) if labels else class_name


def task_of_label(sizes: Sequence[int]) -> list[int]:
    """1-based task of every label, for labels 0..sum(sizes)-1."""
    return [t + 1 for t, size in enumerate(sizes) for _ in range(size)]


def missing_targets(n: int, missing_type: str, rate: float) -> tuple[int, int]:
    """How many samples of n get code 1 and code 2: (t1, t2)."""
    if missing_type not in ("none", "text", "image", "both"):
        raise ParamsError(f"data.missing_type: unknown type {missing_type!r}")
    if not 0.0 <= rate <= 1.0:
        raise ParamsError(f"data.missing_rate: must lie in [0, 1], got {rate}")
    if missing_type == "none":
        return 0, 0
    m = int(n * rate)
    if missing_type == "text":
        return m, 0
    if missing_type == "image":
        return 0, m
    return m - m // 2, m // 2


def missing_table(
    natural: np.ndarray,
    missing_type: str,
    rate: float,
    seed: int,
    task: int,
    split: str,
) -> np.ndarray:
    """Missing codes of one (task, split).

    Args:
        natural: (n,) int8 codes the dataset imposes (0 where both modalities
            exist), for the (task, split)'s samples sorted by id.
        missing_type, rate: the protocol for this split.
        seed, task, split: the table's seed words (`data.seed`, 1-based task,
            split name).

    Returns:
        (n,) int8 codes 0/1/2.
    """
    natural = np.asarray(natural, dtype=np.int8)
    t1, t2 = missing_targets(len(natural), missing_type, rate)
    need1 = max(0, t1 - int(np.sum(natural == Missing.TEXT)))
    need2 = max(0, t2 - int(np.sum(natural == Missing.IMAGE)))
    codes = natural.copy()
    free = np.flatnonzero(natural == Missing.COMPLETE)
    rng = np.random.default_rng([seed, task, SPLIT_CODES[split]])
    chosen = free[rng.permutation(len(free))[: need1 + need2]]
    codes[chosen[:need2]] = Missing.IMAGE
    codes[chosen[need2:]] = Missing.TEXT
    return codes
