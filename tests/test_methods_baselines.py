"""DualPrompt, RebQ, MAP and MSP as their authors' code has them: the
DualPrompt E-prompt carried over to the next task, RebQ's reconstruction
target and loss scale, MAP's (and MSP's) pooler + MLP head (DESIGN §6)."""

import pytest
import torch

from pipeline.methods import build, build_model
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
