"""The optimiser of a task's tuning and its learning-rate schedule (DESIGN §5):
AdamW (betas 0.9 / `tune.beta2`) over the head rows and the prompt slices
being trained, linear warm-up then cosine decay or a constant lr."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch

from pipeline import params as pparams
from pipeline.model.graphs import capturable_adamw

if TYPE_CHECKING:
    from pipeline.model.network import PalModel

BETA1 = 0.9


def lr_factor(step: int, total: int, warmup: int, decay: str = "cosine") -> float:
    """Linear warm-up over `warmup` steps, then cosine decay to 0 at `total`
    (`decay` "none": the full lr to the end)."""
    if step < warmup:
        return (step + 1) / (warmup + 1)
    if decay == "none":
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def optimiser_for(
    model: PalModel, tune_p: pparams.TuneParams, capturable: bool
) -> tuple[torch.optim.Optimizer, list[float]]:
    """AdamW over the head rows (`tune.head_lr`) and prompt slices (`tune.lr`)
    being trained; returns it and the groups' base learning rates."""
    device = model.backbone.device
    head = [p for p in model.head.parameters() if p.requires_grad]
    prompts = [p for p in model.trainable_parameters() if all(p is not h for h in head)]
    # torch's param groups: a dict of parameters and per-group options
    groups: list[dict[str, Any]] = [{"params": head, "lr": tune_p.head_lr or tune_p.lr}]
    if prompts:
        groups.append({"params": prompts, "lr": tune_p.lr})
    base_lrs: list[float] = [g["lr"] for g in groups]
    betas, decay = (BETA1, tune_p.beta2), tune_p.weight_decay
    if capturable:
        optimiser = capturable_adamw(groups, device, betas=betas, weight_decay=decay)
        return optimiser, base_lrs
    # fused: one kernel for all parameters
    fused = device.type == "cuda"
    optimiser = torch.optim.AdamW(groups, fused=fused, betas=betas, weight_decay=decay)
    return optimiser, base_lrs
