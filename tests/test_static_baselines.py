"""Every trained method on the static (CUDA-graph) training step: MAP, MSP,
L2P (input and prefix), DualPrompt give `loss`'s parts and gradients from
`static_loss`, short batches padded with label −1 included; several static
steps (clipped or not) train as the eager ones do, for all six methods; a
static step reads nothing back on the host and copies nothing blocking."""

from __future__ import annotations

import contextlib
import sys

import pytest
import torch
from helpers import ROOT, make_model, random_head, sync_counter

from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.methods.registry import METHODS
from pipeline.model.backbone import load_backbone
from pipeline.model.device import autocast
from pipeline.model.losses import dummy_segments, static_inputs, static_loss
from pipeline.model.losses import loss as batch_loss
from pipeline.model.network import build_cache
from pipeline.model.optim import optimiser_for
from pipeline.model.train import make_step
from pipeline.params import TuneParams

T = 12  # model.max_text_len of the fixtures
PROJECT = str(ROOT)  # the code `blocking_transfers` audits
TASK = 2  # DualPrompt's E-prompt of task 1 frozen, task 2's training
L2P = dict(method="l2p", pool_size=4, length=4, top_n=2, layers=(0,))
# each method's prompt params on the tiny ViLT (2 layers, hidden 32)
ROWS = {
    "pal": {},
    "rebq": {"method": "rebq"},
    "map": {"method": "map", "length": 4, "layers": (0, 1)},
    "map_input": {"method": "map", "length": 4, "layers": (0, 1), "position": "input"},
    "msp": {"method": "msp", "length": 4, "layers": (0, 1)},
    "msp_input": {"method": "msp", "length": 4, "layers": (0, 1), "position": "input"},
    "l2p": {**L2P, "position": "input"},
    "l2p_pp": L2P,
    "dualprompt": dict(
        method="dualprompt", g_layers=(0,), g_length=4, layers=(1,), length=4
    ),
}
BASELINES = ["map", "map_input", "msp", "msp_input", "l2p", "l2p_pp", "dualprompt"]
TRAINED = ["pal", "rebq", "map", "msp", "l2p", "dualprompt"]  # one row each


@pytest.fixture(scope="module")
def data(tiny_prepare):
    return read_prepare(tiny_prepare)


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_backbone(str(tiny_vilt), T)


def _setup(backbone, data, row):
    """The model of `row` at task 2 with random head tensors (so the CE's
    gradient reaches every prompt), task 2's training set (uint8 pixels, as
    `pal tune` loads them), its query cache and the embedded dummy inputs."""
    samples, tasks = data
    model = make_model(backbone, tasks, steps=TASK, **ROWS[row])
    random_head(model)
    model.to(backbone.device)
    train = select(samples, "train", [TASK])
    ds = SampleDataset(
        train, tasks.root, backbone.processor, T, backbone.image_side, uint8=True
    )
    with autocast(backbone.device):  # bf16 on CUDA, as `pal tune`'s
        cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    dummy = dummy_segments(backbone, ds.empty_ids, ds.empty_mask, ds.dummy_image())
    return model, ds, cache, dummy


def _grads(model):
    out = {}
    for name, p in model.named_parameters():
        if p.requires_grad:
            out[name] = None if p.grad is None else p.grad.clone()
            p.grad = None
    return out


@pytest.mark.parametrize("row", BASELINES)
def test_static_loss_equals_the_eager_loss(backbone, data, row):
    """Batches of 5 of task 2's 12 samples: two full ones and a short one of 2
    padded to 5 rows (label −1), whose padding counts for nothing."""
    model, ds, cache, _ = _setup(backbone, data, row)
    assert type(model.prompts).graphable
    # MAP's input tokens start as rows of ones and pile up over the layers: the
    # text padded to max_text_len sums in another order, and a few of P's 768
    # gradient elements differ by up to 3e-4 relative (float32 noise that
    # depends on the CPU's threads); the others hold to PAL's 1e-4
    rtol = 1e-3 if row == "map_input" else 1e-4
    sizes = []
    for batch in make_loader(ds, 5, copies=False):
        sizes.append(batch.n)
        loss_e, parts_e = batch_loss(model, batch, cache, TASK, 0.5)
        loss_e.backward()
        grads_e = _grads(model)
        inputs = static_inputs(model, batch, rows=5)
        assert inputs["labels"].tolist()[batch.n :] == [-1] * (5 - batch.n)
        loss_s, parts_s = static_loss(model, inputs, cache, None, TASK, 0.5)
        loss_s.backward()
        grads_s = _grads(model)
        assert loss_s.item() == pytest.approx(loss_e.item(), rel=1e-5, abs=1e-6)
        for key in ("ce", "aux", "aux_rows", "correct"):
            assert parts_s[key].item() == pytest.approx(
                parts_e[key].item(), rel=1e-5, abs=1e-6
            ), key
        assert grads_s.keys() == grads_e.keys()
        assert [g is None for g in grads_s.values()] == [
            g is None for g in grads_e.values()
        ]
        for name, g in grads_e.items():
            if g is not None:
                torch.testing.assert_close(grads_s[name], g, rtol=rtol, atol=1e-6)
    assert sizes == [5, 5, 2]
    trained = [g for g in grads_e.values() if g is not None]
    assert trained and all(g.abs().sum() > 0 for g in trained)


