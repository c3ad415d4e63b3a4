"""Images on the device (pipeline/model/vision.py): mixed-size batches embedded from
the image sizes equal HF's embedding up to patch order, without host syncs;
uint8 pixels normalised on the device equal the loader's float pixels bit for
bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import make_model, sync_counter
from PIL import Image

from palcore.codes import Missing
from pipeline.data.images import vilt_pixels
from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import Sample, read_prepare, select
from pipeline.model import vision
from pipeline.model.backbone import load_backbone
from pipeline.model.losses import static_inputs, text_bucket

SIZES = [(32, 32), (32, 48), (48, 32), (40, 64)]  # raw photo sizes (h, w)


def _photos(sizes, seed=0):
    rng = np.random.default_rng(seed)
    return [
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        for h, w in sizes
    ]


def _inputs(backbone, texts, sizes):
    """Processor inputs (padded batch) and the (B, 2) host image sizes."""
    out = backbone.processor(
        images=_photos(sizes),
        text=texts,
        padding="max_length",
        max_length=backbone.max_text_len,
        truncation=True,
        return_tensors="pt",
    )
    pm = out["pixel_mask"]
    hw = torch.stack([pm[:, :, 0].sum(1), pm[:, 0, :].sum(1)], 1)
    return out["input_ids"], out["attention_mask"], out["pixel_values"], pm, hw


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_backbone(str(tiny_vilt), 12)


def test_padded_embedding_matches_hf_on_mixed_sizes(backbone):
    texts = ["a red cat", "", "the big blue bird photo", "x"]
    ids, am, px, pm, hw = _inputs(backbone, texts, SIZES)
    assert hw.tolist() == [[32, 32], [32, 48], [48, 32], [32, 48]]  # 8-px patches
    torch.manual_seed(0)
    h_ref, m_ref = backbone.embed(ids, am, px, pm)  # HF's path (CPU)
    ref = backbone.encode(h_ref, m_ref)
    h, mask = backbone.embed_padded(ids, am, px, hw)
    out = backbone.encode(h, mask)
    T = ids.shape[1]
    assert out.shape == ref.shape == (4, T + 1 + 24, 32)
    assert torch.equal(mask.sum(1), m_ref.sum(1))  # same number of live tokens
    assert mask[:, T + 1 :].sum(1).tolist() == [16, 24, 24, 24]
    # text and CLS outputs: what the model reads
    assert (out[:, : T + 1] - ref[:, : T + 1]).abs().max().item() < 1e-5
    # the live patch tokens: the same multiset per sample and feature
    for b in range(4):
        a = out[b, T + 1 :][mask[b, T + 1 :]].sort(0).values
        r = ref[b, T + 1 :][m_ref[b, T + 1 :]].sort(0).values
        assert (a - r).abs().max().item() < 1e-5
    # the position tables are kept per patch grid
    assert sorted(backbone._positions.tables) == [(4, 4), (4, 6), (6, 4)]


def test_full_images_equal_embed_full(backbone):
    ids, am, px, pm, hw = _inputs(backbone, ["a", "b"], [(32, 32)] * 2)
    h1, m1 = backbone.embed_full(ids, am, px)
    h2, m2 = backbone.embed_padded(ids, am, px, hw)
    assert torch.equal(h1, h2) and torch.equal(m1, m2)


def test_padded_embedding_makes_no_host_sync_and_hf_does(backbone):
    ids, am, px, pm, hw = _inputs(backbone, ["a", "b", "c", "d"], SIZES)
    backbone.embed_padded(ids, am, px, hw)  # grids cached: a later batch's case
    with sync_counter() as fast:
        backbone.embed_padded(ids, am, px, hw)
    with sync_counter() as hf:
        backbone.embed(ids, am, px, pm)
    assert fast.syncs == []
    assert len(hf.syncs) >= 10  # nonzero, unique and per-row masks


def test_embed_takes_the_padded_path_where_fast(backbone):
    ids, am, px, pm, hw = _inputs(backbone, ["a", "b", "c", "d"], SIZES)
    backbone.fast_embed = True
    try:
        with sync_counter() as counter:
            h, mask = backbone.embed(ids, am, px, None, hw)
    finally:
        backbone.fast_embed = False
    assert counter.syncs == []
    h2, mask2 = backbone.embed_padded(ids, am, px, hw)
    assert torch.equal(h, h2) and torch.equal(mask, mask2)


def test_sampled_patches_keep_hf_path(backbone):
    hw = torch.tensor([[32, 48], [32, 32]])  # 24 and 16 patches
    backbone.vilt.config.max_image_length = 20
    try:
        assert vision.samples_patches(backbone.vilt, hw)
        backbone.vilt.config.max_image_length = 24
        assert not vision.samples_patches(backbone.vilt, hw)
    finally:
        backbone.vilt.config.max_image_length = -1
    assert not vision.samples_patches(backbone.vilt, hw)


def _samples(tmp_path, sizes):
    out = []
    for i, im in enumerate(_photos(sizes, seed=1)):
        im.save(tmp_path / f"{i}.png")
        missing = Missing.IMAGE if i == 1 else Missing.COMPLETE  # 1: the dummy
        text = f"photo {i}"
        out.append(Sample(f"s{i}", "train", 1, i % 2, "c", f"{i}.png", text, missing))
    return out


def test_uint8_batches_normalise_to_the_float_pixels_bit_for_bit(backbone, tmp_path):
    samples = _samples(tmp_path, SIZES + [(50, 33), (17, 90)])
    batches = {}
    for uint8 in (False, True):
        ds = SampleDataset(
            samples, tmp_path, backbone.processor, 12, backbone.image_side,
            uint8=uint8,
        )  # fmt: skip
        batches[uint8] = next(iter(make_loader(ds, len(samples), copies=True)))
    f32, u8 = batches[False], batches[True]
    assert u8.pixel_values.dtype == torch.uint8 and u8.pixel_mask is None
    assert torch.equal(u8.image_sizes, f32.image_sizes)
    ids, am, px, pm = vision.batch_inputs(u8, torch.device("cpu"))
    assert pm is None and px.dtype == torch.float32
    assert torch.equal(px, f32.pixel_values)
    H, W = px.shape[2:]
    assert torch.equal(vision.pixel_mask(u8.image_sizes, H, W), f32.pixel_mask)
    # the dummy rows: the missing image and the image-dropped copies
    assert u8.dummy.tolist() == [False, True] + [False] * 9 + [True] * 5
    # one photo against `vilt_pixels` directly
    img = Image.open(tmp_path / "3.png").convert("RGB")
    ref = torch.from_numpy(vilt_pixels(img, backbone.processor.image_processor))
    assert torch.equal(px[3, :, : ref.shape[1], : ref.shape[2]], ref)


def test_uint8_batches_are_smaller(backbone, tmp_path):
    samples = _samples(tmp_path, SIZES)
    size = {}
    for uint8 in (False, True):
        ds = SampleDataset(
            samples, tmp_path, backbone.processor, 12, backbone.image_side,
            uint8=uint8,
        )  # fmt: skip
        b = next(iter(make_loader(ds, 4)))
        size[uint8] = sum(
            t.numel() * t.element_size()
            for t in (b.pixel_values, b.pixel_mask)
            if t is not None
        )
    # float32 + int64 mask: 4 + 8 bytes a pixel position over 3 channels
    # against 1 byte a channel: 20 bytes against 3 per canvas position
    assert size[False] * 3 == size[True] * 20


@pytest.mark.gpu
def test_padded_embedding_has_no_cuda_sync(tiny_vilt):
    backbone = load_backbone(str(tiny_vilt), 12).place(torch.device("cuda"))
    ids, am, px, pm, hw = _inputs(backbone, ["a", "b", "c", "d"], SIZES)
    ids, am, px = (t.cuda() for t in (ids, am, px))
    hw = hw.pin_memory()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        backbone.embed(ids, am, px, None, hw)  # first batch: builds the tables
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            h, mask = backbone.embed(ids, am, px, None, hw)
            q = backbone.queries(h, mask, ids.shape[1])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert q[0].shape == (4, 32) and mask.shape == (4, 12 + 1 + 24)


def test_graphed_step_inputs_of_uint8_batches_make_no_host_sync(
    tiny_vilt, tiny_prepare
):
    samples, tasks = read_prepare(tiny_prepare)
    backbone = load_backbone(str(tiny_vilt), 12)
    model = make_model(backbone, tasks, steps=2)
    train = select(samples, "train", [2])
    batch = {}
    for uint8 in (False, True):
        ds = SampleDataset(train, tasks.root, backbone.processor, 12, 32, uint8=uint8)
        # the graphed step's dummy segments take the float dummy image
        assert torch.equal(ds.dummy_image(), torch.ones(3, 32, 32))
        batch[uint8] = next(iter(make_loader(ds, 4)))
    backbone.fast_embed = True  # what place() sets on CUDA
    try:
        with sync_counter() as counter:
            new = static_inputs(model, batch[True], rows=6)
    finally:
        backbone.fast_embed = False
    # the float32 batch through HF's ViltEmbeddings (the path before uint8 loading)
    old = static_inputs(model, batch[False], rows=6)
    assert counter.syncs == []
    for key in ("index", "missing", "labels"):
        assert torch.equal(new[key], old[key])
    assert new["labels"][4:].tolist() == [-1, -1]  # rows padded to 6
    assert new["h"].shape == old["h"].shape and torch.equal(new["mask"], old["mask"])
    T = new["text_mask"].shape[1]  # the batch's text bucket
    assert (
        T
        == old["text_mask"].shape[1]
        == text_bucket(batch[True].input_ids.shape[1], 12)
    )
    q_new = backbone.queries(new["h"], new["mask"], T)
    q_old = backbone.queries(old["h"], old["mask"], T)
    for a, b in zip(q_new, q_old, strict=True):
        assert (a - b).abs().max().item() < 1e-5
