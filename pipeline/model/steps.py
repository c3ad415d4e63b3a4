"""One optimiser step per batch, as `pal tune` runs it (`make_step`).

Eagerly (`loss` on the batch the loader made, its copies included: the CPU's
form) or static (`static_inputs` and `static_loss`: shapes fixed by the
batch's, copies spliced on the device), the static step replayed as a CUDA
graph per batch shape on a GPU (`pipeline.model.graphs.GraphedSteps`).
`tune.clip_norm` clips the gradients in either form.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from pipeline.data.samples import Batch
from pipeline.model.device import autocast
from pipeline.model.graphs import GraphedSteps
from pipeline.model.losses import (
    DummySegments,
    Parts,
    loss,
    static_inputs,
    static_loss,
)
from pipeline.model.network import PalModel, QueryCache


@dataclass
class Stepper:
    """One optimiser step per batch: `step(batch)` → its parts. `graphs`: the
    CUDA graphs it replays (their counts for the log), None without."""

    run: Callable[[Batch], Parts]
    graphs: GraphedSteps | None = None

    def __call__(self, batch: Batch) -> Parts:
        return self.run(batch)


def _eager_step(
    model: PalModel,
    optimiser: torch.optim.Optimizer,
    cache: QueryCache,
    task: int,
    recon_weight: float,
    clip_norm: float | None,
) -> Stepper:
    """`make_step`'s eager form: `loss` on the batch as the loader made it."""
    device = model.backbone.device
    params = [p for g in optimiser.param_groups for p in g["params"]]

    def eager(batch: Batch) -> Parts:
        with autocast(device):
            value, parts = loss(model, batch, cache, task, recon_weight)
        optimiser.zero_grad(set_to_none=True)
        value.backward()
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        optimiser.step()
        return parts

    return Stepper(eager)


def make_step(
    model: PalModel,
    optimiser: torch.optim.Optimizer,
    cache: QueryCache,
    task: int,
    recon_weight: float,
    static: bool = False,
    dummy: DummySegments | None = None,
    graphs: bool = False,
    clip_norm: float | None = None,
) -> Stepper:
    """One optimiser step per batch.

    static=False: `loss` on the batch as the loader made it (with copies).
    static=True: `static_loss`; the loader must not add copies, they are
    spliced from `dummy` (None: no reconstruction loss), and a short last
    batch is padded to a full one with rows labelled −1, which count for
    nothing. graphs=True (CUDA): each static step is replayed as a CUDA graph
    per batch shape (`GraphedSteps`). clip_norm (`tune.clip_norm`): the
    gradient of every trained tensor is clipped to that global norm before
    the optimiser steps, in either form.
    """
    if not static:
        return _eager_step(model, optimiser, cache, task, recon_weight, clip_norm)
    return _static_step(
        model, optimiser, cache, task, recon_weight, dummy, graphs, clip_norm
    )


def _static_step(
    model: PalModel,
    optimiser: torch.optim.Optimizer,
    cache: QueryCache,
    task: int,
    recon_weight: float,
    dummy: DummySegments | None,
    graphs: bool,
    clip_norm: float | None,
) -> Stepper:
    """`make_step`'s static form: fixed-shape inputs per batch, replayed as
    CUDA graphs when `graphs`."""
    device = model.backbone.device
    params = [p for g in optimiser.param_groups for p in g["params"]]

    def step(inputs: Mapping[str, torch.Tensor]) -> Parts:
        with autocast(device, cache_enabled=False):
            value, parts = static_loss(model, inputs, cache, dummy, task, recon_weight)
        value.backward()
        if clip_norm is not None:  # the norm stays on the device: no sync
            torch.nn.utils.clip_grad_norm_(
                params, clip_norm, error_if_nonfinite=False, foreach=True
            )
        optimiser.step()
        return parts

    def unrecorded(inputs: Mapping[str, torch.Tensor]) -> Parts:
        optimiser.zero_grad(set_to_none=True)
        return step(inputs)

    graphed = GraphedSteps(step, optimiser) if graphs else None
    replay: Callable[[Mapping[str, torch.Tensor]], Parts] = (
        graphed if graphed is not None else unrecorded
    )
    rows = None
    # room for the dummy image's tokens in the copies of a batch of wide photos
    min_image_tokens = dummy.image.shape[0] if dummy is not None else 0

    def run(batch: Batch) -> Parts:
        nonlocal rows
        rows = rows or batch.n  # the first batch is a full one
        with autocast(device):
            inputs = static_inputs(model, batch, rows, min_image_tokens)
        return replay(inputs)

    return Stepper(run, graphed)
