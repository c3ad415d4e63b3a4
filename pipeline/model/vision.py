"""Images on the device: mixed-size batches embedded without host syncs, and
pixels normalised there from uint8 (DESIGN §5, "Images on the device").

ViLT pads a batch's images to its largest height and width; HF's
`ViltEmbeddings.visual_embed` then finds each image's patches with
`nonzero`, `unique` and per-sample Python loops (dozens of host syncs per
batch) and shuffles them with torch's RNG. `embed_padded` gives the same
tokens from the images' sizes, which the loader knows on the host:

* the patch count P of the token layout is the batch's largest `gh·gw`,
  a host number, so no shape depends on device data;
* token j < gh·gw of an image is its patch (j // gw, j % gw) in raster
  order, gathered from the padded canvas; tokens past gh·gw are masked
  padding (HF fills them with random masked patches: masked keys change
  nothing);
* each grid's interpolated position table is computed once, with HF's
  arithmetic, and kept (`PositionTables`): a batch only gathers rows.

The encoder is permutation-equivariant over patch tokens (positions are
added before), so the CLS outputs equal HF's up to summation order
(tests/test_vision.py holds them to 1e-5).

`normalise_pixels` turns the loader's uint8 canvas into ViLT's float
pixels on the device, bit for bit what `images.vilt_pixels` makes on the
host (rescale in float64, then normalise in float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

SYNC_OPS = frozenset(
    {
        "aten._local_scalar_dense",  # .item(), bool(t), int(t)
        "aten.nonzero",
        "aten.unique",
        "aten._unique",
        "aten._unique2",
        "aten.unique_consecutive",
        "aten.masked_select",
        "aten.is_nonzero",
        "aten.equal",
        "aten.repeat_interleave",
    }
)


class PositionTables:
    """ViLT's spatial position table interpolated to each patch grid, cached.

    `pos`: the model's position parameter (1, 1 + g·g, D). For a batch the
    tables of its grids are read from a bank (K, P_max, D) through a lookup
    (rows, cols) → bank index kept on the device, so a batch whose grids were
    all seen before costs one gather and no host-device transfer.
    """

    def __init__(self) -> None:
        self.tables: dict[tuple[int, int], torch.Tensor] = {}
        self.bank: torch.Tensor | None = None  # (K, P_max, D)
        self.lookup: torch.Tensor | None = None  # (gh_max + 1, gw_max + 1) int64

    def gather(
        self,
        pos: torch.Tensor,
        grids: list[tuple[int, int]],
        gdev: torch.Tensor,
        P: int,
    ) -> torch.Tensor:
        """(B, P, D): row b holds grid `grids[b]`'s table, zero-padded to P.
        grids: host (gh, gw) per row; gdev: the same (B, 2) int64 on the device."""
        stale = self.bank is None or (
            self.bank.device != pos.device or self.bank.dtype != pos.dtype
        )
        if stale:
            self.tables.clear()
        new = set(grids) - set(self.tables)
        if new or stale:
            for gh, gw in sorted(new | (set(grids) if stale else set())):
                self.tables[(gh, gw)] = _interpolate(pos, gh, gw)
            self._rebuild(pos)
        # a stale bank is rebuilt above, so both exist here
        assert self.bank is not None and self.lookup is not None
        k = self.lookup[gdev[:, 0], gdev[:, 1]]  # (B,)
        return self.bank[k, :P]

    def _rebuild(self, pos: torch.Tensor) -> None:
        keys = sorted(self.tables)
        width = max(gh * gw for gh, gw in keys)
        self.bank = torch.stack(
            [F.pad(self.tables[g], (0, 0, 0, width - g[0] * g[1])) for g in keys]
        )
        lookup = torch.zeros(
            max(g[0] for g in keys) + 1, max(g[1] for g in keys) + 1, dtype=torch.int64
        )
        for i, g in enumerate(keys):
            lookup[g] = i
        self.lookup = lookup.to(pos.device, non_blocking=True)


def _interpolate(pos: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
    """(gh·gw, D): the spatial table bilinearly resized to gh × gw, as
    `visual_embed` does it (align_corners=True, in the parameter's dtype)."""
    D = pos.shape[-1]
    g = int(round((pos.shape[1] - 1) ** 0.5))
    spatial = pos[:, 1:, :].transpose(1, 2).reshape(1, D, g, g)
    table = F.interpolate(spatial, size=(gh, gw), mode="bilinear", align_corners=True)
    return table.flatten(2)[0].transpose(0, 1).contiguous()


def patch_grids(sizes: torch.Tensor, patch: tuple[int, int]) -> torch.Tensor:
    """(B, 2) int64 patch rows and columns of images of (B, 2) pixel sizes."""
    return torch.stack([sizes[:, 0] // patch[0], sizes[:, 1] // patch[1]], 1)


def gather_patches(
    pixel_values: torch.Tensor,
    grids: torch.Tensor,
    patch: tuple[int, int],
    P: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The pixels of each image's patches in raster order.

    pixel_values: (B, C, H, W) padded canvas; grids: (B, 2) int64 on its
    device. Returns (B, P, C·ph·pw) patches (zeros past an image's gh·gw)
    and valid (B, P) bool.
    """
    B, C, H, W = pixel_values.shape
    ph, pw = patch
    GH, GW = H // ph, W // pw
    px = pixel_values[:, :, : GH * ph, : GW * pw]
    px = px.reshape(B, C, GH, ph, GW, pw).permute(0, 2, 4, 1, 3, 5)
    px = px.reshape(B, GH * GW, C * ph * pw)
    j = torch.arange(P, device=px.device)[None]  # (1, P)
    gh, gw = grids[:, :1], grids[:, 1:]
    valid = j < gh * gw
    where = torch.where(valid, (j // gw) * GW + j % gw, 0)  # canvas patch index
    out = px.gather(1, where[..., None].expand(-1, -1, px.shape[-1]))
    return out * valid[..., None].to(out.dtype), valid


def image_embeddings(
    embeddings,
    tables: PositionTables,
    pixel_values: torch.Tensor,
    sizes: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ViLT's image tokens of a padded batch: (B, 1 + P, D) (CLS, then each
    image's patches in raster order) and their mask (B, 1 + P) bool.

    embeddings: HF's `ViltEmbeddings`; sizes: (B, 2) int64 image heights and
    widths in pixels, on the host (they set P; no device value is read).
    """
    conv = embeddings.patch_embeddings.projection
    patch = tuple(conv.kernel_size)
    grids_host = patch_grids(sizes, patch)
    keys = [(int(h), int(w)) for h, w in grids_host.tolist()]  # host values
    P = max(h * w for h, w in keys)
    grids = grids_host.to(pixel_values.device, non_blocking=True)
    px, valid = gather_patches(pixel_values.to(conv.weight.dtype), grids, patch, P)
    x = F.linear(px, conv.weight.flatten(1), conv.bias)  # (B, P, D)
    pos = embeddings.position_embeddings  # (1, 1 + g·g, D)
    x = x + tables.gather(pos, keys, grids, P)
    B = x.shape[0]
    cls = embeddings.cls_token.expand(B, -1, -1) + pos[:, :1, :]
    image = torch.cat([cls, x], 1)
    ones = torch.ones(B, 1, dtype=torch.bool, device=x.device)
    return image, torch.cat([ones, valid], 1)


def pixel_mask(sizes: torch.Tensor, H: int, W: int) -> torch.Tensor:
    """(B, H, W) int64: 1 inside each image of (B, 2) sizes, 0 in the padding."""
    rows = torch.arange(H, device=sizes.device)[None, :, None] < sizes[:, :1, None]
    cols = torch.arange(W, device=sizes.device)[None, None, :] < sizes[:, 1:, None]
    return (rows & cols).to(torch.int64)


def normalise_pixels(
    u8: torch.Tensor,
    sizes: torch.Tensor,
    dummy: torch.Tensor,
    norm: torch.Tensor,
) -> torch.Tensor:
    """ViLT's float pixels from the loader's uint8 canvas, on u8's device.

    u8: (B, 3, H, W) uint8; sizes: (B, 2) int64; dummy: (B,) bool, rows that
    are the all-white dummy image (1.0 after normalisation); norm: (3, 3)
    float64, rows rescale factor, mean and std per channel. Returns (B, 3, H,
    W) float32, 0 in the padding: bit for bit `vilt_pixels` on each image.
    """
    scale = norm[0].view(1, 3, 1, 1)
    mean = norm[1].float().view(1, 3, 1, 1)
    std = norm[2].float().view(1, 3, 1, 1)
    x = ((u8.double() * scale).float() - mean) / std
    x = torch.where(dummy.view(-1, 1, 1, 1), 1.0, x)
    inside = pixel_mask(sizes, u8.shape[2], u8.shape[3]).bool()[:, None]
    return torch.where(inside, x, 0.0)


def samples_patches(vilt, sizes: torch.Tensor) -> bool:
    """True when ViLT would keep a random subset of some image's patches
    (`max_image_length` > 0 and below the largest patch count of the (B, 2)
    host `sizes`); no device value is read."""
    limit = vilt.config.max_image_length
    if not isinstance(limit, int) or limit <= 0:
        return False
    ph, pw = vilt.embeddings.patch_embeddings.patch_size
    return limit < max((h // ph) * (w // pw) for h, w in sizes.tolist())


def full_images(vilt, pixel_mask: torch.Tensor) -> bool:
    """True when every image fills the whole padded tensor and ViLT would keep
    all of its patches. One host sync: the rule for a float32 batch with a
    pixel mask (the loader's uint8 batches carry their sizes instead)."""
    limit = vilt.config.max_image_length
    if isinstance(limit, int) and limit > 0:
        ph, pw = vilt.embeddings.patch_embeddings.patch_size
        if limit < (pixel_mask.shape[1] // ph) * (pixel_mask.shape[2] // pw):
            return False  # HF samples a random subset of patches
    return bool(pixel_mask.all())


def batch_inputs(
    batch, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(input_ids, attention_mask, pixel_values, pixel_mask) of a `Batch` on
    `device`; uint8 pixels are normalised there (`normalise_pixels`) and the
    pixel mask is None (`Backbone.embed` builds it from the sizes if it needs
    one). Copies from pinned memory do not block the host."""
    nb = device.type == "cuda"
    ids, am, px = (
        t.to(device, non_blocking=nb)
        for t in (batch.input_ids, batch.attention_mask, batch.pixel_values)
    )
    if px.dtype.is_floating_point:
        return ids, am, px, batch.pixel_mask.to(device, non_blocking=nb)
    sizes, dummy, norm = (
        t.to(device, non_blocking=nb)
        for t in (batch.image_sizes, batch.dummy, batch.norm)
    )
    return ids, am, normalise_pixels(px, sizes, dummy, norm), None
