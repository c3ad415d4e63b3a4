"""Decode once: what each way of storing Food101's photos costs per image on
one CPU core, and on disk for the 83.8k photos a run uses.

    .venv/bin/python bench/decode_options.py             # 48 photos, ~30 s

Photos: the photo mix's Food101 shapes (pipeline/fakes/trees.py, JPEG quality 90),
brought to ViLT-B/32's processor size (shorter side 384, longer ≤ 640) as
uint8, which is what the loader ships (`images.vilt_uint8`). Options, each
timed from the file to that uint8 array:

- jpeg: today's path, the original JPEG decoded (draft scaling) and resized;
- raw: a prepared cache of the resized uint8 pixels (bit-exact), read back
  from memory (a file in the page cache; from disk it is bound by the disk:
  0.57 MB an image is ≈ 900 images/s at 500 MB/s, ≈ 5,000 at 3 GB/s);
- png: the resized pixels as PNG (lossless, bit-exact);
- jpeg95: the resized pixels re-encoded as JPEG quality 95 (lossy: the
  largest and mean absolute difference in uint8 levels are printed).

GPU decoding (`torchvision.io.decode_jpeg(..., device="cuda")`, nvJPEG) cannot
be timed here: the CPU machine has no torchvision matching its torch.
"""

from __future__ import annotations

import io
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from pipeline.fakes import trees as fakes  # noqa: E402

FOOD101_PHOTOS = 83_800


class Processor:  # the fields of ViLT-B/32's image processor that matter here
    do_resize = True
    size = type("Size", (), {"shortest_edge": 384})()
    size_divisor = 32
    resample = Image.BICUBIC


def decode_resize(data: bytes) -> np.ndarray:
    """(h, w, 3) uint8: the loader's draft decode and ViLT resize."""
    from pipeline.data.images import vilt_resize

    with Image.open(io.BytesIO(data)) as im:
        w, h = im.size
        scale = 384 / min(w, h)
        im.draft(None, (math.ceil(w * scale), math.ceil(h * scale)))
        return np.asarray(vilt_resize(im.convert("RGB"), Processor))


def best(fn, items, repeat: int = 3) -> float:
    """Best over `repeat` of the mean ms per item."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for it in items:
            fn(it)
        times.append(1e3 * (time.perf_counter() - t0) / len(items))
    return min(times)


def encoded(arrays: list[np.ndarray], fmt: str, **kw) -> list[bytes]:
    out = []
    for a in arrays:
        buf = io.BytesIO()
        Image.fromarray(a).save(buf, format=fmt, **kw)
        out.append(buf.getvalue())
    return out


def main(n: int = 48) -> None:
    rng = np.random.default_rng(0)
    jpegs = []
    for i in range(n):
        buf = io.BytesIO()
        fakes.photo(fakes.SIZES[i % 4], rng).save(buf, format="JPEG", quality=90)
        jpegs.append(buf.getvalue())
    pixels = [decode_resize(j) for j in jpegs]
    raw = [a.tobytes() for a in pixels]
    shapes = [a.shape for a in pixels]
    png = encoded(pixels, "PNG")
    q95 = encoded(pixels, "JPEG", quality=95)

    def from_raw(i: int) -> np.ndarray:
        return np.frombuffer(raw[i], np.uint8).reshape(shapes[i]).copy()

    def from_file(data: bytes) -> np.ndarray:
        with Image.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))

    rows = [
        ("jpeg (today: decode + resize)", best(decode_resize, jpegs), jpegs, "–"),
        ("raw uint8 cache", best(from_raw, range(n)), raw, "bit-exact"),
        ("png of the resized pixels", best(from_file, png), png, "bit-exact"),
    ]
    back = [from_file(b).astype(int) for b in q95]
    diff = [np.abs(b - a.astype(int)) for a, b in zip(pixels, back, strict=True)]
    mean = np.mean([d.mean() for d in diff])
    lossy = f"max {max(d.max() for d in diff)}, mean {mean:.2f} levels"
    rows.append(("jpeg q95 of the resized pixels", best(from_file, q95), q95, lossy))
    print(f"{n} Food101-shaped photos, one core; disk for {FOOD101_PHOTOS:,} photos")
    print(
        "| form | ms per image | images/s per core | KB per image | disk GB | exact |"
    )
    print("|---|---|---|---|---|---|")
    for name, ms, blobs, exact in rows:
        kb = np.mean([len(b) for b in blobs]) / 1e3
        gb = kb * FOOD101_PHOTOS / 1e6
        print(f"| {name} | {ms:.2f} | {1e3 / ms:.0f} | {kb:.0f} | {gb:.1f} | {exact} |")


if __name__ == "__main__":
    main()
