"""L2P's two forms on the tiny ViLT (DESIGN §5).

The original (`position: input`, row `l2p`): the chosen prompts are input
tokens at layer 0 that every layer attends over, and the joint embedding (the
head's input, and extract's feature for the analytic classifier) is the mean
of the prompt positions' outputs, here computed independently through HF's
own `ViltLayer` modules. L2P++ (`position: prefix`, row `l2p_pp`) gives the
features of the code before the original was built (to 1e-6: the last layer
now runs on the text CLS only, `Backbone.encode(read=...)`).
"""

import subprocess
import types
from pathlib import Path

import pytest
import torch

from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.methods import build, build_model
from pipeline.methods.l2p import L2P
from pipeline.model.backbone import load_backbone
from pipeline.model.method import View
from pipeline.model.vision import batch_inputs
from pipeline.params import PromptParams

ROOT = Path(__file__).resolve().parents[1]
# the last commit whose l2p.py had only L2P++'s head (the text CLS)
BEFORE = "bf8f78ff39a331ddf17c5dde773aa0cf8ba4839f"
B, N_TOKENS, D = 3, 9, 32  # batch, sequence length, width of the tiny ViLT


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_backbone(str(tiny_vilt), 12)


def _l2p(position: str = "input", layers=(0,), length: int = 3) -> L2P:
    row = dict(method="l2p", pool_size=4, top_n=2, length=length, layers=layers)
    module = build(PromptParams(**row, position=position), n_tasks=2, dim=D, depth=2)
    module.add_task(torch.Generator().manual_seed(0))
    with torch.no_grad():  # prompts of the scale of the tokens, so they matter
        module.P.mul_(100.0)
    return module


def _view(seed: int = 0) -> View:
    """3 random sequences of 9 tokens, the last one's final 2 padded."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(B, N_TOKENS, D, generator=g)
    mask = torch.ones(B, N_TOKENS, dtype=torch.bool)
    mask[2, 7:] = False
    q_t, q_v = torch.randn(B, D, generator=g), torch.randn(B, D, generator=g)
    return View(h, mask, 5, q_t, q_v, torch.zeros(B, dtype=torch.int64))


def _hf_layers(backbone, h, mask, tokens: dict[int, torch.Tensor]) -> torch.Tensor:
    """h (B, K, D) through HF's own ViltLayer modules and final LayerNorm,
    tokens[i] (B, L, D) put in front of the sequence before layer i (the
    earlier ones kept, as L2P's JAX code does); eager attention, additive mask."""
    for i, layer in enumerate(backbone.vilt.encoder.layer):
        if i in tokens:
            h = torch.cat([tokens[i], h], 1)
            on = torch.ones(len(h), tokens[i].shape[1], dtype=torch.bool)
            mask = torch.cat([on, mask], 1)
        bias = torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(h.dtype).min)
        out = layer(h, attention_mask=bias[:, None, None, :])
        h = out[0] if isinstance(out, tuple) else out
    return backbone.vilt.layernorm(h)


def _chosen(module: L2P, idx: torch.Tensor, j: int) -> torch.Tensor:
    """Layer j's tokens of the prompts idx (B, N), one prompt after another:
    (B, N·L_p, D)."""
    P = module.P.detach()[idx][:, :, j]  # (B, N, L_p, D)
    return P.reshape(len(idx), -1, D)


def test_hf_layers_equal_the_backbone_without_prompts(backbone):
    view = _view()
    ref = _hf_layers(backbone, view.h, view.mask, {})
    assert (backbone.encode(view.h, view.mask) - ref).abs().max().item() <= 1e-6


@pytest.mark.parametrize("layers", [(0,), (0, 1)], ids=["layer0", "layers01"])
def test_l2p_embedding_is_the_mean_of_the_prompt_positions_outputs(backbone, layers):
    module, view = _l2p(layers=layers), _view()
    idx, cos = module.select(view.q_t)
    assert idx.shape == (3, 2) and len({tuple(r) for r in idx.tolist()}) > 1
    tokens = {j: _chosen(module, idx, j) for j in layers}  # 2 prompts × 3 tokens
    out = _hf_layers(backbone, view.h, view.mask, tokens)
    n = 6 * len(layers)  # prompt positions in front after the last layer
    assert out.shape == (3, n + 9, 32)
    got = module.features(backbone, view)
    assert got.x.shape == (3, 32) and got.x.dtype == torch.float32
    assert (got.x - out[:, :n].mean(1)).abs().max().item() <= 1e-6
    # not the text CLS (L2P++'s feature: 2.6 and 2.3 away here), nor the
    # first prompt token (1.9 away)
    assert (got.x - out[:, n]).abs().max().item() > 1.0
    assert (got.x - out[:, 0]).abs().max().item() > 1.0
    assert got.aux.item() == pytest.approx((1 - cos).sum(-1).mean().item())
    assert got.aux_rows.item() == 3


