"""`pal pixels`: decode every listed image once into the pixel cache (DESIGN §5).

Every image the dataset lists (after `data.per_class`), whatever run, variant
or grid cell later loads it, is decoded and resized exactly as the loader does
(`pipeline.data.images.decode_resized`) and stored as uint8 in
`data/pixels/pixels.h5` (`pipeline.data.pixel_cache`); tune and extract then
read those bytes instead of decoding, and make the same batches.

The stage depends on the images and the backbone (its processor) only: not
on the class order, the missing tables or the missing rate, so every run
and every `pal-paper` grid cell of a dataset shares one cache through DVC's
run cache. An image that is listed but absent or does not decode is not
stored: `pal prepare` keeps its sample with the image missing
(`pipeline.data.absent`). With `pixels.enabled: false` the folder holds only
an empty marker and the loader decodes as before.

Reads params `pixels` and the keys data.dataset, data.per_class,
data.text_field, data.label_count and model.backbone (data.root, like tune
and extract, only to find the images: their content is the stage's
dependency).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from palcore.cliutil import clean_errors, folder_option, run_params_option
from palcore.errors import PalError
from palcore.params import Source, load_section, section_value
from pipeline import params as pparams
from pipeline.contracts import write_stamp
from pipeline.data.datasets import FileIndex, read_dataset
from pipeline.data.listing import per_class
from pipeline.data.pixel_cache import FILE, OFF_MARKER, write_cache

log = logging.getLogger(__name__)


def listed_images(data: pparams.DataParams) -> list[str]:
    """The image paths (relative to `data.root`) the dataset lists and holds
    on disk, after `data.per_class`, in listing order."""
    listing = read_dataset(data)
    if data.per_class is not None:
        listing = per_class(listing, data.per_class)
    index = FileIndex(listing.root)
    return [s.image for s in listing.samples if s.image and index.exists(s.image)]


def image_processor(backbone: str):
    """(ViLT's image processor of `model.backbone`, the dummy image's side):
    the side is the processor's shorter side floored to its size divisor, as
    the backbone computes it (`pipeline.model.encoder.Backbone.image_side`)."""
    from transformers import ViltProcessor

    where = f"model.backbone '{backbone}'"
    try:  # as the backbone loads it (`load_backbone`): the same processor class
        ip = ViltProcessor.from_pretrained(backbone).image_processor
    except (OSError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else "no config"
        raise PalError(f"{where}: cannot load the image processor ({reason})") from None
    side = getattr(ip.size, "shortest_edge", None) if ip.do_resize else None
    if not side:
        raise PalError(
            f"{where}: its image processor has no size.shortest_edge; set "
            "pixels.enabled: false"
        )
    divisor = int(ip.size_divisor or 1)
    return ip, int(side) // divisor * divisor


def pixels(
    params: pparams.PixelsParams,
    data: pparams.DataParams,
    backbone: str,
    out: str | Path,
) -> Path:
    """Write `out`/pixels.h5 (or, disabled, the marker `out`/off); returns the
    file written. Whatever `out` held before is replaced."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for old in (out / FILE, out / OFF_MARKER):
        old.unlink(missing_ok=True)
    if not params.enabled:
        (out / OFF_MARKER).write_bytes(b"")
        log.info("pixels.enabled is false: tune and extract decode every image")
        return out / OFF_MARKER
    ip, side = image_processor(backbone)
    rels = listed_images(data)
    workers = params.workers or min(16, os.cpu_count() or 1)
    bad = write_cache(out / FILE, Path(data.root), rels, ip, side, workers)
    if bad:
        log.warning(
            "%d image file%s do not decode and are not cached; prepare keeps "
            "their samples with the image missing (first: %s)",
            len(bad),
            "s" * (len(bad) != 1),
            ", ".join(bad[:5]),
        )
    size = (out / FILE).stat().st_size
    log.info(
        "cached %d images in %s (%.2f GB)", len(rels) - len(bad), out / FILE, size / 1e9
    )
    return out / FILE


def _data_params(params_file: Source) -> pparams.DataParams:
    """`data` with only the keys that choose the images (the rest defaults)."""
    keys = {  # each named (tests/test_dvc_deps.py reads the calls)
        "dataset": section_value(params_file, "data", "dataset"),
        "per_class": section_value(params_file, "data", "per_class"),
        "text_field": section_value(params_file, "data", "text_field"),
        "label_count": section_value(params_file, "data", "label_count"),
    }
    given = {k: v for k, v in keys.items() if v is not None}
    # data_root reads the file itself, which os.fspath names for a Source
    root = pparams.data_root(os.fspath(params_file)) or pparams.DataParams.root
    return pparams.DataParams(root=root, **given)


@click.command("pixels")
@run_params_option
@folder_option("out", "data/pixels", "Output folder for pixels.h5.")
@clean_errors
def cli(params_file: Source, out: str) -> None:
    """Decode every listed image once into a uint8 pixel cache.

    Every image of the dataset at data.root (after data.per_class) is decoded
    and resized exactly as tune's and extract's loader does, and stored in
    <out>/pixels.h5 (3·h·w bytes an image: Food101 at ViLT-B/32's size is
    about 52 GB); `pal tune` and `pal extract` given `--pixels <out>` read it
    instead of decoding, with the same bytes. With pixels.enabled: false,
    <out> holds only an empty marker `off` and they decode as before. Images
    that do not decode are left out (prepare keeps their samples with the
    image missing). Reads params pixels, data.dataset, data.per_class,
    data.text_field, data.label_count and model.backbone.
    """
    params = load_section(params_file, "pixels", pparams.PixelsParams)
    backbone = section_value(params_file, "model", "backbone")
    if backbone is None:
        raise PalError(f"{params_file.path}: model.backbone is not set")
    pixels(params, _data_params(params_file), str(backbone), out)
    write_stamp(Path(out), "pixels")
