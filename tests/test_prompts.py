"""Prompt pools: CODA maths, Gram–Schmidt growth, freezing, variants, checks."""

import pytest
import torch
import torch.nn.functional as F

from palcore.errors import ParamsError
from pipeline.model.prompts import (
    PromptPool,
    Prompts,
    check_prompt_params,
    orthogonal_rows,
)
from pipeline.params import PromptParams


def test_orthogonal_rows_against_non_orthogonal_earlier_rows():
    g = torch.Generator().manual_seed(0)
    earlier = torch.randn(5, 16, generator=g)  # trained rows: not orthogonal
    new = orthogonal_rows(earlier, 4, g)
    assert new.shape == (4, 16) and new.dtype == torch.float32
    assert (new @ earlier.T).abs().max().item() < 1e-5
    assert torch.allclose(new @ new.T, torch.eye(4), atol=1e-6)


def test_orthogonal_rows_are_deterministic():
    a = orthogonal_rows(torch.zeros(0, 8), 3, torch.Generator().manual_seed(7))
    b = orthogonal_rows(torch.zeros(0, 8), 3, torch.Generator().manual_seed(7))
    assert torch.equal(a, b)


def test_pool_weights_are_cosine_of_attended_query_and_key():
    g = torch.Generator().manual_seed(0)
    pool = PromptPool(n_layers=2, length=4, dim=8, per_task=3)
    pool.add_task(g)
    pool.add_task(g)
    q = torch.randn(5, 8, generator=g)
    w = pool.weights(q)  # (J, B, N)
    A = torch.cat(list(pool.A), 1)
    E = torch.cat(list(pool.E), 1)
    naive = F.cosine_similarity(q[None, :, None, :] * A[:, None], E[:, None], dim=-1)
    assert w.shape == (2, 5, 6)
    assert torch.allclose(w, naive, atol=1e-6)
    P = torch.cat(list(pool.P), 1)  # (J, N, L, D)
    expected = torch.einsum("jbn,jnld->jbld", naive, P)
    assert torch.allclose(pool(q), expected, atol=1e-6)


def test_zero_query_gives_zero_prompt_and_finite_gradients():
    pool = PromptPool(1, 2, 8, 2)
    pool.add_task(torch.Generator().manual_seed(0))
    out = pool(torch.zeros(3, 8))
    assert torch.equal(out, torch.zeros_like(out))
    (out.sum() + pool(torch.ones(1, 8)).sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in pool.parameters())


def test_new_slice_is_orthogonal_to_trained_earlier_slices_and_freezes_them():
    g = torch.Generator().manual_seed(0)
    pool = PromptPool(n_layers=2, length=4, dim=16, per_task=3)
    pool.add_task(g)
    with torch.no_grad():  # "training" moves the first slice off its init
        for p in pool.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=g))
    before = [p.detach().clone() for p in pool.parameters()]
    pool.add_task(g)
    assert [p.requires_grad for p in pool.P] == [False, True]
    for name, width in (("P", 4 * 16), ("E", 16), ("A", 16)):
        old, new = getattr(pool, name)
        for j in range(2):
            dots = new[j].reshape(-1, width) @ old[j].reshape(-1, width).T
            assert dots.abs().max().item() < 1e-5, name
    assert all(
        torch.equal(a, b)
        for a, b in zip(before, [pool.P[0], pool.E[0], pool.A[0]], strict=True)
    )


@pytest.mark.parametrize("pools", ["modality", "shared", "vector"])
@pytest.mark.parametrize("position", ["prefix", "input"])
def test_prompt_module_shapes_and_masks(pools, position):
    params = PromptParams(
        pools=pools, pool_size=6, length=4, layers=(0, 2), position=position
    )
    prompts = Prompts(params, n_tasks=3, dim=8, depth=3)
    prompts.add_task(torch.Generator().manual_seed(0))
    q_t, q_v = torch.randn(5, 8), torch.randn(5, 8)
    text_on = torch.tensor([True, False, True, True, False])
    out = prompts(q_t, q_v, text_on, ~text_on)
    assert sorted(out) == [0, 2]
    p = out[0]
    if position == "prefix":  # L/2 text + L/2 image tokens as keys and as values
        assert p.keys.shape == p.values.shape == (5, 4, 8) and p.tokens is None
        assert torch.equal(p.mask[:, :2], text_on[:, None].expand(5, 2))
        assert torch.equal(p.mask[:, 2:], ~text_on[:, None].expand(5, 2))
    else:  # L text + L image tokens prepended
        assert p.tokens.shape == (5, 8, 8) and p.keys is None
        assert p.mask.shape == (5, 8)
    trainable = [n for n, t in prompts.named_parameters() if t.requires_grad]
    assert trainable, "the first task's prompts must be trainable"


def test_shared_pool_uses_one_set_of_parameters():
    params = PromptParams(pools="shared", pool_size=4, length=2, layers=(0,))
    prompts = Prompts(params, n_tasks=2, dim=8, depth=2)
    prompts.add_task(torch.Generator().manual_seed(0))
    q = torch.randn(3, 8)
    on = torch.ones(3, dtype=torch.bool)
    p = prompts(q, q, on, on)[0]
    # same query into the same pool: text and image halves are identical
    assert torch.equal(p.keys[:, :1], p.keys[:, 1:])
    assert len(list(prompts.parameters())) == 3


@pytest.mark.parametrize(
    "kwargs, n_tasks, match",
    [
        (
            {"layers": (0, 4)},
            2,
            r"prompt\.layers \[0, 4\]: layer 4 is beyond the "
            r"backbone's 4 layers \(0\.\.3\)",
        ),
        (
            {"pool_size": 3},
            5,
            r"prompt\.pool_size 3 is smaller than the number of "
            r"tasks \(5\)",
        ),
        ({"pool_size": 40}, 5, r"prompt\.pool_size 40 exceeds the hidden size 32"),
    ],
)
def test_prompt_params_checked_against_backbone_and_tasks(kwargs, n_tasks, match):
    with pytest.raises(ParamsError, match=match):
        check_prompt_params(PromptParams(**kwargs), n_tasks, dim=32, depth=4)


def test_vector_variant_needs_no_pool_size():
    check_prompt_params(PromptParams(pools="vector", pool_size=1), 5, dim=32, depth=4)
