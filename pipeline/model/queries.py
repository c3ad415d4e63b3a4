"""The file of frozen queries `pal frozen` writes, and its reader (DESIGN §5).

A sample's frozen, prompt-free pass (q_t at the text CLS, q_v at the image
CLS, `Backbone.queries`) depends only on its image, its text, the state it is
in and the backbone; `pal frozen` computes it once per dataset for each of the
three states (`palcore.codes.Missing`: complete, text missing, image missing)
and writes `data/frozen/queries.h5`:

    ids     (n,) UTF-8 strings, sorted: every sample the dataset lists
    pairs   (n, 3, 2, D) float32: [state, (q_t, q_v)] of each sample; NaN in
            the states a sample cannot take (its image is naturally absent:
            image missing only; its text is empty: text missing only)
    attrs   format_version, backbone, max_text_len, hidden_size, n_samples
            and sha256 (of ids and pairs: what a resumed run depends on)

`FrozenQueries.open` checks the file against the backbone that reads it;
`queries` gathers the pair of each sample's state in this run's missing table
(tune's `QueryCache.q`, extract's q_t, q_v) and `cache` also the copies' pairs.
`batch_queries` is the frozen pass itself, which `pal frozen` runs and, without
the file, tune (`network.build_cache`) and extract (`PalModel.features`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np
import torch

from palcore.codes import Missing
from palcore.errors import PalError
from palcore.outputs import atomic_path
from pipeline.data.samples import Sample
from pipeline.model.vision import batch_inputs

if TYPE_CHECKING:
    from pipeline.data.samples import Batch
    from pipeline.model.encoder import Backbone

FILE_NAME = "queries.h5"
FORMAT_VERSION = 1


@dataclass
class QueryCache:
    """Frozen queries of a dataset's samples (the backbone never changes).

    q: (n, 2, D) float32 — [q_t, q_v] of each sample as given (dummies for a
    missing modality); copies: (n, 2, D) — for complete samples, [q_t of the
    image-dropped copy, q_v of the text-dropped copy] (zeros elsewhere).
    """

    q: torch.Tensor
    copies: torch.Tensor


@torch.no_grad()
def batch_queries(
    backbone: Backbone, batch: Batch
) -> tuple[torch.Tensor, torch.Tensor]:
    """The frozen, prompt-free pass over all R rows of a batch (with its
    copies): (q_t, q_v), each (R, D) float32 (`Backbone.queries`)."""
    ids, am, px, pm = batch_inputs(batch, backbone.device)
    h, embedded = backbone.embed(ids, am, px, pm, batch.image_sizes)
    mask: torch.Tensor | None = embedded
    if backbone.no_masked_keys(batch.attention_mask, batch.image_sizes):
        mask = None  # attention without a mask: flash-eligible
    return backbone.queries(h, mask, ids.shape[1])


class FrozenError(PalError):
    """The frozen-queries file is missing, damaged or from another backbone."""


def queries_path(folder: str | Path) -> Path:
    """The file inside `pal frozen`'s output folder."""
    return Path(folder) / FILE_NAME


def open_frozen(
    folder: str | Path | None, backbone: str, max_text_len: int, D: int | None
) -> FrozenQueries | None:
    """`FrozenQueries.open` of the file in `pal frozen`'s `folder`; None for
    no folder (the frozen pass then runs where the queries are needed)."""
    if folder is None:
        return None
    return FrozenQueries.open(queries_path(folder), backbone, max_text_len, D)


def digest(ids: Sequence[str], pairs: np.ndarray) -> str:
    """sha256 of the ids (one per line) and the pairs' bytes."""
    h = hashlib.sha256("\n".join(ids).encode("utf-8"))
    h.update(np.ascontiguousarray(pairs, dtype=np.float32).tobytes())
    return h.hexdigest()


def write_queries(
    path: str | Path, ids: Sequence[str], pairs: np.ndarray, backbone: dict
) -> Path:
    """Write ids (n,) and pairs (n, 3, 2, D) float32 to `path` through a
    temporary name; `backbone`: model.backbone, max_text_len. No timestamps:
    same inputs, same bytes."""
    n, D = len(ids), pairs.shape[-1]
    assert pairs.shape == (n, len(Missing), 2, D) and pairs.dtype == np.float32
    path = Path(path)
    with atomic_path(path) as tmp, h5py.File(tmp, "w", track_order=True) as f:
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["backbone"] = str(backbone["backbone"])
        f.attrs["max_text_len"] = int(backbone["max_text_len"])
        f.attrs["hidden_size"] = int(D)
        f.attrs["n_samples"] = int(n)
        f.attrs["sha256"] = digest(ids, pairs)
        f.create_dataset("ids", data=list(ids), dtype=h5py.string_dtype("utf-8"))
        f.create_dataset("pairs", data=pairs)
    return path


