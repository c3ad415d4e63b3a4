"""The demo's tiny ViLT: vocabulary, config, brief pre-training, saving.

The backbone is pre-trained on synthetic (look, flavour) pairs that are *not*
demo classes (`data.pretrain_pairs`), with one linear head per attribute
(shape, colour, texture, flavour) on the text-CLS token after the final
LayerNorm, the token PAL classifies from. Some pre-training samples lack their
caption (empty text) or their image (all white), so the backbone has seen
missing inputs. Only the `ViltModel` weights are saved; the heads are dropped.
With `demo.variants` > 1 or `demo.colour_free` there is no texture head, and
with `variants` > 1 every pre-training caption carries a random cooking word:
cues the demo's classes depend on that pre-training never supervised.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from transformers import (
    BertTokenizer,
    ViltConfig,
    ViltImageProcessorPil,
    ViltModel,
    ViltProcessor,
)

from palcore.progress import tqdm
from pipeline.fakes import demo_data as dd
from pipeline.params import DemoParams

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_TEXT_LEN = 40  # ViLT's text position table
PRETRAIN_TEXT_LEN = 16  # demo captions are at most 13 tokens with [CLS], [SEP]
PRETRAIN_SEED_TAG = 1  # second entropy word of the pre-training generators


def write_vocab(path: Path, cooking: bool = False) -> int:
    """Write `vocab.txt`: special tokens, then the demo words (`cooking`: with
    the cooking words). Returns its size."""
    tokens = list(SPECIAL_TOKENS) + dd.vocabulary(cooking)
    assert len(set(tokens)) == len(tokens), "duplicate vocabulary entries"
    path.write_text("\n".join(tokens) + "\n", encoding="utf-8")
    return len(tokens)


def vilt_config(params: DemoParams, vocab_size: int) -> ViltConfig:
    """The tiny ViLT's config: text tokens ≤ 40, (image_size / patch_size)² patches."""
    return ViltConfig(
        vocab_size=vocab_size,
        hidden_size=params.hidden_size,
        num_hidden_layers=params.num_layers,
        num_attention_heads=params.num_heads,
        intermediate_size=params.intermediate_size,
        image_size=params.image_size,
        patch_size=params.patch_size,
        max_position_embeddings=MAX_TEXT_LEN,
        max_image_length=-1,
        pad_token_id=0,
    )


def make_processor(folder: Path, params: DemoParams) -> ViltProcessor:
    """Tokenizer over `folder/vocab.txt` + PIL image processor (mean = std = 0.5)."""
    tokenizer = BertTokenizer(
        vocab=str(folder / "vocab.txt"),
        do_lower_case=True,
        model_max_length=MAX_TEXT_LEN,
    )
    # size_divisor is one of ViLT's own processor kwargs (its valid_kwargs),
    # which the base class's typed __init__ does not list
    images = ViltImageProcessorPil(  # type: ignore[call-arg]
        size={"shortest_edge": params.image_size},
        size_divisor=params.patch_size,
        do_pad=True,
    )
    return ViltProcessor(image_processor=images, tokenizer=tokenizer)


def to_pixel_values(images: np.ndarray) -> torch.Tensor:
    """(B, H, W, 3) uint8 → (B, 3, H, W) float32 normalised as ViLT's processor does.

    For images already at the processor's size this equals its output exactly:
    value = (pixel / 255 − 0.5) / 0.5, so white is 1.0.
    """
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float()
    return (x / 255.0 - 0.5) / 0.5


