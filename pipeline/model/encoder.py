"""The frozen ViLT backbone, run as an explicit loop so prompts can be inserted.

`Backbone` wraps a frozen `ViltModel` and its `ViltProcessor` (loaded by
`pipeline.model.backbone.load_backbone`). The encoder is run as our own loop over
`embeddings` → `encoder.layer[i]` → `layernorm` (DESIGN §5):

* token layout `[text CLS, text…, image CLS, patches…]`, T = text length;
* each layer is pre-LN: `h += attn(LN(h)); h += MLP(LN(h))`, computed from the
  layer's own HF submodules with a fused QKV projection and
  `F.scaled_dot_product_attention`;
* prompts enter a layer either as prefix keys/values (`LayerPrompt.keys` /
  `values`, prepended to that layer's keys and values only) or as input tokens
  (`LayerPrompt.tokens`, prepended to the sequence and replaced at each
  prompt layer); their key mask lets a prompt be switched off per sample.

On CUDA, batches of images of any sizes are embedded without HF's per-sample
loops and host syncs (`Backbone.embed_padded`, `pipeline.model.vision`: patches in
raster order, from the image sizes the loader ships).

With no prompts the loop equals `ViltModel.forward(...).last_hidden_state`
(a test holds this to 1e-6; ViLT shuffles patch order with torch's RNG, so seed
before comparing).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline.model import vision
from pipeline.model.rows import Read, read_ranges, take_rows

if TYPE_CHECKING:  # transformers is imported where a model is loaded
    from transformers import ViltModel
    from transformers.models.vilt.modeling_vilt import ViltLayer

SMALL_MODEL_WIDTH = 256  # CPU: below this hidden size, run single-threaded


@dataclass
class LayerPrompt:
    """Prompts for one encoder layer, for a batch of B samples.

    Prefix style: `keys` and `values` (B, L_k, D), prepended to the layer's
    keys and values. Input style: `tokens` (B, L_i, D), prepended to the
    sequence. `mask` (B, L_k or L_i) bool: False switches a prompt token off
    for that sample (it is then ignored as a key). Input tokens replace the
    earlier layers' prompt tokens, or with `keep` go in front of them, so they
    accumulate over the prompt layers (MAP's input prompts).
    """

    mask: torch.Tensor
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    tokens: torch.Tensor | None = None
    keep: bool = False


class Backbone(nn.Module):
    """A frozen `ViltModel` with a prompt-aware encoder loop.

    Attributes: `vilt` (the HF model, eval mode, no gradients), `processor`
    (its `ViltProcessor`), `hidden_size` D, `num_layers`, `max_text_len` T,
    `image_side` (the side of the square dummy image in pixels), `name`.
    """

    def __init__(self, vilt: ViltModel, processor, name: str, max_text_len: int):
        super().__init__()
        self.vilt = vilt.eval().requires_grad_(False)
        self.processor = processor
        self.name = name
        cfg = vilt.config
        self.hidden_size = int(cfg.hidden_size)
        self.num_layers = int(cfg.num_hidden_layers)
        self.num_heads = int(cfg.num_attention_heads)
        self.max_text_len = int(max_text_len)
        self.fused_attention = False  # True: F.scaled_dot_product_attention
        self.fast_embed = False  # True: `embed_full` for batches of full images
        self.attention_backends: list | None = None  # SDPA kernels allowed
        self._positions = vision.PositionTables()  # per patch grid, for embed_padded
        if self.max_text_len > cfg.max_position_embeddings:
            interpolate_text_positions(vilt, self.max_text_len)
        ip = processor.image_processor if processor is not None else None
        side = _shortest_edge(ip)
        divisor = int(getattr(ip, "size_divisor", None) or 1)
        if side:
            self.image_side = side // divisor * divisor
        else:
            # ViLT's config gives its square image one side (the type allows pairs)
            config_side = cfg.image_size
            assert not isinstance(config_side, (list, tuple)), "one image side"
            self.image_side = int(config_side)
        # Fused QKV projection per layer: one GEMM instead of three.
        for i, layer in enumerate(self._layers):
            a = layer.attention.attention
            w = torch.cat([a.query.weight, a.key.weight, a.value.weight], 0)
            b = torch.cat([_bias(a.query), _bias(a.key), _bias(a.value)], 0)
            self.register_buffer(f"qkv_w{i}", w.detach().clone(), persistent=False)
            self.register_buffer(f"qkv_b{i}", b.detach().clone(), persistent=False)

    @property
    def _layers(self) -> Sequence[ViltLayer]:
        """The encoder's layers (ViltEncoder's ModuleList holds ViltLayers)."""
        return cast("Sequence[ViltLayer]", self.vilt.encoder.layer)

    def train(self, mode: bool = True) -> Backbone:
        """The backbone stays in eval mode (frozen)."""
        return super().train(False)

    @property
    def device(self) -> torch.device:
        return self.vilt.layernorm.weight.device

    def place(self, device: torch.device) -> Backbone:
        """Move to `device`. On CUDA the frozen weights are stored in bf16 (no
        per-call autocast casts) and attention uses the fused SDPA kernels; on
        the CPU everything stays float32 with HF's exact arithmetic."""
        if device.type == "cuda":
            self.to(device=device, dtype=torch.bfloat16)
            # LayerNorm runs in float32 under autocast: float32 parameters
            # spare two casts per LayerNorm call (and keep the residual exact)
            for module in self.modules():
                if isinstance(module, nn.LayerNorm):
                    module.float()
            self.fused_attention = True
            # cuDNN attention builds a plan for every new shape (batches vary
            # in rows and text length): the efficient/flash kernels do not
            self.attention_backends = [
                SDPBackend.FLASH_ATTENTION,
                SDPBackend.EFFICIENT_ATTENTION,
                SDPBackend.MATH,
            ]
            self.fast_embed = True
        else:
            self.to(device=device)
            # Small matrices gain nothing from threads, and spinning OpenMP
            # threads slow down badly when other processes share the cores.
            if self.hidden_size < SMALL_MODEL_WIDTH:
                torch.set_num_threads(1)
        return self

    def embed(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        pixel_mask: torch.Tensor | None,
        sizes: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token embeddings and key mask.

        input_ids, attention_mask: (B, T) int64; pixel_values: (B, 3, H, W)
        float; pixel_mask: (B, H, W) int64 (None: built from `sizes`); sizes:
        (B, 2) int64 image heights and widths on the host (`Batch.image_sizes`).
        Returns h (B, T + 1 + P, D) and mask (B, T + 1 + P) bool (True =
        attend). On CUDA, with `sizes`, the sync-free `embed_padded`; else HF's
        `ViltEmbeddings`, which consumes torch's RNG (patch order).
        """
        if self.fast_embed and sizes is not None:
            if not vision.samples_patches(self.vilt, sizes):
                return self.embed_padded(input_ids, attention_mask, pixel_values, sizes)
        if pixel_mask is None:
            assert sizes is not None, "embed needs a pixel mask or the image sizes"
            H, W = pixel_values.shape[2:]
            pixel_mask = vision.pixel_mask(sizes.to(pixel_values.device), H, W)
        elif self.fast_embed and vision.full_images(self.vilt, pixel_mask):
            return self.embed_full(input_ids, attention_mask, pixel_values)
        h, mask = self.vilt.embeddings(
            input_ids,
            attention_mask,
            None,
            pixel_values,
            pixel_mask,
            None,
            None,
            image_token_type_idx=1,
        )
        return h, mask.bool()

    def embed_padded(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
        sizes: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`embed` of a padded batch of images of (B, 2) host `sizes`, without
        host syncs (`vision.image_embeddings`): each image's patches in raster
        order, then masked padding up to the batch's largest patch count.
        Same tokens as `ViltEmbeddings.forward` up to patch order; the encoder
        is permutation-equivariant over the patch tokens, so the CLS outputs
        are the same up to summation order."""
        emb = self.vilt.embeddings
        type_w = emb.token_type_embeddings.weight  # (types, D)
        text = emb.text_embeddings(input_ids=input_ids) + type_w[0]
        image, image_mask = vision.image_embeddings(
            emb, self._positions, pixel_values, sizes
        )
        h = torch.cat([text, image + type_w[1]], 1)
        return h, torch.cat([attention_mask.bool(), image_mask], 1)

    def embed_full(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        pixel_values: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`embed_padded` of a batch whose images all fill pixel_values."""
        B, _, H, W = pixel_values.shape
        sizes = torch.tensor([[H, W]], dtype=torch.int64).expand(B, 2)
        return self.embed_padded(input_ids, attention_mask, pixel_values, sizes)

    def encode(
        self,
        h: torch.Tensor,
        mask: torch.Tensor | None,
        prompts: dict[int, LayerPrompt] | None = None,
        prompt_outputs: bool = False,
        read: Read | None = None,
    ) -> torch.Tensor:
        """Run the encoder layers and the final LayerNorm.

        h: (B, N, D) from `embed`; mask: (B, N) bool, or None when no token
        is masked (`no_masked_keys`): a prompt-free pass then attends without
        a mask, which SDPA's flash kernel allows; prompts: layer index →
        `LayerPrompt` (None or {}: prompt-free). Returns (B, N, D): the output
        at the input's token positions (input-style prompt tokens are dropped);
        with `prompt_outputs`, (B, L_i + N, D): the L_i input-style prompt
        tokens present after the last layer (L2P's head reads them) in front.

        read: the positions of that output the caller reads — a sequence of
        ints or a slice (step 1) — and then the return is (B, R, D), row j
        the output at position read[j]: the last layer computes its query,
        attention output, MLP and LayerNorms, and the final LayerNorm runs,
        only for those R rows (its keys and values still come from every
        token), the same rows as the full output's up to summation order.
        None: every position.
        """
        if self.fused_attention and self.attention_backends:
            with sdpa_kernel(self.attention_backends):
                return self._encode(h, mask, prompts or {}, prompt_outputs, read)
        return self._encode(h, mask, prompts or {}, prompt_outputs, read)

    def _encode(
        self,
        h: torch.Tensor,
        mask: torch.Tensor | None,
        prompts: dict[int, LayerPrompt],
        prompt_outputs: bool = False,
        read: Read | None = None,
    ) -> torch.Tensor:
        last = len(self._layers) - 1
        if mask is None and prompts:  # prompt masks are device values: a bias
            mask = torch.ones(h.shape[:2], dtype=torch.bool, device=h.device)
        n_input = 0  # input-style prompt tokens currently at the front of h
        mask_in: torch.Tensor | None = None
        generation = 0  # counts the changes of mask_in, which keys the biases
        # one bias per distinct key mask; keyed by the prompts' own mask objects
        # (alive in `prompts` all along) and mask_in's generation, never by the
        # id of an accumulated mask_in: a freed one's id comes back
        biases: dict[tuple[int, int], torch.Tensor | None] = {}
        for i, layer in enumerate(self._layers):
            p = prompts.get(i)
            if p is not None and p.tokens is not None and p.keep and n_input:
                h = torch.cat([p.tokens.to(h.dtype), h], 1)
                n_input += p.tokens.shape[1]
                assert mask_in is not None  # set with the first input tokens
                mask_in, generation = torch.cat([p.mask, mask_in], 1), generation + 1
            elif p is not None and p.tokens is not None:
                h = torch.cat([p.tokens.to(h.dtype), h[:, n_input:]], 1)
                generation += mask_in is not p.mask  # a shared mask keeps its bias
                n_input, mask_in = p.tokens.shape[1], p.mask
            prefix: tuple[torch.Tensor, torch.Tensor] | None = None
            prefix_mask: torch.Tensor | None = None  # the prefix prompts' key mask
            if p is not None and p.keys is not None:
                assert p.values is not None, "prefix prompts have keys and values"
                prefix, prefix_mask = (p.keys, p.values), p.mask
            key = (id(prefix_mask) if prefix_mask is not None else 0, generation)
            if key not in biases:
                bias = None
                if mask is not None:
                    parts = [prefix_mask] if prefix_mask is not None else []
                    parts += [mask_in, mask] if mask_in is not None else [mask]
                    bias = self._bias(torch.cat(parts, 1), h.dtype)
                biases[key] = bias
            rows = None
            if i == last and read is not None:
                offset = 0 if prompt_outputs else n_input
                rows = read_ranges(read, h.shape[1] - offset, offset)
            h = self._layer(i, layer, h, biases[key], prefix, rows)
        h = self.vilt.layernorm(h)
        return h if prompt_outputs or read is not None else h[:, n_input:]

    def _bias(self, key_mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Additive attention mask (B, 1, 1, K): 0 to attend, dtype's min not to."""
        if torch.is_autocast_enabled(key_mask.device.type):
            dtype = torch.get_autocast_dtype(key_mask.device.type)
        bias = torch.zeros(key_mask.shape, dtype=dtype, device=key_mask.device)
        return bias.masked_fill_(~key_mask, torch.finfo(dtype).min)[:, None, None, :]

    def _layer(
        self,
        i: int,
        layer: ViltLayer,
        h: torch.Tensor,
        bias: torch.Tensor | None,
        prefix: tuple[torch.Tensor, torch.Tensor] | None,
        rows: list[tuple[int, int]] | None = None,
    ) -> torch.Tensor:
        """One pre-LN layer over h (B, N, D); bias None: no key is masked.
        rows (`read_ranges`): only those rows are computed past the keys and
        values, and returned."""
        B, N, D = h.shape
        H = self.num_heads
        x = layer.layernorm_before(h)
        w, b = getattr(self, f"qkv_w{i}"), getattr(self, f"qkv_b{i}")
        if rows is None:
            q, k, v = F.linear(x, w, b).split(D, dim=-1)  # 3 × (B, N, D)
        else:  # queries of the read rows only: (B, R, D)
            k, v = F.linear(x, w[D:], b[D:]).split(D, dim=-1)
            h = take_rows(h, rows)
            q = F.linear(take_rows(x, rows), w[:D], b[:D])
            N = q.shape[1]
        if prefix is not None:
            k = torch.cat([prefix[0].to(k.dtype), k], 1)  # (B, L_k + N, D)
            v = torch.cat([prefix[1].to(v.dtype), v], 1)
        q = q.view(B, N, H, -1).transpose(1, 2)  # (B, H, N, d_h)
        k = k.view(B, k.shape[1], H, -1).transpose(1, 2)
        v = v.view(B, v.shape[1], H, -1).transpose(1, 2)
        if self.fused_attention:
            attn_mask = None if bias is None else bias.to(q.dtype)
            ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        else:  # HF's eager arithmetic, bit for bit
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            scores = scores if bias is None else scores + bias
            ctx = scores.softmax(-1) @ v
        ctx = ctx.transpose(1, 2).reshape(B, N, D)
        h = layer.attention.output.dense(ctx) + h
        return layer.output.dense(layer.intermediate(layer.layernorm_after(h))) + h

    def no_masked_keys(
        self, attention_mask: torch.Tensor, sizes: torch.Tensor | None
    ) -> bool:
        """True when the embedding of a batch masks no token, read from host
        tensors only (no sync): attention_mask (R, T) with no padding and
        sizes (R, 2) of images with one patch count, all of them kept.
        sizes None (a float32 batch with a pixel mask): False."""
        if sizes is None or attention_mask.device.type != "cpu":
            return False
        if vision.samples_patches(self.vilt, sizes) or not bool(attention_mask.all()):
            return False
        ph, pw = self.vilt.embeddings.patch_embeddings.patch_size
        return len({(h // ph) * (w // pw) for h, w in sizes.tolist()}) == 1

    def queries(
        self, h: torch.Tensor, mask: torch.Tensor | None, text_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Prompt-free pass: (q_t, q_v), each (B, D) float32 — the final-LN
        output at the text CLS (0) and at the image CLS (T); mask None: no
        token masked (`no_masked_keys`)."""
        out = self.encode(h, mask, read=(0, text_len))
        return out[:, 0].float(), out[:, 1].float()


def _bias(linear: nn.Linear) -> torch.Tensor:
    if linear.bias is not None:
        return linear.bias
    return torch.zeros(linear.out_features, dtype=linear.weight.dtype)


def _shortest_edge(image_processor) -> int | None:
    size = getattr(image_processor, "size", None)
    if size is None:
        return None
    value = (
        size.get("shortest_edge")
        if isinstance(size, dict)
        else getattr(size, "shortest_edge", None)
    )
    return int(value) if value else None


def interpolate_text_positions(vilt: ViltModel, length: int) -> None:
    """Stretch the text position table (40, D) to (length, D) by linear
    interpolation, as the missing-modality literature does for long texts."""
    te = vilt.embeddings.text_embeddings
    old = te.position_embeddings.weight.detach()  # (P, D)
    new = F.interpolate(old.T[None], size=length, mode="linear", align_corners=False)
    table = nn.Embedding(length, old.shape[1]).to(old.device, old.dtype)
    table.weight.data.copy_(new[0].T)
    table.requires_grad_(False)
    te.position_embeddings = table
    te.position_ids = torch.arange(length, device=old.device).expand(1, -1)
    te.token_type_ids = torch.zeros(1, length, dtype=torch.long, device=old.device)
