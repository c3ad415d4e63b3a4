"""Every prompt method holds to the method interface (DESIGN §5): each module
of pipeline/methods that declares `METHOD`, and the template researchers copy
(docs/method_template.py), with no test edited for a new one.

On the tiny ViLT of the fixtures, a method builds from its params; plain
gradient descent on one batch lowers the loss at every step, the gradients
reaching exactly its trainable tensors and head rows while every other tensor
stays as it was; extraction gives (n, D) float32 embeddings and (n, C_1)
logits; a seed makes the same model, loss and features; and a checkpoint of
two tasks rebuilds a model with the same features.
"""

from __future__ import annotations

import dataclasses
import importlib.util
from collections.abc import Callable

import pytest
import torch
from helpers import PROMPT

from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.methods import build_model, model_from_checkpoint
from pipeline.model.backbone import load_backbone
from pipeline.model.checkpoint import restore
from pipeline.model.losses import loss
from pipeline.model.method import Method
from pipeline.model.network import PalModel, build_cache
from pipeline.params import PromptParams, method_names

T = 12  # model.max_text_len of the fixtures
TEMPLATE = "docs/method_template.py"
# the prompt params each method runs with on the tiny ViLT (2 layers, hidden
# 32): the fixtures' (both layers, prefix), with these keys changed
SETTINGS: dict[str, dict[str, object]] = {
    "l2p": {"top_n": 2},
    "dualprompt": {"g_layers": (0,), "g_length": 4, "layers": (1,)},
}
# every method in the setting above, and the other forms of the paper's
# baselines (MAP's and MSP's input tokens, L2P's as L2P, not L2P++)
CASES = [pytest.param(m, {}, id=m) for m in (*method_names(), TEMPLATE)] + [
    pytest.param(m, {"position": "input"}, id=f"{m}-input")
    for m in ("map", "msp", "l2p")
]


def _template() -> type[Method]:
    from helpers import ROOT

    spec = importlib.util.spec_from_file_location("method_template", ROOT / TEMPLATE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.METHOD


def _params(method: str, form: dict[str, object]) -> PromptParams:
    name = "pal" if method == TEMPLATE else method  # the template reads no name
    prompt = {**PROMPT, "layers": tuple(PROMPT["layers"]), "method": name}
    return PromptParams(**{**prompt, **SETTINGS.get(method, {}), **form})


def _maker(backbone, tasks, method: str, form) -> Callable[[], PalModel]:
    """A fresh model of `method` with no task added, as `build_model` makes
    it (the template: its class on the same backbone)."""
    params, classes = _params(method, form), tasks.classes_per_task
    if method != TEMPLATE:
        return lambda: build_model(backbone, params, classes)
    cls = _template()
    D, depth = backbone.hidden_size, backbone.num_layers
    cls.check(params, len(classes), D, depth)
    return lambda: PalModel(backbone, cls(params, len(classes), D, depth), classes)


@pytest.fixture(scope="module")
def tiny(tiny_vilt, tiny_prepare):
    """The backbone, the first task's batches of 4 (with their copies) and
    query cache, the tasks."""
    backbone = load_backbone(str(tiny_vilt), T)
    samples, tasks = read_prepare(tiny_prepare)
    train = select(samples, "train", [1])
    ds = SampleDataset(train, tasks.root, backbone.processor, T, backbone.image_side)
    probe = PalModel(backbone, None, tasks.classes_per_task)
    cache = build_cache(probe, make_loader(ds, 16, copies=True), len(ds))
    batches = list(make_loader(ds, 4, copies=True))
    return backbone, tasks, cache, batches


def _model(tiny, method: str, form, steps: int = 1, seed: int = 0) -> PalModel:
    backbone, tasks, _, _ = tiny
    model = _maker(backbone, tasks, method, form)()
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        model.add_task(generator)
    return model


def _features(model: PalModel, batch, q=None):
    """`model.features` of `batch` in eval mode, torch's RNG seeded first
    (on the CPU, HF's ViLT embedding draws the patch order from it)."""
    torch.manual_seed(0)
    with torch.no_grad():
        return model.eval().features(batch, q)


def _mixed_batch(batches):
    """A batch with complete samples, a missing modality and two labels."""
    return next(
        b
        for b in batches
        if len(b.complete)
        and (b.missing != 0).any()
        and len(set(b.labels.tolist())) > 1
    )


def test_every_method_module_is_listed_in_the_papers_order() -> None:
    names = method_names()
    assert names[:6] == ("pal", "map", "msp", "rebq", "l2p", "dualprompt")
    assert list(names[6:]) == sorted(names[6:])  # methods added since


@pytest.mark.parametrize("method, form", CASES)
def test_a_train_step_reaches_only_the_trainable_tensors(tiny, method, form):
    _, _, cache, batches = tiny
    model = _model(tiny, method, form)
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    assert any(n.startswith("backbone.") for n in frozen)
    trained = {n: p.clone() for n, p in model.named_parameters() if p.requires_grad}
    assert {n.split(".")[0] for n in trained} == {"prompts", "head"}
    batch = _mixed_batch(batches)
    # plain gradient descent on one batch: the loss falls at every step (the
    # random tiny ViLT's features are alike, so a few steps cannot fit the task)
    opt = torch.optim.SGD(model.trainable_parameters(), lr=0.02)
    losses, reached = [], set()
    named = dict(model.named_parameters())
    for _ in range(4):
        value, _ = loss(model, batch, cache, 1, 0.1)
        assert value.ndim == 0 and torch.isfinite(value), value
        losses.append(value.item())
        opt.zero_grad()
        value.backward()
        assert all(named[n].grad is None for n in frozen)
        reached |= {n for n in trained if named[n].grad.abs().sum() > 0}
        opt.step()
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    # every trainable tensor gets a gradient (the prompts from the second step
    # on: the head starts at zero)
    assert reached == set(trained)
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], p) for n, p in frozen.items())
    # SGD moved them (a tiny gradient may fall below float32's step)
    assert any(not torch.equal(now[n], p) for n, p in trained.items())


