"""The prompt-aware ViLT loop: equality with HF, prompt insertion, loading errors."""

import json

import numpy as np
import pytest
import torch
from helpers import make_vilt
from PIL import Image

from pipeline.model import vision
from pipeline.model.backbone import BackboneError, load_backbone
from pipeline.model.encoder import LayerPrompt
from pipeline.sameness import RTOL


def _inputs(backbone, texts, sizes):
    """Processor inputs for texts and random images of (h, w) sizes (padded)."""
    rng = np.random.default_rng(0)
    images = [
        Image.fromarray(rng.integers(0, 255, (h, w, 3), dtype=np.uint8))
        for h, w in sizes
    ]
    out = backbone.processor(
        images=images,
        text=texts,
        padding="max_length",
        max_length=backbone.max_text_len,
        truncation=True,
        return_tensors="pt",
    )
    return (
        out["input_ids"],
        out["attention_mask"],
        out["pixel_values"],
        out["pixel_mask"],
    )


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_backbone(str(tiny_vilt), 12)


def test_loop_without_prompts_equals_vilt_forward(backbone):
    # one text empty (missing), images of two sizes so pixel_mask pads one of them
    ids, am, px, pm = _inputs(
        backbone,
        ["a red cat", "", "the big blue bird photo"],
        [(32, 32), (32, 48), (40, 32)],
    )
    assert not bool(pm.all()), "the batch must contain padded pixels"
    for seed in range(3):
        torch.manual_seed(seed)
        ref = backbone.vilt(
            input_ids=ids, attention_mask=am, pixel_values=px, pixel_mask=pm
        ).last_hidden_state
        torch.manual_seed(seed)
        h, mask = backbone.embed(ids, am, px, pm)
        out = backbone.encode(h, mask)
        # 12 text tokens, the image CLS, the largest image's 4 × 6 patches
        assert out.shape == ref.shape == (3, 12 + 1 + 24, 32)
        assert (out - ref).abs().max().item() <= 1e-6


def test_fused_attention_matches_eager(backbone):
    ids, am, px, pm = _inputs(backbone, ["a red cat", ""], [(32, 32), (32, 32)])
    torch.manual_seed(0)
    h, mask = backbone.embed(ids, am, px, pm)
    eager = backbone.encode(h, mask)
    backbone.fused_attention = True
    try:
        fused = backbone.encode(h, mask)
    finally:
        backbone.fused_attention = False
    assert (fused - eager).abs().max().item() < 1e-5


def test_queries_are_the_two_cls_outputs(backbone):
    ids, am, px, pm = _inputs(backbone, ["a red cat", "dog"], [(32, 32), (32, 32)])
    torch.manual_seed(0)
    h, mask = backbone.embed(ids, am, px, pm)
    q_t, q_v = backbone.queries(h, mask, ids.shape[1])
    out = backbone.encode(h, mask)
    # the query pass runs the last layer on the CLS rows only: a GEMM over
    # fewer rows, which some CPU kinds sum in another order (DESIGN §2, "The
    # same output"), so the same to RTOL of the outputs' scale, not bit for bit
    limit = RTOL * out.abs().max().item()
    assert (q_t - out[:, 0]).abs().max().item() <= limit
    assert (q_v - out[:, 12]).abs().max().item() <= limit
    assert (q_v - out[:, 11]).abs().max().item() > 1e-2  # row 12 is the image CLS


def test_prefix_prompts_switched_off_change_nothing(backbone):
    ids, am, px, pm = _inputs(backbone, ["a red cat", "dog"], [(32, 32), (32, 32)])
    torch.manual_seed(0)
    h, mask = backbone.embed(ids, am, px, pm)
    plain = backbone.encode(h, mask)
    kv = torch.randn(2, 4, 32)
    off = {0: LayerPrompt(mask=torch.zeros(2, 4, dtype=torch.bool), keys=kv, values=kv)}
    assert torch.allclose(backbone.encode(h, mask, off), plain, atol=1e-6)
    on = {0: LayerPrompt(mask=torch.ones(2, 4, dtype=torch.bool), keys=kv, values=kv)}
    changed = backbone.encode(h, mask, on)
    assert changed.shape == plain.shape
    assert (changed - plain).abs().max().item() > 1e-3


def test_input_prompts_keep_the_output_layout(backbone):
    ids, am, px, pm = _inputs(backbone, ["a red cat", "dog"], [(32, 32), (32, 32)])
    torch.manual_seed(0)
    h, mask = backbone.embed(ids, am, px, pm)
    tokens = torch.randn(2, 6, 32, requires_grad=True)
    prompts = {
        i: LayerPrompt(mask=torch.ones(2, 6, dtype=torch.bool), tokens=tokens)
        for i in (0, 1)
    }
    out = backbone.encode(h, mask, prompts)
    assert out.shape == h.shape
    (out[:, 0] * torch.randn(32)).sum().backward()  # a plain sum of LN output is flat
    assert tokens.grad is not None and tokens.grad.abs().sum() > 0
    assert all(p.grad is None for p in backbone.parameters())


