"""The options several stage commands share: where `pal pixels` and `pal
frozen` wrote their outputs, read by `pal tune`, `pal extract` (and `pal
frozen`, for the pixels). Click lives in the stages, not below them."""

from __future__ import annotations

from palcore.cliutil import folder_option

# `--pixels DIR` of `pal tune`, `pal extract` and `pal frozen`
pixels_option = folder_option(
    "pixels",
    None,
    "Folder written by `pal pixels`: read the images' pixels from its cache "
    "instead of decoding them (same bytes). Default: decode.",
)

# `--frozen DIR` of `pal tune` and `pal extract` (dest `frozen_dir`)
frozen_option = folder_option(
    "frozen",
    None,
    "Folder written by `pal frozen`: the frozen queries are read from its "
    "queries.h5 instead of computed from the images (default: computed).",
    dest="frozen_dir",
)
