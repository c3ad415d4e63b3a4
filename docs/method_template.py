"""A prompt method to copy: `cp docs/method_template.py pipeline/methods/toy.py`.

The file's name is the method's `prompt.method` name (`toy` here); a module of
pipeline/methods that declares `METHOD` is a method, with no list to edit
(docs/USAGE.md, "Add a method"; the interface: pipeline/model/method.py,
DESIGN §5). tests/test_method_conformance.py then runs the new method too.

This one: a single prompt (J, L_p, D) shared by every sample, put in as
prefix keys and values at the layers of `prompt.layers`, trained in the first
task and frozen after (later tasks train their head rows only). Its joint
embedding is the prompted text CLS.
"""

from __future__ import annotations

import torch
from torch import nn

from palcore.errors import ParamsError
from pipeline.model.encoder import Backbone
from pipeline.model.method import Method, Out, View, layer_prompts, no_aux
from pipeline.params import PromptParams


class Toy(Method):
    """One prompt P (J, L_p, D) for every sample."""

    # True: the CE of task t is over t's classes, earlier head rows frozen (as
    # PAL); False: over every class seen so far, every head row training
    masked = True
    # True: training batches carry the reconstruction copies (`View.copies`)
    copies = False
    # the auxiliary loss's name in tune's log.jsonl
    aux_name = "aux"
    # True only with `static_features` written (the CUDA-graph step, see
    # pipeline/methods/map.py); False: `pal tune` runs `features` eagerly
    graphable = False

    @classmethod
    def check(cls, params: PromptParams, n_tasks: int, dim: int, depth: int) -> None:
        """Before anything is built: a `ParamsError` of one line naming the
        key when the params do not fit the backbone (`depth` layers of width
        `dim`) or the `n_tasks` tasks."""
        params.check_depth(depth)  # every prompt layer exists
        if params.position != "prefix":
            raise ParamsError(
                f"prompt.position {params.position!r}: the toy method puts its "
                "prompt in as prefix keys and values only"
            )

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        """The parameters at their final shapes, zero: `add_task` draws them.
        Their names are the checkpoint's keys (`prompts.P`)."""
        super().__init__()
        self.layers = tuple(params.layers)
        self.P = nn.Parameter(torch.zeros(len(self.layers), params.length, dim))
        self.n_tasks = 0

    def add_task(self, generator: torch.Generator) -> None:
        """Start the next task. What trains in it is what has `requires_grad`
        after this call; draw every random number from `generator` (a
        checkpoint is rebuilt by calling this once per task, then loading
        its tensors)."""
        if self.n_tasks == 0:
            with torch.no_grad():
                self.P.normal_(0.0, 0.02, generator=generator)
        else:
            self.P.requires_grad_(False)  # trained in the first task only
        self.n_tasks += 1

    def features(self, backbone: Backbone, view: View) -> Out:
        """The joint embeddings x (B, D) float32 of a batch, for the head and
        the analytic classifier. `view` holds the embedded samples (h, mask),
        their frozen queries (q_t, q_v), missing codes and, in training, the
        task id. With an auxiliary loss, return `Out(x, aux, aux_rows)` (aux
        a scalar mean over aux_rows rows, weighted by `tune.recon_weight`)."""
        B = view.h.shape[0]
        P = self.P.float()[:, None].expand(-1, B, -1, -1)  # (J, B, L, D)
        prompts = layer_prompts(P, self.layers, "prefix")
        x = backbone.encode(view.h, view.mask, prompts)[:, 0].float()  # (B, D)
        return no_aux(x)

    # make_head(backbone): a classifier of the method's own in place of the
    # linear head (MAP's pooler and MLP, pipeline/methods/map.py); the
    # default, None, is the linear head.


METHOD = Toy  # what makes this module a method
