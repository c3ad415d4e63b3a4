"""Images/s of one DataLoader worker: decode + resize + normalise of photo-sized
JPEGs with ViLT-B/32's image processor (shorter side 384, multiple of 32).

The photo mix (a stand-in: the datasets cannot be downloaded here): UPMC-Food101
photos come from web image search, most between 300 and 1000 px on the longer
side; N24News photos are the New York Times' article images, mostly wide 3:2 or
16:9 at about 1000–2000 px. The mix, one image each in turn:

    512×384, 384×512, 800×800, 1024×683, 1050×550, 2048×1365

Each image is a smooth random field with noise (JPEG quality 90), so decoding
costs what a photo costs. Times, in this process: the earlier image path (PIL
decode, then a `ViltImageProcessor` call per image), and the project's loader
(`SampleDataset`, whose `vilt_pixels` gives the processor's output bit for bit
without its per-call overhead) with JPEG draft decoding (the default) and
without; prints the largest pixel difference draft makes, in ViLT's normalised
units, and the workers a target rate needs.

    .venv/bin/python bench/loader.py --images 60
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from pipeline.data.loader import SampleDataset
from pipeline.data.samples import Sample
from pipeline.fakes.trees import SIZES, photo


class _Processor:
    """The parts of ViltProcessor that SampleDataset uses."""

    def __init__(self) -> None:
        from transformers import BertTokenizer, ViltImageProcessorPil

        self.image_processor = ViltImageProcessorPil(
            size={"shortest_edge": 384}, size_divisor=32, do_pad=True
        )
        vocab = Path(tempfile.mkdtemp()) / "vocab.txt"
        vocab.write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nphoto\n")
        self.tokenizer = BertTokenizer(vocab=str(vocab))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=60, help="images per measurement")
    ap.add_argument("--repeat", type=int, default=3, help="best of N")
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    processor = _Processor()
    with tempfile.TemporaryDirectory(prefix="pal-loader-") as tmp:
        root = Path(tmp)
        samples = []
        for i in range(a.images):
            name = f"{i:04d}.jpg"
            photo(SIZES[i % len(SIZES)], rng).save(root / name, quality=90)
            samples.append(Sample(str(i), "train", 1, 0, "x", name, "photo", 0))
        rates, pixels = {}, {}

        def before() -> None:  # the loader's earlier image path: the processor
            for s in samples:
                with Image.open(root / s.image) as im:
                    rgb = im.convert("RGB")
                processor.image_processor(images=rgb, return_tensors="np", do_pad=False)

        t_before = float("inf")
        for _ in range(a.repeat):
            t0 = time.perf_counter()
            before()
            t_before = min(t_before, time.perf_counter() - t0)
        rates["processor"] = len(samples) / t_before
        for draft in (False, True):
            ds = SampleDataset(samples, root, processor, 40, 384, draft=draft)
            best = float("inf")
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                items = [ds[i] for i in range(len(ds))]
                best = min(best, time.perf_counter() - t0)
            rates[draft] = len(ds) / best
            pixels[draft] = [it["pixel_values"].numpy() for it in items]
    diffs = [
        float(np.abs(a - b).max()) if a.shape == b.shape else float("inf")
        for a, b in zip(pixels[False], pixels[True], strict=True)
    ]
    means = [
        float(np.abs(a - b).mean())
        for a, b in zip(pixels[False], pixels[True], strict=True)
        if a.shape == b.shape
    ]
    print(
        f"# {a.images} photo-sized JPEGs, sizes {SIZES}, one worker, best of {a.repeat}"
    )
    print(f"ViltProcessor call per image (before): {rates['processor']:6.1f} images/s")
    print(f"vilt_pixels, full decode:              {rates[False]:6.1f} images/s")
    print(
        f"vilt_pixels, draft decode:             {rates[True]:6.1f} images/s "
        f"({rates[True] / rates['processor']:.2f}× before)"
    )
    print(
        f"draft vs full, normalised pixels in [-1, 1]: same shapes "
        f"{all(np.isfinite(diffs))}, max |diff| {max(diffs):.3f}, "
        f"mean |diff| {np.mean(means):.4f}"
    )
    for target in (475, 2600):
        print(
            f"workers for {target} images/s: {int(np.ceil(target / rates[True]))} "
            f"(draft), {int(np.ceil(target / rates[False]))} (full)"
        )


if __name__ == "__main__":
    main()
