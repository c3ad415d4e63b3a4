"""Stand-ins for the real downloads, laid out exactly as they are: a ViLT in
the hub's `dandelin/vilt-b32-mlm` layout (random weights, tiny or at
ViLT-B/32's sizes), a UPMC-Food101 tree, an N24News tree and a files-layout
tree (a listing beside the images) of photo-sized JPEGs.

For rehearsals of a real run (palbench/rehearsal.py, palbench/gpu_check.py) and the
tests, and the output contracts' fixture (`pipeline/stages/contract_runs.py`,
so the contracts stage declares it); no other stage imports this module.
Needs only the runtime packages (torch, transformers, tokenizers, numpy,
pillow), never the dev extras.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = [
    "red",
    "green",
    "blue",
    "yellow",
    "cat",
    "dog",
    "bird",
    "fish",
    "car",
    "tree",
    "a",
    "the",
    "small",
    "big",
    "photo",
    "of",
]

# The photo mix: UPMC-Food101's web photos (most 300-1000 px on the longer
# side) and N24News' article images (wide, 1000-2000 px), one of each in turn.
SIZES = [(512, 384), (384, 512), (800, 800), (1024, 683), (1050, 550), (2048, 1365)]
TITLE_WORDS = "grilled chicken salad with fresh herbs and lemon dressing recipe".split()


def tiny_config(
    folder: Path,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    image: int = 32,
    patch: int = 8,
    **extra: Any,
):
    """`folder/vocab.txt` (a few words) and a tiny `ViltConfig` over it."""
    from transformers import ViltConfig

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join(SPECIAL + WORDS) + "\n")
    return ViltConfig(
        vocab_size=len(SPECIAL) + len(WORDS),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        intermediate_size=2 * hidden,
        image_size=image,
        patch_size=patch,
        max_position_embeddings=40,
        max_image_length=-1,
        pad_token_id=0,
        **extra,
    )


def make_hub_vilt(
    folder: Path,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 32,
    *,
    full_size: bool = False,
) -> Path:
    """A random ViLT saved as the hub's `dandelin/vilt-b32-mlm` is laid out:
    ViltForMaskedLM keys (with the MLM head) in `pytorch_model.bin`, the old
    feature-extractor `preprocessor_config.json` (integer `size`), and the
    tokenizer files `tokenizer.json`, `vocab.txt`, `tokenizer_config.json`
    (BertTokenizer, lower case, 40 tokens) and `special_tokens_map.json`.

    Tiny by default (`layers` × `hidden`, 32-px images, 8-px patches); with
    `full_size`, ViLT-B/32's sizes (12 layers of 768, 384-px images, 32-px
    patches) over the same small vocabulary."""
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import ViltConfig, ViltForMaskedLM

    cfg = tiny_config(folder, hidden, layers, architectures=["ViltForMaskedLM"])
    size, divisor = 32, 8
    if full_size:
        cfg = ViltConfig(
            vocab_size=cfg.vocab_size,
            max_position_embeddings=40,
            max_image_length=-1,
            architectures=["ViltForMaskedLM"],
        )  # the defaults: hidden 768, 12 layers, 384-px images, 32-px patches
        size, divisor = 384, 32
    cfg.save_pretrained(folder)
    torch.manual_seed(seed)
    torch.save(ViltForMaskedLM(cfg).state_dict(), folder / "pytorch_model.bin")
    BertWordPieceTokenizer(str(folder / "vocab.txt"), lowercase=True).save(
        str(folder / "tokenizer.json")
    )
    for name, doc in _hub_documents(size, divisor).items():
        (folder / name).write_text(json.dumps(doc, indent=2))
    return folder


def _hub_documents(size: int, divisor: int) -> dict[str, dict]:
    """The hub snapshot's JSON files beside the weights and the vocabulary:
    file name → document (images resized to `size`, a multiple of `divisor`)."""
    return {
        "tokenizer_config.json": {
            "do_lower_case": True,
            "model_max_length": 40,
            "name_or_path": "bert-base-uncased",
            "special_tokens_map_file": None,
            "tokenizer_class": "BertTokenizer",
        },
        "special_tokens_map.json": {
            "unk_token": "[UNK]",
            "sep_token": "[SEP]",
            "pad_token": "[PAD]",
            "cls_token": "[CLS]",
            "mask_token": "[MASK]",
        },
        "preprocessor_config.json": {  # the hub's: size 384, size_divisor 32
            "do_normalize": True,
            "do_resize": True,
            "feature_extractor_type": "ViltFeatureExtractor",
            "image_mean": [0.5, 0.5, 0.5],
            "image_std": [0.5, 0.5, 0.5],
            "resample": 3,
            "size": size,
            "size_divisor": divisor,
        },
    }


def tiny_jpeg() -> bytes:
    """An 8-px JPEG: a listed image file that decodes, at almost no cost."""
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 40, 40)).save(buf, format="JPEG")
    return buf.getvalue()


def photo(size: tuple[int, int], rng: np.random.Generator) -> Image.Image:
    """A smooth random RGB field plus pixel noise, `size` = (width, height):
    as a JPEG at quality 90 it decodes at a photo's cost."""
    w, h = size
    coarse = rng.random((h // 32 + 2, w // 32 + 2, 3))
    small = Image.fromarray((coarse * 255).astype(np.uint8))
    smooth = small.resize((w, h), Image.Resampling.BICUBIC)
    field = np.asarray(smooth).astype(np.float32)
    noisy = field + rng.normal(0, 12, field.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8))


def _save_photo(job: tuple[Path, tuple[int, int], int]) -> None:
    path, size, seed = job
    path.parent.mkdir(parents=True, exist_ok=True)
    photo(size, np.random.default_rng(seed)).save(path, quality=90)


def make_food101_tree(
    root: Path, classes: int, train: int, test: int, workers: int = 1
) -> int:
    """UPMC-Food101 in its titles-CSV layout: images/{train,test}/<dish>/
    <dish>_<k>.jpg of the photo mix and texts/{train,test}_titles.csv with
    12-word titles; the last class has one training photo fewer (as the real
    one's smallest class, which prepare drops). `workers` processes encode
    the JPEGs. Returns the number of photos."""
    rng = np.random.default_rng(0)
    (root / "texts").mkdir(parents=True)
    jobs: list[tuple[Path, tuple[int, int], int]] = []
    for split, count in (("train", train), ("test", test)):
        with (root / "texts" / f"{split}_titles.csv").open("w") as f:
            f.write("image_name,text,class_name\n")
            for c in range(classes):
                dish = f"dish_{c:03d}"
                for k in range(count - (split == "train" and c == classes - 1)):
                    name = f"{dish}_{k}.jpg"
                    path = root / "images" / split / dish / name
                    jobs.append((path, SIZES[len(jobs) % len(SIZES)], len(jobs)))
                    f.write(f"{name},{' '.join(rng.choice(TITLE_WORDS, 12))},{dish}\n")
    if workers > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            list(pool.map(_save_photo, jobs, chunksize=8))
    else:
        for job in jobs:
            _save_photo(job)
    return len(jobs)


def make_n24news_tree(root: Path, sections: int, per_split: dict[str, int]) -> int:
    """N24News as released: news/nytimes_{train,dev,test}.json (article
    records with `section`, `headline`, `abstract`, `caption`, `body` and
    `image_id`) and imgs/<image_id>.jpg of the photo mix. `per_split` gives
    the articles per section and split. Returns the number of photos."""
    rng = np.random.default_rng(0)
    (root / "news").mkdir(parents=True)
    k = 0
    for split, count in per_split.items():
        items = []
        for s in range(sections):
            for _ in range(count):
                image_id = f"img{k:05d}"
                words = " ".join(rng.choice(TITLE_WORDS, 8))
                items.append(
                    {
                        "section": f"Section {s:02d}",
                        "headline": words,
                        "abstract": f"abstract {words}",
                        "caption": f"caption {image_id}",
                        "body": f"body {words}",
                        "image_id": image_id,
                        "image_url": "http://example.invalid/x.jpg",
                    }
                )
                _save_photo((root / "imgs" / f"{image_id}.jpg", SIZES[k % 6], k))
                k += 1
        (root / "news" / f"nytimes_{split}.json").write_text(json.dumps(items))
    return k


def make_files_tree(
    root: Path,
    classes: int = 12,
    per_split: dict[str, int] | None = None,
    fmt: str = "jsonl",
    sizes: list[tuple[int, int]] | None = None,
) -> dict[str, int]:
    """A dataset of one's own (`data.dataset: files`): images/<class>/<id>.jpg
    of the photo mix (or of `sizes`) and a listing (`listing.jsonl`, or with
    `fmt="csv"` `listing.csv`) of `per_split` samples per class and split
    (default 4 train, 1 val, 2 test). Classes are named `kind 00`, … Every
    7th sample (k % 7 == 3) has an empty image field and no file, every 5th
    (k % 5 == 1) with an image an empty text. Returns the counts: rows,
    `image` (no image) and `text` (no text)."""
    per_split = per_split or {"train": 4, "val": 1, "test": 2}
    sizes = sizes or SIZES
    rng = np.random.default_rng(0)
    rows = []
    counts = {"rows": 0, "image": 0, "text": 0}
    for c in range(classes):
        name = f"kind {c:02d}"
        for split, n in per_split.items():
            for j in range(n):
                k = counts["rows"]
                counts["rows"] += 1
                ident = f"c{c:02d}-{split}-{j}"
                image = f"images/{c:02d}/{ident}.jpg"
                text = " ".join(rng.choice(TITLE_WORDS, 8))
                if k % 7 == 3:
                    image, counts["image"] = "", counts["image"] + 1
                else:
                    _save_photo((root / image, sizes[k % len(sizes)], k))
                    if k % 5 == 1:
                        text, counts["text"] = "", counts["text"] + 1
                row = {"id": ident, "image": image, "text": text}
                rows.append(row | {"class": name, "split": split})
    root.mkdir(parents=True, exist_ok=True)
    if fmt == "csv":
        with (root / "listing.csv").open("w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    else:
        lines = [json.dumps(r, ensure_ascii=False) + "\n" for r in rows]
        (root / "listing.jsonl").write_text("".join(lines), encoding="utf-8")
    return counts


POSTER = (20, 30)  # MM-IMDb's posters are portrait; tiny, for the layout alone


def make_mmimdb_tree(
    root: Path, train: int = 6, val: int = 2, test: int = 3, seed: int = 0
) -> Path:
    """MM-IMDb as released (`pipeline.data.datasets.mmimdb`): root/split.json,
    {"train", "dev", "test"} → seven-digit id strings in drawn order, and per
    film root/dataset/<id>.json (IMDbPY's keys `title`, `year`, `kind`,
    `genres`, `plot`, dumped with a 4-space indent) and <id>.jpeg, a tiny
    poster of the photo kind. `train`, `val` and `test` films, numbered k = 0,
    1, … in that order; `seed` draws the ids, the genres and the posters.

    Film k has 1 + k % 3 of the 23 genres, plus "News" when k % 7 == 6; no
    poster when k % 5 == 3; no `plot` key when k % 6 == 1, an empty list when
    k % 6 == 4, else 1 + k % 3 plots, "<id> plot <j>: " and the first 2 + 3r
    `TITLE_WORDS`, the ranks r a drawn permutation (the longest one need not
    come first). Returns `root`."""
    from pipeline.data.datasets.mmimdb import GENRES

    rng = np.random.default_rng(seed)
    counts = {"train": train, "dev": val, "test": test}
    drawn = rng.choice(4_000_000, size=sum(counts.values()), replace=False)
    ids = [f"{int(x) + 1:07d}" for x in drawn]
    splits: dict[str, list[str]] = {}
    k = 0
    for key, n in counts.items():
        splits[key] = ids[k : k + n]
        k += n
    (root / "dataset").mkdir(parents=True)
    for k, ident in enumerate(ids):
        picked = rng.choice(len(GENRES), size=1 + k % 3, replace=False)
        genres = [GENRES[int(i)] for i in picked] + (["News"] if k % 7 == 6 else [])
        doc: dict[str, Any] = {
            "title": f"Film {ident}",
            "year": 1920 + int(rng.integers(0, 95)),
            "kind": "movie",
            "genres": genres,
        }
        ranks = rng.permutation(1 + k % 3)
        if k % 6 == 4:
            doc["plot"] = []
        elif k % 6 != 1:
            doc["plot"] = [
                f"{ident} plot {j}: " + " ".join(TITLE_WORDS[: 2 + 3 * int(r)])
                for j, r in enumerate(ranks)
            ]
        text = json.dumps(doc, indent=4)
        (root / "dataset" / f"{ident}.json").write_text(text, encoding="utf-8")
        poster_seed = int(rng.integers(2**31))
        if k % 5 != 3:
            _save_photo((root / "dataset" / f"{ident}.jpeg", POSTER, poster_seed))
    (root / "split.json").write_text(json.dumps(splits, indent=4), encoding="utf-8")
    return root
