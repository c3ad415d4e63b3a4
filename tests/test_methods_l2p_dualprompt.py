"""L2P and DualPrompt prompt modules: selection rules and pull losses on
hand-made vectors, and training on the tiny ViLT (loss falls, frozen parts
stay bit-identical)."""

import pytest
import torch
import torch.nn.functional as F

from palcore.errors import ParamsError
from pipeline.model.backbone import load_backbone
from pipeline.data.loader import SampleDataset, make_loader
from pipeline.methods.dualprompt import DualPromptPrompts
from pipeline.methods.l2p import L2PPrompts
from pipeline.model.network import TaskHead
from pipeline.data.samples import read_prepare, select
from pipeline.model.vision import batch_inputs

EYE = torch.eye(4)


def _l2p(**kw) -> L2PPrompts:
    args = dict(pool_size=3, length=4, top_n=2, layers=(0,), position="prefix")
    module = L2PPrompts(**{**args, **kw}, dim=4, depth=2)
    module.add_task(torch.Generator().manual_seed(0))
    with torch.no_grad():
        module.K.copy_(EYE[:3] * torch.tensor([[2.0], [1.0], [5.0]]))  # e0, e1, e2
    return module


def _dual(**kw) -> DualPromptPrompts:
    args = dict(g_layers=(0,), g_length=2, e_layers=(1,), e_length=4, n_tasks=3)
    module = DualPromptPrompts(**{**args, **kw}, dim=4, depth=2)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        module.add_task(g)
    with torch.no_grad():
        for t, key in enumerate((EYE[0], EYE[1], -EYE[0])):
            module.K[t].copy_(3 * key)
    return module


ON = torch.ones(2, dtype=torch.bool)


def test_l2p_picks_the_top_n_keys_by_cosine_in_decreasing_order():
    module = _l2p()
    q = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 1.0, 0.0, 1.0]])
    idx, cos = module.select(q)
    # cosines: row 0 (0.6, 0.8, 0), row 1 (0, 1/√2, 0)
    assert idx.tolist()[0] == [1, 0]
    assert idx[1, 0] == 1
    torch.testing.assert_close(cos[0], torch.tensor([0.8, 0.6]))
    assert cos[1, 0].item() == pytest.approx(2**-0.5)


def test_l2p_pull_loss_is_the_mean_of_summed_one_minus_cosine():
    module = _l2p()
    q = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    # row 0: (1 − 0.8) + (1 − 0.6) = 0.6; row 1: e2 then a cosine-0 key: 0 + 1
    assert module.pull_loss(q, q).item() == pytest.approx((0.6 + 1.0) / 2)


def test_l2p_pull_loss_moves_only_the_keys():
    module = _l2p()
    module.pull_loss(torch.tensor([[3.0, 4.0, 0.0, 0.0]]), None).backward()
    assert module.P.grad is None
    # d(1 − cos)/dK_m for q ∝ (0.6, 0.8): −(q̂ − cos·K̂)/‖K‖ on the chosen keys
    q_hat = torch.tensor([0.6, 0.8, 0.0, 0.0])
    for m, norm, cos in ((0, 2.0, 0.6), (1, 1.0, 0.8)):
        expected = -(q_hat - cos * EYE[m]) / norm
        torch.testing.assert_close(module.K.grad[m], expected)
    assert module.K.grad[2].abs().sum() == 0


def test_l2p_prefix_tokens_are_the_chosen_prompts_halves_side_by_side():
    module = _l2p()
    q = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.1]])
    on = torch.tensor([True, False])
    p = module(q, q, on, torch.zeros(2, dtype=torch.bool), task=1)
    assert list(p) == [0]
    P = module.P.detach()  # (M, J, L, D)
    assert torch.equal(p[0].keys[0], torch.cat([P[1, 0, :2], P[0, 0, :2]]))
    assert torch.equal(p[0].values[0], torch.cat([P[1, 0, 2:], P[0, 0, 2:]]))
    assert torch.equal(p[0].keys[1, :2], P[2, 0, :2])
    assert p[0].mask.tolist() == [[True] * 4, [False] * 4]


def test_l2p_input_position_prepends_every_token_of_the_chosen_prompts():
    module = _l2p(position="input", layers=(0, 1))
    q = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.1]])
    p = module(q, q, ON, ON)
    assert sorted(p) == [0, 1] and p[1].keys is None
    P = module.P.detach()
    assert torch.equal(p[1].tokens[0], torch.cat([P[1, 1], P[0, 1]]))
    assert p[0].tokens.shape == (2, 8, 4) and p[0].mask.shape == (2, 8)


def test_l2p_settings_beyond_the_pool_or_backbone_are_one_line_errors():
    with pytest.raises(ParamsError, match=r"prompt.top_n 4: must be in 1..prompt"):
        _l2p(top_n=4)
    with pytest.raises(ParamsError, match=r"prompt.layers \[0, 2\]: layer 2 is"):
        _l2p(layers=(0, 2))


def test_dualprompt_task_id_picks_the_e_prompt_in_training_whatever_the_query():
    module = _dual()
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    assert module.select(q, task=3).tolist() == [2, 2]
    p = module(q, q, ON, ON, task=3)
    E = module.E[2].detach()  # (J_e, L_e, D)
    assert torch.equal(p[1].keys[0], E[0, :2]) and torch.equal(p[1].values[1], E[0, 2:])


