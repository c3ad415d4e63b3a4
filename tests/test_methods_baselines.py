"""DualPrompt, RebQ, MAP and MSP as their authors' code has them: the
DualPrompt E-prompt carried over to the next task, RebQ's reconstruction
target and loss scale, MAP's (and MSP's) pooler + MLP head (DESIGN §6)."""

import torch

from pipeline.methods import build
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
