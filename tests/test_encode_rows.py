"""`Backbone.encode(read=...)`: the last layer and the final LayerNorm only for
the rows a caller reads, against the full encode, for every method's passes."""

import pytest
import torch
import torch.nn.functional as F
from helpers import make_model, random_head

from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.model.backbone import load_backbone
from pipeline.model.encoder import Backbone, LayerPrompt
from pipeline.model.losses import loss as batch_loss
from pipeline.model.network import build_cache
from pipeline.model.rows import read_ranges, take_rows

T = 12  # model.max_text_len of the fixtures
FULL_ENCODE = Backbone.encode

# every method and form whose passes call `encode`
METHODS = [
    {},
    {"position": "input"},
    {"pools": "shared"},
    {"method": "rebq"},
    {"method": "map", "position": "input"},
    {"method": "msp", "position": "input"},
    {"method": "l2p", "pool_size": 4, "top_n": 2, "layers": (0,)},
    {"method": "l2p", "pool_size": 4, "top_n": 2, "layers": (0, 1)},
    {"method": "l2p", "pool_size": 4, "top_n": 2, "position": "input"},
    {"method": "dualprompt", "g_layers": (0,), "g_length": 2, "layers": (1,)},
]


@pytest.fixture(scope="module")
def tiny(tiny_vilt, tiny_prepare):
    samples, tasks = read_prepare(tiny_prepare)
    return load_backbone(str(tiny_vilt), T), samples, tasks


def _full_then_rows(calls):
    """`Backbone.encode` computing every row, then taking the read ones (the
    encode before `read`), recording each call's `read`."""

    def encode(self, h, mask, prompts=None, prompt_outputs=False, read=None):
        calls.append(read)
        out = FULL_ENCODE(self, h, mask, prompts, prompt_outputs)
        return out if read is None else take_rows(out, read_ranges(read, out.shape[1]))

    return encode


def _cosines(a, b):
    return F.cosine_similarity(a.flatten(1), b.flatten(1), dim=-1)


def _run(model, batch, cache, task):
    """The training loss (parts, gradients) and the extraction's features."""
    loss, parts = batch_loss(model, batch, cache, task, 0.5)
    loss.backward()
    grads = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            grads[name], p.grad = p.grad.clone(), None
    with torch.no_grad():
        x, logits = model.features(batch)
    return parts, grads, x, logits


