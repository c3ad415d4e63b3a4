"""MAP (Lee et al., CVPR 2023): missing-aware prompts (DESIGN §6, the baselines).

One prompt set per missing case — complete, text missing, image missing —
each (J, L_p, D) over the prompt layers; a sample gets the set of its case.
There is no key, no query and no continual-learning mechanism: the same three
sets and every head row keep training task after task (sequential
fine-tuning), and the CE is taken over every class seen so far.

As in MAP's code, with `prompt.position: input` the sets' tokens go in front
of the sequence at each prompt layer and accumulate (layer j sees the tokens
of layers 0..j); `prefix` is MAP's `attention` mode (first half keys, second
half values). Each set starts at zero with a row of ones, at a different row
for each case, as MAP's does. MAP's own head (pooler, 768→1536→C MLP) is
replaced by the project's linear head on the prompted text CLS, so that its
features feed the analytic classifier like every method's.
"""

from __future__ import annotations

import torch
from torch import nn

from pipeline.model.encoder import Backbone
from pipeline.model.method import Method, Out, View, layer_prompts, no_aux
from pipeline.params import PromptParams

N_CASES = 3  # codes of palcore.codes.Missing: complete, text missing, image missing


class Map(Method):
    """Three prompt sets P (3, J, L_p, D), chosen by each sample's case."""

    masked = False

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        super().__init__()
        self.layers, self.position = tuple(params.layers), params.position
        self.P = nn.Parameter(
            torch.zeros(N_CASES, len(self.layers), params.length, dim)
        )
        self.n_tasks = 0

    def add_task(self, generator: torch.Generator) -> None:
        """First task: the init (a row of ones per case); later tasks keep
        training the same sets."""
        if self.n_tasks == 0:
            L = self.P.shape[2]
            with torch.no_grad():
                self.P.zero_()
                for case in range(N_CASES):
                    self.P[case, :, case % L].fill_(1.0)
        self.n_tasks += 1

    def prompts(self, missing: torch.Tensor) -> torch.Tensor:
        """The sets of samples of `missing` (B,) codes: (J, B, L_p, D) float32."""
        return self.P.float()[missing.to(self.P.device)].transpose(0, 1)

    def features(self, backbone: Backbone, view: View) -> Out:
        P = self.prompts(view.missing)
        prompts = layer_prompts(P, self.layers, self.position, keep=True)
        return no_aux(backbone.encode(view.h, view.mask, prompts)[:, 0].float())


METHOD = Map
