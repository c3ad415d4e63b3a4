"""Prompt pools (CODA-Prompt style) and the prompt module of PAL (DESIGN §5).

Per prompt layer j, a pool holds components P (N, L_p, D), keys E (N, D) and
attention vectors A (N, D). For a query q (B, D):

    w_n = cos(q ⊙ A_n, E_n)          (B, N), no softmax, may be negative
    prompt = Σ_n w_n P_n             (B, L_p, D)

The N components are split over the K tasks, N // K per task, stored as one
parameter slice per task. `add_task()` appends the next slice, initialised by
Gram–Schmidt orthogonal to the earlier slices, and freezes the earlier ones
(`requires_grad=False`: no gradient and, as they are left out of the
optimiser, no weight decay). Step k uses the slices of tasks 1..k.

`Prompts` combines two pools (`modality`: text pool driven by q_t, image pool by
q_v), one pool for both (`shared`), or one prompt vector per modality without a
pool (`vector`), and returns per-layer `LayerPrompt`s for the backbone, as
prefix keys/values (`position: prefix`) or input tokens (`position: input`).
"""

from __future__ import annotations

import torch
from torch import nn

from palcore.errors import ParamsError
from pipeline.model.encoder import LayerPrompt
from pipeline.params import PromptParams


def orthogonal_rows(
    earlier: torch.Tensor, n: int, generator: torch.Generator
) -> torch.Tensor:
    """`n` random unit rows, orthogonal to each other and to span(earlier).

    earlier: (s, m) rows (any dtype, trained rows need not be orthogonal);
    returns (n, m) float32. Needs s + n ≤ m. Computed in float64 with two
    rounds of projection ("twice is enough").
    """
    s, m = earlier.shape
    assert s + n <= m, (s, n, m)
    x = torch.randn(n, m, generator=generator, dtype=torch.float64)
    if s:
        basis, _ = torch.linalg.qr(earlier.detach().double().cpu().T)  # (m, s)
        for _ in range(2):
            x = x - (x @ basis) @ basis.T
    q, r = torch.linalg.qr(x.T)  # (m, n) orthonormal columns
    q = q * torch.sign(torch.diagonal(r))[None, :]  # unique sign: deterministic
    if s:
        q = q - basis @ (basis.T @ q)
        q = q / q.norm(dim=0, keepdim=True)
    return q.T.float()


class PromptPool(nn.Module):
    """A CODA-style pool over J prompt layers, grown one task slice at a time.

    Slice t holds `P[t]` (J, n, L_p, D), `E[t]` (J, n, D), `A[t]` (J, n, D).
    """

    def __init__(self, n_layers: int, length: int, dim: int, per_task: int):
        super().__init__()
        self.n_layers, self.length, self.dim, self.per_task = (
            n_layers,
            length,
            dim,
            per_task,
        )
        self.P = nn.ParameterList()
        self.E = nn.ParameterList()
        self.A = nn.ParameterList()

    @property
    def n_tasks(self) -> int:
        return len(self.P)

    def add_task(self, generator: torch.Generator) -> None:
        """Append the next task's slice (Gram–Schmidt init) and freeze the rest."""
        J, n, L, D = self.n_layers, self.per_task, self.length, self.dim
        for p in self.parameters():
            p.requires_grad_(False)
        new: dict[str, list[torch.Tensor]] = {"P": [], "E": [], "A": []}
        for j in range(J):
            for name, width in (("P", L * D), ("E", D), ("A", D)):
                old = [t[j].reshape(-1, width) for t in getattr(self, name)]
                earlier = torch.cat(old) if old else torch.zeros(0, width)
                new[name].append(orthogonal_rows(earlier, n, generator))
        device = self.P[0].device if self.n_tasks else torch.device("cpu")
        self.P.append(nn.Parameter(torch.stack(new["P"]).view(J, n, L, D).to(device)))
        self.E.append(nn.Parameter(torch.stack(new["E"]).to(device)))
        self.A.append(nn.Parameter(torch.stack(new["A"]).to(device)))

    def weights(self, q: torch.Tensor) -> torch.Tensor:
        """w (J, B, N_k) = cos(q ⊙ A_n, E_n) for every layer and component.

        Uses cos = q·(A_n ⊙ Ê_n) / ‖q ⊙ A_n‖, so no (J, B, N, D) tensor is built.
        """
        A = torch.cat(list(self.A), 1).float()  # (J, N_k, D)
        E = torch.cat(list(self.E), 1).float()
        E_hat = E / E.norm(dim=-1, keepdim=True).clamp_min(1e-12)
        q = q.float()
        dot = torch.einsum("bd,jnd->jbn", q, A * E_hat)
        # ‖q ⊙ A_n‖ floored at 1e-12 as F.normalize does; clamping the square
        # keeps the gradient finite for an all-zero query (a switched-off modality)
        norm = torch.einsum("bd,jnd->jbn", q * q, A * A).clamp_min(1e-24).sqrt()
        return dot / norm

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """Prompts (J, B, L_p, D) float32 for queries q (B, D).

        Computed in float32 even under autocast: the pool is small, and the
        cosine's norms lose too much in bf16.
        """
        with torch.autocast(q.device.type, enabled=False):
            w = self.weights(q)  # (J, B, N_k)
            P = torch.cat(list(self.P), 1).float()  # (J, N_k, L_p, D)
            J, N, L, D = P.shape
            return torch.bmm(w, P.view(J, N, L * D)).view(J, -1, L, D)