def test_the_pull_and_orthogonality_rows_are_the_valid_ones(backbone, data):
    """aux_rows counts real rows, not the padded batch's: the epoch's mean of
    the auxiliary loss weighs each batch by them."""
    counts = {}
    for row in ("msp", "l2p", "dualprompt", "map"):
        model, ds, cache, _ = _setup(backbone, data, row)
        batch = next(iter(make_loader(ds, 3, copies=False)))
        _, parts = static_loss(
            model, static_inputs(model, batch, rows=8), cache, None, TASK, 1.0
        )
        counts[row] = parts["aux_rows"].item()
    assert counts == {"msp": 3, "l2p": 3, "dualprompt": 3, "map": 0}


def _steps(backbone, data, row, static, clip_norm, n_steps=3):
    """The trainable tensors after `n_steps` steps of `make_step` (the eager
    step on the loader's batches with copies, or the static one, unrecorded,
    on batches without), and each step's parts."""
    model, ds, cache, dummy = _setup(backbone, data, row)
    tune_p = TuneParams(lr=3e-3, head_lr=3e-3, clip_norm=clip_norm, device="cpu")
    optimiser, _ = optimiser_for(model, tune_p, capturable=static)
    dummy = dummy if static and model.prompts.copies else None
    step = make_step(
        model, optimiser, cache, TASK, 0.5, static, dummy, clip_norm=clip_norm
    )
    copies = not static and model.prompts.copies  # as `pal tune`'s loader
    batches = list(make_loader(ds, 4, copies=copies))[:n_steps]
    parts = [{k: v.item() for k, v in step(b).items()} for b in batches]
    assert len(parts) == n_steps
    return [p.detach().clone() for p in model.trainable_parameters()], parts


@pytest.mark.parametrize("clip_norm", [None, 0.05], ids=["unclipped", "clipped"])
@pytest.mark.parametrize("row", TRAINED)
def test_static_steps_train_like_eager_steps(backbone, data, row, clip_norm):
    """Three AdamW steps (lr 3e-3): the tensors and every step's parts agree.
    At clip norm 0.05 every step is clipped (the gradients' norm is larger),
    so the clipped and unclipped runs differ."""
    eager, parts_e = _steps(backbone, data, row, False, clip_norm)
    static, parts_s = _steps(backbone, data, row, True, clip_norm)
    for pe, ps in zip(parts_e, parts_s, strict=True):
        assert ps == pytest.approx(pe, rel=1e-4, abs=1e-5)
    assert len(eager) == len(static) > 0
    for a, b in zip(eager, static, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=2e-5)
    if clip_norm is not None:
        unclipped, _ = _steps(backbone, data, row, True, None, n_steps=1)
        clipped, _ = _steps(backbone, data, row, True, clip_norm, n_steps=1)
        assert any(
            not torch.equal(a, b) for a, b in zip(unclipped, clipped, strict=True)
        )


@contextlib.contextmanager
def blocking_transfers():
    """Records (function, line) of each `Tensor.to` call in the project's
    code that names a device (a device, a string or a tensor whose device it
    takes) without `non_blocking=True`: on CUDA such a copy from the host
    makes the host wait. Left out: torch's own calls (clipping moves each
    norm to the first one's device, a copy on the device) and those of
    `vision.batch_inputs`, which asks for non_blocking on CUDA only (on the
    CPU a copy to the CPU does nothing)."""
    real = torch.Tensor.to
    seen: list[tuple[str, int]] = []

    def to(self, *args, **kwargs):
        device = kwargs.get("device")
        for a in args:
            if isinstance(a, torch.device | str):
                device = a
            elif isinstance(a, torch.Tensor):
                device = a.device
        flags = [a for a in args if isinstance(a, bool)]
        if device is not None and not kwargs.get("non_blocking", any(flags[:1])):
            frame = sys._getframe(1)
            while frame.f_code.co_name == "<genexpr>":
                frame = frame.f_back
            code = frame.f_code
            ours = (
                code.co_filename.startswith(PROJECT) and ".venv" not in code.co_filename
            )
            if ours and code.co_name != "batch_inputs":
                seen.append((code.co_name, frame.f_lineno))
        return real(self, *args, **kwargs)

    torch.Tensor.to = to
    try:
        yield seen
    finally:
        torch.Tensor.to = real


