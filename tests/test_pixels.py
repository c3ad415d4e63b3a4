"""The pixel cache (`pal pixels`): the loader's uint8 bit for bit, the same
bytes whatever the workers, one-line errors for a damaged or foreign cache,
and tune reading it to the same checkpoints."""

from __future__ import annotations

import hashlib
import shutil

import h5py
import numpy as np
import pytest
import torch
import yaml
from click.testing import CliRunner
from helpers import make_hub_vilt
from PIL import Image

from palcore.codes import Missing
from pipeline import params as pparams
from pipeline.data.images import vilt_uint8
from pipeline.data.loader import SampleDataset, SampleError, make_loader
from pipeline.data.pixel_cache import (
    FILE,
    OFF_MARKER,
    PixelCache,
    PixelCacheError,
    open_pixels,
    write_cache,
)
from pipeline.data.samples import Sample, read_prepare
from pipeline.fakes.trees import SIZES, make_food101_tree, photo
from pipeline.model.backbone import load_backbone
from pipeline.stages.pixels import cli, image_processor, listed_images

# JPEG photos of the photo mix's sizes, a grey JPEG, a PNG and a file that
# does not decode
JPEGS = [f"photo_{w}x{h}.jpg" for w, h in SIZES]
IMAGES = [*JPEGS, "grey.jpg", "plain.png"]


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for name, size in zip(JPEGS, SIZES, strict=True):
        photo(size, rng).save(root / name, quality=90)
    photo((300, 200), rng).convert("L").save(root / "grey.jpg", quality=90)
    photo((70, 50), rng).save(root / "plain.png")
    (root / "broken.jpg").write_bytes((root / JPEGS[0]).read_bytes()[:200])
    return root


@pytest.fixture(scope="module")
def backbones(tiny_vilt, tmp_path_factory):
    """The tests' tiny ViLT (processor saved by transformers) and one laid out
    as the hub's (the old feature-extractor config)."""
    hub = make_hub_vilt(tmp_path_factory.mktemp("hub") / "vilt")
    return [load_backbone(str(p), 12) for p in (tiny_vilt, hub)]


def _samples(names: list[str]) -> list[Sample]:
    return [
        Sample(id=f"s{i}", split="train", task=1, label=0, class_name="c",
               image=name, text="a photo", missing=int(Missing.COMPLETE))
        for i, name in enumerate(names)
    ]  # fmt: skip


def _dataset(backbone, root, names, uint8=True, pixels=None) -> SampleDataset:
    return SampleDataset(_samples(names), root, backbone.processor, 12,
                         backbone.image_side, uint8=uint8, pixels=pixels)  # fmt: skip


def _write(backbone, root, path, workers=1) -> list[str]:
    ip = backbone.processor.image_processor
    rels = [*IMAGES, "broken.jpg"]
    return write_cache(path, root, rels, ip, backbone.image_side, workers)


def test_the_cache_holds_the_loaders_uint8_bit_for_bit(backbones, photos, tmp_path):
    for b, backbone in enumerate(backbones):
        path = tmp_path / f"{b}.h5"
        assert _write(backbone, photos, path) == ["broken.jpg"]
        cache = PixelCache(path)
        for uint8 in (True, False):
            today = _dataset(backbone, photos, IMAGES, uint8)
            cached = _dataset(backbone, photos, IMAGES, uint8, cache)
            for i, name in enumerate(IMAGES):
                ref, got = today[i]["pixel_values"], cached[i]["pixel_values"]
                assert ref.dtype == (torch.uint8 if uint8 else torch.float32)
                assert got.shape == ref.shape and torch.equal(got, ref), name
        # the PNG (no draft decoding): vilt_uint8 of the image as PIL reads it
        with Image.open(photos / "plain.png") as im:
            ref = vilt_uint8(im.convert("RGB"), backbone.processor.image_processor)
        assert torch.equal(
            torch.from_numpy(cache.read("plain.png")), torch.from_numpy(ref)
        )
        # the index: sorted paths and each image's (h, w), multiples of 8
        with h5py.File(path) as f:
            sizes, paths = f["sizes"][()], f["paths"].asstr()[()].tolist()
        assert paths == sorted(IMAGES)
        today = _dataset(backbone, photos, paths)
        shapes = [tuple(today[i]["pixel_values"].shape[1:]) for i in range(8)]
        assert sizes.tolist() == [list(s) for s in shapes]
        assert (sizes % 8 == 0).all() and len(set(shapes)) > 3


