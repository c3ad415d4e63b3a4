"""One photo as ViLT's image processor makes it: decoded (a JPEG at a reduced
scale), resized keeping the aspect ratio, rescaled and normalised, bit for
bit what the processor makes, through the same PIL resize and NumPy
functions. The loader (`pipeline.data.loader`) and the pixel cache
(`pipeline.data.pixel_cache`) both decode through `decode_resized`, so the
cache holds the loader's bytes.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch


def dummy_image(side: int) -> torch.Tensor:
    """(3, side, side) of 1.0: an all-white image after ViLT's normalisation."""
    return torch.ones(3, side, side)


def decode_resized(path: Path, image_processor, image_side: int, draft: bool = True):
    """(h, w, 3) uint8: the image at `path` decoded (JPEG at a reduced scale
    with `draft`) and resized as ViLT's image processor resizes it. Both the
    loader and the pixel cache (`pipeline.data.pixel_cache`) decode through
    here, so the cache holds the loader's bytes."""
    from PIL import Image

    with Image.open(path) as im:
        if draft and im.format == "JPEG":
            # decode at 1/2, 1/4 or 1/8 scale when the result still covers
            # the processor's size (shorter side image_side): several
            # times faster on photos (bench/loader.py, tolerance there)
            w, h = im.size
            scale = image_side / min(w, h)
            im.draft(None, (math.ceil(w * scale), math.ceil(h * scale)))
        rgb = im.convert("RGB")
    return np.asarray(vilt_resize(rgb, image_processor))


def vilt_uint8(rgb, image_processor) -> np.ndarray:
    """(3, h, w) uint8: the image `vilt_pixels` makes, resized but before
    rescaling and normalisation."""
    x = np.asarray(vilt_resize(rgb, image_processor))
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def vilt_resize(rgb, ip):
    """The RGB PIL image resized as ViLT's image processor resizes it."""
    from transformers.models.vilt import image_processing_pil_vilt as vilt

    if not ip.do_resize:
        return rgb
    shorter = ip.size.shortest_edge
    longer = int(vilt.MAX_LONGER_EDGE / vilt.MAX_SHORTER_EDGE * shorter)
    height, width = vilt.get_resize_output_image_size(
        np.empty((rgb.height, rgb.width, 0)),
        shorter=shorter,
        longer=longer,
        size_divisor=ip.size_divisor,
        input_data_format="channels_last",
    )
    return rgb.resize((width, height), resample=ip.resample)


def vilt_pixels(rgb, image_processor) -> np.ndarray:
    """(3, h, w) float32: what ViLT's image processor makes of one RGB PIL image
    (resize keeping the aspect ratio — shorter side `size.shortest_edge`, longer
    capped at 1333/800 of it, both floored to `size_divisor` — then rescale and
    normalise), bit for bit, through the same PIL resize and NumPy functions,
    without the processor's per-call overhead (several times its cost for one
    image; bench/loader.py)."""
    return normalised(np.asarray(vilt_resize(rgb, image_processor)), image_processor)


def normalised(x: np.ndarray, ip) -> np.ndarray:
    """(3, h, w) float32: a resized image `x` (h, w, 3) uint8 rescaled and
    normalised by the image processor `ip` (as `vilt_pixels`)."""
    from transformers.image_transforms import normalize, rescale

    if ip.do_rescale:
        x = rescale(x, ip.rescale_factor, input_data_format="channels_last")
    if ip.do_normalize:
        x = normalize(x, ip.image_mean, ip.image_std, input_data_format="channels_last")
    return np.ascontiguousarray(x.transpose(2, 0, 1), dtype=np.float32)
