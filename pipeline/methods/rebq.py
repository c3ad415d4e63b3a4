"""RebQ (Zhao et al., 2024): reconstruct before query, with its own memory pool.

RebQ's prompt module is PAL's (`pipeline.methods.pal`): modality-specific
CODA pools queried by the frozen text and image CLS, task slices grown and
frozen per task, a missing modality's query reconstructed before it queries
its pool, complete samples copied text-dropped and image-dropped with the
reconstruction loss (α = `tune.recon_weight`, 0.01 in both papers), and a
linear head on the prompted text CLS whose CE sees the current task's classes
only. What differs, and is built here:

* the reconstruction pass: RebQ runs it with a third pool, the memory pool,
  queried by the present modality's frozen CLS, where PAL switches on the
  present modality's own pool. The memory pool here is a CODA pool like the
  others, of `prompt.pool_size` components, and its prompts enter as the
  pools' do (`prompt.position`); RebQ inserts them as input tokens after the
  text CLS.
* the reconstruction target: the output of the memory pass on the complete
  sample itself (its memory prompt the sum of the pool's prompts for q_t and
  for q_v), at the text CLS for the text-dropped copy and at the image CLS
  for the image-dropped one, without gradient (RebQ's
  `original_outputs[rec_gts].detach()`); PAL's target is the frozen,
  prompt-free query (Eq. 1). One more pass, over the complete rows, in
  training.
* the loss's scale: RebQ's per-element mean, ((q̂ − t)²).mean() over the D
  dimensions, averaged over the copies (2 per complete sample), where PAL sums
  over D: at the same α it weighs 1/(2D) of PAL's term.
* the reported classifier: RebQ's table row is its BP head; PAL's is the
  analytic classifier on the same kind of features.

Not reproduced: RebQ's fp16 autocast (bf16 here, as for every method), its
uninitialised later task slices (`REINIT: False`: only task 1's components are
Gram–Schmidt initialised, later ones stay zero; here each task's slice is
initialised as PAL's), and AdamW's default weight decay on detached slices
(old slices are frozen here).
"""

from __future__ import annotations

import torch

from pipeline.methods.pal import Pal
from pipeline.model.encoder import Backbone
from pipeline.model.method import layer_prompts
from pipeline.model.prompts import PromptPool
from pipeline.params import PromptParams


class RebQ(Pal):
    """PAL's pools plus a memory pool that drives the reconstruction pass."""

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        super().__init__(params, n_tasks, dim, depth)
        J, L = len(self.layers), params.length
        self.memory = PromptPool(J, L, dim, params.pool_size // n_tasks)

    def add_task(self, generator: torch.Generator) -> None:
        """Grow PAL's pools, then the memory pool, by the next task's slice."""
        super().add_task(generator)
        self.memory.add_task(generator)

    def reconstruct(
        self,
        backbone: Backbone,
        h: torch.Tensor,
        mask: torch.Tensor,
        text_len: int,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        text_missing: torch.Tensor,
    ) -> torch.Tensor:
        """PAL's reconstruction pass with the memory pool's prompts, queried by
        the present modality's frozen CLS (q_v where the text is missing, q_t
        where the image is). Returns q̂ (R, D) float32."""
        present = torch.where(text_missing[:, None], q_v, q_t)
        prompts = layer_prompts(self.memory(present), self.layers, self.params.position)
        out = backbone.encode(h, mask, prompts, read=(0, text_len))
        return torch.where(text_missing[:, None], out[:, 0], out[:, 1]).float()

    @torch.no_grad()
    def recon_targets(
        self,
        backbone: Backbone,
        h: torch.Tensor,
        mask: torch.Tensor,
        text_len: int,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        rows: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The memory pass over the complete rows (all B when `rows` is None),
        memory prompt = memory(q_t) + memory(q_v): its text CLS and image CLS
        outputs (c, D) float32, detached."""
        if rows is not None:
            h, mask, q_t, q_v = h[rows], mask[rows], q_t[rows], q_v[rows]
        c = len(q_t)
        both = self.memory(torch.cat([q_t, q_v]))  # (J, 2c, L, D)
        P = both[:, :c] + both[:, c:]
        prompts = layer_prompts(P, self.layers, self.params.position)
        out = backbone.encode(h, mask, prompts, read=(0, text_len))
        return out[:, 0].float(), out[:, 1].float()

    def recon_error(
        self,
        qt_hat: torch.Tensor,
        qv_hat: torch.Tensor,
        target_t: torch.Tensor,
        target_v: torch.Tensor,
    ) -> torch.Tensor:
        """Per complete sample (c,): the mean over its two copies of the
        per-element squared error, ((q̂ − t)²).mean() over D (RebQ's
        `rebq.py`), so that the loss is the mean over all copies."""
        err_t = (qt_hat - target_t).pow(2).mean(-1)
        err_v = (qv_hat - target_v).pow(2).mean(-1)
        return (err_t + err_v) / 2


METHOD = RebQ
