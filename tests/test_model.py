"""PAL model: gradients, reconstruction, variants, features, checkpoints."""

import pytest
import torch
from helpers import PROMPT, make_model, random_head

from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.methods import model_from_checkpoint
from pipeline.model.backbone import load_backbone
from pipeline.model.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from pipeline.model.device import autocast
from pipeline.model.losses import loss as batch_loss
from pipeline.model.network import build_cache


@pytest.fixture(scope="module")
def data(tiny_prepare):
    return read_prepare(tiny_prepare)


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_backbone(str(tiny_vilt), 12)


def _task_data(backbone, samples, tasks, task, batch_size=4, copies=True):
    train = select(samples, "train", [task])
    ds = SampleDataset(train, tasks.root, backbone.processor, 12, backbone.image_side)
    return ds, make_loader(ds, batch_size, copies=copies)


def _batch_with(loader, want_complete: bool):
    for batch in loader:
        if (len(batch.complete) > 0) == want_complete and (batch.missing != 0).any():
            return batch
    raise AssertionError("fixture has no such batch")


def test_only_active_slice_and_head_get_gradients(backbone, data):
    samples, tasks = data
    model = make_model(backbone, tasks, steps=2)
    ds, loader = _task_data(backbone, samples, tasks, 2)
    cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    loss, _ = batch_loss(model, _batch_with(loader, True), cache, 2, recon_weight=0.01)
    loss.backward()
    named = dict(model.named_parameters())
    for pool in ("text", "image"):
        for name in ("P", "E", "A"):
            assert named[f"prompts.{pool}.{name}.0"].grad is None
            grad = named[f"prompts.{pool}.{name}.1"].grad
            assert grad is not None and grad.abs().sum() > 0, (pool, name)
    assert named["head.W.0"].grad is None and named["head.b.0"].grad is None
    assert named["head.W.1"].grad.abs().sum() > 0
    assert all(p.grad is None for p in model.backbone.parameters())
    trainable = {n for n, p in named.items() if p.requires_grad}
    assert trainable == {
        f"prompts.{m}.{n}.1" for m in ("text", "image") for n in "PEA"
    } | {"head.W.1", "head.b.1"}


def test_reconstruction_only_from_complete_samples_copies(backbone, data, monkeypatch):
    samples, tasks = data
    model = make_model(backbone, tasks)
    ds, loader = _task_data(backbone, samples, tasks, 1)
    cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    rows, joint_q = [], []
    pal = model.prompts
    reconstruct, joint = pal.reconstruct, pal.joint
    monkeypatch.setattr(
        pal,
        "reconstruct",
        lambda b, h, *a: rows.append(h.shape[0]) or reconstruct(b, h, *a),
    )
    monkeypatch.setattr(
        pal,
        "joint",
        lambda b, h, m, q_t, q_v: (
            joint_q.append((q_t, q_v)) or joint(b, h, m, q_t, q_v)
        ),
    )

    missing_only = [s for s in select(samples, "train", [1]) if s.missing]
    ds_m = SampleDataset(
        missing_only, tasks.root, backbone.processor, 12, backbone.image_side
    )
    cache_m = build_cache(model, make_loader(ds_m, 16, copies=True), len(ds_m))
    no_complete = _batch_with(make_loader(ds_m, 4, copies=True), False)
    _, parts = batch_loss(model, no_complete, cache_m, 1, recon_weight=0.01)
    assert parts["aux"].item() == 0.0
    assert rows == [int((no_complete.missing != 0).sum())]  # only the missing samples

    rows.clear()
    joint_q.clear()
    batch = _batch_with(loader, True)
    c, n_missing = len(batch.complete), int((batch.missing != 0).sum())
    assert batch.input_ids.shape[0] == batch.n + 2 * c
    _, parts = batch_loss(model, batch, cache, 1, recon_weight=0.01)
    assert parts["aux"].item() > 0
    assert rows == [n_missing + 2 * c]  # missing samples + two copies per complete
    # reconstruct, then query: a missing modality's query is replaced, the rest kept
    q_t, q_v = joint_q[0]
    frozen = cache.q[batch.index]
    for i, code in enumerate(batch.missing.tolist()):
        assert torch.equal(q_t[i], frozen[i, 0]) == (code != 1)
        assert torch.equal(q_v[i], frozen[i, 1]) == (code != 2)


def test_reconstruction_loss_goes_down_over_an_epoch(backbone, data):
    samples, tasks = data
    model = make_model(backbone, tasks)
    ds, loader = _task_data(backbone, samples, tasks, 1)
    cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    full = list(make_loader(ds, len(ds), copies=True))[0]

    def recon() -> float:
        torch.manual_seed(0)
        with torch.no_grad():
            return batch_loss(model, full, cache, 1, recon_weight=1.0)[1]["aux"].item()

    before = recon()
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=3e-2)
    for batch in loader:  # one epoch, reconstruction only (λ large)
        loss, _ = batch_loss(model, batch, cache, 1, recon_weight=1.0)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert recon() < 0.9 * before


