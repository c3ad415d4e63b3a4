"""The missing-modality code of a sample: part of the shard contract (DESIGN §3).

Shards store it as `missing` (n,) int8; samples.jsonl as `missing`. It lives
apart from the HDF5 code of `solver.shards` so that the pipeline's data layer
can share it without importing the shard reader.
"""

from __future__ import annotations

from enum import IntEnum


class Missing(IntEnum):
    """0 complete, 1 text missing, 2 image missing; no sample lacks both."""

    COMPLETE = 0
    TEXT = 1
    IMAGE = 2

    @property
    def key(self) -> str:
        """The name used in metrics: complete, text_missing, image_missing."""
        return (
            "complete" if self is Missing.COMPLETE else f"{self.name.lower()}_missing"
        )
