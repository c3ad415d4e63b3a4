"""DualPrompt (Wang et al., ECCV 2022) on the frozen ViLT: G- and E-prompts.

* G-prompt: one prompt (J_g, L_g, D) shared by all tasks, at the first
  layers (`prompt.g_layers`, the paper's 0–1; `prompt.g_length` tokens); it
  keeps training in every task, as in the paper's code (nothing protects it).
* E-prompts: one per task, (J_e, L_e, D) at the next layers (`prompt.layers`,
  the paper's 2–4; `prompt.length` tokens), each with one key (D,) shared by
  its layers. In training the task id picks the task's own E-prompt, and the
  pull loss draws its key toward the task's queries; at test the E-prompt
  whose key has the highest cosine with the frozen query is used (top-1),
  over the tasks seen so far. Adding a task freezes the earlier tasks'
  E-prompts and keys. A new task's E-prompt starts as a copy of the previous
  task's trained one, its key drawn fresh, as the authors' code does
  (`shared_prompt_pool=True`, `shared_prompt_key=False`: the JAX
  `train_continual.py` and the PyTorch port's `engine.py`); the first task's
  is drawn.

Both go in as prefix keys/values (the paper's prefix-tuning): the first half
of a prompt's tokens are keys, the second half values. The query is the
frozen, prompt-free text CLS q_t, as in `pipeline.methods.l2p` (which says
why); a missing modality is not reconstructed. The auxiliary loss (weight
`tune.recon_weight`):

    pull = mean_b (1 − cos(q_b, K_task))       (0 at extraction: no task)
"""

from __future__ import annotations

import torch
from torch import nn

from palcore.errors import ParamsError
from pipeline.methods.l2p import cosine, uniform
from pipeline.model.encoder import Backbone, LayerPrompt
from pipeline.model.method import (
    Method,
    Out,
    StaticView,
    View,
    layer_prompts,
    valid_mean,
)
from pipeline.params import PromptParams


class DualPrompt(Method):
    """The G-prompt G (J_g, L_g, D); per task t, an E-prompt E[t] (J_e, L_e,
    D) and its key K[t] (D,)."""

    aux_name = "pull"
    graphable = True

    @classmethod
    def check(cls, params: PromptParams, n_tasks: int, dim: int, depth: int) -> None:
        params.check_depth(depth)
        deep = [layer for layer in params.g_layers if layer >= depth]
        if deep:
            raise ParamsError(
                f"prompt.g_layers {list(params.g_layers)}: layer {deep[0]} is "
                f"beyond the backbone's {depth} layers (0..{depth - 1})"
            )
        both = set(params.g_layers) & set(params.layers)
        if both:
            raise ParamsError(
                f"prompt.g_layers {list(params.g_layers)} and prompt.layers "
                f"{list(params.layers)} share layer {min(both)}: DualPrompt puts "
                "the G-prompt and the E-prompts in different layers"
            )
        if params.position != "prefix":
            raise ParamsError(
                f"prompt.position '{params.position}': DualPrompt's prompts are "
                "prefix keys and values (prefix)"
            )

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        super().__init__()
        self.g_layers, self.e_layers = tuple(params.g_layers), tuple(params.layers)
        self.e_length, self.dim, self.max_tasks = params.length, dim, n_tasks
        self.G = nn.Parameter(torch.zeros(len(self.g_layers), params.g_length, dim))
        self.E = nn.ParameterList()  # task t: (J_e, L_e, D)
        self.K = nn.ParameterList()  # task t: (D,)

    @property
    def n_tasks(self) -> int:
        return len(self.E)

    def add_task(self, generator: torch.Generator) -> None:
        """Start the next task's E-prompt (the first task: drawn, with the
        G-prompt; later: a copy of the previous task's) and draw its key;
        freeze the earlier E-prompts and keys."""
        if self.n_tasks >= self.max_tasks:
            raise ValueError("all tasks have been added")
        device = self.G.device
        shape = (len(self.e_layers), self.e_length, self.dim)
        if self.n_tasks == 0:
            with torch.no_grad():
                self.G.copy_(uniform(self.G.shape, generator))
            E = uniform(shape, generator).to(device)
        else:
            E = self.E[-1].detach().clone()
        for p in [*self.E, *self.K]:
            p.requires_grad_(False)
        self.E.append(nn.Parameter(E))
        self.K.append(nn.Parameter(uniform((self.dim,), generator).to(device)))

    def select(self, q: torch.Tensor, task: int | None) -> torch.Tensor:
        """The E-prompt index (B,) int64 (0-based task) for queries q (B, D):
        task − 1 for every row when `task` is given, else the top-1 key by
        cosine over the tasks added so far (ties: the earliest task)."""
        if task is not None:
            return torch.full((q.shape[0],), task - 1, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            return cosine(q.detach(), torch.stack(list(self.K))).argmax(-1)

    def prompts(self, idx: torch.Tensor) -> dict[int, LayerPrompt]:
        """Every prompt layer's `LayerPrompt` for E-prompt indices idx (B,)."""
        B = len(idx)
        E = torch.stack(list(self.E)).float()[idx].transpose(0, 1)  # (J_e, B, L, D)
        G = self.G.float()[:, None].expand(-1, B, -1, -1)  # (J_g, B, L_g, D)
        out = layer_prompts(G, self.g_layers, "prefix") if self.g_layers else {}
        return out | layer_prompts(E, self.e_layers, "prefix")

    def distances(self, q: torch.Tensor, task: int) -> torch.Tensor:
        """1 − cos(q, K_task) per query q (B, D): (B, 1) float32."""
        with torch.autocast(q.device.type, enabled=False):
            return 1 - cosine(q.detach(), self.K[task - 1][None])

    def pull(self, q: torch.Tensor, task: int) -> torch.Tensor:
        """mean over the batch of (1 − cos(q, K_task)), scalar float32."""
        return self.distances(q, task).mean()

    def features(self, backbone: Backbone, view: View) -> Out:
        prompts = self.prompts(self.select(view.q_t, view.task))
        x = backbone.encode(view.h, view.mask, prompts, read=(0,))[:, 0].float()
        rows = torch.full((), len(x), device=x.device)
        if view.task is None:
            return Out(x, torch.zeros((), device=x.device), rows)
        return Out(x, self.pull(view.q_t, view.task), rows)

    def static_features(self, backbone: Backbone, inputs: StaticView) -> Out:
        """`features` in training (`task` given): the task's E-prompt for every
        row, the pull loss a mean over the valid rows."""
        q_t, task = inputs.q_t, inputs.task
        prompts = self.prompts(self.select(q_t, task))
        x = backbone.encode(inputs.h, inputs.mask, prompts, read=(0,))[:, 0].float()
        pull, rows = valid_mean(self.distances(q_t, task)[:, 0], inputs.valid)
        return Out(x, pull, rows)


METHOD = DualPrompt
