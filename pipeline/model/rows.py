"""The token rows an encode's caller reads (`Backbone.encode(read=...)`):
positions as runs of consecutive rows, taken by slices only, so a CUDA graph
can capture them (no index tensor from the host)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

Read = Sequence[int] | slice  # token positions an encode's caller reads


def read_ranges(read: Read, n: int, offset: int = 0) -> list[tuple[int, int]]:
    """The positions `read` of an output of n tokens as runs [start, stop) of
    consecutive positions, in read's order, shifted by `offset` (the tokens
    in front of the output). Raises IndexError for a position outside it and
    ValueError for a slice with a step other than 1."""
    if isinstance(read, slice):
        start, stop, step = read.indices(n)
        if step != 1:
            raise ValueError(f"read {read}: slices of step 1 only")
        return [(start + offset, max(start, stop) + offset)]
    runs: list[tuple[int, int]] = []
    for p in read:
        q = int(p) + n if int(p) < 0 else int(p)
        if not 0 <= q < n:
            raise IndexError(f"read position {p} outside an output of {n} tokens")
        if runs and runs[-1][1] == q + offset:
            runs[-1] = (runs[-1][0], q + offset + 1)
        else:
            runs.append((q + offset, q + offset + 1))
    return runs or [(offset, offset)]


def take_rows(t: torch.Tensor, runs: list[tuple[int, int]]) -> torch.Tensor:
    """The rows `runs` (`read_ranges`) of t (B, N, ...) along dim 1: slices
    only (graph-safe: no index tensor from the host)."""
    parts = [t[:, a:b] for a, b in runs]
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)
