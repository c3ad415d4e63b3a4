"""PAL's BP model: frozen ViLT + prompt method + head (DESIGN §5).

The prompt method (`prompt.method`, `pipeline.methods`: PAL's pools with
reconstruction, or a baseline's prompts; called through the interface of
`pipeline.model.method`) turns a batch's embedded tokens and
frozen queries into joint embeddings; the head (the linear `TaskHead`, or the
method's own, `Method.make_head`) classifies them. The frozen,
prompt-free query pass (q_t at the text CLS, q_v at the image CLS) is the
model's, cacheable per sample (`QueryCache`), and stored once per dataset by
`pal frozen` (`pipeline.model.queries`). The training loss lives in
`pipeline.model.losses`, checkpoints in `pipeline.model.checkpoint`. With
`prompt.enabled: false` there is no method: the joint embedding is q_t and only
the head is trained.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, cast

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.data.samples import Batch
from pipeline.model.encoder import Backbone
from pipeline.model.method import Method, View
from pipeline.model.queries import QueryCache, batch_queries
from pipeline.model.vision import batch_inputs


class GrowingHead(Protocol):
    """What a head adds to nn.Module's interface (`Method.make_head`): rows
    for the next task's classes."""

    def add_task(
        self,
        n_classes: int,
        generator: torch.Generator | None = None,
        freeze: bool = True,
    ) -> None: ...


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

    def add_task(
        self,
        n_classes: int,
        generator: torch.Generator | None = None,
        freeze: bool = True,
    ) -> None:
        """Append zero rows for `n_classes` classes (`generator` unused: no
        draw); `freeze`: the earlier tasks' rows stop training."""
        if freeze:
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


class PalModel(nn.Module):
    """Frozen backbone + prompt method (None when disabled) + per-task head
    (`TaskHead`, or the method's own: `Method.make_head`).

    method: built for this backbone and these tasks (`pipeline.methods.
    build_model` builds it from `prompt.method`); classes_per_task: number of
    classes of each task 1..K (task k owns labels [offset_k, offset_k + n_k)).
    """

    def __init__(
        self,
        backbone: Backbone,
        method: Method | None,
        classes_per_task: Sequence[int],
    ):
        super().__init__()
        self.backbone = backbone
        self.classes_per_task = list(classes_per_task)
        # `prompts`: the attribute name keeps the state-dict keys of PAL's
        # checkpoints (`prompts.text.P.0`, ...)
        self.prompts = method
        own = None if method is None else method.make_head(backbone)
        self.head = TaskHead(backbone.hidden_size) if own is None else own
        self.step = 0

    # ------------------------------------------------------------ structure

    def class_range(self, task: int) -> tuple[int, int]:
        """Labels [lo, hi) of `task` (1-based)."""
        lo = sum(self.classes_per_task[: task - 1])
        return lo, lo + self.classes_per_task[task - 1]

    def train_range(self, task: int) -> tuple[int, int]:
        """Labels [lo, hi) whose logits the training CE of `task` takes: the
        task's own (`masked`), or every class seen so far."""
        lo, hi = self.class_range(task)
        return (lo, hi) if self.masked else (0, hi)

    def add_task(self, generator: torch.Generator) -> None:
        """Start the next task: new prompt slices and head rows; freeze the rest."""
        if self.step >= len(self.classes_per_task):
            raise ValueError("all tasks have been added")
        if self.prompts is not None:
            self.prompts.add_task(generator)
        # TaskHead, or a method's own head, which Method.make_head promises
        # has TaskHead's interface
        head = cast(GrowingHead, self.head)
        head.add_task(self.classes_per_task[self.step], generator, freeze=self.masked)
        self.step += 1

    @property
    def masked(self) -> bool:
        """Training CE over the current task's classes, earlier head rows
        frozen (no method: as PAL)."""
        return self.prompts is None or self.prompts.masked

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

    def batch_queries(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """Frozen queries of all R rows of a batch: (q_t, q_v), each (R, D)."""
        return batch_queries(self.backbone, batch)

    def features(
        self, batch: Batch | None, q: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Extraction: joint embeddings (n, D) float32 and head logits (n, C_k).

        q: (n, 2, D) float32, the batch's stored frozen queries (q_t, q_v)
        (`pipeline.model.queries`); None: computed here by the frozen pass.
        Without prompts the embedding is q_t, so a given q needs no forward
        (nor a batch: None).
        """
        if q is not None and self.prompts is None:
            x = q[:, 0]
            return x, self.head(x)
        assert batch is not None, "only given queries without prompts need no batch"
        ids, am, px, pm = batch_inputs(batch, self.backbone.device)
        n, T = batch.n, ids.shape[1]
        sizes = None if batch.image_sizes is None else batch.image_sizes[:n]
        pm = None if pm is None else pm[:n]
        h, mask = self.backbone.embed(ids[:n], am[:n], px[:n], pm, sizes)
        if q is None:
            q_t, q_v = self.backbone.queries(h, mask, T)
        else:
            q_t, q_v = q[:, 0], q[:, 1]
        if self.prompts is None:
            x = q_t
        else:
            view = View(h, mask, T, q_t, q_v, batch.missing)
            x = self.prompts.features(self.backbone, view).x
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
