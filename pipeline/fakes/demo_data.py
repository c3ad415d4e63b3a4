"""Synthetic image–text data of the offline demo: attributes, images, captions.

A demo class is a pair (look, flavour). A *look* is an image attribute triple
(shape, colour, texture); a *flavour* is a text attribute, written as one of two
synonyms among shared filler words. Classes are chained so that every look is
shared by two classes and every flavour by two other classes:

    class c  ->  look c // 2,  flavour ((c + 1) // 2) % L,   L = ceil(n_classes / 2)

so the image alone narrows a sample down to two classes, the caption alone to two
other classes, and the pair identifies it. A missing modality therefore costs
accuracy (about half of the samples become a coin flip) while the complete pair
does not.

Backbone pre-training draws (look, flavour) pairs from the whole attribute space
except the demo's own pairs, so its classes are disjoint from the demo's.

Three designs of a gap between that pre-training and the demo's classes are
options (`demo:` params, all off in the committed demo; bench/README.md, "Demos
with a gap"):

- `variants` = k > 1: the chain runs over n_classes / k visible classes, and
  each has k classes that differ only in texture (TEXTURES[j]) and in a cooking
  word of the caption (COOKING[j]); pre-training trains no texture head and
  writes a random cooking word, so neither cue was ever supervised;
- `colour_free`: a look is (shape, texture), its colour drawn per sample, so the
  colour the backbone learnt best says nothing about the class; pre-training
  trains no texture head;
- `side_dish`: every image also shows a smaller object of a random look in a
  corner, behind the class's object; pre-training only ever saw one object.

Everything is drawn from `numpy.random.Generator`s passed in by the caller; the
functions here hold no global state.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

SHAPES = ("circle", "square", "triangle", "cross", "ring")
COLOURS = {  # name -> RGB
    "red": (215, 40, 40),
    "green": (40, 165, 60),
    "blue": (45, 80, 215),
    "yellow": (230, 200, 30),
    "purple": (140, 50, 175),
    "orange": (240, 125, 20),
}
TEXTURES = ("solid", "striped", "dotted")
COOKING = ("steamed", "grilled", "fried")  # caption words of `variants`

# Text attributes: each flavour is written with one of two synonyms.
FLAVOURS = (
    ("spicy", "fiery"),
    ("sweet", "sugary"),
    ("crispy", "crunchy"),
    ("creamy", "velvety"),
    ("salty", "briny"),
    ("sour", "tangy"),
    ("smoky", "charred"),
    ("fresh", "raw"),
    ("hearty", "rich"),
    ("fluffy", "airy"),
    ("bitter", "dark"),
    ("fruity", "juicy"),
    ("cheesy", "melted"),
    ("nutty", "toasted"),
    ("herbal", "minty"),
    ("zesty", "lemony"),
)
FILLERS = tuple(
    """a an the photo of my our this that plate dish bowl with served on in table
    homemade recipe today is very really and some lunch dinner breakfast tasty quick
    easy best for family weekend kitchen classic simple new favourite style little
    big at home night""".split()
)
PUNCTUATION = (".", ",", "!")

MIN_CLASSES = 4  # two looks and two flavours at least, so that the chain closes
MAX_CLASSES = 2 * len(FLAVOURS)


@dataclasses.dataclass(frozen=True)
class Look:
    """An image attribute triple; indices into SHAPES, COLOURS, TEXTURES."""

    shape: int
    colour: int
    texture: int

    @property
    def name(self) -> str:
        colour = list(COLOURS)[self.colour]
        return f"{TEXTURES[self.texture]}_{colour}_{SHAPES[self.shape]}"


def all_looks() -> list[Look]:
    """Every (shape, colour, texture) triple, 90 in all, in a fixed order."""
    n = len(SHAPES) * len(COLOURS) * len(TEXTURES)
    return [look_of(j) for j in range(n)]


def look_of(j: int) -> Look:
    """Look number `j`: (shape j % 5, colour j % 6, texture j % 3) for j < 30.

    Consecutive looks differ in shape, colour and texture at once; two demo looks
    always differ in shape or colour. Beyond 30 the remaining triples follow in
    lexicographic order so that `all_looks()` covers the whole space.
    """
    ns, nc, nt = len(SHAPES), len(COLOURS), len(TEXTURES)
    if j < 30:
        return Look(j % ns, j % nc, j % nt)
    rest = [
        Look(s, c, t)
        for s in range(ns)
        for c in range(nc)
        for t in range(nt)
        if Look(s, c, t) not in {Look(i % ns, i % nc, i % nt) for i in range(30)}
    ]
    return rest[j - 30]


@dataclasses.dataclass(frozen=True)
class DemoClass:
    """One demo class: its look, its flavour, its cooking word and its name."""

    index: int  # natural index 0..n_classes-1 (not the incremental label)
    look: Look  # with `colour_free`, its colour is drawn per sample
    flavour: int  # index into FLAVOURS
    cooking: int | None = None  # index into COOKING (`variants` > 1 only)

    @property
    def name(self) -> str:
        cooked = "" if self.cooking is None else f"{COOKING[self.cooking]}_"
        return f"{FLAVOURS[self.flavour][0]}_{cooked}{self.look.name}"


def demo_classes(
    n_classes: int, variants: int = 1, colour_free: bool = False
) -> list[DemoClass]:
    """The chained (look, flavour) classes described in the module docstring."""
    if not MIN_CLASSES * variants <= n_classes <= MAX_CLASSES:
        raise ValueError(
            f"n_classes must lie in [{MIN_CLASSES * variants}, {MAX_CLASSES}], "
            f"got {n_classes}"
        )
    n_visible = n_classes // variants
    n_groups = math.ceil(n_visible / 2)
    out = []
    for c in range(n_visible):
        look = look_of(c // 2)
        if colour_free:  # shape and texture tell the looks apart
            look = Look((c // 2) % len(SHAPES), 0, (c // 2) % len(TEXTURES))
        flavour = ((c + 1) // 2) % n_groups
        if variants == 1:
            out.append(DemoClass(c, look, flavour))
            continue
        for k in range(variants):
            retextured = Look(look.shape, look.colour, k)
            out.append(DemoClass(c * variants + k, retextured, flavour, k))
    return out


def pretrain_pairs(
    n_classes: int, variants: int = 1, colour_free: bool = False
) -> list[tuple[Look, int]]:
    """All (look, flavour) pairs of the attribute space that are not demo
    classes (with `colour_free`, a demo look in any colour)."""
    taken = {
        (c.look, c.flavour) for c in demo_classes(n_classes, variants, colour_free)
    }
    if colour_free:
        taken = {
            (Look(lk.shape, k, lk.texture), f)
            for lk, f in taken
            for k in range(len(COLOURS))
        }
    return [
        (look, f)
        for look in all_looks()
        for f in range(len(FLAVOURS))
        if (look, f) not in taken
    ]


# ---------------------------------------------------------------------------
# Images


def render_image(
    look: Look,
    size: int,
    rng: np.random.Generator,
    noise: float,
    side: Look | None = None,
) -> np.ndarray:
    """Draw one image of `look` with per-sample jitter.

    Position, scale, rotation, colour shade, stripe/dot phase and spacing,
    background tint and pixel noise (std `noise` × 255) are drawn from `rng`.
    `side`: a smaller object drawn first in a random corner (`side_dish`).

    Returns:
        (size, size, 3) uint8 RGB array.
    """
    s = float(size)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    # background: a light tint with a soft gradient
    base = rng.uniform(200, 250) + rng.uniform(-12, 12, size=3)
    grad = rng.uniform(-20, 20) * (xx / s - 0.5) + rng.uniform(-20, 20) * (yy / s - 0.5)
    img = base[None, None, :] + grad[..., None]

    if side is not None:
        corner = rng.integers(2, size=2)
        sx, sy = (0.2 + 0.6 * corner + rng.uniform(-0.05, 0.05, size=2)) * s
        img = _draw(img, side, (sx, sy, rng.uniform(0.14, 0.2) * s), xx, yy, rng)
    cx, cy = s / 2 + rng.uniform(-0.14, 0.14, size=2) * s
    radius = rng.uniform(0.24, 0.34) * s
    img = _draw(img, look, (cx, cy, radius), xx, yy, rng)
    img = img + rng.normal(0.0, noise * 255.0, size=img.shape)
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def _draw(
    img: np.ndarray,
    look: Look,
    where: tuple[float, float, float],
    xx: np.ndarray,
    yy: np.ndarray,
    rng: np.random.Generator,
) -> np.ndarray:
    """`img` with `look` drawn at centre (cx, cy) and circumradius r (`where`),
    its rotation, shade and texture drawn from `rng`."""
    cx, cy, radius = where
    theta = rng.uniform(0, 2 * np.pi)
    # coordinates in the shape's rotated frame, unit = radius
    dx, dy = (xx - cx) / radius, (yy - cy) / radius
    u = np.cos(theta) * dx + np.sin(theta) * dy
    v = -np.sin(theta) * dx + np.cos(theta) * dy
    mask = _shape_mask(SHAPES[look.shape], u, v)

    base = np.array(list(COLOURS.values())[look.colour], dtype=np.float32)
    colour = base + rng.uniform(-22, 22, size=3)
    shade = _texture(TEXTURES[look.texture], xx, yy, rng)  # (size, size) in [0, 1]
    fill = colour[None, None, :] * (1.0 - 0.55 * shade[..., None])
    return np.where(mask[..., None], fill, img)


def _shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    r = np.hypot(u, v)
    if shape == "circle":
        return r <= 1.0
    if shape == "ring":
        return (r <= 1.0) & (r >= 0.55)
    if shape == "square":
        return (np.abs(u) <= 0.8) & (np.abs(v) <= 0.8)
    if shape == "cross":
        arm = 0.33
        return ((np.abs(u) <= arm) & (np.abs(v) <= 1.0)) | (
            (np.abs(v) <= arm) & (np.abs(u) <= 1.0)
        )
    if shape == "triangle":  # equilateral, circumradius 1
        k = np.sqrt(3.0)
        return (v >= -0.5) & (v <= 1.0 - k * np.abs(u) * 1.0) & (np.abs(u) <= k / 2)
    raise ValueError(f"unknown shape {shape!r}")


def _texture(
    texture: str, xx: np.ndarray, yy: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    if texture == "solid":
        return np.zeros_like(xx)
    period = rng.uniform(5.0, 7.0)
    phase = rng.uniform(0, period, size=2)
    if texture == "striped":
        angle = rng.uniform(-0.3, 0.3)  # roughly diagonal stripes
        t = (xx + phase[0]) * np.cos(np.pi / 4 + angle) + (yy + phase[1]) * np.sin(
            np.pi / 4 + angle
        )
        return ((t % period) < period / 2).astype(np.float32)
    if texture == "dotted":
        gx = (xx + phase[0]) % period - period / 2
        gy = (yy + phase[1]) % period - period / 2
        return (np.hypot(gx, gy) < period * 0.28).astype(np.float32)
    raise ValueError(f"unknown texture {texture!r}")


# ---------------------------------------------------------------------------
# Captions


def make_caption(
    flavour: int, rng: np.random.Generator, noise: float, cooking: int | None = None
) -> str:
    """A caption carrying `flavour` as one of its synonyms among filler words.

    With probability `noise` the flavour word is replaced by a synonym of a
    random other flavour (a misleading caption); 4–9 filler words surround it;
    `cooking`: COOKING[cooking] is inserted at a random place too.
    """
    if rng.random() < noise:
        others = [f for f in range(len(FLAVOURS)) if f != flavour]
        flavour = others[int(rng.integers(len(others)))]
    word = FLAVOURS[flavour][int(rng.integers(2))]
    n_fill = int(rng.integers(4, 10))
    words = [FILLERS[int(i)] for i in rng.integers(len(FILLERS), size=n_fill)]
    words.insert(int(rng.integers(n_fill + 1)), word)
    if cooking is not None:
        words.insert(int(rng.integers(n_fill + 2)), COOKING[cooking])
    if rng.random() < 0.5:
        words.append(PUNCTUATION[int(rng.integers(len(PUNCTUATION)))])
    return " ".join(words)


def vocabulary(cooking: bool = False) -> list[str]:
    """Every word a demo caption can contain, sorted, without duplicates
    (`cooking`: the COOKING words too, for `variants` > 1)."""
    words = set(FILLERS) | set(PUNCTUATION)
    words |= {w for pair in FLAVOURS for w in pair}
    if cooking:
        words |= set(COOKING)
    return sorted(words)
