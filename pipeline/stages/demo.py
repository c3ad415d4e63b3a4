"""`pal demo`: the offline demo, a synthetic image–text dataset and a tiny ViLT.

Writes, deterministically from `demo.seed`:

    <out>/dataset/captions.json                      classes and samples (see below)
    <out>/dataset/images/<split>/<class>/<id>.png    one RGB PNG per sample
    <out>/vilt/                                      ViltModel + ViltProcessor

`captions.json` holds `{"format": "pal-demo", "version": 1, "classes": [...],
"samples": [...]}`; a class is `{"name", "shape", "colour", "texture",
"flavour"}`, a sample `{"id", "split", "class_name", "image", "text"}` with
`image` relative to the dataset folder. The class design (each modality alone
is ambiguous, the pair is not) is described in `pipeline.fakes.demo_data`.

The whole output is built in a temporary folder next to `--out` and renamed
into place, so an earlier demo is never left half-overwritten.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import click
import numpy as np
from PIL import Image

from palcore.cliutil import clean_errors, folder_option, params_option
from palcore.progress import tqdm
from pipeline.data.samples import SPLITS
from pipeline.fakes import demo_data as dd
from pipeline.params import DemoParams, load

log = logging.getLogger(__name__)

FORMAT = "pal-demo"
FORMAT_VERSION = 1
DATA_SEED_TAG = 0  # second entropy word of the per-(class, split) generators


def write_dataset(params: DemoParams, folder: Path) -> dict:
    """Render the demo dataset into `folder` (created); return the captions manifest."""
    classes = dd.demo_classes(params.n_classes, params.variants, params.colour_free)
    counts = {
        "train": params.train_per_class,
        "val": params.val_per_class,
        "test": params.test_per_class,
    }
    samples = []
    total = params.n_classes * sum(counts.values())
    bar = tqdm(total=total, desc="demo images", disable=None)
    for split_code, split in enumerate(SPLITS):
        for cls in classes:
            if counts[split] == 0:
                continue
            # one generator per (class, split): independent of generation order
            rng = np.random.default_rng(
                [params.seed, DATA_SEED_TAG, cls.index, split_code]
            )
            sub = Path("images") / split / cls.name
            (folder / sub).mkdir(parents=True, exist_ok=True)
            for i in range(counts[split]):
                sample_id = f"{split}-{cls.index:02d}-{i:04d}"
                pixels = _render(cls, params, rng)
                text = dd.make_caption(cls.flavour, rng, params.text_noise, cls.cooking)
                image = (sub / f"{sample_id}.png").as_posix()
                Image.fromarray(pixels).save(
                    folder / image, format="PNG", compress_level=6
                )
                samples.append(
                    {
                        "id": sample_id,
                        "split": split,
                        "class_name": cls.name,
                        "image": image,
                        "text": text,
                    }
                )
                bar.update()
    bar.close()
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "classes": [_class_entry(c, params) for c in classes],
        "samples": samples,
    }
    text = json.dumps(manifest, indent=1, ensure_ascii=False) + "\n"
    (folder / "captions.json").write_text(text, encoding="utf-8")
    return manifest


def _render(cls: dd.DemoClass, params: DemoParams, rng: np.random.Generator):
    """One image of `cls`: its colour drawn first with `colour_free`, then a
    side dish's look with `side_dish`, then the picture."""
    look = cls.look
    if params.colour_free:
        look = dd.Look(look.shape, int(rng.integers(len(dd.COLOURS))), look.texture)
    side = dd.look_of(int(rng.integers(90))) if params.side_dish else None
    return dd.render_image(look, params.image_size, rng, params.image_noise, side)


def _class_entry(c: dd.DemoClass, params: DemoParams) -> dict:
    """A class of captions.json: its name and attributes (colour "any" with
    `colour_free`; a cooking word with `variants` > 1)."""
    entry = {
        "name": c.name,
        "shape": dd.SHAPES[c.look.shape],
        "colour": "any" if params.colour_free else list(dd.COLOURS)[c.look.colour],
        "texture": dd.TEXTURES[c.look.texture],
        "flavour": dd.FLAVOURS[c.flavour][0],
    }
    if c.cooking is not None:
        entry["cooking"] = dd.COOKING[c.cooking]
    return entry


@contextlib.contextmanager
def _deterministic_torch(seed: int) -> Iterator[None]:
    """Seeded torch RNG, deterministic kernels and 2 threads; restored on exit."""
    import torch

    threads = torch.get_num_threads()
    det = torch.are_deterministic_algorithms_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_num_threads(2)
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(det)
            torch.set_num_threads(threads)


def write_backbone(params: DemoParams, folder: Path) -> None:
    """Build, pre-train and save the tiny ViLT and its processor into `folder`."""
    from pipeline.fakes import demo_model

    folder.mkdir(parents=True, exist_ok=True)
    demo_model.write_vocab(folder / "vocab.txt", cooking=params.variants > 1)
    processor = demo_model.make_processor(folder, params)
    with _deterministic_torch(params.seed):
        model = demo_model.build_backbone(params, processor.tokenizer)
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    for path in folder.iterdir():  # save_pretrained may leave private (0600) files
        path.chmod(0o644)


def make_demo(params: DemoParams, out: str | Path) -> Path:
    """Write the demo dataset and backbone to `out`, replacing it atomically.

    Returns the output folder.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp.{os.getpid()}"
    old = out.parent / f".{out.name}.old.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        manifest = write_dataset(params, tmp / "dataset")
        log.info(
            "demo dataset: %d classes, %d samples",
            len(manifest["classes"]),
            len(manifest["samples"]),
        )
        write_backbone(params, tmp / "vilt")
        if out.exists():
            os.replace(out, old)
        try:
            os.replace(tmp, out)
        except OSError:
            if old.exists():
                os.replace(old, out)  # put the earlier demo back
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    log.info("wrote %s", out)
    return out


@click.command("demo")
@params_option
@folder_option(
    "out",
    "data/demo",
    "Output folder: dataset/ (PNGs + captions.json) and vilt/ (the checkpoint).",
)
@clean_errors
def cli(params_file: str, out: str) -> None:
    """Make the offline demo: a synthetic image–text dataset and a tiny ViLT.

    Classes pair an image look (shape, colour, texture) with a caption flavour,
    chained so that each modality alone leaves two candidate classes and the pair
    leaves one. The ViLT (a few layers, 64-px images) is pre-trained briefly on
    other look–flavour pairs and saved with its tokenizer and processor, loadable
    offline with `ViltModel.from_pretrained(<out>/vilt)`. Same params, same bytes.
    Reads the `demo` section of the params file.
    """
    params = load(params_file, "demo")
    # Read by OpenMP when torch loads (below, lazily): spinning worker threads
    # slow pre-training several-fold when the cores are shared with other work.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    make_demo(params, out)