@pytest.mark.parametrize("prompt", METHODS, ids=str)
def test_read_rows_equal_the_full_encode_for_every_method(tiny, prompt, monkeypatch):
    backbone, samples, tasks = tiny
    torch.manual_seed(0)
    model = make_model(backbone, tasks, steps=2, **prompt)
    random_head(model)
    train = select(samples, "train", [2])
    ds = SampleDataset(train, tasks.root, backbone.processor, T, backbone.image_side)
    cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    batches = list(make_loader(ds, 4, copies=True))
    assert any(len(b.complete) and (b.missing != 0).any() for b in batches)
    trimmed = [_run(model, b, cache, 2) for b in batches]
    calls = []
    monkeypatch.setattr(Backbone, "encode", _full_then_rows(calls))
    full = [_run(model, b, cache, 2) for b in batches]
    assert calls and None not in calls  # every pass reads rows
    for (parts_t, grads_t, x_t, l_t), (parts_f, grads_f, x_f, l_f) in zip(
        trimmed, full, strict=True
    ):
        assert _cosines(x_t, x_f).min().item() >= 0.9999
        torch.testing.assert_close(x_t, x_f, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(l_t, l_f, rtol=1e-5, atol=1e-6)
        assert torch.equal(l_t.argmax(-1), l_f.argmax(-1))
        for key in ("ce", "aux", "correct", "aux_rows"):
            assert parts_t[key].item() == pytest.approx(
                parts_f[key].item(), rel=1e-5, abs=1e-6
            ), key
        assert grads_t.keys() == grads_f.keys()
        for name, grad in grads_f.items():
            torch.testing.assert_close(grads_t[name], grad, rtol=1e-4, atol=1e-6)


def _embedded(tiny, n=3):
    backbone, samples, tasks = tiny
    train = select(samples, "train", [1])[:n]
    ds = SampleDataset(train, tasks.root, backbone.processor, T, backbone.image_side)
    b = next(iter(make_loader(ds, n)))
    torch.manual_seed(0)
    return backbone, *backbone.embed(
        b.input_ids, b.attention_mask, b.pixel_values, b.pixel_mask
    )


@pytest.mark.parametrize("read", [(0,), (0, T), (T, 0, 1, 2), slice(3, 9), (-1,)])
def test_read_positions_come_back_in_reads_order(tiny, read):
    backbone, h, mask = _embedded(tiny)
    with torch.no_grad():
        full = backbone.encode(h, mask)
        rows = backbone.encode(h, mask, read=read)
    idx = list(range(full.shape[1]))[read] if isinstance(read, slice) else read
    assert rows.shape == (h.shape[0], len(idx), h.shape[2])
    want = full[:, list(idx)]
    assert _cosines(rows.transpose(0, 1), want.transpose(0, 1)).min() >= 0.9999
    torch.testing.assert_close(rows, want, rtol=1e-5, atol=1e-6)


def test_read_counts_input_prompt_tokens_only_with_prompt_outputs(tiny):
    backbone, h, mask = _embedded(tiny)
    B, _, D = h.shape
    g = torch.Generator().manual_seed(2)
    last = backbone.num_layers - 1
    tokens = torch.randn(B, 3, D, generator=g)
    prompts = {
        last: LayerPrompt(mask=torch.ones(B, 3, dtype=torch.bool), tokens=tokens)
    }
    with torch.no_grad():
        full = backbone.encode(h, mask, prompts, prompt_outputs=True)
        with_prompts = backbone.encode(h, mask, prompts, True, slice(0, 4))
        without = backbone.encode(h, mask, prompts, read=(0, T))
    assert full.shape[1] == 3 + h.shape[1]
    torch.testing.assert_close(with_prompts, full[:, :4], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(without, full[:, [3, 3 + T]], rtol=1e-5, atol=1e-6)


def test_read_ranges_merges_runs_and_refuses_what_is_not_there():
    assert read_ranges((0, 1, 2, 7, 8, 3), 10) == [(0, 3), (7, 9), (3, 4)]
    assert read_ranges((0, 5), 10, offset=2) == [(2, 3), (7, 8)]
    assert read_ranges((-1,), 10) == [(9, 10)]
    assert read_ranges(slice(2, None), 10, offset=1) == [(3, 11)]
    assert read_ranges((), 10) == [(0, 0)]
    with pytest.raises(IndexError, match="read position 10 outside an output of 10"):
        read_ranges((10,), 10)
    with pytest.raises(ValueError, match="slices of step 1 only"):
        read_ranges(slice(0, 10, 2), 10)


# ---------------------------------------------------------------- no masked key


@pytest.mark.parametrize("fused", [False, True], ids=["eager", "sdpa"])
def test_no_mask_equals_a_mask_of_all_true(tiny, fused, monkeypatch):
    backbone, h, _ = _embedded(tiny)
    monkeypatch.setattr(backbone, "fused_attention", fused)
    B, N, D = h.shape
    ones = torch.ones(B, N, dtype=torch.bool)
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(B, 2, D, generator=g)
    prompts = {0: LayerPrompt(mask=torch.ones(B, 2, dtype=torch.bool), keys=keys,
                              values=keys.flip(1))}  # fmt: skip
    with torch.no_grad():
        for p in (None, prompts):
            want = backbone.encode(h, ones, p, read=(0, T))
            got = backbone.encode(h, None, p, read=(0, T))
            if fused:
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            else:  # adding a zero bias is exact
                assert torch.equal(got, want)


def test_no_masked_keys_reads_host_masks_and_image_sizes(tiny):
    backbone = tiny[0]
    full, padded = torch.ones(2, 5, dtype=torch.int64), torch.ones(2, 5).long()
    padded[1, 4] = 0
    same = torch.tensor([[32, 32], [32, 32]])
    transposed = torch.tensor([[16, 32], [32, 16]])  # one patch count: 8
    other = torch.tensor([[32, 32], [16, 32]])  # 16 and 8 patches
    assert backbone.no_masked_keys(full, same)
    assert backbone.no_masked_keys(full, transposed)
    assert not backbone.no_masked_keys(padded, same)
    assert not backbone.no_masked_keys(full, other)
    assert not backbone.no_masked_keys(full, None)


def test_a_batch_without_padding_gets_its_queries_without_a_mask(tiny, monkeypatch):
    from pipeline.model.queries import batch_queries
    from pipeline.model.vision import batch_inputs

    backbone, samples, tasks = tiny
    one = select(samples, "train", [1])[:1]
    ds = SampleDataset(one, tasks.root, backbone.processor, T, backbone.image_side)
    batch = next(iter(make_loader(ds, 1)))
    assert backbone.no_masked_keys(batch.attention_mask, batch.image_sizes)
    masks = []
    encode = Backbone.encode

    def spy(self, h, mask, *args, **kw):
        masks.append(mask)
        return encode(self, h, mask, *args, **kw)

    torch.manual_seed(0)
    ids, am, px, pm = batch_inputs(batch, backbone.device)
    h, mask = backbone.embed(ids, am, px, pm, batch.image_sizes)
    with torch.no_grad():
        want = backbone.queries(h, mask, ids.shape[1])
    monkeypatch.setattr(Backbone, "encode", spy)
    torch.manual_seed(0)
    got = batch_queries(backbone, batch)
    assert masks == [None]
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)
