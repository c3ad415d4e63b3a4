"""DualPrompt, RebQ, MAP and MSP as their authors' code has them: the
DualPrompt E-prompt carried over to the next task, RebQ's reconstruction
target and loss scale, MAP's (and MSP's) pooler + MLP head (DESIGN §6)."""

import pytest
import torch
import torch.nn.functional as F

from pipeline.methods import build, build_model
from pipeline.methods.map import PoolerHead
from pipeline.model.method import layer_prompts
from pipeline.params import PromptParams

# ---------------------------------------------------------------- DualPrompt


def test_a_new_dualprompt_e_prompt_starts_as_the_previous_one_its_key_fresh():
    params = PromptParams(
        method="dualprompt", g_layers=(0,), g_length=2, layers=(1,), length=4
    )
    module = build(params, n_tasks=3, dim=8, depth=2)
    g = torch.Generator().manual_seed(0)
    module.add_task(g)
    with torch.no_grad():  # task 1's training moves its E-prompt
        module.E[0].add_(torch.arange(8.0))
    trained = module.E[0].detach().clone()
    module.add_task(g)
    assert torch.equal(module.E[1], trained)  # exact copy, not a draw
    assert not torch.equal(module.K[1], module.K[0])
    assert module.K[1].min() >= 0 and module.K[1].max() < 0.01  # U(0, 0.01)
    assert module.E[1].requires_grad and not module.E[0].requires_grad
    assert module.E[1].data_ptr() != module.E[0].data_ptr()
    with torch.no_grad():  # training task 2 leaves task 1's E-prompt alone
        module.E[1].mul_(2.0)
    assert torch.equal(module.E[0], trained)
    module.add_task(g)
    assert torch.equal(module.E[2], module.E[1])
    assert len({tuple(k.tolist()) for k in module.K}) == 3


# ---------------------------------------------------------------- on the tiny ViLT


@pytest.fixture(scope="module")
def tiny(tiny_vilt, tiny_prepare):
    from pipeline.data.samples import read_prepare
    from pipeline.model.backbone import load_backbone

    return load_backbone(str(tiny_vilt), 12), *read_prepare(tiny_prepare)


def _batch_with_copies(tiny, method: str, **prompt):
    """A model of `method` at task 1, a batch of 4 with complete samples
    (and their copies) and a missing one, its cache."""
    from helpers import make_model

    from pipeline.data.loader import SampleDataset, make_loader
    from pipeline.data.samples import select
    from pipeline.model.network import build_cache

    backbone, samples, tasks = tiny
    model = make_model(backbone, tasks, method=method, **prompt)
    train = select(samples, "train", [1])
    ds = SampleDataset(train, tasks.root, backbone.processor, 12, backbone.image_side)
    cache = build_cache(model, make_loader(ds, 16, copies=True), len(ds))
    batch = next(
        b
        for b in make_loader(ds, 4, copies=True)
        if len(b.complete) >= 2 and (b.missing != 0).any()
    )
    return model, cache, batch


def test_rebq_loss_is_the_per_element_mean_against_its_memory_pass(tiny):
    from pipeline.model.losses import _copies
    from pipeline.model.method import View
    from pipeline.model.vision import batch_inputs

    model, cache, batch = _batch_with_copies(tiny, "rebq")
    rebq, backbone = model.prompts, model.backbone
    torch.manual_seed(0)
    ids, am, px, pm = batch_inputs(batch, backbone.device)
    h, mask = backbone.embed(ids, am, px, pm, batch.image_sizes)
    n, T, D = batch.n, ids.shape[1], backbone.hidden_size
    q = cache.q[batch.index]
    comp = batch.complete
    copies = _copies(h, mask, n, batch.index, comp, cache)
    view = View(h[:n], mask[:n], T, q[:, 0], q[:, 1], batch.missing, 1, copies)
    with torch.no_grad():
        aux = rebq.features(backbone, view).aux

    # independently: RebQ's memory pass over the complete originals (memory
    # prompt = pool(q_t) + pool(q_v)), read at the text and image CLS
    with torch.no_grad():
        P = rebq.memory(q[comp, 0]) + rebq.memory(q[comp, 1])
        prompts = layer_prompts(P, rebq.layers, "prefix")
        out = backbone.encode(h[comp], mask[comp], prompts)
        target_t, target_v = out[:, 0], out[:, T]
        c = len(comp)
        q_hat = rebq.reconstruct(
            backbone,
            copies.h,
            copies.mask,
            T,
            copies.q_t,
            copies.q_v,
            torch.arange(2 * c) < c,
        )
    # the copies: text-dropped first (their text CLS), then image-dropped
    targets = torch.cat([target_t, target_v])
    per_copy = [((q_hat[i] - targets[i]) ** 2).mean() for i in range(2 * c)]
    expect = sum(per_copy) / len(per_copy)
    assert aux.item() == pytest.approx(expect.item(), rel=1e-5)
    summed = sum(((q_hat[i] - targets[i]) ** 2).sum() for i in range(2 * c)) / (2 * c)
    assert aux.item() == pytest.approx(summed.item() / D, rel=1e-5)
    # the target is the memory pass's output, not the frozen, prompt-free CLS
    got_t, got_v = rebq.recon_targets(
        backbone, h[:n], mask[:n], T, q[:, 0], q[:, 1], comp
    )
    torch.testing.assert_close(got_t, target_t, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got_v, target_v, rtol=1e-5, atol=1e-6)
    assert not got_t.requires_grad
    assert (got_t - q[comp, 0]).abs().max() > 1e-3
    # PAL's loss on the same hand-made numbers keeps its sum over D
    a, b = torch.randn(2, 3, D, generator=torch.Generator().manual_seed(0))
    zero = torch.zeros(3, D)
    pal = build_model(backbone, PromptParams(), [2, 2, 2]).prompts
    assert torch.equal(
        pal.recon_error(a, b, zero, zero), a.pow(2).sum(-1) + b.pow(2).sum(-1)
    )
    assert torch.allclose(
        rebq.recon_error(a, b, zero, zero), (a.pow(2).mean(-1) + b.pow(2).mean(-1)) / 2
    )


