"""L2P and DualPrompt behind the method interface: selection rules and pull
losses on hand-made vectors, and training on the tiny ViLT through the
project's loss (CE and pull fall, frozen parts stay bit-identical)."""

import json

import pytest
import torch

from palcore.errors import ParamsError
from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.methods import build, build_model, model_from_checkpoint
from pipeline.methods.dualprompt import DualPrompt
from pipeline.methods.l2p import L2P, side_by_side
from pipeline.model.backbone import load_backbone
from pipeline.model.losses import loss as batch_loss
from pipeline.model.network import build_cache
from pipeline.params import PromptParams

EYE = torch.eye(4)
Q = torch.tensor([[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.1]])


def _l2p(**kw) -> L2P:
    args = dict(method="l2p", pool_size=3, length=4, top_n=2, layers=(0,))
    module = build(PromptParams(**{**args, **kw}), n_tasks=3, dim=4, depth=2)
    module.add_task(torch.Generator().manual_seed(0))
    with torch.no_grad():
        module.K.copy_(EYE[:3] * torch.tensor([[2.0], [1.0], [5.0]]))  # e0, e1, e2
    return module


def _dual(**kw) -> DualPrompt:
    args = dict(method="dualprompt", g_layers=(0,), g_length=2, layers=(1,), length=4)
    module = build(PromptParams(**{**args, **kw}), n_tasks=3, dim=4, depth=2)
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        module.add_task(g)
    with torch.no_grad():
        for t, key in enumerate((EYE[0], EYE[1], -EYE[0])):
            module.K[t].copy_(3 * key)
    return module


def test_l2p_picks_the_top_n_keys_by_cosine_in_decreasing_order():
    idx, cos = _l2p().select(torch.tensor([[3.0, 4.0, 0, 0], [0, 1.0, 0, 1.0]]))
    # cosines: row 0 (0.6, 0.8, 0), row 1 (0, 1/√2, 0)
    assert idx[0].tolist() == [1, 0] and idx[1, 0] == 1
    torch.testing.assert_close(cos[0], torch.tensor([0.8, 0.6]))
    assert cos[1, 0].item() == pytest.approx(2**-0.5)


def test_l2p_pull_loss_is_the_mean_of_summed_one_minus_cosine():
    _, cos = _l2p().select(torch.tensor([[3.0, 4.0, 0, 0], [0, 0, 1.0, 0]]))
    # row 0: (1 − 0.8) + (1 − 0.6) = 0.6; row 1: e2, then a key at cosine 0
    assert L2P.pull(cos).item() == pytest.approx((0.6 + 1.0) / 2)


def test_l2p_pull_loss_moves_only_the_chosen_keys():
    module = _l2p()
    _, cos = module.select(torch.tensor([[3.0, 4.0, 0.0, 0.0]]))
    L2P.pull(cos).backward()
    assert module.P.grad is None
    # d(1 − cos)/dK_m = −(q̂ − cos·K̂_m)/‖K_m‖ for the chosen keys e0 (‖·‖ 2), e1
    q_hat = torch.tensor([0.6, 0.8, 0.0, 0.0])
    for m, norm, c in ((0, 2.0, 0.6), (1, 1.0, 0.8)):
        torch.testing.assert_close(module.K.grad[m], -(q_hat - c * EYE[m]) / norm)
    assert module.K.grad[2].abs().sum() == 0


def test_l2p_prefix_pairs_each_chosen_prompts_keys_with_its_values():
    module = _l2p()
    idx, _ = module.select(Q)  # row 0: prompts 1, 0; row 1: prompt 2 first
    P = module.prompts(idx)  # (J, B, N·L, D)
    W = module.P.detach()  # (M, J, L, D)
    keys = torch.cat([W[1, 0, :2], W[0, 0, :2]])
    values = torch.cat([W[1, 0, 2:], W[0, 0, 2:]])
    assert torch.equal(P[0, 0], torch.cat([keys, values]))
    assert torch.equal(P[0, 1, :2], W[2, 0, :2])


def test_l2p_input_position_puts_the_chosen_prompts_one_after_another():
    module = _l2p(position="input", layers=(0, 1))
    P = module.prompts(module.select(Q)[0])
    W = module.P.detach()
    assert P.shape == (2, 2, 8, 4)
    assert torch.equal(P[1, 0], torch.cat([W[1, 1], W[0, 1]]))


