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
for each case, as MAP's does.

The classifier is MAP's (`PoolerHead`): its pooler (dense D→D and tanh, from
the backbone's pretrained pooler, as MAP loads it with the ViLT checkpoint)
on the prompted text CLS after the final LayerNorm, then Linear D→2D,
LayerNorm, GELU, Linear 2D→C, initialised as MAP's `init_weights` (normal,
std 0.02; biases 0); the last layer grows by the new task's rows. Pooler,
MLP and every row train in every task (MAP has no continual-learning
mechanism). The joint embedding handed to the analytic classifier (extract)
is the head's input, the prompted text CLS (D), the same kind of feature as
every method's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.model.backbone import BackboneError
from pipeline.model.encoder import Backbone
from pipeline.model.method import Method, Out, StaticView, View, layer_prompts, no_aux
from pipeline.params import PromptParams

N_CASES = 3  # codes of palcore.codes.Missing: complete, text missing, image missing
INIT_STD = 0.02  # MAP's init_weights (vilt/modules/objectives.py): normal(0, 0.02)


class PoolerHead(nn.Module):
    """MAP's classifier on a joint embedding x (B, D): the pooler
    z = tanh(x P_wᵀ + p_b) (D), then h = GELU(LN(z M_wᵀ + m_b)) (2D) and the
    logits h W_kᵀ + b_k over the classes of the tasks added (`W[t]` (n_t, 2D),
    `b[t]` (n_t,) per task).

    The pooler starts as a copy of the backbone's pretrained pooler (ViLT's
    dense + tanh), as the backbone holds it on its device; the MLP and each
    task's rows are drawn at `add_task` from its generator (the MLP at the
    first task only).
    """

    def __init__(self, pooler: nn.Linear, dim: int):
        super().__init__()
        self.dim = dim
        self.pooler = nn.Linear(dim, dim)
        with torch.no_grad():
            self.pooler.weight.copy_(pooler.weight.float())
            self.pooler.bias.copy_(pooler.bias.float())
        self.hidden = nn.Linear(dim, 2 * dim)
        self.norm = nn.LayerNorm(2 * dim)
        self.W = nn.ParameterList()
        self.b = nn.ParameterList()

    def add_task(
        self,
        n_classes: int,
        generator: torch.Generator | None = None,
        freeze: bool = True,
    ) -> None:
        """Append rows for `n_classes` classes, normal(0, 0.02) from
        `generator` (the first task draws the hidden layer first); `freeze`:
        the earlier tasks' rows stop training (pooler and MLP always train)."""
        if generator is None:
            raise ValueError("PoolerHead.add_task draws its rows: pass a generator")
        device = self.pooler.weight.device
        if not len(self.W):
            with torch.no_grad():
                w = torch.randn(self.hidden.weight.shape, generator=generator)
                self.hidden.weight.copy_(w * INIT_STD)
                self.hidden.bias.zero_()
                self.norm.weight.fill_(1.0)
                self.norm.bias.zero_()
        if freeze:
            for p in [*self.W, *self.b]:
                p.requires_grad_(False)
        rows = torch.randn(n_classes, 2 * self.dim, generator=generator) * INIT_STD
        self.W.append(nn.Parameter(rows.to(device)))
        self.b.append(nn.Parameter(torch.zeros(n_classes, device=device)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, D) → logits (B, C_k)."""
        z = torch.tanh(self.pooler(x.float()))  # (B, D)
        h = F.gelu(self.norm(self.hidden(z)))  # (B, 2D)
        return F.linear(h, torch.cat(list(self.W)), torch.cat(list(self.b)))


def pooler_head(backbone: Backbone) -> PoolerHead:
    """MAP's head for `backbone`, its pooler copied from the backbone's."""
    pooler = getattr(backbone.vilt, "pooler", None)
    if pooler is None:
        raise BackboneError(
            f"model.backbone '{backbone.name}': the ViLT has no pooler, which "
            "MAP's head starts from"
        )
    return PoolerHead(pooler.dense, backbone.hidden_size).to(backbone.device)


class Map(Method):
    """Three prompt sets P (3, J, L_p, D), chosen by each sample's case."""

    masked = False
    graphable = True

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

    def make_head(self, backbone: Backbone) -> PoolerHead:
        """MAP's pooler and MLP head (`PoolerHead`)."""
        return pooler_head(backbone)

    def prompts(self, missing: torch.Tensor) -> torch.Tensor:
        """The sets of samples of `missing` (B,) codes (host or device):
        (J, B, L_p, D) float32."""
        code = missing.to(self.P.device, non_blocking=True)
        return self.P.float()[code].transpose(0, 1)

    def features(self, backbone: Backbone, view: View) -> Out:
        P = self.prompts(view.missing)
        prompts = layer_prompts(P, self.layers, self.position, keep=True)
        return no_aux(
            backbone.encode(view.h, view.mask, prompts, read=(0,))[:, 0].float()
        )

    def static_features(self, backbone: Backbone, inputs: StaticView) -> Out:
        """`features` as it is: its shapes follow the batch's and the codes
        are on the device (padding rows get their sets; the CE ignores them)."""
        view = View(
            inputs.h,
            inputs.mask,
            inputs.T,
            inputs.q_t,
            inputs.q_v,
            inputs.missing,
        )
        return self.features(backbone, view)


METHOD = Map
