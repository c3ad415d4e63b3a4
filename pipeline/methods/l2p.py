"""L2P (Wang et al., CVPR 2022) on the frozen ViLT: a keyed prompt pool.

A pool of M = `prompt.pool_size` prompts P_m (J, L_p, D), one per prompt
layer j, each with a key K_m (D,). A sample's frozen query q (D,) picks the
N = `prompt.top_n` prompts whose keys are nearest by cosine (per sample, no
batch-wise vote: a vote assumes a batch holds one task, which a test set
does not), and their tokens go to the prompt layers side by side:

    idx = top-N_m cos(q, K_m)                              (B, N)

`prompt.position` picks one of two forms (DESIGN §5):

* `input`, L2P as its authors wrote it (google-research/l2p, dd8836e:
  `e_prompt_layer_idx=[0]`, `use_prefix_tune_for_e_prompt=False`,
  `vit_classifier='prompt'`): the N·L_p tokens of the chosen prompts are
  prepended to the embedded sequence at layer 0 and pass through every layer
  (with several prompt layers, each layer's tokens go in front of the
  earlier ones, as the JAX code concatenates them); the joint embedding is
  the mean of the prompt positions' outputs after the final LayerNorm:

      x = mean_{i < J·N·L_p} LN(h_12)_i                    (B, D)

* `prefix`, CODA-Prompt's L2P++ (row `l2p_pp`): per layer, the first L_p/2
  tokens of each chosen prompt are keys, the rest values; a prefix has no
  outputs, so the joint embedding is the text CLS, as the other methods'.

The joint embedding is what the head reads and what extract hands to the
analytic classifier, in both forms.

The query is the frozen, prompt-free text CLS q_t: ViLT is single-stream, so
its text CLS after the final LayerNorm (the token its pooler reads) is the
frozen model's summary of the whole pair, as ViT's CLS is of an image in L2P.
A sample missing a modality is queried with the frozen output on what it has
(the dummy in place of the missing part); nothing is reconstructed.

The pull loss (the method's auxiliary loss, weight `tune.recon_weight`)
draws the chosen keys toward the query:

    pull = mean_b Σ_{m ∈ idx_b} (1 − cos(q_b, K_m))

(L2P's −λ·Σcos/B plus the constant N, so it is ≥ 0 and has the same
gradient). Selection is not differentiable: keys learn by the pull loss only,
prompts by the classification loss only. The pool is shared by all tasks and
keeps training in every task (L2P freezes no prompt); the head's earlier
rows are frozen and its CE is over the current task's classes (`masked`),
which is L2P's −inf mask of the other tasks' logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from palcore.errors import ParamsError
from pipeline.model.encoder import Backbone
from pipeline.model.method import (
    Method,
    Out,
    StaticView,
    View,
    layer_prompts,
    valid_mean,
)
from pipeline.params import PromptParams

INIT_SCALE = 1e-2  # U(0, 0.01): flax's `initializers.uniform()`


def uniform(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """U(0, 0.01) float32 of `shape` from `generator`, drawn on the CPU
    (seeded bytes): the init of prompts and keys in the authors' code of L2P
    and DualPrompt (google-research/l2p). Prefix values near zero leave the
    frozen features almost as they are at the start, and small keys turn
    toward the queries within a few hundred steps at lr 1e-4. (The PyTorch
    ports draw U(−1, 1).)"""
    return torch.rand(*shape, generator=generator) * INIT_SCALE


def cosine(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """cos (B, M) float32 between queries q (B, D) and keys (M, D)."""
    return F.normalize(q.float(), dim=-1) @ F.normalize(keys.float(), dim=-1).T


def side_by_side(chosen: torch.Tensor, position: str) -> torch.Tensor:
    """Chosen prompts (J, B, N, L_p, D) → (J, B, N·L_p, D) for `layer_prompts`.

    prefix: every prompt's first L_p/2 tokens (its keys) first, then every
    prompt's last L_p/2 (its values), so that `layer_prompts`' split at the
    middle pairs each prompt's keys with its own values; input: prompt after
    prompt.
    """
    J, B, N, L, D = chosen.shape
    if position == "prefix":
        h = L // 2
        keys = chosen[:, :, :, :h].reshape(J, B, N * h, D)
        values = chosen[:, :, :, h:].reshape(J, B, N * h, D)
        return torch.cat([keys, values], 2)
    return chosen.reshape(J, B, N * L, D)


class L2P(Method):
    """The pool P (M, J, L_p, D) and its keys K (M, D)."""

    aux_name = "pull"
    graphable = True

    @classmethod
    def check(cls, params: PromptParams, n_tasks: int, dim: int, depth: int) -> None:
        params.check_depth(depth)
        if params.top_n > params.pool_size:
            raise ParamsError(
                f"prompt.top_n {params.top_n}: L2P picks at most "
                f"prompt.pool_size ({params.pool_size}) prompts"
            )

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        super().__init__()
        self.layers, self.position = tuple(params.layers), params.position
        self.top_n = params.top_n
        M, J = params.pool_size, len(self.layers)
        self.P = nn.Parameter(torch.zeros(M, J, params.length, dim))
        self.K = nn.Parameter(torch.zeros(M, dim))
        self.n_tasks = 0

    def add_task(self, generator: torch.Generator) -> None:
        """First task: draw the pool and keys; later tasks go on training them."""
        if self.n_tasks == 0:
            with torch.no_grad():
                self.P.copy_(uniform(self.P.shape, generator))
                self.K.copy_(uniform(self.K.shape, generator))
        self.n_tasks += 1

    def select(self, q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The top-N keys per query q (B, D): indices (B, N) int64, in
        decreasing cosine, and their cosines (B, N) float32 (with graph to K)."""
        with torch.autocast(q.device.type, enabled=False):
            cos = cosine(q.detach(), self.K)  # (B, M)
            idx = cos.detach().topk(self.top_n, dim=-1).indices
            return idx, cos.gather(1, idx)

    def prompts(self, idx: torch.Tensor) -> torch.Tensor:
        """The chosen prompts of idx (B, N), side by side: (J, B, N·L_p, D)."""
        chosen = self.P.float()[idx].permute(2, 0, 1, 3, 4)  # (J, B, N, L_p, D)
        return side_by_side(chosen, self.position)

    @staticmethod
    def pull(cos: torch.Tensor) -> torch.Tensor:
        """The pull loss from the chosen keys' cosines (B, N): scalar."""
        return (1 - cos).sum(-1).mean()

    def joint(
        self,
        backbone: Backbone,
        h: torch.Tensor,
        mask: torch.Tensor,
        q_t: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The joint embeddings (B, D) float32 of h (B, N, D), mask (B, N)
        with the prompts that q_t (B, D) picks, and the chosen keys'
        cosines (B, N) (`select`)."""
        idx, cos = self.select(q_t)
        P = self.prompts(idx)  # (J, B, N·L_p, D)
        if self.position == "prefix":  # L2P++: the text CLS
            prompts = layer_prompts(P, self.layers, self.position)
            x = backbone.encode(h, mask, prompts, read=(0,))[:, 0].float()
        else:  # L2P: the mean of the J·N·L_p prompt positions' outputs
            prompts = layer_prompts(P, self.layers, self.position, keep=True)
            read = slice(0, P.shape[0] * P.shape[2])  # the prompt positions
            out = backbone.encode(h, mask, prompts, True, read)
            x = out[:, : P.shape[0] * P.shape[2]].float().mean(1)
        return x, cos

    def features(self, backbone: Backbone, view: View) -> Out:
        x, cos = self.joint(backbone, view.h, view.mask, view.q_t)
        return Out(x, self.pull(cos), torch.full((), len(x), device=x.device))

    def static_features(self, backbone: Backbone, inputs: StaticView) -> Out:
        """`features` with the pull loss a mean over the valid rows."""
        x, cos = self.joint(backbone, inputs.h, inputs.mask, inputs.q_t)
        pull, rows = valid_mean((1 - cos).sum(-1), inputs.valid)
        return Out(x, pull, rows)


METHOD = L2P
