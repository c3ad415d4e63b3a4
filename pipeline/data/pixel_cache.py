"""The pixel cache: every listed image decoded and resized once, as the loader
makes it, so tune and extract read bytes instead of decoding (DESIGN §5).

`data/pixels/pixels.h5` (written by `pal pixels`, `pipeline.stages.pixels`):

    pixels   (N,) uint8, flat: image i's (3, h, w) bytes, C order, at
             offsets[i]:offsets[i + 1]; chunked with Fletcher-32 checksums, so
             a damaged chunk fails to read instead of giving other pixels
    offsets  (n + 1,) int64
    sizes    (n, 2) int32: (h, w) of image i
    paths    (n,) str: image i's path relative to `data.root`, sorted
    attrs    format_version; processor: JSON of the resize settings the bytes
             were made with (`processor_key`), checked by every reader

Only images that decode are stored; one that does not is what `pal prepare`
makes of it (a sample with the image missing, `pipeline.data.absent`), and a
loader asked for it says so. With `pixels.enabled: false` the folder holds
only the marker `OFF_MARKER` and the loader decodes as before.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import h5py
import numpy as np

from palcore.errors import PalError
from palcore.outputs import atomic_path, exits_when_full, free_bytes
from palcore.progress import tqdm
from palcore.recorded import check_content
from pipeline.data import images

log = logging.getLogger(__name__)

FILE = "pixels.h5"
OFF_MARKER = "off"  # an empty file: the cache is turned off
FORMAT_VERSION = 1
# bytes per HDF5 chunk of `pixels`: a ~0.5 MB photo reads at most 0.5 MB more
CHUNK = 1 << 18
_STR = h5py.string_dtype("utf-8")


class PixelCacheError(PalError):
    """The pixel cache is missing, damaged, or made for other settings."""


def processor_key(image_processor, image_side: int, draft: bool = True) -> dict:
    """The settings a resized image's bytes depend on: ViLT's resize (shorter
    side, divisor, resampling filter), the dummy image's side (which the JPEG
    draft scale follows) and whether draft decoding is on."""
    ip = image_processor
    return {
        "do_resize": bool(ip.do_resize),
        "shortest_edge": int(ip.size.shortest_edge) if ip.do_resize else None,
        "size_divisor": int(ip.size_divisor or 1) if ip.do_resize else None,
        "resample": int(ip.resample) if ip.do_resize else None,
        "image_side": int(image_side),
        "draft": bool(draft),
    }


# (image processor, dummy image side) of a decoding worker process, set by
# `_init_worker` when the process starts
_WORKER: tuple[object, int]


def _init_worker(ip, image_side: int) -> None:
    global _WORKER
    _WORKER = (ip, image_side)


def _decode_in_worker(path: Path) -> np.ndarray | None:
    return _decode(path, *_WORKER)


def _decode(path: Path, ip, image_side: int) -> np.ndarray | None:
    """(3, h, w) uint8 as the loader makes it, or None when it does not decode."""
    try:
        x = images.decode_resized(path, ip, image_side)
    except Exception:  # OSError, ValueError, DecompressionBombError…
        return None
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def _decoded(
    root: Path, rels: list[str], ip, image_side: int, workers: int
) -> Iterator[np.ndarray | None]:
    """Each image of `rels` decoded, in order; in `workers` processes (1: here)."""
    paths = [root / rel for rel in rels]
    if workers <= 1:
        yield from (_decode(p, ip, image_side) for p in paths)
        return
    with ProcessPoolExecutor(
        workers, initializer=_init_worker, initargs=(ip, image_side)
    ) as pool:
        yield from pool.map(_decode_in_worker, paths, chunksize=16)


def write_cache(
    path: Path, root: Path, rels: list[str], ip, image_side: int, workers: int = 1
) -> list[str]:
    """Decode every image of `rels` (paths under `root`) once and write the
    cache to `path` (a temporary name, then renamed); returns the images that
    did not decode (not stored). The same images and processor give the same
    bytes whatever `workers`. A full disk ends the process with one line
    (`palcore.outputs.exits_when_full`), the temporary file removed."""
    rels = sorted(set(rels))
    written = _Written(len(rels))
    free = free_bytes(Path(path).parent)
    key = json.dumps(processor_key(ip, image_side), sort_keys=True)
    with atomic_path(Path(path)) as tmp, h5py.File(tmp, "w", track_order=True) as f:
        with exits_when_full(Path(path), tmp, written.needed, free):
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["processor"] = key
            flat = f.create_dataset(
                "pixels",
                shape=(0,),
                maxshape=(None,),
                dtype=np.uint8,
                chunks=(CHUNK,),
                fletcher32=True,
            )
            images = _decoded(Path(root), rels, ip, image_side, workers)
            bar = tqdm(
                images,
                total=len(rels),
                desc="pixels",
                unit="image",
                disable=None,
                leave=False,
            )
            for rel, x in zip(rels, bar, strict=True):
                written.add(flat, rel, x)
            written.write_index(f)
            f.flush()
    return written.bad


@dataclasses.dataclass
class _Written:
    """What `write_cache` has stored so far: the images in order, the ones
    that did not decode, each stored image's (h, w) and its end in the flat
    `pixels` dataset (`offsets`, from 0)."""

    n: int  # images to write in all
    kept: list[str] = dataclasses.field(default_factory=list)
    bad: list[str] = dataclasses.field(default_factory=list)
    sizes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    offsets: list[int] = dataclasses.field(default_factory=lambda: [0])
    trying: int = 0  # the size of the image being written

    def needed(self) -> int:
        """The bytes so far, scaled to every image (`exits_when_full`)."""
        done = len(self.kept) + len(self.bad) + 1  # with the image it was writing
        return int((self.offsets[-1] + self.trying) * self.n / done)

    def add(self, flat: h5py.Dataset, rel: str, x: np.ndarray | None) -> None:
        """Append image `rel`'s pixels `x` (None: it did not decode)."""
        if x is None:
            self.bad.append(rel)
            return
        end = self.offsets[-1] + x.size
        self.trying = x.size
        flat.resize((end,))
        flat[self.offsets[-1] : end] = x.reshape(-1)
        self.kept.append(rel)
        self.sizes.append(x.shape[1:])
        self.offsets.append(end)

    def write_index(self, f: h5py.File) -> None:
        """The index a reader finds an image by: offsets, sizes, paths."""
        f.create_dataset("offsets", data=np.asarray(self.offsets, np.int64))
        sizes = np.asarray(self.sizes, np.int32).reshape(-1, 2)
        f.create_dataset("sizes", data=sizes)
        paths = np.asarray(self.kept, dtype=object)
        f.create_dataset("paths", data=paths, dtype=_STR)


