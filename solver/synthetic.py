"""Synthetic feature shards, for tests, benchmarks and a solver demo without a GPU.

Rows look like a pooled transformer output: X = tanh(m₀ + s·μ_y + n·ε), bounded
in (−1, 1), with one mean μ_y per class. Classes are numbered in task order
(task k owns a contiguous range), as in DESIGN §3. Test sets are fixed per
task and repeated in every later step's test shard; `bp_logits` mimic a BP
head that forgets: its margin on a task shrinks with every later step.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from palcore.outputs import step_dir_name
from solver.shards import Block, ShardAttrs, write_test, write_train


def _rows(
    rng: np.random.Generator,
    means: np.ndarray,
    base: np.ndarray,
    labels: np.ndarray,
    noise: float,
    dtype: str,
) -> np.ndarray:
    eps = rng.standard_normal((len(labels), base.shape[0]))
    return np.tanh(base + means[labels] + noise * eps).astype(dtype)


def _missing(rng: np.random.Generator, n: int, rate: float) -> np.ndarray:
    """int(n·rate) rows lose a modality: half image (2), the rest text (1)."""
    codes = np.zeros(n, np.int8)
    chosen = rng.choice(n, size=int(n * rate), replace=False)
    n_image = len(chosen) // 2
    codes[chosen[:n_image]] = 2
    codes[chosen[n_image:]] = 1
    return codes


def make_features(
    out_dir: str | Path,
    rows_per_step: Sequence[int] | int = 200,
    classes_per_step: Sequence[int] | int = 4,
    *,
    feature_dim: int = 32,
    test_rows: int = 40,
    n_steps: int | None = None,
    seed: int = 0,
    noise: float = 0.5,
    separation: float = 0.5,
    missing_rate: float = 0.5,
    bp_logits: bool = True,
    dtype: str = "float32",
) -> Path:
    """Write `out_dir/step_XX/{train,test}.h5` for a synthetic class-incremental run.

    `rows_per_step` and `classes_per_step` are per-step lists (or one value for
    every step, with `n_steps`). Returns `out_dir`.
    """
    if isinstance(rows_per_step, int):
        rows_per_step = [rows_per_step] * (n_steps or 3)
    if isinstance(classes_per_step, int):
        classes_per_step = [classes_per_step] * len(rows_per_step)
    if len(rows_per_step) != len(classes_per_step):
        raise ValueError("rows_per_step and classes_per_step differ in length")
    rng = np.random.default_rng(seed)
    n_classes = int(sum(classes_per_step))
    base = 0.3 * rng.standard_normal(feature_dim)
    means = separation * rng.standard_normal((n_classes, feature_dim))
    tests: list[Block] = []
    first = 0
    for step, (n, c) in enumerate(
        zip(rows_per_step, classes_per_step, strict=True), start=1
    ):
        seen = first + c
        y = np.sort(rng.integers(first, seen, size=n)).astype(np.int64)
        attrs = ShardAttrs(step, seen, feature_dim, {"source": "synthetic"})
        draw = _Draw(rng, means, base, noise, missing_rate, dtype)
        train = draw.block(y, f"s{step:02d}-train")
        folder = Path(out_dir) / step_dir_name(step)
        write_train(folder / "train.h5", train, attrs)
        y_test = rng.integers(first, seen, size=test_rows).astype(np.int64)
        tests.append(draw.block(y_test, f"s{step:02d}-test"))
        blocks = _with_logits(rng, tests, step, seen) if bp_logits else tests
        write_test(folder / "test.h5", dict(enumerate(blocks, 1)), attrs)
        first = seen
    return Path(out_dir)


@dataclass(frozen=True)
class _Draw:
    """How a synthetic block's rows are drawn: class means around a shared
    base, Gaussian noise, a missing rate, the stored dtype."""

    rng: np.random.Generator
    means: np.ndarray
    base: np.ndarray
    noise: float
    missing_rate: float
    dtype: str

    def block(self, y: np.ndarray, prefix: str) -> Block:
        """Rows of labels `y` (features, then missing codes), ids `prefix-j`."""
        x = _rows(self.rng, self.means, self.base, y, self.noise, self.dtype)
        codes = _missing(self.rng, len(y), self.missing_rate)
        return Block(x, y, codes, [f"{prefix}-{j:06d}" for j in range(len(y))])


def _with_logits(
    rng: np.random.Generator, tests: list[Block], step: int, seen: int
) -> list[Block]:
    """The test blocks of tasks 1..step with BP logits (n, seen) float32 that
    favour the true class, less so for older tasks."""
    out = []
    for task, block in enumerate(tests, start=1):
        margin = 3.0 / (1 + step - task)  # older tasks: smaller margin
        n = len(block.labels)
        logits = rng.standard_normal((n, seen)).astype(np.float32)
        logits[np.arange(n), block.labels] += margin
        out.append(
            Block(block.features, block.labels, block.missing, block.sample_ids, logits)
        )
    return out
