"""L2P (Wang et al., CVPR 2022) on the frozen ViLT: a keyed prompt pool.

A pool of M prompts P_m (J, L_p, D), one per prompt layer j, each with a key
K_m (D,). A sample's frozen query q (D,) picks the N prompts whose keys are
nearest by cosine (per sample, no batch-wise vote: a vote assumes a batch
holds one task, which a test set does not), and their tokens go to the
prompt layers side by side:

    idx = top-N_m cos(q, K_m)                              (B, N)
    prefix (`position: prefix`, CODA-Prompt's L2P++): per layer, the first
        L_p/2 tokens of each chosen prompt are keys, the rest values
    input (`position: input`, the original's layer-0 insertion): all L_p
        tokens of each chosen prompt are prepended to the sequence

The query is the frozen, prompt-free text CLS q_t: ViLT is single-stream, so
its text CLS after the final LayerNorm (the token its pooler reads) is the
frozen model's summary of the whole pair, as ViT's CLS is of an image in L2P.
A sample missing a modality is queried with the frozen output on what it has
(the dummy in place of the missing part); nothing is reconstructed.

The pull loss draws the chosen keys toward the query:

    pull = mean_b Σ_{m ∈ idx_b} (1 − cos(q_b, K_m))

(L2P's −λ·Σcos/B plus the constant N, so it is ≥ 0 and has the same
gradient). Selection is not differentiable: keys learn by the pull loss only,
prompts by the classification loss only. The pool is shared by all tasks and
keeps training in every task (L2P freezes no prompt); the head's earlier
rows are frozen and its CE is over the current task's classes, which is
L2P's −inf mask of the other tasks' logits.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from palcore.errors import ParamsError
from pipeline.model.backbone import LayerPrompt


def uniform(shape: Sequence[int], generator: torch.Generator) -> torch.Tensor:
    """U(−1, 1) float32 of `shape` from `generator` (the L2P and DualPrompt
    ports' init of prompts and keys), drawn on the CPU: seeded bytes."""
    return torch.rand(*shape, generator=generator) * 2 - 1


def cosine(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """cos (B, M) float32 between queries q (B, D) and keys (M, D)."""
    return F.normalize(q.float(), dim=-1) @ F.normalize(keys.float(), dim=-1).T


def as_layer_prompts(
    tokens: dict[int, torch.Tensor], on: torch.Tensor, position: str
) -> dict[int, LayerPrompt]:
    """Per-layer prompt tokens (B, L, D) → `LayerPrompt`s for the backbone.

    prefix: the first half of each chosen prompt's tokens are keys, the
    second half values; `tokens[layer]` is (B, N, L_p, D) for N chosen
    prompts. input: all tokens, flattened to (B, N·L_p, D). on: (B,) bool,
    False switches a sample's prompts off.
    """
    out = {}
    for layer, t in tokens.items():
        B, N, L, D = t.shape
        if position == "prefix":
            h = L // 2
            keys = t[:, :, :h].reshape(B, N * h, D)
            values = t[:, :, h:].reshape(B, N * h, D)
            mask = on[:, None].expand(B, N * h)
            out[layer] = LayerPrompt(mask=mask, keys=keys, values=values)
        else:
            mask = on[:, None].expand(B, N * L)
            out[layer] = LayerPrompt(mask=mask, tokens=t.reshape(B, N * L, D))
    return out


def check_layers(key: str, layers: Sequence[int], depth: int) -> None:
    """ParamsError naming `key` when a layer is beyond the backbone's depth."""
    too_deep = [layer for layer in layers if layer >= depth]
    if too_deep:
        raise ParamsError(
            f"{key} {list(layers)}: layer {too_deep[0]} is beyond the "
            f"backbone's {depth} layers (0..{depth - 1})"
        )


class L2PPrompts(nn.Module):
    """L2P's prompt pool: `pool_size` prompts (J, `length`, D) with keys (D,).

    forward(q_t, q_v, text_on, image_on, task) → {layer: LayerPrompt};
    `pull_loss(q_t, q_v, task)` is the key–query term. `task` (1-based, or
    None at test) changes nothing in L2P: the key match picks the prompts in
    training and test alike.
    """

    def __init__(
        self,
        *,
        pool_size: int,
        length: int,
        top_n: int,
        layers: Sequence[int],
        position: str,
        dim: int,
        depth: int,
    ):
        super().__init__()
        check_layers("prompt.layers", layers, depth)
        if not 0 < top_n <= pool_size:
            raise ParamsError(
                f"prompt.top_n {top_n}: must be in 1..prompt.pool_size ({pool_size})"
            )
        self.layers, self.position = tuple(layers), position
        self.top_n, self.length = top_n, length
        J = len(self.layers)
        self.P = nn.Parameter(torch.zeros(pool_size, J, length, dim))
        self.K = nn.Parameter(torch.zeros(pool_size, dim))
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

    def forward(
        self,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        text_on: torch.Tensor,
        image_on: torch.Tensor,
        task: int | None = None,
    ) -> dict[int, LayerPrompt]:
        """q_t, q_v (B, D) frozen queries (q_v unused); text_on, image_on (B,)
        bool: a sample's prompts are on where it has either modality on."""
        idx, _ = self.select(q_t)
        chosen = self.P.float()[idx]  # (B, N, J, L_p, D)
        tokens = {layer: chosen[:, :, j] for j, layer in enumerate(self.layers)}
        return as_layer_prompts(tokens, text_on | image_on, self.position)

    def pull_loss(
        self, q_t: torch.Tensor, q_v: torch.Tensor, task: int | None = None
    ) -> torch.Tensor:
        """mean over the batch of Σ over the chosen keys of (1 − cos), scalar."""
        _, cos = self.select(q_t)
        return (1 - cos).sum(-1).mean()
