"""PAL's prompt method: modality-specific CODA pools with reconstruction.

Three kinds of pass share one embedding of a batch (DESIGN §5):

1. query pass — prompt-free, frozen (done by the model or the query cache):
   q_t at the text CLS, q_v at the image CLS;
2. reconstruction pass — over rows missing one modality (missing samples and,
   in training, the text-dropped / image-dropped copies of complete samples):
   only the present modality's prompts are on, driven by its frozen query; the
   missing modality's CLS output is the reconstructed query q̂;
3. classification pass — both prompts on, driven by (q_t, q_v) with q̂ in place
   of a missing modality's query ("reconstruct, then query"); the prompted
   text CLS after the final LN is the joint embedding.

The auxiliary loss is the reconstruction loss: the mean over complete samples
of ‖q̂_t − q_t‖² + ‖q̂_v − q_v‖² (stop-gradient targets; `recon_targets` and
`recon_error` are where RebQ's differ).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from palcore.codes import Missing
from pipeline.model.method import Method, Out, StaticView, View
from pipeline.model.prompts import Prompts, check_prompt_params
from pipeline.params import PromptParams

if TYPE_CHECKING:
    from pipeline.model.encoder import Backbone


class Pal(Prompts, Method):
    """PAL: `Prompts` (text and image pools, or the ablations' shared pool and
    prompt vectors) with the reconstruction pass."""

    copies = True
    masked = True
    aux_name = "recon"
    graphable = True

    @classmethod
    def check(cls, params: PromptParams, n_tasks: int, dim: int, depth: int) -> None:
        check_prompt_params(params, n_tasks, dim, depth)

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
        """Reconstruction pass over R rows that each miss one modality.

        h (R, N, D), mask (R, N); q_t, q_v (R, D) frozen queries (the missing
        one is ignored); text_missing (R,) bool (False: image missing).
        Returns q̂ (R, D) float32: the text CLS output where text is missing,
        the image CLS output where the image is.
        """
        prompts = self(q_t, q_v, text_on=~text_missing, image_on=text_missing)
        out = backbone.encode(h, mask, prompts, read=(0, text_len))
        return torch.where(text_missing[:, None], out[:, 0], out[:, 1]).float()

    def joint(
        self,
        backbone: Backbone,
        h: torch.Tensor,
        mask: torch.Tensor,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
    ) -> torch.Tensor:
        """Classification pass: the prompted text CLS (B, D) float32."""
        on = torch.ones(h.shape[0], dtype=torch.bool, device=h.device)
        prompts = self(q_t, q_v, text_on=on, image_on=on)
        return backbone.encode(h, mask, prompts, read=(0,))[:, 0].float()

    def fill_missing(
        self,
        backbone: Backbone,
        view: View,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Reconstruct the missing queries of the view's samples (and of its
        copies). Returns q_t, q_v (B, D) with q̂ in place of missing queries,
        and q̂ (2c, D) of the copies (or None)."""
        h, mask, q_t, q_v, missing = view.h, view.mask, view.q_t, view.q_v, view.missing
        rows = torch.nonzero(missing != Missing.COMPLETE).flatten()
        extra = view.copies
        n_rows, n_extra = len(rows), 0 if extra is None else extra.h.shape[0]
        if n_rows + n_extra == 0:
            return q_t, q_v, None
        dev = h.device
        text_missing = torch.cat(
            [missing[rows] == Missing.TEXT, torch.arange(n_extra) < n_extra // 2]
        ).to(dev, non_blocking=True)
        rows_d = rows.to(dev, non_blocking=True)
        parts = [(h[rows_d], mask[rows_d], q_t[rows_d], q_v[rows_d])]
        if extra is not None:
            parts.append((extra.h, extra.mask, extra.q_t, extra.q_v))
        h_r, mask_r, qt_r, qv_r = (torch.cat(x) for x in zip(*parts, strict=True))
        q_hat = self.reconstruct(
            backbone, h_r, mask_r, view.text_len, qt_r, qv_r, text_missing
        )
        if n_rows:
            code = missing[rows]
            for want, is_text in ((Missing.TEXT, True), (Missing.IMAGE, False)):
                dst = rows[code == want].to(dev, non_blocking=True)
                src = torch.nonzero(code == want).flatten().to(dev, non_blocking=True)
                if is_text:
                    q_t = q_t.index_put((dst,), q_hat[src])
                else:
                    q_v = q_v.index_put((dst,), q_hat[src])
        return q_t, q_v, (q_hat[n_rows:] if n_extra else None)

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
        """The reconstruction targets (t_t, t_v) of complete samples: PAL's
        are their frozen queries (Eq. 1). h (B, N, D), mask (B, N), q_t, q_v
        (B, D) of a batch; rows: the complete rows' indices (None: all B).
        Returns two (c, D) tensors, no gradient."""
        if rows is None:
            return q_t, q_v
        return q_t[rows], q_v[rows]

    def recon_error(
        self,
        qt_hat: torch.Tensor,
        qv_hat: torch.Tensor,
        target_t: torch.Tensor,
        target_v: torch.Tensor,
    ) -> torch.Tensor:
        """Per complete sample (c,): PAL's ‖q̂_t − t_t‖² + ‖q̂_v − t_v‖², summed
        over D (the loss is its mean over the complete samples)."""
        return (qt_hat - target_t).pow(2).sum(-1) + (qv_hat - target_v).pow(2).sum(-1)

    def features(self, backbone: Backbone, view: View) -> Out:
        """Reconstruct, then query; with copies, the reconstruction loss."""
        q_t, q_v, q_hat = self.fill_missing(backbone, view)
        recon = torch.zeros((), device=view.h.device)
        c = 0
        if view.copies is not None:
            comp = view.copies.complete
            c = len(comp)
            # the copies' rows are reconstructed, so fill_missing returns their q̂
            assert q_hat is not None, "copies without a reconstruction"
            target_t, target_v = self.recon_targets(
                backbone, view.h, view.mask, view.text_len, view.q_t, view.q_v, comp
            )
            recon = self.recon_error(q_hat[:c], q_hat[c:], target_t, target_v).mean()
        x = self.joint(backbone, view.h, view.mask, q_t, q_v)
        return Out(x, recon, torch.full((), c, device=x.device))

    def static_features(self, backbone: Backbone, inputs: StaticView) -> Out:
        """`features` for `pipeline.model.losses.static_loss`: every row gets a
        text-missing and an image-missing slot in one reconstruction pass of
        2B rows (a complete row's copies spliced from the dummy inputs, a row
        missing a modality fills its own slot; unused slots get no gradient),
        and masks stand in for counts.

        inputs: h (B, N, D), mask (B, N), text length T; copies: (h_a,
        mask_a, h_b, mask_b), the rows with the text (a) and the image (b)
        replaced by the dummy's where `complete`; q_t, q_v (B, D) frozen
        queries, qc (B, 2, D) those of the copies; missing (B,) int64 and
        complete (B,) bool (rows whose copies count) on the device.
        """
        h, mask, T = inputs.h, inputs.mask, inputs.T
        h_a, mask_a, h_b, mask_b = inputs.copies
        q_t, q_v, qc = inputs.q_t, inputs.q_v, inputs.qc
        missing, complete = inputs.missing, inputs.complete
        cm = complete[:, None]
        zeros = torch.zeros_like(q_t)
        q_hat = self.reconstruct(
            backbone,
            torch.cat([h_a, h_b]),
            torch.cat([mask_a, mask_b]),
            T,
            torch.cat([zeros, torch.where(cm, qc[:, 0], q_t)]),
            torch.cat([torch.where(cm, qc[:, 1], q_v), zeros]),
            torch.arange(2 * len(h), device=h.device) < len(h),
        )
        B = len(h)
        qt_hat, qv_hat = q_hat[:B], q_hat[B:]
        target_t, target_v = self.recon_targets(backbone, h, mask, T, q_t, q_v)
        err = self.recon_error(qt_hat, qv_hat, target_t, target_v)
        n_complete = complete.sum()
        recon = (err * complete).sum() / n_complete.clamp_min(1)
        q_t = torch.where((missing == Missing.TEXT)[:, None], qt_hat, q_t)
        q_v = torch.where((missing == Missing.IMAGE)[:, None], qv_hat, q_v)
        return Out(self.joint(backbone, h, mask, q_t, q_v), recon, n_complete)


METHOD = Pal