class FrozenQueries:
    """The pairs of one `queries.h5`, held in memory ((n, 3, 2, D) float32:
    1.7 GB for Food101's 90.9k samples at D = 768)."""

    def __init__(self, path: Path, ids: list[str], pairs: np.ndarray, sha: str):
        self.path = path
        self.row = {sid: i for i, sid in enumerate(ids)}
        self.pairs = pairs
        self.sha256 = sha

    @classmethod
    def open(
        cls, path: str | Path, backbone: str, max_text_len: int, D: int | None
    ) -> FrozenQueries:
        """Read and check `path` against the backbone that will use it
        (`model.backbone`, `model.max_text_len`, hidden size D; None: not
        checked); `FrozenError` naming the file otherwise."""
        path = Path(path)
        if not path.is_file():
            raise FrozenError(f"{path}: not found (run `pal frozen`)")
        try:
            with h5py.File(path, "r") as f:
                attrs = dict(f.attrs)
                ids = [s.decode("utf-8") for s in f["ids"][()]]
                pairs = np.asarray(f["pairs"][()], dtype=np.float32)
        except (OSError, KeyError, ValueError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise FrozenError(
                f"{path}: not a readable frozen-queries file ({first}); rerun "
                "`pal frozen`"
            ) from None
        _check(path, attrs, ids, pairs, backbone, max_text_len, D)
        return cls(path, ids, pairs, str(attrs["sha256"]))

    def rows(self, samples: Sequence[Sample]) -> np.ndarray:
        """(n,) int64: each sample's row in the file."""
        try:
            return np.array([self.row[s.id] for s in samples], dtype=np.int64)
        except KeyError as exc:
            raise FrozenError(
                f"{self.path}: holds no sample {exc.args[0]!r} (made from other "
                "data; rerun `pal frozen`)"
            ) from None

    def queries(self, samples: Sequence[Sample]) -> np.ndarray:
        """(n, 2, D) float32: (q_t, q_v) of each sample in its state
        (`Sample.missing`)."""
        states = np.array([s.missing for s in samples], dtype=np.int64)
        q = self.pairs[self.rows(samples), states]
        bad = np.flatnonzero(np.isnan(q[:, 0, 0]))
        if len(bad):
            s = samples[int(bad[0])]
            raise FrozenError(
                f"{self.path}: sample {s.id!r} has no {Missing(s.missing).key} "
                "pair (a modality of it is naturally absent in the data the file "
                "was made from; rerun `pal frozen`)"
            )
        return q

    def cache(self, samples: Sequence[Sample], device: torch.device) -> QueryCache:
        """Tune's `QueryCache` of `samples`: q as `queries`; copies (n, 2, D)
        = (q_t of the image-missing state, q_v of the text-missing state) for
        the complete samples, zeros elsewhere."""
        q = self.queries(samples)
        copies = np.zeros_like(q)
        comp = np.array([s.missing == Missing.COMPLETE for s in samples], dtype=bool)
        rows = self.rows(samples)[comp]
        copies[comp, 0] = self.pairs[rows, Missing.IMAGE, 0]
        copies[comp, 1] = self.pairs[rows, Missing.TEXT, 1]
        return QueryCache(
            torch.from_numpy(q).to(device), torch.from_numpy(copies).to(device)
        )


def _check(
    path: Path,
    attrs: dict,
    ids: list[str],
    pairs: np.ndarray,
    backbone: str,
    max_text_len: int,
    D: int | None,
) -> None:
    """The file's layout, and that it was made by this backbone."""
    if attrs.get("format_version") != FORMAT_VERSION:
        raise FrozenError(
            f"{path}: format_version {attrs.get('format_version')!r}, expected "
            f"{FORMAT_VERSION}; rerun `pal frozen`"
        )
    if pairs.shape != (len(ids), len(Missing), 2, pairs.shape[-1]):
        raise FrozenError(
            f"{path}: pairs {pairs.shape} do not match {len(ids)} ids "
            f"(expected ({len(ids)}, 3, 2, D))"
        )
    made = (str(attrs.get("backbone")), int(attrs.get("max_text_len", -1)))
    D = pairs.shape[-1] if D is None else D
    if made != (str(backbone), int(max_text_len)) or pairs.shape[-1] != D:
        raise FrozenError(
            f"{path}: made with model.backbone {made[0]!r} (max_text_len "
            f"{made[1]}, hidden {pairs.shape[-1]}), but this run uses "
            f"{backbone!r} ({max_text_len}, hidden {D}); rerun `pal frozen`"
        )
    if digest(ids, pairs) != attrs.get("sha256"):
        raise FrozenError(
            f"{path}: its ids and pairs do not match its sha256 (damaged); rerun "
            "`pal frozen`"
        )