def test_same_images_same_bytes_whatever_the_workers(backbones, photos, tmp_path):
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    _write(backbones[0], photos, one, workers=1)
    _write(backbones[0], photos, two, workers=2)
    assert one.read_bytes() == two.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.h5", "two.h5"]


def test_a_damaged_cache_is_one_line_naming_the_file(backbones, photos, tmp_path):
    path = tmp_path / FILE
    _write(backbones[0], photos, path)
    whole = path.read_bytes()
    # cut short
    path.write_bytes(whole[: len(whole) // 2])
    cut = rf"^{path}: not a readable pixel cache \(.*\); rerun `pal pixels`$"
    with pytest.raises(PixelCacheError, match=cut):
        _dataset(backbones[0], photos, IMAGES, pixels=PixelCache(path))
    # one byte of an image's pixels changed: its chunk's checksum fails
    path.write_bytes(whole)
    with h5py.File(path) as f:
        chunk = f["pixels"].id.get_chunk_info(0)
    damaged = bytearray(whole)
    damaged[chunk.byte_offset + 100] ^= 0xFF
    path.write_bytes(bytes(damaged))
    ds = _dataset(backbones[0], photos, IMAGES, pixels=PixelCache(path))
    message = (
        rf"^sample 's0': cannot read image {photos}/{IMAGES[0]} \({path}: not a "
        r"readable pixel cache \(.*\); rerun `pal pixels`\)$"
    )
    with pytest.raises(SampleError, match=message):
        next(iter(make_loader(ds, 2)))


@pytest.mark.parametrize(
    ("name", "byte", "reason"),
    [
        ("grey.jpg", 0x1D, "its image names are not sorted and unique"),  # g -> z
        ("plain.png", 0x80, "'utf-8' codec can't decode byte 0xf0"),  # p -> 0xf0
    ],
)
def test_a_damaged_image_name_is_one_line_naming_the_file(
    backbones, photos, tmp_path, name, byte, reason
):
    """The names are outside the pixels' checksums: a name bit-flipped into
    another order, or into bytes that are not UTF-8, is refused on opening
    (and, in a DVC project, the file's md5 says it first: tests/test_recorded.py)."""
    path = tmp_path / "pixels" / FILE
    path.parent.mkdir()
    _write(backbones[0], photos, path)
    data = bytearray(path.read_bytes())
    at = data.find(name.encode())
    assert at > 0 and data.count(name.encode()) == 1
    data[at] ^= byte
    path.write_bytes(bytes(data))
    message = f"{path}: not a readable pixel cache ({reason}"
    with pytest.raises(PixelCacheError) as err:
        open_pixels(path.parent)
    assert str(err.value).startswith(message)
    assert str(err.value).endswith("; rerun `pal pixels`")
    assert "\n" not in str(err.value)


def test_a_name_damaged_in_its_place_is_named_damaged(backbones, photos, tmp_path):
    """A bit flip that keeps the names in order (outside a DVC project, where
    no md5 was recorded) makes an image vanish: the reader that wants it
    finds its name one byte away and says the cache is damaged, not that the
    image did not decode."""
    path = tmp_path / FILE
    _write(backbones[0], photos, path)
    data = bytearray(path.read_bytes())
    at = data.find(b"plain.png")
    assert at > 0 and data.count(b"plain.png") == 1
    data[at + len("plain.pn")] ^= 0x01  # plain.png -> plain.pnf, still the last
    path.write_bytes(bytes(data))
    ds = _dataset(backbones[0], photos, ["plain.png"], pixels=PixelCache(path))
    assert ds[0] == {
        "error": f"sample 's0': cannot read image {photos}/plain.png ({path}: not "
        "a readable pixel cache (image name plain.png reads plain.pnf); rerun "
        "`pal pixels`)"
    }


def test_an_image_the_cache_lacks_or_other_settings_are_refused(
    backbones, photos, tmp_path
):
    path = tmp_path / FILE
    _write(backbones[0], photos, path)
    ds = _dataset(backbones[0], photos, ["broken.jpg"], pixels=PixelCache(path))
    assert ds[0] == {
        "error": f"sample 's0': cannot read image {photos}/broken.jpg ({path}: "
        "holds no pixels of broken.jpg (it did not decode when `pal pixels` ran, "
        "or the cache is of other data))"
    }
    ip = backbones[0].processor.image_processor
    with pytest.raises(PixelCacheError) as err:
        PixelCache(path).check(ip, 64)
    assert str(err.value) == (
        f"{path}: made for other processor settings (image_side 32 (now 64)); "
        "rerun `pal pixels`"
    )


def _params(path, root, backbone, **pixels):
    doc = {
        "data": {"dataset": "food101", "root": str(root), "per_class": None},
        "model": {"backbone": str(backbone), "max_text_len": 12},
        "pixels": {"enabled": True, "workers": 1, **pixels},
    }
    path.write_text(yaml.safe_dump(doc))
    return path


def test_pal_pixels_caches_every_listed_image_or_writes_the_marker(tmp_path):
    root = tmp_path / "food101"
    make_food101_tree(root, classes=3, train=2, test=1)
    hub = make_hub_vilt(tmp_path / "vilt")
    out = tmp_path / "pixels"
    params = _params(tmp_path / "p.yaml", root, hub)
    result = CliRunner().invoke(cli, ["--params", str(params), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = pparams.DataParams(dataset="food101", root=str(root))
    rels = listed_images(data)
    assert len(rels) == 6  # 2 classes of 2 + 1 (the reader drops the smallest)
    one = pparams.DataParams(dataset="food101", root=str(root), per_class=1)
    assert len(listed_images(one)) == 4  # data.per_class: 1 of each class and split
    assert sorted(p.name for p in out.iterdir()) == ["contract.json", FILE]
    with h5py.File(out / FILE) as f:
        assert f["paths"].asstr()[()].tolist() == sorted(rels)
    cache = open_pixels(out)
    ip, side = image_processor(str(hub))
    cache.check(ip, side)
    digest = hashlib.sha256((out / FILE).read_bytes()).hexdigest()
    again = CliRunner().invoke(cli, ["--params", str(params), "--out", str(out)])
    assert again.exit_code == 0
    assert hashlib.sha256((out / FILE).read_bytes()).hexdigest() == digest
    # turned off: the marker only, and the loader decodes
    off = _params(tmp_path / "off.yaml", root, hub, enabled=False)
    result = CliRunner().invoke(cli, ["--params", str(off), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["contract.json", OFF_MARKER]
    assert (out / OFF_MARKER).read_bytes() == b""
    assert open_pixels(out) is None
    shutil.rmtree(out)
    out.mkdir()
    empty = rf"^{out}: holds no {FILE} \(run `pal pixels` first\)$"
    with pytest.raises(PixelCacheError, match=empty):
        open_pixels(out)


def test_a_backbone_without_a_processor_is_one_line(tmp_path):
    root = tmp_path / "food101"
    make_food101_tree(root, classes=3, train=2, test=1)
    params = _params(tmp_path / "p.yaml", root, tmp_path / "nowhere")
    result = CliRunner().invoke(
        cli, ["--params", str(params), "--out", str(tmp_path / "px")]
    )
    assert result.exit_code == 1
    assert result.output.startswith(
        f"Error: model.backbone '{tmp_path / 'nowhere'}': cannot load the image "
        "processor ("
    )
    assert result.output.count("\n") == 1


def test_tune_with_the_cache_writes_the_same_checkpoints(tuned, tmp_path):
    from pipeline.stages.tune import tune

    params, prepare, tune_dir = tuned
    samples, tasks = read_prepare(prepare)
    backbone = load_backbone(
        str(yaml.safe_load(params.read_text())["model"]["backbone"]), 12
    )
    rels = [s.image for s in samples if s.image]
    write_cache(tmp_path / "pixels" / FILE, tasks.root, rels,
                backbone.processor.image_processor, backbone.image_side)  # fmt: skip
    load = pparams.load
    tune(prepare, tmp_path / "tune", load(params, "model"), load(params, "prompt"),
         load(params, "tune"), pixels=tmp_path / "pixels")  # fmt: skip
    names = sorted(p.name for p in tune_dir.iterdir())
    assert names == sorted(p.name for p in (tmp_path / "tune").iterdir())
    for name in names:
        assert (tmp_path / "tune" / name).read_bytes() == (
            tune_dir / name
        ).read_bytes(), name


def test_extract_given_a_truncated_cache_stops_in_one_line(tuned, tmp_path):
    from pipeline.stages.extract import cli as extract_cli

    params, prepare, tune_dir = tuned
    folder = tmp_path / "pixels"
    folder.mkdir()
    (folder / FILE).write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    out = tmp_path / "out"
    args = ["--params", params, "--prepare", prepare, "--tune", tune_dir,
            "--out", out, "--pixels", folder]  # fmt: skip
    result = CliRunner().invoke(extract_cli, [str(a) for a in args])
    assert result.exit_code == 1
    assert result.output.startswith(
        f"Error: {folder / FILE}: not a readable pixel cache ("
    )
    assert result.output.endswith("); rerun `pal pixels`\n")
    assert result.output.count("\n") == 1 and not out.exists()