def test_side_by_side_prefix_layout_on_numbered_tokens():
    chosen = torch.arange(8.0).view(1, 1, 2, 4, 1)  # 2 prompts of 4 tokens
    assert side_by_side(chosen, "prefix").flatten().tolist() == [0, 1, 4, 5, 2, 3, 6, 7]
    assert side_by_side(chosen, "input").flatten().tolist() == list(range(8))


def test_l2p_and_dualprompt_settings_that_do_not_fit_are_one_line_errors():
    with pytest.raises(ParamsError, match=r"^prompt.top_n 4: L2P picks at most "):
        _l2p(top_n=4)
    with pytest.raises(ParamsError, match=r"^prompt.layers \[0, 2\]: layer 2 is"):
        _l2p(layers=(0, 2))
    with pytest.raises(ParamsError, match=r"share layer 1: DualPrompt puts the G"):
        _dual(g_layers=(0, 1))
    with pytest.raises(ParamsError, match=r"^prompt.g_layers \[5\]: layer 5 is"):
        _dual(g_layers=(5,))
    with pytest.raises(ParamsError, match=r"^prompt.position 'input': DualPrompt"):
        _dual(position="input")
    with pytest.raises(ParamsError, match=r"^prompt.g_length must be even and > 0"):
        PromptParams(g_length=3)
    with pytest.raises(ParamsError, match=r"^prompt.top_n must be > 0, got 0$"):
        PromptParams(top_n=0)


def test_dualprompt_task_id_picks_the_e_prompt_in_training_whatever_the_query():
    module = _dual()
    q = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])
    idx = module.select(q, task=3)
    assert idx.tolist() == [2, 2]
    p = module.prompts(idx)
    E = module.E[2].detach()  # (J_e, L_e, D)
    assert torch.equal(p[1].keys[0], E[0, :2]) and torch.equal(p[1].values[1], E[0, 2:])


def test_dualprompt_key_match_picks_the_e_prompt_at_test():
    module = _dual()
    q = torch.tensor([[1.0, 0.2, 0, 0], [0.1, 1.0, 0, 0], [-1.0, 0.5, 0, 0]])
    idx = module.select(q, task=None)
    assert idx.tolist() == [0, 1, 2]
    p = module.prompts(idx)
    for row in range(3):
        assert torch.equal(p[1].keys[row], module.E[row].detach()[0, :2])
        assert torch.equal(p[0].keys[row], module.G.detach()[0, :1])  # shared G
    assert sorted(p) == [0, 1] and p[0].values.shape == (3, 1, 4)


def test_dualprompt_pull_loss_draws_the_task_key_only():
    module = _dual()
    q = torch.tensor([[3.0, 4.0, 0, 0], [0, 1.0, 0, 0]])
    # task 2's key e1: cosines 0.8 and 1; task 3's key −e0: cosines −0.6 and 0
    assert module.pull(q, task=2).item() == pytest.approx((0.2 + 0.0) / 2)
    value = module.pull(q, task=3)
    assert value.item() == pytest.approx((1.6 + 1.0) / 2)
    value.backward()
    assert module.K[2].grad.abs().sum() > 0 and module.G.grad is None


def test_dualprompt_adding_a_task_freezes_the_earlier_e_prompts_and_keys():
    module = _dual()
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    assert trainable == {"G", "E.2", "K.2"}
    with pytest.raises(ValueError, match="all tasks have been added"):
        module.add_task(torch.Generator())


# ---------------------------------------------------------------- on the tiny ViLT

L2P_ROW = dict(method="l2p", pool_size=4, length=4, top_n=2, layers=(0,))
L2P_INPUT_ROW = {**L2P_ROW, "position": "input"}  # the original; L2P_ROW: L2P++
DUAL_ROW = dict(method="dualprompt", g_layers=(0,), g_length=4, layers=(1,), length=4)


@pytest.fixture(scope="module")
def backbone(tiny_vilt):
    return load_backbone(str(tiny_vilt), 12)


def _train(backbone, tiny_prepare, row, steps=8):
    """A model of `row` at task 2, trained `steps` AdamW steps (lr 3e-3) on
    one batch of task 2 through the project's loss (pull weight 1); returns
    the model, its tensors before training and the (ce, pull) of each step."""
    samples, tasks = read_prepare(tiny_prepare)
    model = build_model(backbone, PromptParams(**row), tasks.classes_per_task)
    g = torch.Generator().manual_seed(0)
    model.add_task(g)
    model.add_task(g)
    train = select(samples, "train", [2])
    ds = SampleDataset(train, tasks.root, backbone.processor, 12, backbone.image_side)
    cache = build_cache(model, make_loader(ds, 16), len(ds))
    batch = next(iter(make_loader(ds, 8)))
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    opt = torch.optim.AdamW(model.trainable_parameters(), lr=3e-3, weight_decay=0.0)
    history = []
    for _ in range(steps):
        torch.manual_seed(0)  # the same patch order every step
        value, parts = batch_loss(model, batch, cache, 2, recon_weight=1.0)
        opt.zero_grad()
        value.backward()
        opt.step()
        history.append((parts["ce"].item(), parts["aux"].item()))
    return model, before, history


