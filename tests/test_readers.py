"""Dataset readers on small fake trees built here (no real images are needed).

The tree builders are imported by test_prepare.py too.
"""

from __future__ import annotations

import csv
import json
from collections import Counter
from pathlib import Path

import pytest

from pipeline.data.datasets import DatasetError, FileIndex, read_dataset
from pipeline.data.datasets.food101 import class_of_file
from pipeline.data.datasets.n24news import text_fields
from pipeline.fakes.trees import tiny_jpeg
from pipeline.params import DataParams

N_FOOD = 101
SMALLEST = "dish_042"  # the Food101 class with the fewest training samples
TRAIN, VAL, TEST = 3, 1, 2  # Food101 samples per class (SMALLEST has TRAIN - 1)


def food_classes() -> list[str]:
    return [f"dish_{i:03d}" for i in range(N_FOOD)]


TINY_JPEG = tiny_jpeg()


def _touch(path: Path) -> None:
    """A listed image: an 8-px JPEG (prepare decodes every image file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(TINY_JPEG)


def make_food101_split_json(root: Path, no_text: tuple[str, ...] = ()) -> Path:
    """Layout (a): class_idx.json, split.json, text.json, images/{train,test}/<c>/."""
    splits: dict[str, list[str]] = {"train": [], "val": [], "test": []}
    texts = {}
    for c in food_classes():
        n_train = TRAIN - 1 if c == SMALLEST else TRAIN
        counts = {"train": n_train, "val": VAL, "test": TEST}
        k = 0
        for split, n in counts.items():
            for _ in range(n):
                name = f"{c}_{k}.jpg"
                k += 1
                splits[split].append(name)
                folder = "test" if split == "test" else "train"
                _touch(root / "images" / folder / c / name)
                if name not in no_text:
                    texts[name] = f"recipe for {c} number {k}"
    (root / "class_idx.json").write_text(
        json.dumps({c: i for i, c in enumerate(food_classes())})
    )
    (root / "split.json").write_text(json.dumps(splits))
    (root / "text.json").write_text(json.dumps(texts))
    return root


def make_food101_titles_csv(root: Path, header: bool = True) -> Path:
    """Layout (b): images/{train,test}/<c>/ and texts/{train,test}_titles.csv."""
    (root / "texts").mkdir(parents=True)
    for split, n in (("train", TRAIN), ("test", TEST)):
        with (root / "texts" / f"{split}_titles.csv").open("w", newline="") as f:
            w = csv.writer(f)
            if header:
                w.writerow(["image_name", "text", "class_name"])
            for c in food_classes():
                count = n - 1 if (c == SMALLEST and split == "train") else n
                for k in range(count):
                    name = f"{c}_{k}.jpg"  # same names in train and test
                    _touch(root / "images" / split / c / name)
                    w.writerow([name, f"{c}, tasty, number {k}", c])
    return root


N24_SECTIONS = [f"Section {i:02d}" for i in range(24)]


def make_n24news(root: Path) -> Path:
    """news/nytimes_{train,dev,test}.json and imgs/<image_id>.jpg; 24 sections."""
    (root / "news").mkdir(parents=True)
    k = 0
    for name, n in (("train", 4), ("dev", 1), ("test", 2)):
        items = []
        for s in N24_SECTIONS:
            for _ in range(n):
                image_id = f"img{k:05d}"
                k += 1
                items.append(
                    {
                        "section": s,
                        "headline": f"head {image_id}",
                        "abstract": f"abs {image_id}",
                        "caption": f"cap {image_id}",
                        "body": f"body {image_id}",
                        "image_id": image_id,
                        "image_url": "http://example.invalid/x.jpg",
                    }
                )
                _touch(root / "imgs" / f"{image_id}.jpg")
        (root / "news" / f"nytimes_{name}.json").write_text(json.dumps(items))
    return root


def _read(dataset: str, root: Path, **kw):
    return read_dataset(DataParams(dataset=dataset, root=str(root), **kw))


# ---------------------------------------------------------------------------


def test_class_of_file():
    assert class_of_file("frozen_yogurt_282.jpg") == "frozen_yogurt"
    assert class_of_file("ramen_3.jpg") == "ramen"


def test_food101_split_json(tmp_path):
    listing = _read("food101", make_food101_split_json(tmp_path))
    assert len(listing.classes) == 100
    assert listing.dropped_classes == [SMALLEST]
    assert SMALLEST not in listing.classes
    ids = [s.id for s in listing.samples]
    assert len(ids) == len(set(ids)) == 100 * (TRAIN + VAL + TEST)
    by_split = {
        sp: sum(s.split == sp for s in listing.samples)
        for sp in ("train", "val", "test")
    }
    assert by_split == {"train": 100 * TRAIN, "val": 100 * VAL, "test": 100 * TEST}
    val = next(s for s in listing.samples if s.split == "val")
    assert val.image.startswith("images/train/")  # val files live in the train folder
    assert val.id.startswith("val/")
    assert all(s.text for s in listing.samples)


def test_food101_tie_dropped_by_name(tmp_path):
    make_food101_split_json(tmp_path)
    splits = json.loads((tmp_path / "split.json").read_text())
    # give dish_007 the same (smallest) train count: the first by name goes
    splits["train"].remove("dish_007_0.jpg")
    (tmp_path / "split.json").write_text(json.dumps(splits))
    listing = _read("food101", tmp_path)
    assert listing.dropped_classes == ["dish_007"]
    assert SMALLEST in listing.classes


def test_food101_missing_text_entry_is_none(tmp_path):
    listing = _read(
        "food101", make_food101_split_json(tmp_path, no_text=("dish_000_0.jpg",))
    )
    s = next(s for s in listing.samples if s.id == "train/dish_000_0.jpg")
    assert s.text is None


def test_food101_titles_csv(tmp_path):
    listing = _read("food101", make_food101_titles_csv(tmp_path))
    assert len(listing.classes) == 100 and listing.dropped_classes == [SMALLEST]
    ids = [s.id for s in listing.samples]
    assert (
        len(ids) == len(set(ids)) == 100 * (TRAIN + TEST)
    )  # names repeat across splits
    s = next(s for s in listing.samples if s.id == "test/dish_001_1.jpg")
    assert (s.split, s.class_name, s.image) == (
        "test",
        "dish_001",
        "images/test/dish_001/dish_001_1.jpg",
    )
    assert s.text == "dish_001, tasty, number 1"  # a quoted field with commas


def test_food101_titles_csv_without_header(tmp_path):
    listing = _read("food101", make_food101_titles_csv(tmp_path, header=False))
    assert len(listing.samples) == 100 * (TRAIN + TEST)


def test_food101_unknown_class_in_csv_row(tmp_path):
    make_food101_titles_csv(tmp_path)
    path = tmp_path / "texts" / "test_titles.csv"
    with path.open("a", newline="") as f:
        csv.writer(f).writerow(["x_1.jpg", "some text", "not_a_dish"])
    n_lines = len(path.read_text().splitlines())
    with pytest.raises(
        DatasetError,
        match=rf"test_titles.csv line {n_lines}: unknown class 'not_a_dish'",
    ):
        _read("food101", tmp_path)


def test_food101_csv_wrong_field_count(tmp_path):
    make_food101_titles_csv(tmp_path)
    path = tmp_path / "texts" / "train_titles.csv"
    path.write_text(path.read_text() + "only_two,fields\n")
    with pytest.raises(
        DatasetError, match=r"train_titles.csv line \d+: expected 3 fields"
    ):
        _read("food101", tmp_path)


def test_food101_csv_unterminated_quote(tmp_path):
    make_food101_titles_csv(tmp_path)
    path = tmp_path / "texts" / "train_titles.csv"
    path.write_text(path.read_text() + 'a_1.jpg,"never closed,dish_000\n')
    with pytest.raises(DatasetError, match=r"train_titles.csv line \d+: malformed CSV"):
        _read("food101", tmp_path)


def test_food101_malformed_json(tmp_path):
    make_food101_split_json(tmp_path)
    (tmp_path / "split.json").write_text('{"train": ["a_1.jpg",]')
    with pytest.raises(DatasetError, match=r"split.json: malformed JSON at line 1"):
        _read("food101", tmp_path)


def test_food101_file_of_unknown_class(tmp_path):
    make_food101_split_json(tmp_path)
    splits = json.loads((tmp_path / "split.json").read_text())
    splits["test"].append("pizza_9.jpg")
    (tmp_path / "split.json").write_text(json.dumps(splits))
    with pytest.raises(
        DatasetError, match=r"'pizza_9.jpg' has class 'pizza', not in class_idx"
    ):
        _read("food101", tmp_path)


def test_food101_not_a_food101_folder(tmp_path):
    with pytest.raises(DatasetError, match=r"not a Food101 folder"):
        _read("food101", tmp_path)


def test_missing_root(tmp_path):
    with pytest.raises(
        DatasetError, match=r"data.root: dataset folder .*nowhere not found"
    ):
        _read("food101", tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("headline", "head img00000"),
        ("abstract", "abs img00000"),
        ("headline+abstract", "head img00000 abs img00000"),
        ("caption + body", "cap img00000 body img00000"),
    ],
)
def test_n24news_text_field(tmp_path, field, expected):
    listing = _read("n24news", make_n24news(tmp_path), text_field=field)
    assert listing.samples[0].text == expected


def test_n24news_listing(tmp_path):
    listing = _read("n24news", make_n24news(tmp_path))
    assert listing.classes == N24_SECTIONS
    ids = [s.id for s in listing.samples]
    assert len(ids) == len(set(ids)) == 24 * 7
    counts = {
        sp: sum(s.split == sp for s in listing.samples)
        for sp in ("train", "val", "test")
    }
    assert counts == {"train": 96, "val": 24, "test": 48}
    s = listing.samples[0]
    assert (s.id, s.image, s.class_name) == (
        "train/img00000",
        "imgs/img00000.jpg",
        "Section 00",
    )


def test_n24news_empty_fields_give_no_text(tmp_path):
    make_n24news(tmp_path)
    path = tmp_path / "news" / "nytimes_train.json"
    items = json.loads(path.read_text())
    items[0]["headline"] = "   "
    path.write_text(json.dumps(items))
    listing = _read("n24news", tmp_path)
    assert listing.samples[0].text is None


def test_n24news_unknown_test_section(tmp_path):
    make_n24news(tmp_path)
    path = tmp_path / "news" / "nytimes_test.json"
    items = json.loads(path.read_text())
    items[3]["section"] = "Gardening"
    path.write_text(json.dumps(items))
    with pytest.raises(
        DatasetError, match=r"nytimes_test.json: item 3 has section 'Gardening'"
    ):
        _read("n24news", tmp_path)


def test_n24news_item_without_section(tmp_path):
    make_n24news(tmp_path)
    path = tmp_path / "news" / "nytimes_dev.json"
    items = json.loads(path.read_text())
    del items[5]["section"]
    path.write_text(json.dumps(items))
    with pytest.raises(
        DatasetError, match=r"nytimes_dev.json: item 5 has no 'section'"
    ):
        _read("n24news", tmp_path)


def test_n24news_unknown_text_field():
    with pytest.raises(DatasetError, match=r"data.text_field: unknown field 'title'"):
        text_fields("headline+title")


def test_file_index_lists_each_folder_once(tmp_path, monkeypatch):
    import os

    for i in range(5):
        _touch(tmp_path / "a" / f"{i}.jpg")
    calls = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: calls.append(p) or real(p))
    index = FileIndex(tmp_path)
    assert [index.exists(f"a/{i}.jpg") for i in range(6)] == [True] * 5 + [False]
    assert not index.exists("b/0.jpg")
    assert len(calls) == 2


def _demo_manifest(root: Path, samples: list[dict]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    classes = [{"name": "a"}, {"name": "b"}]
    doc = {"format": "pal-demo", "version": 1, "classes": classes, "samples": samples}
    (root / "captions.json").write_text(json.dumps(doc))
    return root


def test_demo_reader(tmp_path):
    rows = [
        {
            "id": "t1",
            "split": "train",
            "class_name": "b",
            "image": "i/t1.png",
            "text": "x",
        },
        {"id": "t2", "split": "test", "class_name": "a", "image": None, "text": "y"},
    ]
    listing = _read("demo", _demo_manifest(tmp_path, rows))
    assert listing.classes == ["a", "b"]
    assert [(s.id, s.split, s.class_name, s.image) for s in listing.samples] == [
        ("t1", "train", "b", "i/t1.png"),
        ("t2", "test", "a", None),
    ]


def test_demo_reader_errors(tmp_path):
    with pytest.raises(DatasetError, match=r"not found \(`pal demo` makes it\)"):
        _read("demo", tmp_path / "nowhere")
    bad = [
        {"id": "t1", "split": "train", "class_name": "c", "image": None, "text": "x"}
    ]
    with pytest.raises(
        DatasetError, match=r"captions.json: samples\[0\] has unknown class 'c'"
    ):
        _read("demo", _demo_manifest(tmp_path / "u", bad))
    bad[0].update(class_name="a", split="dev")
    with pytest.raises(
        DatasetError, match=r"samples\[0\] has split 'dev', expected train"
    ):
        _read("demo", _demo_manifest(tmp_path / "s", bad))
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "captions.json").write_text("[1, 2")
    with pytest.raises(DatasetError, match=r"captions.json: malformed JSON at line 1"):
        _read("demo", tmp_path / "j")


def make_n24news_full(root: Path, per_section: int = 10) -> Path:
    """The build script's layout: nytimes_dataset_full.json and images/."""
    root.mkdir(parents=True, exist_ok=True)
    items = []
    for s in N24_SECTIONS:
        for k in range(per_section):
            image_id = f"{s[-2:]}{k:03d}"
            items.append({"section": s, "headline": f"head {image_id}",
                          "image_id": image_id})  # fmt: skip
            _touch(root / "images" / f"{image_id}.jpg")
    (root / "nytimes_dataset_full.json").write_text(json.dumps(items[::-1]))
    return root