def test_dualprompt_key_match_picks_the_e_prompt_at_test():
    module = _dual()
    q = torch.tensor([[1.0, 0.2, 0, 0], [0.1, 1.0, 0, 0], [-1.0, 0.5, 0, 0]])
    assert module.select(q, task=None).tolist() == [0, 1, 2]
    on = torch.ones(3, dtype=torch.bool)
    p = module(q, q, on, on)
    for row, t in enumerate((0, 1, 2)):
        assert torch.equal(p[1].keys[row], module.E[t].detach()[0, :2])
    G = module.G.detach()  # the shared G-prompt, the same for every row
    assert all(torch.equal(p[0].keys[r], G[0, :1]) for r in range(3))
    assert p[0].values.shape == (3, 1, 4)


def test_dualprompt_pull_loss_draws_the_task_key_only():
    module = _dual()
    q = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    value = module.pull_loss(q, q, task=2)  # key e1: cos 0.8 and 1
    assert value.item() == pytest.approx(((1 - 0.8) + (1 - 1.0)) / 2)


def test_dualprompt_layers_may_not_overlap_and_lengths_split_evenly():
    with pytest.raises(ParamsError, match=r"share layer 1: a layer takes one"):
        _dual(g_layers=(0, 1))
    with pytest.raises(ParamsError, match=r"prompt.g_length 3: must be even"):
        _dual(g_length=3)
    with pytest.raises(ParamsError, match=r"prompt.g_layers \[5\]: layer 5 is"):
        _dual(g_layers=(5,))


def test_dualprompt_adding_a_task_freezes_the_earlier_e_prompts_and_keys():
    module = _dual()
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable == {"G", "E.2", "K.2"}
    with pytest.raises(ValueError, match="all tasks have been added"):
        module.add_task(torch.Generator())


# ---------------------------------------------------------------- on the tiny ViLT


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_backbone(str(tiny_vilt), 12)


@pytest.fixture(scope="module")
def task2(backbone, tiny_prepare):
    """One batch of task 2's training samples, embedded: (h, mask, T, labels)."""
    samples, tasks = read_prepare(tiny_prepare)
    train = select(samples, "train", [2])
    ds = SampleDataset(train, tasks.root, backbone.processor, 12, backbone.image_side)
    batch = next(iter(make_loader(ds, 8)))
    ids, am, px, pm = batch_inputs(batch, backbone.device)
    torch.manual_seed(0)
    with torch.no_grad():
        h, mask = backbone.embed(ids, am, px, pm, batch.image_sizes)
    lo = tasks.classes_per_task[0]
    return h, mask, ids.shape[1], batch.labels - lo, tasks.classes_per_task


def _train(backbone, module, data, steps=8):
    """Train `module` and a task head on task 2 for `steps` AdamW steps (lr 3e-3) on one
    batch (CE over task 2's classes + the pull loss); returns the (ce, pull)
    of each step and the head."""
    h, mask, T, labels, classes = data
    head = TaskHead(backbone.hidden_size)
    head.add_task(classes[0])
    head.add_task(classes[1])
    with torch.no_grad():
        q_t, q_v = backbone.queries(h, mask, T)
    params = [p for p in [*module.parameters(), *head.parameters()] if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-3, weight_decay=0.0)
    on = torch.ones(len(h), dtype=torch.bool)
    lo, hi = classes[0], classes[0] + classes[1]
    history = []
    for _ in range(steps):
        out = backbone.encode(h, mask, module(q_t, q_v, on, on, task=2))[:, 0]
        ce = F.cross_entropy(head(out)[:, lo:hi], labels)
        pull = module.pull_loss(q_t, q_v, task=2)
        opt.zero_grad()
        (ce + pull).backward()
        opt.step()
        history.append((ce.item(), pull.item()))
    return history, head


def _snapshot(module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in module.state_dict().items()}


def test_l2p_trains_its_pool_and_head_and_leaves_the_backbone_unchanged(
    backbone, task2
):
    D = backbone.hidden_size
    module = L2PPrompts(
        pool_size=4, length=4, top_n=2, layers=(0,), position="prefix", dim=D, depth=2
    )
    g = torch.Generator().manual_seed(0)
    module.add_task(g)
    module.add_task(g)  # task 2: the same pool, still trained
    frozen, before = _snapshot(backbone), _snapshot(module)
    history, head = _train(backbone, module, task2)
    ce, pull = zip(*history, strict=True)
    assert ce[-1] < ce[0] - 0.05 and sorted(pull, reverse=True) == list(pull), history
    after = _snapshot(backbone)
    assert all(torch.equal(after[k], v) for k, v in frozen.items())
    assert not torch.equal(module.K, before["K"]) and not torch.equal(
        module.P, before["P"]
    )
    assert head.W[0].grad is None and head.W[1].grad.abs().sum() > 0


def test_dualprompt_trains_g_and_its_task_e_prompt_and_freezes_the_rest(
    backbone, task2
):
    D = backbone.hidden_size
    module = DualPromptPrompts(
        g_layers=(0,), g_length=4, e_layers=(1,), e_length=4, n_tasks=3, dim=D, depth=2
    )
    g = torch.Generator().manual_seed(0)
    module.add_task(g)
    module.add_task(g)
    frozen, before = _snapshot(backbone), _snapshot(module)
    history, head = _train(backbone, module, task2)
    ce, pull = zip(*history, strict=True)
    assert ce[-1] < ce[0] - 0.05 and sorted(pull, reverse=True) == list(pull), history
    after_backbone, after = _snapshot(backbone), _snapshot(module)
    assert all(torch.equal(after_backbone[k], v) for k, v in frozen.items())
    assert torch.equal(after["E.0"], before["E.0"])
    assert torch.equal(after["K.0"], before["K.0"])
    for name in ("G", "E.1", "K.1"):
        assert not torch.equal(after[name], before[name]), name
    assert head.W[0].grad is None
