"""DualPrompt (Wang et al., ECCV 2022) on the frozen ViLT: G- and E-prompts.

* G-prompt: one prompt (J_g, L_g, D) shared by all tasks, at the first
  layers (`g_layers`, the paper's 0–1); it keeps training in every task, as
  in the paper's code (nothing protects it).
* E-prompts: one per task, (J_e, L_e, D) at the next layers (`e_layers`, the
  paper's 2–4), each with one key (D,) shared by its layers. In training the
  task id picks the task's own E-prompt, and the pull loss draws its key
  toward the task's queries; at test the E-prompt whose key has the highest
  cosine with the frozen query is used (top-1), over the tasks seen so far.
  When a task is added the earlier tasks' E-prompts and keys are frozen.

Both go in as prefix keys/values (the paper's prefix-tuning): the first half
of a prompt's tokens are keys, the second half values. The query is the
frozen, prompt-free text CLS q_t, as in `pipeline.methods.l2p` (which says
why); a missing modality is not reconstructed.

    pull = mean_b (1 − cos(q_b, K_task))
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from palcore.errors import ParamsError
from pipeline.model.backbone import LayerPrompt
from pipeline.methods.l2p import as_layer_prompts, check_layers, cosine, uniform


class DualPromptPrompts(nn.Module):
    """The G-prompt and the per-task E-prompts with their keys.

    forward(q_t, q_v, text_on, image_on, task) → {layer: LayerPrompt}; task
    (1-based) picks the E-prompt in training, None picks it by key at test.
    """

    def __init__(
        self,
        *,
        g_layers: Sequence[int],
        g_length: int,
        e_layers: Sequence[int],
        e_length: int,
        n_tasks: int,
        dim: int,
        depth: int,
    ):
        super().__init__()
        check_layers("prompt.g_layers", g_layers, depth)
        check_layers("prompt.layers", e_layers, depth)
        both = set(g_layers) & set(e_layers)
        if both:
            raise ParamsError(
                f"prompt.g_layers {list(g_layers)} and prompt.layers "
                f"{list(e_layers)} share layer {min(both)}: a layer takes one prompt"
            )
        for key, length in (("prompt.g_length", g_length), ("prompt.length", e_length)):
            if length <= 0 or length % 2:
                raise ParamsError(
                    f"{key} {length}: must be even and > 0 (keys, values)"
                )
        self.g_layers, self.e_layers = tuple(g_layers), tuple(e_layers)
        self.e_length, self.dim, self.max_tasks = e_length, dim, n_tasks
        self.G = nn.Parameter(torch.zeros(len(self.g_layers), g_length, dim))
        self.E = nn.ParameterList()  # task t: (J_e, L_e, D)
        self.K = nn.ParameterList()  # task t: (D,)

    @property
    def n_tasks(self) -> int:
        return len(self.E)

    def add_task(self, generator: torch.Generator) -> None:
        """Draw the next task's E-prompt and key and freeze the earlier ones;
        the first task also draws the G-prompt."""
        if self.n_tasks >= self.max_tasks:
            raise ValueError("all tasks have been added")
        device = self.G.device
        if self.n_tasks == 0:
            with torch.no_grad():
                self.G.copy_(uniform(self.G.shape, generator))
        for p in list(self.E) + list(self.K):
            p.requires_grad_(False)
        shape = (len(self.e_layers), self.e_length, self.dim)
        self.E.append(nn.Parameter(uniform(shape, generator).to(device)))
        self.K.append(nn.Parameter(uniform((self.dim,), generator).to(device)))

    def select(self, q: torch.Tensor, task: int | None) -> torch.Tensor:
        """The E-prompt index (B,) int64 (0-based task) for queries q (B, D):
        task − 1 for every row when `task` is given, else the top-1 key by
        cosine over the tasks added so far (ties: the earliest task)."""
        if task is not None:
            return torch.full((q.shape[0],), task - 1, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            return cosine(q.detach(), torch.stack(list(self.K))).argmax(-1)

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
        B = q_t.shape[0]
        idx = self.select(q_t, task)
        E = torch.stack(list(self.E)).float()[idx]  # (B, J_e, L_e, D)
        G = self.G.float()[None].expand(B, -1, -1, -1)  # (B, J_g, L_g, D)
        tokens = {layer: G[:, j, None] for j, layer in enumerate(self.g_layers)}
        tokens |= {layer: E[:, j, None] for j, layer in enumerate(self.e_layers)}
        return as_layer_prompts(tokens, text_on | image_on, "prefix")

    def pull_loss(
        self, q_t: torch.Tensor, q_v: torch.Tensor, task: int | None = None
    ) -> torch.Tensor:
        """mean over the batch of (1 − cos(q_t, K_task)), scalar; the key of
        the task being trained (the last added one when task is None)."""
        t = self.n_tasks if task is None else task
        with torch.autocast(q_t.device.type, enabled=False):
            cos = cosine(q_t.detach(), self.K[t - 1][None])  # (B, 1)
        return (1 - cos).mean()