def test_n24news_build_script_layout_gets_a_seeded_8_1_1_split(tmp_path):
    listing = _read("n24news", make_n24news_full(tmp_path / "a"))
    counts = Counter((s.class_name, s.split) for s in listing.samples)
    for section in N24_SECTIONS:
        assert [counts[(section, x)] for x in ("train", "val", "test")] == [8, 1, 1]
    assert all(s.image == f"images/{s.id.split('/')[1]}.jpg" for s in listing.samples)
    again = _read("n24news", make_n24news_full(tmp_path / "b"))
    assert [s.id for s in again.samples] == [s.id for s in listing.samples]


def test_n24news_without_either_layout_says_what_to_provide(tmp_path):
    (tmp_path / "x").mkdir()
    with pytest.raises(DatasetError) as info:
        _read("n24news", tmp_path / "x")
    assert str(info.value) == (
        f"data.root: {tmp_path / 'x'} holds neither news/nytimes_{{train,dev,test}}"
        ".json (with imgs/) nor nytimes_dataset_full.json (with images/), the two "
        "N24News layouts"
    )


def test_every_dataset_name_has_a_reader():
    """params' `Dataset` Literal (what `data.dataset` is checked against at
    load) and the registry `read_dataset` looks readers up in list the same
    names."""
    from typing import get_args

    from pipeline.data.datasets import READERS
    from pipeline.params import Dataset

    assert list(READERS) == list(get_args(Dataset))