def test_accumulated_input_prompts_over_six_layers(tmp_path):
    # MAP's and MSP's `keep` prompts: each layer's tokens go in front of the
    # earlier ones, each with its own per-sample mask. Against a loop that builds
    # every layer's attention bias afresh, for many sequence lengths (the bias
    # cache once keyed a freed mask's id, which came back two layers later:
    # "size of tensor a (222) must match b (126)" on Food101's MSP)
    bb = load_backbone(str(make_vilt(tmp_path / "vilt", layers=6)), 12)
    gen = torch.Generator().manual_seed(0)
    B, D, L = 4, 32, 16
    tokens = torch.randn(6, B, L, D, generator=gen)
    masks = [torch.rand(B, L, generator=gen) > 0.3 for _ in range(6)]
    prompts = {
        j: LayerPrompt(mask=masks[j], tokens=tokens[j], keep=True) for j in range(6)
    }
    for n in range(20, 45):
        h = torch.randn(B, n, D, generator=gen)
        mask = torch.ones(B, n, dtype=torch.bool)
        mask[1, n - 5 :] = False
        x, key_mask = h, mask
        with torch.no_grad():
            for j, layer in enumerate(bb.vilt.encoder.layer):
                x = torch.cat([tokens[j], x], 1)
                key_mask = torch.cat([masks[j], key_mask], 1)
                x = bb._layer(j, layer, x, bb._bias(key_mask, x.dtype), None)
            want = bb.vilt.layernorm(x)[:, 6 * L :]
            got = bb.encode(h, mask, prompts)
        assert got.shape == (B, n, D)
        assert torch.equal(got, want), n


def test_long_text_interpolates_positions(tiny_vilt):
    backbone = load_backbone(str(tiny_vilt), 50)
    table = backbone.vilt.embeddings.text_embeddings.position_embeddings.weight
    assert table.shape == (50, 32)
    ids, am, px, pm = _inputs(backbone, ["a red cat " * 20], [(32, 32)])
    assert ids.shape == (1, 50)
    torch.manual_seed(0)
    ref = backbone.vilt(
        input_ids=ids, attention_mask=am, pixel_values=px, pixel_mask=pm
    ).last_hidden_state
    torch.manual_seed(0)
    out = backbone.encode(*backbone.embed(ids, am, px, pm))
    assert out.shape == (1, 50 + 1 + 16, 32)
    assert (out - ref).abs().max().item() <= 1e-6


def test_backbone_errors_name_the_folder(tmp_path):
    with pytest.raises(BackboneError, match=r"model.backbone '.*nope': no such folder"):
        load_backbone(str(tmp_path / "nope"), 40)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(
        BackboneError, match=r"'.*empty': not a ViLT folder \(no config"
    ):
        load_backbone(str(empty), 40)
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(
        BackboneError,
        match=r"not a ViLT \(config.json model_type is "
        r"'bert'\)",
    ):
        load_backbone(str(bert), 40)
    with pytest.raises(BackboneError, match=r"no such folder, and no hub model"):
        load_backbone("nobody/no-such-vilt", 40)


def test_damaged_weights_are_one_error(tmp_path):
    folder = make_vilt(tmp_path / "vilt")
    (folder / "model.safetensors").write_bytes(b"\0" * 100)
    with pytest.raises(BackboneError, match=r"cannot load the ViLT model or processor"):
        load_backbone(str(folder), 40)


@pytest.mark.parametrize("side", [32, 48])
def test_full_image_embedding_matches_hf_up_to_patch_order(backbone, side):
    # the CUDA fast path keeps patches in raster order; HF shuffles them: the
    # text and CLS outputs (what the model reads) must agree
    ids, am, px, pm = _inputs(backbone, ["a red cat", ""], [(side, side)] * 2)
    assert vision.full_images(backbone.vilt, pm)
    torch.manual_seed(0)
    h, mask = backbone.embed(ids, am, px, pm)
    ref = backbone.encode(h, mask)
    h2, mask2 = backbone.embed_full(ids, am, px)
    assert torch.equal(mask2, mask)
    out = backbone.encode(h2, mask2)
    T = ids.shape[1]
    assert out.shape == ref.shape
    assert (out[:, : T + 1] - ref[:, : T + 1]).abs().max().item() < 1e-5
    # patch tokens: the same multiset per sample and feature
    a, b = out[:, T + 1 :].sort(1).values, ref[:, T + 1 :].sort(1).values
    assert (a - b).abs().max().item() < 1e-5


def test_padded_images_are_not_full_images(backbone):
    # the legacy path's rule: a padded batch is not one of full images
    _, _, _, pm = _inputs(backbone, ["a", "b"], [(32, 32), (32, 48)])
    assert not vision.full_images(backbone.vilt, pm)