# ---------------------------------------------------------------- MAP and MSP heads


@pytest.mark.parametrize("method", ["map", "msp"])
def test_map_and_msp_classify_with_maps_pooler_and_mlp(tiny, method):
    backbone, _, tasks = tiny
    D = backbone.hidden_size
    prompt = PromptParams(method=method, length=4, layers=(0, 1), position="input")
    model = build_model(backbone, prompt, tasks.classes_per_task)
    head = model.head
    assert isinstance(head, PoolerHead)
    assert not any(n.startswith("head") for n, _ in model.prompts.named_parameters())
    pooler = backbone.vilt.pooler.dense
    assert torch.equal(head.pooler.weight, pooler.weight)
    assert torch.equal(head.pooler.bias, pooler.bias)
    g = torch.Generator().manual_seed(3)
    model.add_task(g)
    model.add_task(g)
    n1, n2 = tasks.classes_per_task[:2]
    shapes = {k: tuple(v.shape) for k, v in head.state_dict().items()}
    assert shapes == {
        "pooler.weight": (D, D),
        "pooler.bias": (D,),
        "hidden.weight": (2 * D, D),
        "hidden.bias": (2 * D,),
        "norm.weight": (2 * D,),
        "norm.bias": (2 * D,),
        "W.0": (n1, 2 * D),
        "b.0": (n1,),
        "W.1": (n2, 2 * D),
        "b.1": (n2,),
    }
    # MAP's init_weights: normal(0, 0.02), zero biases, LayerNorm (1, 0)
    assert 0.015 < head.hidden.weight.std().item() < 0.025
    assert not head.hidden.bias.any() and not head.b[0].any()
    assert torch.equal(head.norm.weight, torch.ones(2 * D))
    # every part trains in every task (no continual-learning mechanism)
    assert all(p.requires_grad for p in head.parameters())
    assert not model.masked and model.train_range(2) == (0, n1 + n2)

    # the forward, by hand on fixed weights
    with torch.no_grad():
        for p in head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    x = torch.randn(5, D, generator=g)
    W = torch.cat([head.W[0], head.W[1]])
    b = torch.cat([head.b[0], head.b[1]])
    z = torch.tanh(x @ head.pooler.weight.T + head.pooler.bias)
    u = z @ head.hidden.weight.T + head.hidden.bias
    mu = u.mean(-1, keepdim=True)
    var = u.var(-1, unbiased=False, keepdim=True)
    u = (u - mu) / torch.sqrt(var + 1e-5) * head.norm.weight + head.norm.bias
    u = 0.5 * u * (1 + torch.erf(u / 2**0.5))  # exact GELU
    expect = u @ W.T + b
    with torch.no_grad():
        got = head(x)
    assert got.shape == (5, n1 + n2)
    torch.testing.assert_close(got, expect, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("method", ["map", "msp"])
def test_map_and_msp_train_their_head_by_unmasked_ce(tiny, method):
    """The loss is the CE over every class seen, through the pooler and MLP;
    the analytic classifier gets the head's input (the prompted text CLS)."""
    from pipeline.model.losses import loss

    model, cache, batch = _batch_with_copies(tiny, method, length=4, position="input")
    model.add_task(torch.Generator().manual_seed(1))  # task 2: classes 0..3
    torch.manual_seed(0)
    value, parts = loss(model, batch, cache, 2, 0.0)
    torch.manual_seed(0)
    x, logits = model.features(batch)
    lo, hi = model.train_range(2)
    assert (lo, hi) == (0, 4) and logits.shape == (batch.n, 4)
    torch.testing.assert_close(logits, model.head(x))
    expect = F.cross_entropy(logits[:, lo:hi], batch.labels - lo)
    assert parts["ce"].item() == pytest.approx(expect.item(), rel=1e-5)
    value.backward()
    head = dict(model.head.named_parameters())
    assert {n for n, p in head.items() if p.grad is not None and p.grad.any()} == set(
        head
    )


def test_a_map_checkpoint_rebuilds_its_head(tiny):
    from pipeline.methods import model_from_checkpoint

    backbone, _, tasks = tiny
    row = dict(method="map", length=4, layers=[0, 1], position="input")
    model = build_model(backbone, PromptParams(**row), tasks.classes_per_task)
    g = torch.Generator().manual_seed(5)
    model.add_task(g)
    model.add_task(g)
    with torch.no_grad():  # a trained pooler is no longer the backbone's
        model.head.pooler.weight.mul_(-2.0)
    ckpt = {
        "params": {"prompt": row},
        "tasks": {"classes_per_task": tasks.classes_per_task},
        "step": 2,
        "state": model.tuned_state(),
    }
    assert "head.pooler.weight" in ckpt["state"] and "head.W.1" in ckpt["state"]
    again = model_from_checkpoint(ckpt, backbone)
    assert isinstance(again.head, PoolerHead) and len(again.head.W) == 2
    state = again.tuned_state()
    assert state.keys() == ckpt["state"].keys()
    assert all(torch.equal(state[k], v) for k, v in ckpt["state"].items())


# ---------------------------------------------------------------- MAP's own budget


@pytest.mark.parametrize(
    "name", ["params.yaml", "configs/food101.yaml", "configs/n24news.yaml"]
)
def test_maps_own_budget_is_an_opt_in_row(tmp_path, name):
    """`map_own`: MAP's row with its authors' budget (config.py
    task_finetune_food101), in no pipeline; `map` keeps the shared one."""
    import yaml
    from helpers import committed

    from palcore.params import Source
    from pipeline import params as pparams

    path = tmp_path / "params.yaml"
    path.write_text(committed(name))
    raw = yaml.safe_load(path.read_text())
    assert all("map_own" not in names for names in raw["pipelines"].values())
    own = pparams.load(Source(path, variant="map_own"), "tune")
    shared = pparams.load(Source(path, variant="map"), "tune")
    assert (own.lr, own.head_lr, own.weight_decay) == (1e-2, 1e-2, 2e-2)
    assert (own.batch_size, own.epochs) == (256, 20)
    assert (own.warmup, own.seed) == (shared.warmup, shared.seed)
    assert shared == pparams.load(path, "tune")  # map: the shared protocol
    prompt = [
        pparams.load(Source(path, variant=v), "prompt") for v in ("map_own", "map")
    ]
    assert prompt[0] == prompt[1] and prompt[0].method == "map"
    assert raw["ablation"]["map_own"]["head"] == "bp"


@pytest.mark.parametrize(
    "name", ["params.yaml", "configs/food101.yaml", "configs/n24news.yaml"]
)
def test_l2ps_own_budget_is_an_opt_in_row(tmp_path, name):
    """`l2p_own`: L2P's row with its authors' budget (Adam, lr 0.03 × 128/256,
    batch 128, constant, clip 1.0, 5 epochs), in no pipeline; `l2p` keeps
    the shared one and the same prompts."""
    import yaml
    from helpers import committed

    from palcore.params import Source
    from pipeline import params as pparams

    path = tmp_path / "params.yaml"
    path.write_text(committed(name))
    raw = yaml.safe_load(path.read_text())
    assert all("l2p_own" not in names for names in raw["pipelines"].values())
    own = pparams.load(Source(path, variant="l2p_own"), "tune")
    shared = pparams.load(Source(path, variant="l2p"), "tune")
    assert (own.lr, own.head_lr, own.weight_decay) == (0.015, 0.015, 0.0)
    assert (own.batch_size, own.epochs, own.warmup) == (128, 5, 0.0)
    assert (own.decay, own.beta2, own.clip_norm) == ("none", 0.999, 1.0)
    assert (shared.decay, shared.beta2, shared.clip_norm) == ("cosine", 0.98, None)
    assert own.recon_weight == shared.recon_weight == 1.0
    prompt = [
        pparams.load(Source(path, variant=v), "prompt") for v in ("l2p_own", "l2p")
    ]
    assert prompt[0] == prompt[1] and prompt[0].position == "input"
    assert raw["ablation"]["l2p_own"]["head"] == "bp"
