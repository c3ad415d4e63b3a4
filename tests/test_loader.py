"""The loader's image path: ViLT's processor bit for bit, JPEG draft decoding
within tolerance, and the wait clock."""

from __future__ import annotations

import io

import numpy as np
import pytest
from helpers import make_hub_vilt
from PIL import Image

from pipeline.data.images import vilt_pixels
from pipeline.data.loader import SampleDataset, WaitClock
from pipeline.data.samples import Sample
from pipeline.model.backbone import load_backbone


def _photo(size: tuple[int, int], seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 255, (size[1] // 8 + 2, size[0] // 8 + 2, 3), np.uint8)
    return Image.fromarray(coarse).resize(size, Image.BICUBIC)


@pytest.fixture(scope="module")
def processors(tiny_vilt, tmp_path_factory):
    hub = make_hub_vilt(tmp_path_factory.mktemp("hub") / "vilt")
    return [load_backbone(str(p), 40).processor for p in (tiny_vilt, hub)]


@pytest.mark.parametrize("size", [(96, 64), (48, 80), (32, 32), (33, 97), (20, 15)])
def test_vilt_pixels_equal_the_processor_bit_for_bit(processors, size):
    image = _photo(size)
    for processor in processors:
        ip = processor.image_processor
        ref = ip(images=image, return_tensors="np", do_pad=False)["pixel_values"][0]
        mine = vilt_pixels(image, ip)
        assert mine.dtype == ref.dtype and mine.shape == ref.shape
        assert mine.tobytes() == ref.tobytes()


def test_jpeg_draft_decoding_stays_within_tolerance(processors, tmp_path):
    """A photo at least twice the processor's size decodes at a reduced scale:
    same shape, mean |diff| ≤ 0.02 and max ≤ 0.25 in normalised units (on
    photo-sized JPEGs bench/loader.py measures 0.004 and 0.11)."""
    buf = io.BytesIO()
    _photo((160, 96), seed=3).save(buf, format="JPEG", quality=90)
    (tmp_path / "p.jpg").write_bytes(buf.getvalue())
    sample = Sample("s", "train", 1, 0, "c", "p.jpg", "photo", 0)
    out = {}
    for draft in (False, True):
        ds = SampleDataset([sample], tmp_path, processors[1], 40, 32, draft=draft)
        out[draft] = ds[0]["pixel_values"].numpy()
    assert out[True].shape == out[False].shape == (3, 32, 48)
    diff = np.abs(out[True] - out[False])
    assert diff.mean() <= 0.02 and diff.max() <= 0.25
    assert diff.max() > 0  # draft did decode at a reduced scale


def test_wait_clock_counts_the_time_spent_waiting():
    def slow():
        import time

        for i in range(3):
            time.sleep(0.02)
            yield i

    clock = WaitClock(slow())
    assert list(clock) == [0, 1, 2]
    assert 0.05 <= clock.seconds < 1.0
