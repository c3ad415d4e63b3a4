"""The static-shape training step (`static_loss`) and its CUDA-graph replay."""

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import make_model, random_head, two_epochs

from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.model import losses
from pipeline.model.backbone import load_backbone
from pipeline.model.device import autocast
from pipeline.model.graphs import set_lr
from pipeline.model.losses import (
    DummySegments,
    dummy_segments,
    splice_copies,
    static_inputs,
    static_loss,
)
from pipeline.model.losses import loss as batch_loss
from pipeline.model.network import build_cache

T = 12  # model.max_text_len of the fixtures


@pytest.fixture(scope="module")
def data(tiny_prepare):
    return read_prepare(tiny_prepare)


def _setup(tiny_vilt, data, device="cpu", task=2, **prompt):
    samples, tasks = data
    backbone = load_backbone(str(tiny_vilt), T).place(torch.device(device))
    model = make_model(backbone, tasks, steps=task, **prompt)
    random_head(model)
    model.to(backbone.device)
    train = select(samples, "train", [task])
    ds = SampleDataset(train, tasks.root, backbone.processor, T, backbone.image_side)
    with autocast(backbone.device):
        cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    dummy = dummy_segments(backbone, ds.empty_ids, ds.empty_mask, ds.dummy_image())
    return model, ds, cache, dummy


def _static(model, batch, cache, dummy, task, rows=None, weight=0.01):
    return static_loss(
        model, static_inputs(model, batch, rows), cache, dummy, task, weight
    )


def _grads(model):
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[name] = p.grad.clone()
            p.grad = None
    return out


def _widen(batch, i):
    """Batch i with its real images 0, 16 or 32 pixels wider (so with more
    patches), as `Collate` makes a batch of larger images: dummy images keep
    their size, padded with masked pixels (rows after the samples are the
    copies: text-dropped ones with real images, then image-dropped ones)."""
    w = 16 * (i % 3)
    c = len(batch.complete)
    dummy = torch.cat(
        [
            batch.missing == 2,
            torch.zeros(c, dtype=torch.bool),
            torch.ones(c, dtype=torch.bool),
        ]
    )[: batch.pixel_mask.shape[0]]
    mask = F.pad(batch.pixel_mask, (0, w), value=1)
    mask[dummy, :, mask.shape[2] - w :] = 0
    return dataclasses.replace(
        batch, pixel_values=F.pad(batch.pixel_values, (0, w)), pixel_mask=mask
    )


def _compare(model, ds, cache, dummy, task, widen=False):
    """Dynamic vs static loss, parts and gradients over `ds` in batches of 4
    (`widen`: images padded, so ViLT adds masked padding patches); returns the
    (has complete, has missing) kinds of batch seen."""
    kinds = set()
    with_copies = make_loader(ds, 4, copies=True)
    plain = make_loader(ds, 4, copies=False)
    for i, (b_dyn, b_st) in enumerate(zip(with_copies, plain, strict=True)):
        if widen:
            b_dyn, b_st = _widen(b_dyn, i), _widen(b_st, i)
        kinds.add((len(b_dyn.complete) > 0, bool((b_dyn.missing != 0).any())))
        loss_d, parts_d = batch_loss(model, b_dyn, cache, task, 0.5)
        loss_d.backward()
        grads_d = _grads(model)
        loss_s, parts_s = _static(model, b_st, cache, dummy, task, weight=0.5)
        loss_s.backward()
        grads_s = _grads(model)
        assert loss_s.item() == pytest.approx(loss_d.item(), rel=1e-5, abs=1e-6)
        for key in ("ce", "aux", "correct", "aux_rows"):
            assert parts_s[key].item() == pytest.approx(
                parts_d[key].item(), rel=1e-5, abs=1e-6
            ), key
        assert grads_s.keys() == grads_d.keys()
        for name, g in grads_d.items():
            torch.testing.assert_close(grads_s[name], g, rtol=1e-4, atol=1e-6)
    return kinds


@pytest.mark.parametrize(
    "prompt",
    [
        {},
        {"pools": "shared"},
        {"pools": "vector"},
        {"position": "input"},
        {"method": "rebq"},
    ],
    ids=str,
)
def test_static_loss_equals_the_dynamic_loss(tiny_vilt, data, prompt):
    task = 2
    model, ds, cache, dummy = _setup(tiny_vilt, data, task=task, **prompt)
    kinds = _compare(model, ds, cache, dummy, task)
    missing_only = [s for s in ds.samples if s.missing]
    ds_m = SampleDataset(
        missing_only, data[1].root, model.backbone.processor, T, ds.image_side
    )
    cache_m = build_cache(model, make_loader(ds_m, 16, copies=True), len(ds_m))
    kinds |= _compare(model, ds_m, cache_m, dummy, task)
    assert kinds == {(True, True), (False, True)}


