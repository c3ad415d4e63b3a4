"""Training steps replayed as CUDA graphs.

A prompt-tuning step at batch 4 runs about 1300 small kernels; launching them
from Python takes several times longer than the GPU needs to run them. With
`GraphedSteps`, the whole step (forward, backward, optimiser update) is
captured once per input shape and then replayed with one launch.

The step function must have static shapes for static input shapes and no host
synchronisation (see `pipeline.model.network.static_loss`), and the optimiser must be
`capturable` with tensor learning rates (`capturable_adamw`). Before each
capture the step runs twice eagerly on a side stream (CUDA's lazy
initialisation must not happen during capture); the parameters and optimiser
state are restored afterwards, so warm-up leaves training unchanged.
"""

from __future__ import annotations

import logging
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from palcore.errors import PalError

log = logging.getLogger(__name__)


class GraphCaptureError(PalError):
    """A training step could not be captured as a CUDA graph."""


StepFn = Callable[[Mapping[str, torch.Tensor]], dict[str, torch.Tensor]]


def capturable_adamw(
    groups: list[dict], device: torch.device, **kwargs
) -> torch.optim.AdamW:
    """A fused AdamW that a CUDA graph can capture: each group's `lr` becomes
    a device tensor (set it with `set_lr`)."""
    groups = [{**g, "lr": torch.tensor(float(g["lr"]), device=device)} for g in groups]
    return torch.optim.AdamW(groups, fused=True, capturable=True, **kwargs)


def set_lr(optimiser: torch.optim.Optimizer, lrs: list[float]) -> None:
    """Set each param group's learning rate, in place for tensor rates (so a
    captured graph sees the new value)."""
    for group, lr in zip(optimiser.param_groups, lrs, strict=True):
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


class GraphedSteps:
    """Run `step(inputs)` (forward, backward and `optimiser.step()` of one
    batch; returns detached tensors) as a CUDA graph per distinct set of input
    shapes, eagerly once `max_graphs` graphs exist. A Food101-like task has
    up to 12 image-token counts (bench/batch_shapes.py at 4d75434) times up to 5 text
    buckets (`losses.text_bucket`, 8 … 40 tokens): 64 graphs hold them all.

    Each graph owns its gradient buffers: gradients are set to None before
    every capture and every eager step, so graphs never accumulate into one
    another's.

    The graphs share one memory pool, so 64 of them cost about the memory of
    the largest, not of all (in private pools, about 0.3 GiB each at
    ViLT-B/32's sizes). That is safe because a step keeps nothing in the pool
    from one replay to the next: its inputs are copied into buffers made
    outside the capture, the optimiser's state is made by the warm-up before
    it, gradients are written (not accumulated) in every replay, and its
    outputs stay allocated (the graph holds them). Only what a capture freed,
    a step's transient memory, may be another graph's; two graphs never
    replay at once (tests/test_static_step.py interleaves two graphs and
    eager steps on a GPU).
    """

    def __init__(
        self,
        step: StepFn,
        optimiser: torch.optim.Optimizer,
        max_graphs: int = 64,
    ):
        self.step = step
        self.optimiser = optimiser
        self.max_graphs = max_graphs
        self.graphs: dict[tuple, _Graph] = {}
        self.eager_steps = 0
        self.capture_seconds = 0.0  # warm-ups and captures, GPU work included
        # the graphs' one memory pool, made at the first capture
        self.pool: torch.cuda._POOL_HANDLE | None = None

    def __call__(self, inputs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        key = tuple(
            (name, tuple(t.shape), t.dtype) for name, t in sorted(inputs.items())
        )
        g = self.graphs.get(key)
        if g is None:
            if len(self.graphs) >= self.max_graphs:
                self.eager_steps += 1
                self.optimiser.zero_grad(set_to_none=True)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    return self.step(inputs)
            start = time.perf_counter()
            try:
                g = self._capture(inputs)
                torch.cuda.synchronize()
            except RuntimeError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                raise GraphCaptureError(
                    f"CUDA graph capture of the training step failed ({first}); "
                    "set tune.cuda_graphs: false to train without graphs"
                ) from None
            self.graphs[key] = g
            self.capture_seconds += time.perf_counter() - start
        for name, t in inputs.items():
            g.inputs[name].copy_(t, non_blocking=True)
        g.graph.replay()
        return g.outputs

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.optimiser.param_groups for p in group["params"]]

    def _capture(self, inputs: Mapping[str, torch.Tensor]) -> _Graph:
        torch.cuda.synchronize()  # the steps before it are not the capture's
        static = {name: t.clone() for name, t in inputs.items()}
        params = self._params()
        saved = [p.detach().clone() for p in params]
        state = {
            p: {k: v.clone() for k, v in self.optimiser.state[p].items()}
            for p in params
            if p in self.optimiser.state
        }
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        # (a capturable optimiser warns when it steps outside a capture)
        with torch.cuda.stream(side), warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            for _ in range(2):
                self.optimiser.zero_grad(set_to_none=True)
                self.step(static)
        torch.cuda.current_stream().wait_stream(side)
        with torch.no_grad():  # undo the warm-up's updates
            for p, s in zip(params, saved, strict=True):
                p.copy_(s)
            for p, values in self.optimiser.state.items():
                for k, v in values.items():
                    if p in state:
                        v.copy_(state[p][k])
                    else:
                        v.zero_()  # AdamW's initial state: zero moments, step 0
        self.optimiser.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        # thread_local: the loader's pin-memory thread allocates pinned host
        # memory while this thread captures; in the default (global) mode
        # that call invalidates the capture (seen at task 2 with 8 workers)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            outputs = self.step(static)
        log.debug(
            "captured a training step for %s",
            {k: tuple(v.shape) for k, v in inputs.items()},
        )
        return _Graph(graph, static, outputs)
