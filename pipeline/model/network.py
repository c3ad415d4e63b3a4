"""PAL's BP model: frozen ViLT + prompt module + linear head (DESIGN §5).

Three kinds of pass share one embedding of a batch:

1. query pass — prompt-free, frozen: q_t = final-LN output at the text CLS,
   q_v = at the image CLS (cacheable per sample; see `QueryCache`);
2. reconstruction pass — over rows missing one modality (missing samples and,
   in training, the text-dropped / image-dropped copies of complete samples):
   only the present modality's prompts are on, driven by its frozen query; the
   missing modality's CLS output is the reconstructed query q̂;
3. classification pass — both prompts on, driven by (q_t, q_v) with q̂ in place
   of a missing modality's query ("reconstruct, then query"); the prompted
   text CLS after the final LN is the joint embedding and feeds the head.

The training loss lives in `pipeline.model.losses`, checkpoints in
`pipeline.model.checkpoint`. With `prompt.enabled: false` the joint embedding is q_t
and only the head is trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from palcore.codes import Missing
from pipeline.data.samples import Batch
from pipeline.model.backbone import Backbone
from pipeline.model.prompts import Prompts, check_prompt_params
from pipeline.model.vision import batch_inputs
from pipeline.params import PromptParams


class TaskHead(nn.Module):
    """Linear head grown per task: task t's classes get rows `W[t]` (n_t, D),
    `b[t]` (n_t,); earlier tasks' rows are frozen when a task is added.

    New rows start at zero. The CE over the current task's classes is blind to
    a vector added to all of that task's rows, so whatever such component the
    init draws stays untrained and becomes an arbitrary logit offset between
    tasks at test time (with random rows, earlier tasks' heads won most of the
    later tasks' samples on the demo). Zero rows fix that offset at zero; the
    task's rows still separate, as their targets differ.
    """

    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim
        self.W = nn.ParameterList()
        self.b = nn.ParameterList()

    def add_task(self, n_classes: int) -> None:
        for p in self.parameters():
            p.requires_grad_(False)
        device = self.W[0].device if len(self.W) else torch.device("cpu")
        self.W.append(nn.Parameter(torch.zeros(n_classes, self.dim, device=device)))
        self.b.append(nn.Parameter(torch.zeros(n_classes, device=device)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, D) → logits (B, C_k) over the classes of tasks 1..k."""
        W = torch.cat(list(self.W))
        b = torch.cat(list(self.b))
        return F.linear(x.float(), W, b)


@dataclass
class QueryCache:
    """Frozen queries of a dataset's samples (the backbone never changes).

    q: (n, 2, D) float32 — [q_t, q_v] of each sample as given (dummies for a
    missing modality); copies: (n, 2, D) — for complete samples, [q_t of the
    image-dropped copy, q_v of the text-dropped copy] (zeros elsewhere).
    """

    q: torch.Tensor
    copies: torch.Tensor


class PalModel(nn.Module):
    """Frozen backbone + prompts (None when disabled) + per-task head.

    classes_per_task: number of classes of each task 1..K (task k owns labels
    [offset_k, offset_k + n_k)).
    """

    def __init__(
        self,
        backbone: Backbone,
        prompt: PromptParams,
        classes_per_task: Sequence[int],
    ):
        super().__init__()
        self.backbone = backbone
        self.prompt_params = prompt
        self.classes_per_task = list(classes_per_task)
        n_tasks, D = len(self.classes_per_task), backbone.hidden_size
        if prompt.enabled:
            self.prompts: Prompts | None = Prompts(
                prompt, n_tasks, D, backbone.num_layers
            )
        else:
            check_prompt_params(prompt, n_tasks, D, backbone.num_layers)
            self.prompts = None
        self.head = TaskHead(D)
        self.step = 0

    # ------------------------------------------------------------ structure

    def class_range(self, task: int) -> tuple[int, int]:
        """Labels [lo, hi) of `task` (1-based)."""
        lo = sum(self.classes_per_task[: task - 1])
        return lo, lo + self.classes_per_task[task - 1]

    def add_task(self, generator: torch.Generator) -> None:
        """Start the next task: new prompt slices and head rows; freeze the rest."""
        if self.step >= len(self.classes_per_task):
            raise ValueError("all tasks have been added")
        if self.prompts is not None:
            self.prompts.add_task(generator)
        self.head.add_task(self.classes_per_task[self.step])
        self.step += 1

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The current task's prompt slices and head rows (and a prompt vector)."""
        return [p for p in self.parameters() if p.requires_grad]

    def tuned_state(self) -> dict[str, torch.Tensor]:
        """Prompt and head tensors (everything but the frozen backbone), on CPU."""
        return {
            k: v.detach().cpu().contiguous()
            for k, v in self.state_dict().items()
            if not k.startswith("backbone.")
        }

    # ------------------------------------------------------------ passes

    def reconstruct(
        self,
        h: torch.Tensor,
        mask: torch.Tensor,
        text_len: int,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        text_missing: torch.Tensor,
    ) -> torch.Tensor:
        """Reconstruction pass over R rows that each miss one modality.

        h (R, N, D), mask (R, N); q_t, q_v (R, D) frozen queries (the missing
        one is ignored); text_missing (R,) bool (False: image missing).
        Returns q̂ (R, D) float32: the text CLS output where text is missing,
        the image CLS output where the image is.
        """
        prompts = self.prompts(q_t, q_v, text_on=~text_missing, image_on=text_missing)
        out = self.backbone.encode(h, mask, prompts)
        return torch.where(text_missing[:, None], out[:, 0], out[:, text_len]).float()

    def joint(
        self,
        h: torch.Tensor,
        mask: torch.Tensor,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
    ) -> torch.Tensor:
        """Classification pass: the prompted text CLS (B, D) float32."""
        on = torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
        prompts = self.prompts(q_t, q_v, text_on=on, image_on=on)
        return self.backbone.encode(h, mask, prompts)[:, 0].float()

    def fill_missing(
        self,
        h: torch.Tensor,
        mask: torch.Tensor,
        text_len: int,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        missing: torch.Tensor,
        extra: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
        | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Reconstruct the missing queries of samples (and of `extra` rows).

        missing: (B,) int64 on the CPU. extra: (h_x, mask_x, q_t_x, q_v_x) of
        copy rows, first half text-dropped, second half image-dropped.
        Returns q_t, q_v with q̂ in place of missing queries, and q̂ of the
        extra rows (or None).
        """
        rows = torch.nonzero(missing != Missing.COMPLETE).flatten()
        n_rows, n_extra = len(rows), 0 if extra is None else extra[0].shape[0]
        if n_rows + n_extra == 0:
            return q_t, q_v, None
        dev = h.device
        text_missing = torch.cat(
            [missing[rows] == Missing.TEXT, torch.arange(n_extra) < n_extra // 2]
        ).to(dev, non_blocking=True)
        rows_d = rows.to(dev, non_blocking=True)
        parts = [(h[rows_d], mask[rows_d], q_t[rows_d], q_v[rows_d])]
        if extra is not None:
            parts.append(extra)
        h_r, mask_r, qt_r, qv_r = (torch.cat(x) for x in zip(*parts, strict=True))
        q_hat = self.reconstruct(h_r, mask_r, text_len, qt_r, qv_r, text_missing)
        if n_rows:
            code = missing[rows]
            t_rows, v_rows = (
                rows[code == Missing.TEXT].to(dev, non_blocking=True),
                rows[code == Missing.IMAGE].to(dev, non_blocking=True),
            )
            t_src = (
                torch.nonzero(code == Missing.TEXT).flatten().to(dev, non_blocking=True)
            )
            v_src = (
                torch.nonzero(code == Missing.IMAGE)
                .flatten()
                .to(dev, non_blocking=True)
            )
            q_t = q_t.index_put((t_rows,), q_hat[t_src])
            q_v = q_v.index_put((v_rows,), q_hat[v_src])
        return q_t, q_v, (q_hat[n_rows:] if n_extra else None)

    @torch.no_grad()
    def batch_queries(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Frozen queries of all R rows of a batch: (q_t, q_v), each (R, D)."""
        ids, am, px, pm = batch_inputs(batch, self.backbone.device)
        h, mask = self.backbone.embed(ids, am, px, pm, batch.image_sizes)
        return self.backbone.queries(h, mask, ids.shape[1])

    def features(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Extraction: joint embeddings (n, D) float32 and head logits (n, C_k)."""
        ids, am, px, pm = batch_inputs(batch, self.backbone.device)
        n, T = batch.n, ids.shape[1]
        sizes = None if batch.image_sizes is None else batch.image_sizes[:n]
        pm = None if pm is None else pm[:n]
        h, mask = self.backbone.embed(ids[:n], am[:n], px[:n], pm, sizes)
        q_t, q_v = self.backbone.queries(h, mask, T)
        if self.prompts is None:
            x = q_t
        else:
            q_t, q_v, _ = self.fill_missing(h, mask, T, q_t, q_v, batch.missing)
            x = self.joint(h, mask, q_t, q_v)
        return x, self.head(x)


def build_cache(model: PalModel, batches, n: int, progress=None) -> QueryCache:
    """Frozen queries of a dataset from its batches (with copies)."""
    D = model.backbone.hidden_size
    dev = model.backbone.device
    q = torch.zeros(n, 2, D, device=dev)
    copies = torch.zeros(n, 2, D, device=dev)
    for batch in batches:
        q_t, q_v = model.batch_queries(batch)
        m, c = batch.n, len(batch.complete)
        idx = batch.index.to(dev, non_blocking=True)
        q[idx, 0], q[idx, 1] = q_t[:m], q_v[:m]
        if c:
            comp = idx[batch.complete.to(dev, non_blocking=True)]
            copies[comp, 1] = q_v[m : m + c]  # text-dropped copy: its image CLS
            copies[comp, 0] = q_t[m + c :]  # image-dropped copy: its text CLS
        if progress is not None:
            progress.update(m)
    return QueryCache(q, copies)
