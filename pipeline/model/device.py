"""Where the model computes: the one resolution of `tune.device`,
`extract.device` (`palcore.params.DEVICES`), and the autocast that goes with it.

On CUDA the frozen backbone is stored in bf16 and runs under bf16 autocast;
on the CPU everything stays float32 (`encoder.Backbone.place`).
"""

from __future__ import annotations

import contextlib

import torch

from palcore.errors import PalError


def auto_device(name: str) -> str:
    """`name` with `auto` resolved: cuda when torch sees a GPU, else cpu."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


def resolve_device(name: str, key: str) -> torch.device:
    """`auto` → cuda when available, else cpu; `cuda` without a GPU is an error
    naming `key` (e.g. `tune.device`)."""
    name = auto_device(name)
    if name == "cuda" and not torch.cuda.is_available():
        raise PalError(
            f"{key} is 'cuda' but torch sees no CUDA GPU here; for a CPU run set "
            "tune.device and extract.device to cpu (or auto), see the README's "
            "CPU smoke run"
        )
    return torch.device(name)


def autocast(device: torch.device, cache_enabled: bool = True):
    """bf16 autocast on CUDA, a no-op (float32) on the CPU. A CUDA-graph
    capture needs `cache_enabled=False`."""
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=cache_enabled)
    return contextlib.nullcontext()