def test_prompts_off_features_are_the_frozen_text_cls(backbone, data):
    samples, tasks = data
    model = make_model(backbone, tasks, enabled=False)
    assert model.prompts is None
    ds, _ = _task_data(backbone, samples, tasks, 1)
    batch = list(make_loader(ds, 8))[0]
    torch.manual_seed(0)
    x, logits = model.features(batch)
    torch.manual_seed(0)
    q_t, _ = model.batch_queries(batch)
    assert torch.equal(x, q_t)
    assert logits.shape == (8, tasks.classes_per_task[0])


@pytest.mark.parametrize(
    "prompt",
    [
        {"pools": "modality"},
        {"pools": "shared"},
        {"pools": "vector"},
        {"position": "input"},
        {"enabled": False},
        {"method": "map"},
        {"method": "map", "position": "input"},
        {"method": "msp"},
        {"method": "msp", "position": "input"},
        {"method": "rebq"},
        {"method": "l2p", "top_n": 2},
        {"method": "l2p", "top_n": 2, "position": "input"},
        {"method": "dualprompt", "g_layers": (0,), "g_length": 4, "layers": (1,)},
    ],
)
def test_every_variant_trains_and_extracts(backbone, data, prompt):
    samples, tasks = data
    model = make_model(backbone, tasks, **prompt)
    random_head(model)
    ds, loader = _task_data(backbone, samples, tasks, 1)
    cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    batch = _batch_with(loader, True)
    loss, parts = batch_loss(model, batch, cache, 1, recon_weight=0.01)
    loss.backward()
    assert torch.isfinite(loss)
    trainable = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    prompts = [n for n, _ in trainable if n.startswith("prompts.")]
    assert bool(prompts) == prompt.get("enabled", True)  # the variant has prompts
    assert {n for n, _ in trainable} - set(prompts), "no trainable head rows"
    for name, p in trainable:  # every prompt tensor and head row learns
        assert p.grad is not None and p.grad.abs().sum() > 0, name
    model.add_task(torch.Generator().manual_seed(1))
    x, logits = model.features(batch)
    assert x.shape == (batch.n, 32) and torch.isfinite(x).all()
    assert logits.shape == (batch.n, sum(tasks.classes_per_task[:2]))


def test_checkpoint_round_trip_and_damage(backbone, data, tmp_path):
    samples, tasks = data
    model = make_model(backbone, tasks, steps=2)
    params = {"prompt": PROMPT}
    path = tmp_path / "step_02.pt"
    digest = save_checkpoint(path, 2, params, tasks.record(), model.tuned_state())
    again = save_checkpoint(
        tmp_path / "again.pt", 2, params, tasks.record(), model.tuned_state()
    )
    assert digest == again and path.read_bytes() == (tmp_path / "again.pt").read_bytes()
    ckpt = load_checkpoint(path)
    rebuilt = model_from_checkpoint(ckpt, backbone)
    for key, value in model.tuned_state().items():
        assert torch.equal(rebuilt.tuned_state()[key], value), key
    ds, _ = _task_data(backbone, samples, tasks, 1)
    batch = list(make_loader(ds, 8))[0]
    torch.manual_seed(0)
    a = model.features(batch)[0]
    torch.manual_seed(0)
    assert torch.equal(a, rebuilt.features(batch)[0])

    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(
        CheckpointError,
        match=r"step_02\.pt: not a readable tune "
        r"checkpoint",
    ):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"step_09\.pt: tune checkpoint missing"):
        load_checkpoint(tmp_path / "step_09.pt")


@pytest.mark.gpu
def test_cuda_bf16_matches_cpu_float32(tiny_vilt, data):
    samples, tasks = data
    ds = None
    out = {}
    for name in ("cpu", "cuda"):
        device = torch.device(name)
        backbone = load_backbone(str(tiny_vilt), 12).place(device)
        model = make_model(backbone, tasks, steps=2).to(device)
        if ds is None:
            ds, _ = _task_data(backbone, samples, tasks, 2)
        batch = list(make_loader(ds, 12, device=device))[0]
        torch.manual_seed(0)
        with torch.inference_mode(), autocast(device):
            x, logits = model.features(batch)
        out[name] = (x.float().cpu(), logits.float().cpu())
    cos = torch.nn.functional.cosine_similarity(out["cpu"][0], out["cuda"][0])
    assert cos.min().item() > 0.99
    assert (out["cpu"][1] - out["cuda"][1]).abs().max().item() < 0.1
