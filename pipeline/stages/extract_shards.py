"""One step's shards for `pal extract`: which rows a rank embeds, the blocks
it writes, and the reuse of the previous step's test features.

Task k's training samples, then the test samples of tasks 1..k, are embedded
as one list in batches of `extract.batch_size`; rank r of `world` takes the
r-th contiguous share of whole batches, so every row lands in the batch (and
the patch-order seed) it has in a one-process run. A model without prompts
embeds a sample the same at every step, so with one process and float32
shards only the new task's samples need the backbone (`reusable`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from palcore.outputs import step_dir_name
from pipeline import params as pparams
from pipeline.data.samples import Batch, Sample, Tasks, label_sets, multi_hot, select
from pipeline.model.device import autocast
from pipeline.model.embed import embed_samples
from pipeline.model.network import PalModel
from pipeline.model.queries import FrozenQueries
from solver.shard_readers import open_step
from solver.shards import Block, ShardAttrs, write_test, write_train

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExtractRun:
    """What every step of one `pal extract` run shares."""

    samples: list[Sample]  # prepare's samples, every task and split
    tasks: Tasks
    params: pparams.ExtractParams
    partial: Path  # the run's folder of finished steps (`PartialRun.path`)
    names: tuple[str, str]  # this rank's shard files (train, test)
    rank: int = 0  # this process's rank among `world` (torchrun)
    world: int = 1
    frozen: FrozenQueries | None = None  # `pal frozen`'s queries; None: computed


def rank_range(n: int, batch_size: int, rank: int, world: int) -> tuple[int, int]:
    """Rank `rank`'s rows [lo, hi) of n: whole batches of `batch_size`, so every
    row lands in the batch (and the patch-order seed) it has in a one-process
    run, and the parts hold the same bytes as one shard."""
    n_batches = -(-n // batch_size)
    lo = rank * n_batches // world * batch_size
    hi = min((rank + 1) * n_batches // world * batch_size, n)
    return lo, hi


def reusable(
    run: ExtractRun, ckpt: dict, step: int, coming: bool = False
) -> Path | None:
    """The previous step's folder when its test features can be reused: a
    model without prompts embeds a sample the same at every step (only its
    BP head grows), so only the new task's samples need the backbone. With
    one process and float32 shards, the stored features are the exact ones.
    `coming`: the previous step is written earlier in this run (its files
    need not exist yet)."""
    prev = run.partial / step_dir_name(step - 1)
    if (
        step == 1
        or ckpt["params"]["prompt"]["enabled"]
        or run.world != 1
        or run.params.dtype != "float32"
        or not (coming or all((prev / name).is_file() for name in run.names))
    ):
        return None
    return prev


def extract_step(
    model: PalModel,
    step: int,
    run: ExtractRun,
    provenance: dict,
    reuse: Path | None = None,
    batches: Iterable[Batch] | None = None,
) -> None:
    """Embed and write one step's shards into its folder of `run.partial`.
    Task `step`'s training samples, then the test samples of tasks 1..step,
    are embedded as one list in batches; this rank takes whole batches of it.
    With `reuse` (a model without prompts, one process), only task `step`'s
    test samples are embedded: the earlier tasks' test features come from
    that step folder. `run.frozen`: the stored frozen queries (`pal frozen`),
    in place of the frozen pass. `batches`: this rank's batches of those
    samples from a loader shared by the steps (`embed.StepLoader`); None: a
    loader of their own."""
    params, frozen = run.params, run.frozen
    blocks = step_blocks(step, run.samples, reuse)
    every, lo, hi = step_rows(blocks, params.batch_size, run.rank, run.world)
    x, logits = embed_samples(
        model,
        every[lo:hi],
        run.tasks.root,
        params,
        f"step {step}",
        first_batch=lo // params.batch_size,
        queries=None if frozen is None else frozen.queries(every[lo:hi]),
        batches=batches,
    )
    x = x.astype(params.dtype)
    parts, start = [], 0
    for i, block in enumerate(blocks):
        a = max(start, lo)
        b = max(a, min(start + len(block), hi))  # a == b: the ranges do not meet
        rows = slice(a - lo, b - lo)
        part = every[a:b]
        parts.append(_block(part, x[rows], logits[rows] if i else None, run, step))
        start += len(block)
    if reuse is not None:
        parts[1:1] = _reused_tests(model, reuse, step)
        log.info(
            "step %d: reused the test features of tasks 1-%d from %s",
            step,
            step - 1,
            reuse.name,
        )
    _write_step(step, run, provenance, parts, x.shape[1])


def step_plan(
    run: ExtractRun, todo: list[int], ckpts: dict[int, dict]
) -> tuple[dict[int, Path | None], list[list[Sample]]]:
    """For the steps `todo` (in order), before the first runs: each one's
    `reuse` folder (`reusable`; a previous step in `todo` will be written by
    then) and the rows this rank embeds at each, for one loader over all."""
    reuse = {s: reusable(run, ckpts[s], s, coming=s - 1 in todo) for s in todo}
    parts = []
    for s in todo:
        blocks = step_blocks(s, run.samples, reuse[s])
        every, lo, hi = step_rows(blocks, run.params.batch_size, run.rank, run.world)
        parts.append(every[lo:hi])
    return reuse, parts


def step_blocks(
    step: int, samples: list[Sample], reuse: Path | None
) -> list[list[Sample]]:
    """The samples step `step` embeds, as blocks: task `step`'s training
    samples, then each task's test samples (only task `step`'s with `reuse`)."""
    train = select(samples, "train", [step])
    first = step if reuse is not None else 1
    return [train] + [select(samples, "test", [t]) for t in range(first, step + 1)]


def step_rows(
    blocks: list[list[Sample]], batch_size: int, rank: int, world: int
) -> tuple[list[Sample], int, int]:
    """(the blocks' samples as one list, this rank's rows [lo, hi) of it)."""
    every = [s for block in blocks for s in block]
    return every, *rank_range(len(every), batch_size, rank, world)


def _reused_tests(model: PalModel, prev: Path, step: int) -> list[Block]:
    """Tasks 1..step-1's test blocks of step folder `prev`: their features as
    stored, scored by this step's BP head."""
    old = open_step(prev, step - 1)
    device = model.backbone.device
    blocks = []
    for task in range(1, step):
        reader = old.test[task]
        feats, labels, missing, _ = reader.read_all()
        with torch.inference_mode(), autocast(device):
            head = model.head(torch.from_numpy(feats).to(device)).float()
        blocks.append(
            Block(
                features=feats,
                labels=labels,
                missing=missing,
                sample_ids=reader.sample_ids(),
                bp_logits=np.ascontiguousarray(head.cpu().numpy()),
                targets=_widened(reader.targets(), head.shape[1]),
            )
        )
    return blocks