class PromptVector(nn.Module):
    """One prompt (J, L_p, D) per modality, shared by all samples and tasks."""

    def __init__(self, n_layers: int, length: int, dim: int):
        super().__init__()
        self.n_layers, self.length, self.dim = n_layers, length, dim
        self.P = nn.Parameter(torch.zeros(n_layers, length, dim))
        self.n_tasks = 0

    def add_task(self, generator: torch.Generator) -> None:
        """First task: a random unit-norm init per layer; later tasks keep
        training the same vector."""
        if self.n_tasks == 0:
            rows = [
                orthogonal_rows(torch.zeros(0, self.length * self.dim), 1, generator)
                for _ in range(self.n_layers)
            ]
            with torch.no_grad():
                self.P.copy_(torch.cat(rows).view_as(self.P))
        self.n_tasks += 1

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        """Prompts (J, B, L_p, D): the vector, repeated for each query row."""
        return self.P.float()[:, None].expand(-1, q.shape[0], -1, -1)


class Prompts(nn.Module):
    """PAL's prompt module: text and image prompts for the prompt layers.

    `forward(q_t, q_v, text_on, image_on)` → {layer: LayerPrompt}; a sample's
    text (image) prompts are masked off where `text_on` (`image_on`) is False.
    """

    # prompt.pools shared: one `pool`; modality: a `text` and an `image` pool;
    # vector: a `text` and an `image` vector
    pool: PromptPool
    text: PromptPool | PromptVector
    image: PromptPool | PromptVector

    def __init__(self, params: PromptParams, n_tasks: int, dim: int, depth: int):
        super().__init__()
        check_prompt_params(params, n_tasks, dim, depth)
        self.params = params
        self.layers = tuple(params.layers)
        J, L = len(self.layers), params.length
        per_task = params.pool_size // n_tasks
        if params.pools == "modality":
            self.text = PromptPool(J, L, dim, per_task)
            self.image = PromptPool(J, L, dim, per_task)
        elif params.pools == "shared":
            self.pool = PromptPool(J, L, dim, per_task)
        else:
            self.text = PromptVector(J, L, dim)
            self.image = PromptVector(J, L, dim)

    def _pools(self) -> list[PromptPool | PromptVector]:
        return [self.pool] if self.params.pools == "shared" else [self.text, self.image]

    def add_task(self, generator: torch.Generator) -> None:
        """Grow every pool by the next task's slice (earlier slices frozen)."""
        for pool in self._pools():
            pool.add_task(generator)

    def forward(
        self,
        q_t: torch.Tensor,
        q_v: torch.Tensor,
        text_on: torch.Tensor,
        image_on: torch.Tensor,
    ) -> dict[int, LayerPrompt]:
        """q_t, q_v: (B, D) queries; text_on, image_on: (B,) bool."""
        B = q_t.shape[0]
        if self.params.pools == "shared":
            both = self.pool(torch.cat([q_t, q_v]))  # (J, 2B, L, D)
            p_t, p_v = both[:, :B], both[:, B:]
        else:
            p_t, p_v = self.text(q_t), self.image(q_v)  # (J, B, L, D) each
        L = self.params.length
        if self.params.position == "prefix":
            h = L // 2
            keys = torch.cat([p_t[:, :, :h], p_v[:, :, :h]], 2)  # (J, B, L, D)
            values = torch.cat([p_t[:, :, h:], p_v[:, :, h:]], 2)
            mask = torch.cat(
                [text_on[:, None].expand(B, h), image_on[:, None].expand(B, h)], 1
            )  # (B, L)
            return {
                layer: LayerPrompt(mask=mask, keys=keys[j], values=values[j])
                for j, layer in enumerate(self.layers)
            }
        tokens = torch.cat([p_t, p_v], 2)  # (J, B, 2L, D)
        mask = torch.cat(
            [text_on[:, None].expand(B, L), image_on[:, None].expand(B, L)], 1
        )  # (B, 2L)
        return {
            layer: LayerPrompt(mask=mask, tokens=tokens[j])
            for j, layer in enumerate(self.layers)
        }


def check_prompt_params(
    params: PromptParams, n_tasks: int, dim: int, depth: int
) -> None:
    """Check PAL's prompt params against the backbone and the task count."""
    params.check_depth(depth)
    if params.pools == "vector":
        return
    if params.pool_size < n_tasks:
        raise ParamsError(
            f"prompt.pool_size {params.pool_size} is smaller than the "
            f"number of tasks ({n_tasks}): each task needs ≥ 1 component"
        )
    if params.pool_size > dim:
        raise ParamsError(
            f"prompt.pool_size {params.pool_size} exceeds the hidden size "
            f"{dim}: orthogonal keys need pool_size ≤ {dim}"
        )