class _AttributeHeads(nn.Module):
    """One linear head per attribute on the text-CLS vector (B, D)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.shape = nn.Linear(hidden, len(dd.SHAPES))
        self.colour = nn.Linear(hidden, len(dd.COLOURS))
        self.texture = nn.Linear(hidden, len(dd.TEXTURES))
        self.flavour = nn.Linear(hidden, len(dd.FLAVOURS))


def _pretrain_batch(
    pairs: list[tuple[dd.Look, int]],
    params: DemoParams,
    rng: np.random.Generator,
    tokenizer: BertTokenizer,
) -> dict[str, torch.Tensor]:
    """One batch of pre-training samples, with modality drop-out."""
    b = params.pretrain_batch
    chosen = rng.integers(len(pairs), size=b)
    drop = rng.random(b)
    has_text = drop >= params.pretrain_drop
    has_image = (drop < params.pretrain_drop) | (drop >= 2 * params.pretrain_drop)
    images = np.empty((b, params.image_size, params.image_size, 3), dtype=np.uint8)
    texts = []
    for i, k in enumerate(chosen):
        look, flavour = pairs[int(k)]
        images[i] = dd.render_image(look, params.image_size, rng, params.image_noise)
        cooking = None
        if params.variants > 1:  # a cue no head reads
            cooking = int(rng.integers(len(dd.COOKING)))
        texts.append(dd.make_caption(flavour, rng, params.text_noise, cooking))
    images[~has_image] = 255
    texts = [t if keep else "" for t, keep in zip(texts, has_text, strict=True)]
    enc = tokenizer(
        texts,
        padding="max_length",
        max_length=PRETRAIN_TEXT_LEN,
        truncation=True,
        return_tensors="pt",
    )
    looks = [pairs[int(k)][0] for k in chosen]
    return {
        "input_ids": enc["input_ids"],
        "attention_mask": enc["attention_mask"],
        "pixel_values": to_pixel_values(images),
        "pixel_mask": torch.ones(
            b, params.image_size, params.image_size, dtype=torch.long
        ),
        "shape": torch.tensor([lk.shape for lk in looks]),
        "colour": torch.tensor([lk.colour for lk in looks]),
        "texture": torch.tensor([lk.texture for lk in looks]),
        "flavour": torch.tensor([pairs[int(k)][1] for k in chosen]),
        "has_text": torch.from_numpy(has_text),
        "has_image": torch.from_numpy(has_image),
    }


def _pretrain_loss(
    heads: _AttributeHeads,
    hidden: torch.Tensor,
    batch: dict[str, torch.Tensor],
    texture_head: bool,
) -> torch.Tensor:
    """Cross-entropy of each attribute head on the samples that show it
    (`texture_head` False: no texture term)."""
    ce = nn.CrossEntropyLoss(reduction="none")
    img = batch["has_image"].float()
    txt = batch["has_text"].float()
    loss = (ce(heads.shape(hidden), batch["shape"]) * img).mean()
    loss = loss + (ce(heads.colour(hidden), batch["colour"]) * img).mean()
    if texture_head:  # the terms in this order: the committed demo's bytes
        loss = loss + (ce(heads.texture(hidden), batch["texture"]) * img).mean()
    return loss + (ce(heads.flavour(hidden), batch["flavour"]) * txt).mean()


def _lr_factor(step: int, total: int) -> float:
    """Linear warm-up over the first 10 % of the steps, then cosine decay to 0."""
    warmup = max(1, total // 10)
    return min((step + 1) / warmup, 0.5 * (1.0 + math.cos(math.pi * step / total)))


def build_backbone(params: DemoParams, tokenizer: BertTokenizer) -> ViltModel:
    """Initialise the tiny ViLT from `params.seed` and pre-train it briefly.

    Call inside a seeded, deterministic torch context (see `demo.make_demo`).
    Returns the `ViltModel` in eval mode.
    """
    config = vilt_config(params, vocab_size=len(tokenizer.get_vocab()))
    model = ViltModel(config)
    if params.pretrain_steps == 0:
        return model.eval()
    heads = _AttributeHeads(params.hidden_size)
    rng = np.random.default_rng([params.seed, PRETRAIN_SEED_TAG])
    pairs = dd.pretrain_pairs(params.n_classes, params.variants, params.colour_free)
    texture_head = params.variants == 1 and not params.colour_free
    optim = torch.optim.AdamW(
        list(model.parameters()) + list(heads.parameters()),
        lr=params.pretrain_lr,
        weight_decay=0.01,
    )
    sched = torch.optim.lr_scheduler.LambdaLR(
        optim, lambda step: _lr_factor(step, params.pretrain_steps)
    )
    model.train()
    bar = tqdm(range(params.pretrain_steps), desc="pre-train", disable=None)
    for step in bar:
        batch = _pretrain_batch(pairs, params, rng, tokenizer)
        hidden = model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            pixel_values=batch["pixel_values"],
            pixel_mask=batch["pixel_mask"],
        ).last_hidden_state[:, 0]  # (B, D) text CLS after the final LN
        loss = _pretrain_loss(heads, hidden, batch, texture_head)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        optim.step()
        sched.step()
        if step % 20 == 0 or step == params.pretrain_steps - 1:
            bar.set_postfix(loss=f"{loss.item():.3f}")
            log.debug("pre-train step %d: loss %.4f", step, loss.item())
    log.info("pre-trained %d steps, last loss %.4f", params.pretrain_steps, loss.item())
    return model.eval()
