"""Prompt methods: one module each, behind one interface (DESIGN §5).

The model (`pipeline.model.network.PalModel`) is a frozen backbone, a method and a
per-task head (linear, or the method's own: `Method.make_head`, MAP's and MSP's
pooler and MLP); it calls the method through the interface of
`pipeline.model.method` (`Method`, `View`, `Out`, `Copies`), which each method
module here implements. A method owns its prompts and decides, for a batch:

* which prompts each sample gets, from the frozen queries (q_t, q_v), the
  sample's missing case and, in training, the task id (`Method.features`);
* an auxiliary loss beside the CE (PAL's reconstruction, a key–query pull,
  an orthogonality term), weighted by `tune.recon_weight`;
* how it grows per task (`add_task`) and so which parameters train: those
  with `requires_grad` after `add_task`;
* whether the CE of training is taken over the current task's classes with
  the earlier tasks' head rows frozen (`masked`), or over every class seen so
  far with every head row training (sequential fine-tuning: MAP, MSP).

A method is one module here, chosen by its file name in `prompt.method`: a
module that declares `METHOD = <its Method subclass>` is a method, found with
no list to edit (`pipeline.params.method_names` reads the files;
`registry.method_class` imports one when it is built). `build_model` is the
one place a `PalModel` gets its method from params, `model_from_checkpoint`
the one place a step's model is rebuilt. Adding a method: copy
docs/method_template.py here (docs/USAGE.md, "Add a method").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from palcore.params import section_from_mapping
from pipeline.methods.registry import method_class
from pipeline.model.checkpoint import restore
from pipeline.model.encoder import Backbone
from pipeline.model.method import Method
from pipeline.model.network import PalModel
from pipeline.params import PromptParams

__all__ = ["build", "build_model", "method_class", "model_from_checkpoint"]


def build(params: PromptParams, n_tasks: int, dim: int, depth: int) -> Method:
    """The method `params.method`, checked against the backbone and tasks."""
    cls = method_class(params.method)
    cls.check(params, n_tasks, dim, depth)
    return cls(params, n_tasks, dim, depth)


def build_model(
    backbone: Backbone, prompt: PromptParams, classes_per_task: Sequence[int]
) -> PalModel:
    """A fresh PalModel on `backbone` with the method of `prompt` (none with
    `prompt.enabled: false`, its params still checked) and no task added."""
    n_tasks, D, depth = len(classes_per_task), backbone.hidden_size, backbone.num_layers
    if prompt.enabled:
        method: Method | None = build(prompt, n_tasks, D, depth)
    else:
        method_class(prompt.method).check(prompt, n_tasks, D, depth)
        method = None
    return PalModel(backbone, method, classes_per_task)


def model_from_checkpoint(ckpt: Mapping[str, Any], backbone: Backbone) -> PalModel:
    """Rebuild step k's model from its checkpoint on `backbone` (eval mode)."""
    # coerced as params.yaml is (lists of layers to tuples, keys a method
    # added later at their defaults)
    prompt = section_from_mapping(PromptParams, "prompt", ckpt["params"]["prompt"])
    model = build_model(backbone, prompt, ckpt["tasks"]["classes_per_task"])
    restore(model, ckpt["state"], int(ckpt["step"]))
    model.eval()
    return model
