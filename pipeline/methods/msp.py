"""MSP (Jang, Wang and Kim, ICASSP 2024): modality-specific prompts.

One prompt set per modality — text and image — each (J, L_p, D) over the
prompt layers; a sample's prompts are those of the modalities it has (a
complete sample gets both, a sample missing its text only the image set), so
two sets cover the three missing cases that MAP needs three for. An
orthogonality loss keeps the two sets apart:

    L_o = mean_j ‖P_t[j] P_v[j]ᵀ‖²_F / (‖P_t[j]‖²_F ‖P_v[j]‖²_F),

zero when every row of one set is orthogonal to every row of the other (a
squared cosine between the sets, smooth where a row is zero, unlike a mean of
row cosines), weighted by `tune.recon_weight`. Like MAP it has no continual-learning
mechanism: the sets and every head row train task after task, the CE over
every class seen so far.

MSP's code is not public; its paper gives none of length, layers, insertion,
head or loss weight. What is inferred here (DESIGN §6): MAP's prompt
placement (input tokens accumulating over the prompt layers, or prefix) and
MAP's classifier (`pipeline.methods.map.PoolerHead`: pretrained pooler, then
Linear D→2D, LayerNorm, GELU, Linear 2D→C; the analytic classifier gets its
input, the prompted text CLS), as MSP builds on MAP; an init of random
orthonormal rows (so the sets start orthogonal) and this form of the
orthogonality term.
"""

from __future__ import annotations

import torch
from torch import nn

from palcore.codes import Missing
from palcore.errors import ParamsError
from pipeline.methods.map import PoolerHead, pooler_head
from pipeline.model.encoder import Backbone
from pipeline.model.method import Method, Out, StaticView, View, layer_prompts
from pipeline.model.prompts import orthogonal_rows
from pipeline.params import PromptParams


class Msp(Method):
    """Two prompt sets P (2, J, L_p, D): [text, image]."""

    masked = False
    aux_name = "ortho"
    graphable = True

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        super().__init__()
        self.layers, self.position = tuple(params.layers), params.position
        self.P = nn.Parameter(torch.zeros(2, len(self.layers), params.length, dim))
        self.n_tasks = 0

    @classmethod
    def check(cls, params: PromptParams, n_tasks: int, dim: int, depth: int) -> None:
        params.check_depth(depth)
        if 2 * params.length > dim:
            raise ParamsError(
                f"prompt.length {params.length}: MSP's two sets need 2 x length "
                f"<= the hidden size {dim} to start orthogonal"
            )

    def add_task(self, generator: torch.Generator) -> None:
        """First task: per layer, 2 L_p random orthonormal rows, the first L_p
        the text set's, so the sets start orthogonal (L_o = 0); later tasks
        keep training the same sets."""
        if self.n_tasks == 0:
            _, J, L, D = self.P.shape
            rows = [
                orthogonal_rows(torch.zeros(0, D), 2 * L, generator) for _ in range(J)
            ]
            with torch.no_grad():
                self.P.copy_(torch.stack(rows).view(J, 2, L, D).transpose(0, 1))
        self.n_tasks += 1

    def make_head(self, backbone: Backbone) -> PoolerHead:
        """MAP's pooler and MLP head (`pipeline.methods.map.PoolerHead`)."""
        return pooler_head(backbone)

    def prompts(self, missing: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompts (J, B, 2 L_p, D) float32 — text set, then image set — and
        their mask (B, 2 L_p) bool: a set is on where its modality is present."""
        J, L, D = self.P.shape[1:]
        code = missing.to(self.P.device, non_blocking=True)
        B = len(code)
        P = self.P.float()
        text_on, image_on = (
            (code != Missing.TEXT)[:, None],
            (code != Missing.IMAGE)[:, None],
        )
        if self.position == "prefix":  # keys: both sets' first halves; values: rest
            h = L // 2
            parts = [(P[0, :, :h], text_on, h), (P[1, :, :h], image_on, h)]
            parts += [(P[0, :, h:], text_on, L - h), (P[1, :, h:], image_on, L - h)]
        else:
            parts = [(P[0], text_on, L), (P[1], image_on, L)]
        joint = torch.cat([p for p, _, _ in parts], 1)  # (J, 2L, D)
        mask = torch.cat([on.expand(B, n) for _, on, n in parts], 1)
        return joint[:, None].expand(J, B, 2 * L, D), mask

    def orthogonality(self) -> torch.Tensor:
        """L_o (scalar float32) = mean over layers j of
        ‖P_t[j] P_v[j]ᵀ‖²_F / (‖P_t[j]‖²_F ‖P_v[j]‖²_F): 0 when every row of
        one set is orthogonal to every row of the other, at most 1."""
        P = self.P.float()  # (2, J, L, D)
        cross = (P[0] @ P[1].transpose(1, 2)).pow(2).sum((1, 2))  # (J,)
        norms = P[0].pow(2).sum((1, 2)) * P[1].pow(2).sum((1, 2))
        return (cross / norms.clamp_min(1e-12)).mean()

    def joint(
        self,
        backbone: Backbone,
        h: torch.Tensor,
        mask: torch.Tensor,
        missing: torch.Tensor,
    ) -> torch.Tensor:
        """The prompted text CLS (B, D) float32 of h (B, N, D), mask (B, N)
        with `missing` (B,) codes (host or device)."""
        P, on = self.prompts(missing)
        prompts = layer_prompts(P, self.layers, self.position, on, keep=True)
        return backbone.encode(h, mask, prompts, read=(0,))[:, 0].float()

    def features(self, backbone: Backbone, view: View) -> Out:
        x = self.joint(backbone, view.h, view.mask, view.missing)
        rows = torch.full((), len(x), device=x.device)
        return Out(x, self.orthogonality(), rows)

    def static_features(self, backbone: Backbone, inputs: StaticView) -> Out:
        """`features` with the codes on the device; L_o is the batch's
        whatever its rows, counted over the valid ones."""
        x = self.joint(backbone, inputs.h, inputs.mask, inputs.missing)
        return Out(x, self.orthogonality(), inputs.valid.sum())


METHOD = Msp