def _changed(model, before) -> set[str]:
    after = model.state_dict()
    return {k for k, v in before.items() if not torch.equal(after[k], v)}


@pytest.mark.parametrize("row", [L2P_INPUT_ROW, L2P_ROW], ids=["l2p", "l2p_pp"])
def test_l2p_trains_its_pool_keys_and_task_head_only(backbone, tiny_prepare, row):
    model, before, history = _train(backbone, tiny_prepare, row)
    ce, pull = zip(*history, strict=True)
    assert ce[-1] < ce[0] - 0.05 and sorted(pull, reverse=True) == list(pull), history
    assert _changed(model, before) == {"prompts.P", "prompts.K", "head.W.1", "head.b.1"}


def test_dualprompt_trains_g_and_its_task_e_prompt_only(backbone, tiny_prepare):
    model, before, history = _train(backbone, tiny_prepare, DUAL_ROW)
    ce, pull = zip(*history, strict=True)
    assert ce[-1] < ce[0] - 0.05 and sorted(pull, reverse=True) == list(pull), history
    assert _changed(model, before) == {
        "prompts.G",
        "prompts.E.1",
        "prompts.K.1",
        "head.W.1",
        "head.b.1",
    }


@pytest.mark.parametrize(
    "row", [L2P_INPUT_ROW, L2P_ROW, DUAL_ROW], ids=["l2p", "l2p_pp", "dualprompt"]
)
def test_a_checkpoint_rebuilds_the_same_model(backbone, tiny_prepare, row):
    samples, tasks = read_prepare(tiny_prepare)
    model = build_model(backbone, PromptParams(**row), tasks.classes_per_task)
    g = torch.Generator().manual_seed(1)
    model.add_task(g)
    model.add_task(g)
    params = {"prompt": {**row, "layers": list(row["layers"])}}
    if "g_layers" in row:
        params["prompt"]["g_layers"] = list(row["g_layers"])
    ckpt = {
        "params": params,
        "tasks": {"classes_per_task": tasks.classes_per_task},
        "step": 2,
        "state": model.tuned_state(),
    }
    again = model_from_checkpoint(ckpt, backbone)
    assert again.prompts.n_tasks == 2
    state = again.tuned_state()
    assert all(torch.equal(state[k], v) for k, v in model.tuned_state().items())


@pytest.mark.parametrize(
    "row", [L2P_INPUT_ROW, L2P_ROW, DUAL_ROW], ids=["l2p", "l2p_pp", "dualprompt"]
)
def test_tune_extract_solve_evaluate_on_the_tiny_model(
    tmp_path, tiny_vilt, tiny_prepare, row
):
    from helpers import write_params

    from pipeline import params as pparams
    from pipeline.stages.extract import extract
    from pipeline.stages.tune import tune
    from solver.evaluate import evaluate
    from solver.params import SolveParams
    from solver.solve import solve

    prompt = {**row, "layers": list(row["layers"])}
    params = write_params(tmp_path / "params.yaml", tiny_vilt, prompt=prompt)
    load = pparams.load
    ckpts = tune(
        tiny_prepare,
        tmp_path / "tune",
        load(params, "model"),
        load(params, "prompt"),
        load(params, "tune"),
    )
    assert len(ckpts) == 3
    log = [json.loads(line) for line in (tmp_path / "tune/log.jsonl").open()]
    assert [e["task"] for e in log] == [1, 2, 3] and all(e["pull"] > 0 for e in log)
    features = tmp_path / "extract"
    extract(tiny_prepare, tmp_path / "tune", features, load(params, "extract"))
    solve_p = SolveParams(eta=1.0, width=64, seed=0, device="cpu")
    (weights,) = solve(features, tmp_path / "solve", solve_p)
    (metrics,) = evaluate(features, [weights], tmp_path / "evaluate", plot=False)
    m = json.loads(metrics.read_text())
    for head in (m, m["bp"]):  # the analytic classifier's and the BP head's
        assert [len(r) for r in head["matrix"]] == [1, 2, 3]
        assert 0 <= head["acc"] <= 100