def _static_step(row, backbone, data, clip_norm=0.05):
    """The static step as `pal tune` graphs it (capturable AdamW, gradient
    clipping), and a padded short batch of 3 of task 2's samples."""
    model, ds, cache, dummy = _setup(backbone, data, row)
    tune_p = TuneParams(lr=3e-3, clip_norm=clip_norm, device="cpu")
    optimiser, _ = optimiser_for(model, tune_p, capturable=True)
    dummy = dummy if model.prompts.copies else None
    batch = next(iter(make_loader(ds, 3, copies=False, device=backbone.device)))
    params = model.trainable_parameters()

    min_image = dummy.image.shape[0] if dummy is not None else 0

    def step():
        with autocast(backbone.device):
            inputs = static_inputs(model, batch, rows=4, min_image_tokens=min_image)
        optimiser.zero_grad(set_to_none=True)
        with autocast(backbone.device, cache_enabled=False):
            value, parts = static_loss(model, inputs, cache, dummy, TASK, 0.5)
        value.backward()
        torch.nn.utils.clip_grad_norm_(params, clip_norm, foreach=True)
        optimiser.step()
        return parts

    return step, batch


@pytest.mark.parametrize("row", TRAINED)
def test_a_static_step_has_no_host_sync_and_no_blocking_copy(backbone, data, row):
    """static_inputs (ViLT's sync-free embedding, as on a GPU), static_loss,
    backward, clipping and the capturable AdamW step: no op that reads a
    device value on the host, no boolean indexing, no blocking `.to(device)`."""
    backbone.fast_embed = True  # what `place` sets on CUDA
    try:
        step, batch = _static_step(row, backbone, data)
        step()  # AdamW's first step creates its state
        with sync_counter() as counter, blocking_transfers() as copies:
            parts = step()
    finally:
        backbone.fast_embed = False
    assert counter.syncs == []
    assert copies == []
    # the auxiliary loss's rows: the complete samples (PAL, RebQ), none (MAP),
    # the 3 samples, not the 4 rows
    rows = {"pal": int((batch.missing == 0).sum()), "map": 0}
    rows["rebq"] = rows["pal"]
    assert 0 < rows["pal"] < 3
    assert parts["aux_rows"].item() == rows.get(row, 3)


def test_the_sync_and_copy_audits_can_fail(backbone, data):
    """The same step with a `.item()` and a blocking copy to the device is
    caught by both."""
    backbone.fast_embed = True
    try:
        step, _ = _static_step("map", backbone, data)
        with sync_counter() as counter, blocking_transfers() as copies:
            parts = step()
            parts["ce"].item()
            parts["correct"].to(backbone.device)
    finally:
        backbone.fast_embed = False
    assert counter.syncs == ["aten._local_scalar_dense"]
    assert [name for name, _ in copies] == ["test_the_sync_and_copy_audits_can_fail"]


def test_every_trained_method_is_graphable():
    assert {name: cls.graphable for name, cls in METHODS.items()} == {
        "pal": True,
        "map": True,
        "msp": True,
        "rebq": True,
        "l2p": True,
        "dualprompt": True,
    }


@pytest.mark.gpu
@pytest.mark.parametrize("row", [*TRAINED, "l2p_pp"])
def test_graphed_steps_run_without_a_host_sync(tiny_vilt, data, row):
    """`make_step` as `pal tune` runs it on CUDA (graphed, clipped): after the
    first step captures the graph, three more steps of the same shape run
    under `torch.cuda.set_sync_debug_mode("error")`, which raises on any
    synchronising op or blocking copy, and replay that graph."""
    backbone = load_backbone(str(tiny_vilt), T).place(torch.device("cuda"))
    model, ds, cache, dummy = _setup(backbone, data, row)
    tune_p = TuneParams(lr=3e-3, clip_norm=0.05, device="cuda")
    optimiser, _ = optimiser_for(model, tune_p, capturable=True)
    dummy = dummy if model.prompts.copies else None
    step = make_step(model, optimiser, cache, TASK, 0.5, True, dummy, True, 0.05)
    batch = next(iter(make_loader(ds, 4, copies=False, device=backbone.device)))
    step(batch)  # warm-up and capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            parts = step(batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(step.graphs.graphs) == 1 and step.graphs.eager_steps == 0
    assert torch.isfinite(parts["ce"]).item()