def _widened(targets: np.ndarray | None, columns: int) -> np.ndarray | None:
    """A previous step's multi-hot targets with zero columns up to `columns`
    (the classes seen now: an old sample holds none of the new task's)."""
    if targets is None:
        return None
    out = np.zeros((len(targets), columns), dtype=np.uint8)
    out[:, : targets.shape[1]] = targets
    return out


def _block(
    part: list[Sample],
    x: np.ndarray,
    logits: np.ndarray | None,
    run: ExtractRun,
    step: int,
) -> Block:
    """The block of `part`'s rows; on a multi-label prepare with its
    multi-hot targets over the classes seen at `step` (`Sample.targets`)."""
    tasks = run.tasks
    targets = None
    if tasks.label_width:
        sets = label_sets(part, tasks.label_width, tasks)
        targets = multi_hot(sets, tasks.end(step))
    return Block(
        features=np.ascontiguousarray(x),
        labels=np.array([s.label for s in part], dtype=np.int64),
        missing=np.array([s.missing for s in part], dtype=np.int8),
        sample_ids=[s.id for s in part],
        bp_logits=None if logits is None else np.ascontiguousarray(logits),
        targets=targets,
    )


def _write_step(
    step: int, run: ExtractRun, provenance: dict, parts: list[Block], feature_dim: int
) -> None:
    folder, names = run.partial / step_dir_name(step), run.names
    classes_seen = sum(run.tasks.classes_per_task[:step])
    attrs = ShardAttrs(
        step=step,
        classes_seen=classes_seen,
        feature_dim=feature_dim,
        provenance=provenance,
    )
    write_train(folder / names[0], parts[0], attrs)
    write_test(folder / names[1], dict(enumerate(parts[1:], start=1)), attrs)
    log.info(
        "%s: %d train, %d test samples (classes seen %d)",
        folder,
        len(parts[0].labels),
        sum(len(p.labels) for p in parts[1:]),
        classes_seen,
    )