def test_static_loss_equals_the_dynamic_loss_for_padded_images(tiny_vilt, data):
    model, ds, cache, dummy = _setup(tiny_vilt, data, task=2)
    assert _compare(model, ds, cache, dummy, 2, widen=True) == {(True, True)}


def test_text_is_padded_to_a_bucket_of_the_batchs_longest(tiny_vilt, data, monkeypatch):
    """Text padded to the batch's longest rounded up to 4 tokens: the loss
    parts and gradients equal those of text padded to max_text_len (12), the
    static step of before, and the eager loss (`_compare`)."""
    task = 2
    model, ds, cache, dummy = _setup(tiny_vilt, data, task=task)
    monkeypatch.setattr(losses, "TEXT_BUCKET", 4)
    widths = set()
    for batch in make_loader(ds, 4, copies=False):
        longest = batch.input_ids.shape[1]
        inputs = static_inputs(model, batch)
        T_b = inputs["text_mask"].shape[1]
        assert T_b == min(T, -(-longest // 4) * 4) and T_b >= longest
        widths.add(T_b)
        loss_b, parts_b = static_loss(model, inputs, cache, dummy, task, 0.5)
        loss_b.backward()
        grads_b = _grads(model)
        with monkeypatch.context() as m:
            m.setattr(losses, "TEXT_BUCKET", 64)  # min(12, 64): max_text_len
            padded = static_inputs(model, batch)
        assert padded["text_mask"].shape[1] == T
        assert padded["h"].shape[1] - T == inputs["h"].shape[1] - T_b
        loss_p, parts_p = static_loss(model, padded, cache, dummy, task, 0.5)
        loss_p.backward()
        grads_p = _grads(model)
        assert loss_b.item() == pytest.approx(loss_p.item(), rel=1e-5, abs=1e-6)
        for key in ("ce", "aux", "correct", "aux_rows"):
            assert parts_b[key].item() == pytest.approx(
                parts_p[key].item(), rel=1e-5, abs=1e-6
            ), key
        for name, g in grads_p.items():
            torch.testing.assert_close(grads_b[name], g, rtol=1e-4, atol=1e-6)
    assert min(widths) < T  # some batch is shorter than max_text_len
    assert _compare(model, ds, cache, dummy, task) == {(True, True)}


def test_text_bucket_rounds_up_to_max_text_len():
    got = [losses.text_bucket(n, 40) for n in (1, 8, 9, 15, 33, 40)]
    assert got == [8, 8, 16, 16, 40, 40]
    assert losses.text_bucket(13, 12) == 12


def test_padding_rows_count_for_nothing(tiny_vilt, data):
    task = 2
    model, ds, cache, dummy = _setup(tiny_vilt, data, task=task)
    batch = next(iter(make_loader(ds, 3, copies=False)))
    loss, parts = _static(model, batch, cache, dummy, task)
    loss.backward()
    grads = _grads(model)
    loss_p, parts_p = _static(model, batch, cache, dummy, task, rows=6)
    loss_p.backward()
    grads_p = _grads(model)
    assert loss_p.item() == pytest.approx(loss.item(), rel=1e-6)
    for key in parts:
        assert parts_p[key].item() == pytest.approx(parts[key].item(), rel=1e-6)
    for name, g in grads.items():
        torch.testing.assert_close(grads_p[name], g, rtol=1e-5, atol=1e-7)


def test_without_copies_there_is_no_reconstruction_loss(tiny_vilt, data):
    model, ds, cache, _ = _setup(tiny_vilt, data, task=1)
    batch = next(iter(make_loader(ds, 8, copies=False)))
    assert (batch.missing == 0).any()
    _, parts = _static(model, batch, cache, None, 1)
    assert parts["aux"].item() == 0.0 and parts["aux_rows"].item() == 0


def testsplice_copies_pads_the_dummy_image_to_the_batch():
    B, Tt, D = 3, 4, 2
    dummy = DummySegments(
        text=torch.full((Tt, D), 7.0),
        text_mask=torch.tensor([True, True, False, False]),
        image=torch.full((3, D), 9.0),  # image CLS + 2 patches
    )
    N = Tt + 5  # the batch's images have 4 patches
    h = torch.arange(B * N * D, dtype=torch.float32).view(B, N, D)
    mask = torch.ones(B, N, dtype=torch.bool)
    complete = torch.tensor([True, False, True])
    h_a, m_a, h_b, m_b = splice_copies(h, mask, Tt, complete, dummy)
    for r in (0, 2):
        assert torch.equal(h_a[r, :Tt], dummy.text)
        assert torch.equal(m_a[r, :Tt], dummy.text_mask)
        assert torch.equal(h_a[r, Tt:], h[r, Tt:]) and m_a[r, Tt:].all()
        assert torch.equal(h_b[r, :Tt], h[r, :Tt])
        assert torch.equal(h_b[r, Tt : Tt + 3], dummy.image)
        assert torch.equal(h_b[r, Tt + 3 :], torch.zeros(2, D))
        assert m_b[r].tolist() == [True] * (Tt + 3) + [False] * 2
    for out in (h_a, h_b):
        assert torch.equal(out[1], h[1])
    assert m_a[1].all() and m_b[1].all()
    with pytest.raises(ValueError, match=r"batch image tokens \(2\) fewer"):
        splice_copies(h[:, : Tt + 2], mask[:, : Tt + 2], Tt, complete, dummy)


def test_set_lr_sets_floats_and_fills_tensors():
    p = torch.nn.Parameter(torch.zeros(2))
    q = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD(
        [{"params": [p], "lr": 1.0}, {"params": [q], "lr": torch.tensor(1.0)}]
    )
    tensor_lr = opt.param_groups[1]["lr"]
    set_lr(opt, [0.25, 0.5])
    assert opt.param_groups[0]["lr"] == 0.25
    assert opt.param_groups[1]["lr"] is tensor_lr and tensor_lr.item() == 0.5
    with pytest.raises(ValueError):
        set_lr(opt, [0.1])


@pytest.mark.gpu
def test_graphed_steps_train_like_eager_steps(tiny_vilt, data):
    """Replayed graphs (one per batch shape, the short last batch padded) give
    the parameters of the same steps run eagerly; the warm-up before each
    capture leaves no trace. Batches come in three image widths (three
    patch counts), one more than the graphs allowed, so one shape runs eagerly
    among the graphs."""
    task = 2
    results = []
    for graphed in (False, True):
        torch.manual_seed(0)  # ViLT's patch order for padded images
        model, ds, cache, dummy = _setup(tiny_vilt, data, "cuda", task=task)
        batches = [_widen(b, i) for i, b in enumerate(make_loader(ds, 4, copies=False))]
        assert len(batches) == 3
        params, ces, runner = two_epochs(model, cache, dummy, task, batches, 4, graphed)
        if graphed:
            assert len(runner.graphs) == 2 and runner.eager_steps == 2
        results.append((params, ces))
    (p_eager, ce_eager), (p_graph, ce_graph) = results
    assert ce_graph == pytest.approx(ce_eager, rel=1e-3, abs=1e-4)
    for a, b in zip(p_eager, p_graph, strict=True):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4)


def test_wide_photos_with_fewer_tokens_than_the_dummy_image(tiny_vilt, data, tmp_path):
    """Photos wider than 1333:800 lose rows of patches to the processor's cap on
    the longer side: a batch of them has fewer image tokens than the square
    dummy image. Padded with masked tokens, the static loss equals the dynamic
    one; unpadded, the copies cannot be spliced."""
    from PIL import Image

    from pipeline.data.samples import Sample

    model, ds, cache, dummy = _setup(tiny_vilt, data, task=1)
    rng = np.random.default_rng(0)
    wide = []
    for i, s in enumerate(ds.samples[:4]):
        name = f"wide{i}.png"
        pixels = rng.integers(0, 255, (24, 96, 3), dtype=np.uint8)  # 4:1
        Image.fromarray(pixels).save(tmp_path / name)
        wide.append(
            Sample(s.id, s.split, s.task, s.label, s.class_name, name, s.text, 0)
        )
    backbone = model.backbone
    ds_w = SampleDataset(wide, tmp_path, backbone.processor, T, backbone.image_side)
    b_dyn = next(iter(make_loader(ds_w, 4, copies=True)))
    b_st = next(iter(make_loader(ds_w, 4, copies=False)))
    n_dummy = dummy.image.shape[0]
    assert b_st.pixel_mask.shape[1:] == (8, 48)  # 1 × 6 patches < the dummy's 16
    with pytest.raises(ValueError, match="fewer than the dummy image's"):
        static_loss(model, static_inputs(model, b_st), cache, dummy, 1, 0.5)
    inputs = static_inputs(model, b_st, min_image_tokens=n_dummy)
    assert inputs["h"].shape[1] == inputs["text_mask"].shape[1] + n_dummy
    loss_s, parts_s = static_loss(model, inputs, cache, dummy, 1, 0.5)
    loss_d, parts_d = batch_loss(model, b_dyn, cache, 1, 0.5)
    assert loss_s.item() == pytest.approx(loss_d.item(), rel=1e-5, abs=1e-6)
    assert parts_s["aux_rows"].item() == parts_d["aux_rows"].item() == 4