def _layer_inputs(backbone, run) -> list[torch.Tensor]:
    """The sequence entering each layer's attention (its first LayerNorm's
    input) while `run()` runs."""
    seen = []
    hooks = [
        layer.layernorm_before.register_forward_hook(
            lambda _m, args, _out: seen.append(args[0].detach().clone())
        )
        for layer in backbone.vilt.encoder.layer
    ]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_l2p_prompts_are_in_the_sequence_of_every_layer(backbone):
    module, view = _l2p(), _view()
    idx, _ = module.select(view.q_t)
    seen = _layer_inputs(backbone, lambda: module.features(backbone, view))
    # both layers attend over the 2 × 3 prompt tokens and the 9 input tokens
    assert [s.shape for s in seen] == [(3, 15, 32), (3, 15, 32)]
    assert torch.equal(seen[0][:, :6], _chosen(module, idx, 0))
    assert torch.equal(seen[0][:, 6:], view.h)
    # a changed prompt moves the text tokens entering layer 1 and the output
    with torch.no_grad():  # (a constant shift would vanish in the LayerNorm)
        module.P[idx[0, 0]] += torch.randn(
            1, 3, 32, generator=torch.Generator().manual_seed(1)
        )
    again = _layer_inputs(backbone, lambda: module.features(backbone, view))
    assert torch.equal(again[0][:, 6:], view.h)
    assert (again[1][0, 6:11] - seen[1][0, 6:11]).abs().min().item() > 0
    # L2P++: the prompts are layer 0's prefix keys/values only, never tokens
    plus = _l2p(position="prefix", length=4)
    seen = _layer_inputs(backbone, lambda: plus.features(backbone, view))
    assert [s.shape for s in seen] == [(3, 9, 32), (3, 9, 32)]


def test_extract_hands_the_prompt_mean_to_the_analytic_classifier(
    backbone, tiny_prepare
):
    samples, tasks = read_prepare(tiny_prepare)
    row = dict(method="l2p", pool_size=4, top_n=2, length=3, layers=(0,))
    model = build_model(
        backbone, PromptParams(**row, position="input"), tasks.classes_per_task
    )
    model.add_task(torch.Generator().manual_seed(0))
    model.eval()
    train = select(samples, "train", [1])
    ds = SampleDataset(train, tasks.root, backbone.processor, 12, backbone.image_side)
    batch = next(iter(make_loader(ds, 4)))
    torch.manual_seed(0)  # ViLT's patch order
    with torch.no_grad():
        x, logits = model.features(batch)  # what `pal extract` writes
        torch.manual_seed(0)
        ids, am, px, pm = batch_inputs(batch, backbone.device)
        h, mask = backbone.embed(ids, am, px, pm)
        q_t, _ = backbone.queries(h, mask, ids.shape[1])
        idx, _ = model.prompts.select(q_t)
        out = _hf_layers(backbone, h, mask, {0: _chosen(model.prompts, idx, 0)})
    assert x.shape == (4, 32) and logits.shape == (4, 2)
    assert (x - out[:, :6].mean(1)).abs().max().item() <= 1e-6


def _committed_l2p() -> types.ModuleType:
    """pipeline/methods/l2p.py as commit BEFORE had it, as a module."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{BEFORE}:pipeline/methods/l2p.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("l2p_before")
    exec(compile(source, "l2p_before.py", "exec"), module.__dict__)
    return module


@pytest.mark.parametrize("layers", [(0,), (0, 1)], ids=["layer0", "layers01"])
def test_l2p_pp_gives_the_committed_codes_features(backbone, layers):
    old_class = _committed_l2p().L2P
    assert old_class is not L2P
    params = PromptParams(method="l2p", pool_size=4, top_n=2, length=4, layers=layers)
    new, old = L2P(params, 2, D, 2), old_class(params, 2, D, 2)
    for module in (new, old):
        module.add_task(torch.Generator().manual_seed(3))
        with torch.no_grad():
            module.P.mul_(100.0)
    view = _view(1)
    got, ref = new.features(backbone, view), old.features(backbone, view)
    assert got.x.shape == (3, 32)
    # the last layer now runs on the read row only: equal up to summation order
    torch.testing.assert_close(got.x, ref.x, rtol=1e-5, atol=1e-6)
    assert torch.equal(got.aux, ref.aux)
    # the prefix moved the text CLS away from the prompt-free one
    assert not torch.equal(got.x, backbone.encode(view.h, view.mask)[:, 0])