def open_pixels(folder: str | Path | None) -> PixelCache | None:
    """The cache in `folder` (written by `pal pixels`), its index read once
    to fail early on a damaged file; None for no folder or for a cache turned
    off (`OFF_MARKER`), where the loader decodes."""
    if folder is None:
        return None
    folder = Path(folder)
    if (folder / FILE).is_file():
        check_content(folder / FILE)  # the whole file, names too, as DVC recorded it
        cache = PixelCache(folder / FILE)
        cache._open()
        cache.close()
        return cache
    if (folder / OFF_MARKER).is_file():
        return None
    raise PixelCacheError(f"{folder}: holds no {FILE} (run `pal pixels` first)")


class PixelCache:
    """Reads images from a cache file. The HDF5 file is opened lazily, once
    per process: each DataLoader worker opens its own handle on its first
    read (an h5py handle does not survive a fork)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._file: h5py.File | None = None
        self._pid = -1
        self._index: dict[str, int] = {}
        # set by `_open`: the pixels (an HDF5 dataset) and their index
        self._flat: h5py.Dataset | None = None
        self._offsets: np.ndarray | None = None
        self._sizes: np.ndarray | None = None

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        PixelCache.__init__(self, state["path"])

    def check(self, image_processor, image_side: int, draft: bool = True) -> None:
        """Raise `PixelCacheError` unless the cache holds bytes made with
        these processor settings (and is readable). Closes the file again:
        worker processes forked afterwards open their own."""
        made = json.loads(self._open().attrs["processor"])
        self.close()
        want = processor_key(image_processor, image_side, draft)
        if made != want:
            diff = ", ".join(
                f"{k} {made.get(k)} (now {want[k]})"
                for k in want
                if made.get(k) != want[k]
            )
            raise PixelCacheError(
                f"{self.path}: made for other processor settings ({diff}); "
                "rerun `pal pixels`"
            )

    def read(self, image: str) -> np.ndarray:
        """(3, h, w) uint8 of `image` (its path relative to `data.root`)."""
        self._open()
        flat, offsets, sizes = self._flat, self._offsets, self._sizes
        # _open has read them (or raised)
        assert flat is not None and offsets is not None and sizes is not None
        i = self._index.get(image)
        if i is None:
            raise self._missing(image)
        lo, hi = int(offsets[i]), int(offsets[i + 1])
        h, w = (int(v) for v in sizes[i])
        try:
            x = flat[lo:hi]
        except OSError as exc:
            raise self._damaged(exc) from None
        return x.reshape(3, h, w)

    def _open(self) -> h5py.File:
        if self._file is not None and self._pid == os.getpid():
            return self._file
        try:
            f = h5py.File(self.path, "r")
            flat, offsets, sizes = f["pixels"], f["offsets"][:], f["sizes"][:]
            paths = f["paths"].asstr()[:]
            version = f.attrs["format_version"]
        except (OSError, KeyError, UnicodeDecodeError) as exc:
            raise self._damaged(exc) from None
        n = len(paths)
        if n and not (paths[1:] > paths[:-1]).all():  # written sorted, unique
            f.close()
            raise self._damaged(ValueError("its image names are not sorted and unique"))
        if (
            version != FORMAT_VERSION
            or offsets.shape != (n + 1,)
            or sizes.shape != (n, 2)
            or offsets[-1] != flat.shape[0]
            or np.any(np.diff(offsets) != 3 * sizes.prod(1))
        ):
            f.close()
            raise self._damaged(ValueError("its index does not match its pixels"))
        self._file, self._pid = f, os.getpid()
        self._flat, self._offsets, self._sizes = flat, offsets, sizes
        self._index = {p: i for i, p in enumerate(paths)}
        return f

    def _missing(self, image: str) -> PixelCacheError:
        """Why `image` is not in the cache. The names lie outside the pixels'
        checksums: a name one byte away from `image` is `image`'s own name,
        damaged (a bit flip that kept the names' order), not an image that
        failed to decode."""
        want = image.encode()
        for name in self._index:
            got = name.encode()
            if len(got) == len(want):
                if sum(a != b for a, b in zip(got, want, strict=True)) == 1:
                    why = f"image name {image} reads {name}"
                    return self._damaged(ValueError(why))
        return PixelCacheError(
            f"{self.path}: holds no pixels of {image} (it did not decode when "
            "`pal pixels` ran, or the cache is of other data)"
        )

    def close(self) -> None:
        """Close this process's handle (reopened by the next read)."""
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file, self._pid = None, -1

    def _damaged(self, exc: Exception) -> PixelCacheError:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return PixelCacheError(
            f"{self.path}: not a readable pixel cache ({reason}); rerun `pal pixels`"
        )
