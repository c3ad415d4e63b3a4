"""The method interface: what the model calls a prompt method through (DESIGN §5).

`pipeline.model.network.PalModel` holds a `Method` (or None) and the training
loss (`pipeline.model.losses`) hands it a `View` of a batch, with the batch's
reconstruction `Copies` in training; it answers an `Out`. The methods
themselves live in `pipeline.methods`, which imports this module and nothing
in `pipeline.model` imports them. `layer_prompts` turns a method's prompt
tensor into the backbone's per-layer prompts; `no_aux` is an `Out` without an
auxiliary loss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from pipeline.model.encoder import Backbone, LayerPrompt
from pipeline.params import PromptParams


@dataclass
class Copies:
    """The reconstruction copies of a training batch's c complete samples.

    h (2c, N, D), mask (2c, N): the text-dropped copies, then the
    image-dropped ones, as the loader appended them; q_t, q_v (2c, D) their
    frozen queries (zeros for the dropped modality); complete (c,) int64 on
    the device: the rows of the batch they were made from.
    """

    h: torch.Tensor
    mask: torch.Tensor
    q_t: torch.Tensor
    q_v: torch.Tensor
    complete: torch.Tensor


@dataclass
class View:
    """A batch of B samples as a method sees it.

    h (B, N, D) and mask (B, N) bool: the embedded samples, text length
    `text_len`; q_t, q_v (B, D) float32: their frozen, prompt-free queries
    (the dummy input's where a modality is missing); missing (B,) int64
    codes on the host (`palcore.codes.Missing`); task: the training task
    (1-based), None at extraction; copies: only in training, for a method
    with `copies`, when the batch has complete samples.
    """

    h: torch.Tensor
    mask: torch.Tensor
    text_len: int
    q_t: torch.Tensor
    q_v: torch.Tensor
    missing: torch.Tensor
    task: int | None = None
    copies: Copies | None = None


@dataclass(frozen=True)
class StaticView:
    """A batch as a graphable method's `static_features` sees it: shapes that
    depend only on the input shapes, all tensors on the device (built by
    `pipeline.model.losses`, for a CUDA-graph capture).

    h (B, N, D), mask (B, N) bool: the embedded samples, text length T;
    copies (h_a, mask_a, h_b, mask_b): the spliced copies (the rows
    themselves when the run has no dummy); q_t, q_v (B, D): frozen queries;
    qc (B, 2, D): those of the copies; missing (B,) int64; complete (B,)
    bool: rows whose copies count; valid (B,) bool: not padding; task: the
    training task (1-based).
    """

    h: torch.Tensor
    mask: torch.Tensor
    T: int
    copies: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
    q_t: torch.Tensor
    q_v: torch.Tensor
    qc: torch.Tensor
    missing: torch.Tensor
    complete: torch.Tensor
    valid: torch.Tensor
    task: int


@dataclass
class Out:
    """A method's output for a batch: x (B, D) float32, the joint embedding
    (fed to the head and dumped for the analytic classifier); aux, the
    unweighted auxiliary loss (scalar, 0 when none) averaged over `aux_rows`
    rows (for the epoch's mean in the log)."""

    x: torch.Tensor
    aux: torch.Tensor
    aux_rows: torch.Tensor


class Method(nn.Module):
    """The interface of a prompt method. Subclasses set the class attributes
    and implement `add_task` and `features`; `check` validates the params
    before anything is built."""

    copies: ClassVar[bool] = False  # training batches carry reconstruction copies
    masked: ClassVar[bool] = True  # CE over the current task's classes only
    aux_name: ClassVar[str] = "aux"  # the auxiliary loss's name in the tune log
    graphable: ClassVar[bool] = False  # has `static_features` (CUDA graphs)

    @classmethod
    def check(cls, params: PromptParams, n_tasks: int, dim: int, depth: int) -> None:
        """Raise `ParamsError` naming the key when params do not fit."""
        params.check_depth(depth)

    def add_task(self, generator: torch.Generator) -> None:
        """Start the next task: grow, init from `generator`, freeze what stays."""
        raise NotImplementedError

    def features(self, backbone: Backbone, view: View) -> Out:
        """The joint embeddings (and auxiliary loss) of a batch."""
        raise NotImplementedError

    def static_features(self, backbone: Backbone, inputs: StaticView) -> Out:
        """`features` of a training batch with shapes fixed by the input
        shapes and no host synchronisation (graphable methods; the dict is
        built in `pipeline.model.losses.static_loss`, which says what it
        holds): everything per sample arrives on the device, rows whose
        `valid` is False are padding and count for nothing, and `aux_rows`
        counts valid rows where `features` counts the batch's."""
        raise NotImplementedError

    def make_head(self, backbone: Backbone) -> nn.Module | None:
        """The classifier on this method's joint embeddings: None for the
        project's linear head (`pipeline.model.network.TaskHead`); a method
        with its own returns a new module (not one of its own submodules) with
        TaskHead's interface: `add_task(n_classes, generator, freeze)` and
        x (B, D) → logits (B, C_k) over the classes of the tasks added."""
        return None


def no_aux(x: torch.Tensor) -> Out:
    """`Out` of joint embeddings x (B, D) with no auxiliary loss."""
    zero = torch.zeros((), device=x.device)
    return Out(x, zero, zero)


def valid_mean(
    values: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The mean of per-row values (B,) over the rows where `valid` (B,) bool,
    and their count (int64 scalar), without reading the count on the host:
    a static step's batch mean over its real rows (0 when there are none)."""
    n = valid.sum()
    return (values * valid).sum() / n.clamp_min(1), n


def layer_prompts(
    P: torch.Tensor,
    layers: tuple[int, ...],
    position: str,
    mask: torch.Tensor | None = None,
    keep: bool = False,
) -> dict[int, LayerPrompt]:
    """Per-layer prompts for the backbone from P (J, B, L, D), layer j of P
    going to encoder layer `layers[j]`.

    position `prefix`: the first L/2 tokens are prepended to the keys, the
    rest to the values; `input`: the L tokens are prepended to the sequence
    (with `keep`, in front of the earlier layers' prompt tokens, which then
    accumulate). mask (B, L) bool switches tokens off per sample (prefix: its
    first L/2 columns are used); None: all on.
    """
    J, B, L, _ = P.shape
    if mask is None:
        mask = torch.ones(B, L, dtype=torch.bool, device=P.device)
    if position == "prefix":
        h = L // 2
        keys_mask = mask[:, :h]  # one tensor for every layer: one attention bias
        return {
            layer: LayerPrompt(mask=keys_mask, keys=P[j, :, :h], values=P[j, :, h:])
            for j, layer in enumerate(layers)
        }
    return {
        layer: LayerPrompt(mask=mask, tokens=P[j], keep=keep)
        for j, layer in enumerate(layers)
    }
