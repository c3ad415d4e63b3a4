"""Counted on the CPU: how often the pipeline decodes each image and runs the
frozen backbone over each sample, and how many bytes an extract batch ships.

    .venv/bin/python bench/counts.py            # tiny ViLT, the tests' data, ~1 min

Decodes and frozen forwards are counted, not derived: `pal tune` and `pal
extract` run in this process (no loader workers) on a tiny prepare folder (3
tasks × 2 classes, 6 training and 3 test samples a class, 50 % missing) with
`images.decode_resized` (one decode) and `Backbone.queries` (the frozen,
prompt-free pass; its rows counted per call) wrapped by counters. Per image
and per sample they are then multiplied out for a 3-run protocol (each run:
PAL tunes and extracts; `init` and `frozen` extract, their tune stages only
start up: `tune.epochs: 0` decodes nothing) and for a grid of two cells
(each cell one more PAL tuning and extraction per run). Frozen forwards are
counted twice in the same run: without `pal frozen`'s file (every tune and
extract runs the frozen pass) and with it (the stage's pass once, then tune
and extract gather; a grid cell's stage hits DVC's run-cache: its deps are the
data and the backbone, which the cells share).

Decodes are counted twice: before, tune and extract decoding every image they
load; after, with the pixel cache (`pal pixels`, written once per dataset and
shared by every run and grid cell through DVC's run cache: its decodes are
counted once), tune and extract reading it. Not counted, before or after:
prepare's check that each image decodes, at 1/8 scale, once per run.

Bytes per extract batch: 256 photos of the photo mix's Food101 shapes at
ViLT-B/32's processor size (shorter side 384, longer ≤ 640, multiples of 32),
as the loader shipped them (float32 pixels + int64 mask) and as it ships them
now (uint8 pixels + (R, 2) int64 sizes + (R,) bool dummy flags).
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from helpers import make_prepare, make_vilt, write_params  # noqa: E402

from pipeline import params as pparams  # noqa: E402
from pipeline.fakes import trees as fakes  # noqa: E402

RUNS, CELLS = 3, 2


def counted(
    work: Path,
    prompt: bool,
    epochs: int,
    frozen_dir: Path | None = None,
    pixels: Path | None = None,
) -> tuple[Counter, Counter, int]:
    """Decodes per image path and frozen rows per call, over one tune and one
    extract of a variant (`frozen_dir`: with `pal frozen`'s folder; `pixels`:
    reading the pixel cache, as dvc.yaml runs them); and the number of
    samples."""
    from pipeline.data import images
    from pipeline.data.samples import read_prepare
    from pipeline.model.encoder import Backbone
    from pipeline.stages.extract import extract
    from pipeline.stages.tune import tune

    decodes: Counter = Counter()
    frozen: Counter = Counter()
    image, queries = images.decode_resized, Backbone.queries

    def count_image(path, *args):
        decodes[str(path)] += 1
        return image(path, *args)

    def count_queries(self, h, mask, text_len):
        frozen["rows"] += h.shape[0]
        return queries(self, h, mask, text_len)

    vilt = work / "vilt"
    if not vilt.exists():
        make_vilt(vilt)
    prepare = work / "data" / "prepare"
    if not prepare.exists():
        prepare = make_prepare(work / "data")
    name = f"{'pal' if prompt else 'frozen'}-{epochs}"
    name += f"-{'file' if frozen_dir else 'pass'}-{'cache' if pixels else 'decode'}"
    params = write_params(work / f"{name}.yaml", vilt, tune={"epochs": epochs},
                          prompt={"enabled": prompt})  # fmt: skip
    load = pparams.load
    images.decode_resized, Backbone.queries = count_image, count_queries
    try:
        tune(prepare, work / f"tune-{name}", load(params, "model"),
             load(params, "prompt"), load(params, "tune"),
             frozen_dir=frozen_dir, pixels=pixels)  # fmt: skip
        extract(prepare, work / f"tune-{name}", work / f"extract-{name}",
                load(params, "extract"), frozen_dir=frozen_dir,
                pixels=pixels)  # fmt: skip
    finally:
        images.decode_resized, Backbone.queries = image, queries
    samples, _ = read_prepare(prepare)
    return decodes, frozen, len(samples)


def stage_rows(work: Path, pixels: Path) -> tuple[Path, int, int]:
    """`pal frozen`'s pass over the tiny dataset (every sample naturally
    complete: three states each), reading the pixel cache as dvc.yaml runs
    it; (its folder, frozen rows, image decodes)."""
    import dataclasses

    from pipeline.data import images
    from pipeline.data.pixel_cache import open_pixels
    from pipeline.data.samples import read_prepare
    from pipeline.model.backbone import load_backbone
    from pipeline.model.encoder import Backbone
    from pipeline.model.queries import queries_path, write_queries
    from pipeline.stages.frozen import frozen_pairs

    samples, tasks = read_prepare(work / "data" / "prepare")
    natural = sorted((dataclasses.replace(s, missing=0) for s in samples),
                     key=lambda s: s.id)  # fmt: skip
    rows, queries, image = [0, 0], Backbone.queries, images.decode_resized

    def count_queries(self, h, mask, text_len):
        rows[0] += h.shape[0]
        return queries(self, h, mask, text_len)

    def count_image(path, *args):
        rows[1] += 1
        return image(path, *args)

    Backbone.queries, images.decode_resized = count_queries, count_image
    try:
        backbone = load_backbone(str(work / "vilt"), 12)
        pairs = frozen_pairs(backbone, natural, tasks.root, pixels=open_pixels(pixels))
    finally:
        Backbone.queries, images.decode_resized = queries, image
    folder = work / "frozen"
    write_queries(queries_path(folder), [s.id for s in natural], pairs,
                  {"backbone": str(work / "vilt"), "max_text_len": 12})  # fmt: skip
    return folder, rows[0], rows[1]


def cache_decodes(work: Path) -> tuple[Path, Counter]:
    """The pixel cache of the prepare folder's images (as `pal pixels` writes
    it, in this process) and its decodes per image path."""
    from pipeline.data import images
    from pipeline.data.pixel_cache import FILE, write_cache
    from pipeline.data.samples import read_prepare
    from pipeline.model.backbone import load_backbone

    samples, tasks = read_prepare(work / "data" / "prepare")
    backbone = load_backbone(str(work / "vilt"), 12)
    decodes: Counter = Counter()
    image = images.decode_resized

    def count_image(path, *args):
        decodes[str(path)] += 1
        return image(path, *args)

    images.decode_resized = count_image
    try:
        rels = [s.image for s in samples if s.image]
        ip = backbone.processor.image_processor
        write_cache(work / "pixels" / FILE, tasks.root, rels, ip, backbone.image_side)
    finally:
        images.decode_resized = image
    return work / "pixels", decodes


def batch_bytes(batch: int = 256) -> tuple[int, int]:
    """(before, after) bytes of an extract batch of `batch` Food101-shaped
    photos at ViLT-B/32's processor size."""
    from transformers.models.vilt import image_processing_pil_vilt as vilt

    longer = int(vilt.MAX_LONGER_EDGE / vilt.MAX_SHORTER_EDGE * 384)
    sizes = []
    for w, h in fakes.SIZES[:4]:
        sizes.append(vilt.get_resize_output_image_size(
            __import__("numpy").empty((h, w, 0)), shorter=384, longer=longer,
            size_divisor=32, input_data_format="channels_last"))  # fmt: skip
    H, W = max(s[0] for s in sizes), max(s[1] for s in sizes)
    before = batch * H * W * (3 * 4 + 8)
    after = batch * H * W * 3 + batch * (2 * 8 + 1)
    return before, after


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="pal-counts-") as tmp:
        work = Path(tmp)
        pal_d, pal_f, n = counted(work, prompt=True, epochs=1)
        epochs = 1
        init_d, init_f, _ = counted(work, prompt=True, epochs=0)
        frozen_d, frozen_f, _ = counted(work, prompt=False, epochs=1)
        # after: `pal pixels` and `pal frozen` once per dataset, then every run
        # and variant reads them (as dvc.yaml runs them)
        pixels, cache_d = cache_decodes(work)
        folder, stage, stage_d = stage_rows(work, pixels)
        after = [counted(work, p, e, folder, pixels) for p, e in
                 ((True, 1), (True, 0), (False, 1))]  # fmt: skip
    images = len(pal_d)
    per = {k: sum(v.values()) / images for k, v in
           (("pal", pal_d), ("init", init_d), ("frozen", frozen_d))}  # fmt: skip
    rows = {k: v["rows"] / n for k, v in
            (("pal", pal_f), ("init", init_f), ("frozen", frozen_f))}  # fmt: skip
    protocol = RUNS * (per["pal"] + per["init"] + per["frozen"])
    grid = RUNS * CELLS * per["pal"]
    print(f"{n} samples, {images} images decoded at least once; tune.epochs "
          f"{epochs} for PAL and frozen (each further epoch adds one decode per "
          "training image)")  # fmt: skip
    print(f"CPU decodes per image: PAL run {per['pal']:.2f} (tune + extract), init "
          f"{per['init']:.2f}, frozen {per['frozen']:.2f}; a {RUNS}-run protocol "
          f"{protocol:.1f}; a grid of {CELLS} cells {grid:.1f} more (target 1, "
          "or 0 where the GPU decodes)")  # fmt: skip
    once = sum(cache_d.values()) / len(cache_d)
    dec = [sum(c[0].values()) / images for c in after]
    print(f"  with the pixel cache and the frozen queries: `pal pixels` {once:.2f} "
          f"per image file ({len(cache_d)} files, once per dataset), `pal frozen` "
          f"{stage_d / images:.2f}, then PAL run {dec[0]:.2f}, init {dec[1]:.2f}, "
          f"frozen {dec[2]:.2f}; a {RUNS}-run protocol "
          f"{once + stage_d / images + RUNS * sum(dec):.1f}; a grid of {CELLS} cells "
          f"{RUNS * CELLS * dec[0]:.1f} more")  # fmt: skip
    names = ("pal", "init", "frozen")
    rows_after = {k: c[1]["rows"] / n for k, c in zip(names, after, strict=True)}
    before_p, before_g = RUNS * sum(rows.values()), RUNS * CELLS * rows["pal"]
    after_p = stage / n + RUNS * sum(rows_after.values())
    after_g = RUNS * CELLS * rows_after["pal"]  # the cells hit the stage's run-cache
    print(f"frozen forward rows per sample, without `pal frozen`: PAL run "
          f"{rows['pal']:.2f}, init {rows['init']:.2f}, frozen "
          f"{rows['frozen']:.2f}; with it: the stage {stage / n:.2f} once per "
          f"dataset, then PAL {rows_after['pal']:.2f}, init {rows_after['init']:.2f}, "
          f"frozen {rows_after['frozen']:.2f}")  # fmt: skip
    print(f"frozen forward rows per sample over a {RUNS}-run protocol and a grid "
          f"of {CELLS} cells: {before_p + before_g:.1f} -> {after_p + after_g:.1f} "
          f"(protocol {before_p:.1f} -> {after_p:.1f}, grid {before_g:.1f} -> "
          f"{after_g:.1f} more; target ≤ 3 per dataset: complete, text missing, "
          "image missing)")  # fmt: skip
    before, after = batch_bytes()
    print(f"bytes per extract batch of 256 Food101-shaped photos: "
          f"before {before / 2**30:.2f} GiB (float32 + int64 mask), after "
          f"{after / 2**20:.0f} MiB (uint8 + sizes): {before / after:.1f}× "
          "fewer")  # fmt: skip


if __name__ == "__main__":
    main()