@pytest.mark.parametrize("method, form", CASES)
def test_extraction_gives_an_embedding_and_logits_per_sample(tiny, method, form):
    backbone, tasks, cache, batches = tiny
    model = _model(tiny, method, form)
    batch = _mixed_batch(batches)
    x, logits = _features(model, batch)
    given, _ = _features(model, batch, cache.q[batch.index])  # stored queries
    n, D, C = batch.n, backbone.hidden_size, tasks.classes_per_task[0]
    assert x.shape == (n, D) and x.dtype == torch.float32
    assert logits.shape == (n, C)
    assert torch.isfinite(x).all() and torch.isfinite(logits).all()
    torch.testing.assert_close(given, x, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("method, form", CASES)
def test_a_seed_makes_the_same_model_loss_and_features(tiny, method, form):
    _, _, cache, batches = tiny
    batch = _mixed_batch(batches)
    runs = []
    for seed in (0, 0, 1):
        model = _model(tiny, method, form, seed=seed)
        torch.manual_seed(0)  # the patch order
        value, _ = loss(model, batch, cache, 1, 0.1)
        x, _ = _features(model, batch)
        runs.append((model.tuned_state(), value.item(), x))
    (state, value, x), again, other = runs
    assert state.keys() == again[0].keys()
    assert all(torch.equal(state[k], again[0][k]) for k in state)
    assert value == again[1] and torch.equal(x, again[2])
    # another seed draws other prompts (or other head rows)
    assert any(not torch.equal(state[k], other[0][k]) for k in state)


@pytest.mark.parametrize("method, form", CASES)
def test_a_checkpoint_of_two_tasks_rebuilds_the_same_model(tiny, method, form):
    backbone, tasks, _, batches = tiny
    model = _model(tiny, method, form, steps=2, seed=3)
    noise = torch.Generator().manual_seed(4)
    with torch.no_grad():  # tensors no init gives, frozen ones too
        for name, p in model.named_parameters():
            if not name.startswith("backbone."):
                p.add_(0.01 * torch.randn(p.shape, generator=noise))
    state = model.tuned_state()
    if method == TEMPLATE:
        rebuilt = _maker(backbone, tasks, method, form)()
        restore(rebuilt, state, 2)
        rebuilt.eval()
    else:
        ckpt = {
            "params": {"prompt": dataclasses.asdict(_params(method, form))},
            "tasks": {"classes_per_task": tasks.classes_per_task},
            "state": state,
            "step": 2,
        }
        rebuilt = model_from_checkpoint(ckpt, backbone)
    assert rebuilt.tuned_state().keys() == state.keys()
    assert all(torch.equal(rebuilt.tuned_state()[k], state[k]) for k in state)
    batch = _mixed_batch(batches)
    x, logits = _features(model, batch)
    x2, logits2 = _features(rebuilt, batch)
    assert logits.shape == (batch.n, sum(tasks.classes_per_task[:2]))
    assert torch.equal(x, x2) and torch.equal(logits, logits2)
