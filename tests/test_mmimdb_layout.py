"""MM-IMDb's release layout read back (`pipeline.data.datasets.mmimdb`) from a
generated tree (`pipeline.fakes.trees.make_mmimdb_tree`, seed 0: 6 train,
2 dev, 3 test films), and each fault of the files as its one-line message."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import heavy_modules_after
from PIL import Image

from pipeline.data.datasets.base import DatasetError
from pipeline.data.datasets.mmimdb import EXTRA_GENRES, GENRES, Film, read_films
from pipeline.fakes.trees import POSTER, make_mmimdb_tree

# The tree of seed 0: split.json's ids in film order k = 0, 1, …
TRAIN = ["2547842", "3402489", "0300961", "1231316", "2044542", "1079145"]
DEV = ["0701069", "0066111"]
TEST = ["3253081", "0163894", "2597663"]
IDS = TRAIN + DEV + TEST


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    """The clean tree (copied by each test that edits it)."""
    return make_mmimdb_tree(tmp_path_factory.mktemp("mmimdb") / "mmimdb")


@pytest.fixture(scope="module")
def films(tree) -> dict[str, Film]:
    return {f.id: f for f in read_films(tree)}


def doc(root: Path, ident: str) -> dict[str, Any]:
    return json.loads((root / "dataset" / f"{ident}.json").read_text())


def files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_ids_and_genres():
    assert len(GENRES) == len(set(GENRES)) == 23
    assert GENRES[:4] == ("Drama", "Comedy", "Romance", "Thriller")
    assert GENRES[-3:] == ("Sport", "Short", "Film-Noir")
    assert not set(EXTRA_GENRES) & set(GENRES)


def test_split_json_as_released(tree):
    splits = json.loads((tree / "split.json").read_text())
    assert list(splits) == ["train", "dev", "test"]
    assert splits == {"train": TRAIN, "dev": DEV, "test": TEST}
    names = {p.name for p in (tree / "dataset").iterdir()}
    assert len(names) == 11 + 9  # a JSON per film, a poster for all but k = 3, 8
    assert sorted(os.listdir(tree)) == ["dataset", "split.json"]


def test_films_per_split_sorted_by_split_then_id(tree):
    listed = read_films(tree)
    assert Counter(f.split for f in listed) == {"train": 6, "val": 2, "test": 3}
    assert [f.id for f in listed] == sorted(TRAIN) + sorted(DEV) + sorted(TEST)
    assert [f.split for f in listed] == ["train"] * 6 + ["val"] * 2 + ["test"] * 3


def test_films_exactly(films):
    assert films["0300961"] == Film(
        id="0300961",
        split="train",
        genres=("Thriller", "Animation", "Romance"),
        image="dataset/0300961.jpeg",
        text="0300961 plot 1: grilled chicken salad with fresh herbs and lemon",
    )
    assert films["1231316"] == Film(
        id="1231316",
        split="train",
        genres=("Mystery",),
        image=None,
        text="1231316 plot 0: grilled chicken",
    )
    assert films["0066111"] == Film(
        id="0066111",
        split="val",
        genres=("Music", "History"),
        image="dataset/0066111.jpeg",
        text=None,
    )
    assert films["3253081"].genres == ("Family", "History", "Musical")
    assert films["3253081"].image is None


def test_the_text_is_the_longest_plot_not_the_first(tree, films):
    plots = doc(tree, "0300961")["plot"]
    assert len(plots) == 3
    assert plots[0] == "0300961 plot 0: grilled chicken salad with fresh"
    assert films["0300961"].text == plots[1] != plots[0]


def test_extra_genres_are_left_out(tree, films):
    assert doc(tree, "0701069")["genres"] == ["Short", "News"]
    assert films["0701069"].genres == ("Short",)


def test_absent_images_and_plots_are_none(tree, films):
    no_image = {i for i, f in films.items() if f.image is None}
    assert no_image == {IDS[3], IDS[8]}
    assert not any((tree / "dataset" / f"{i}.jpeg").exists() for i in no_image)
    no_text = {i for i, f in films.items() if f.text is None}
    assert no_text == {IDS[1], IDS[4], IDS[7], IDS[10]}
    assert "plot" not in doc(tree, IDS[1]) and "plot" not in doc(tree, IDS[7])
    assert doc(tree, IDS[4])["plot"] == doc(tree, IDS[10])["plot"] == []
    assert sum(len(f.genres) > 1 for f in films.values()) == 7


def test_posters_are_small_jpegs(tree, films):
    for f in films.values():
        if f.image is not None:
            with Image.open(tree / f.image) as im:
                assert (im.format, im.size) == ("JPEG", POSTER)


def test_same_seed_same_bytes(tmp_path, tree):
    again = make_mmimdb_tree(tmp_path / "again")
    assert files(again) == files(tree)
    assert len(files(tree)) == 21
    other = make_mmimdb_tree(tmp_path / "other", seed=1)
    assert json.loads((other / "split.json").read_text())["train"] != TRAIN


def test_counts_follow_the_arguments(tmp_path):
    listed = read_films(make_mmimdb_tree(tmp_path / "m", train=3, val=0, test=1))
    assert Counter(f.split for f in listed) == {"train": 3, "test": 1}


def test_posters_are_checked_with_one_listing(tree, monkeypatch):
    calls = []
    real = os.listdir
    monkeypatch.setattr(os, "listdir", lambda p: calls.append(p) or real(p))
    assert len(read_films(tree)) == 11
    assert calls == [tree / "dataset"]


@pytest.mark.parametrize(
    ("plot", "text"),
    [
        (["ab", "abcd", "abc"], "abcd"),
        (["ab", "cd"], "ab"),  # equally long: the first
        ([], None),
        ([""], None),
        (["   ", " "], None),  # the longest is blank
        (None, None),
    ],
)
def test_plot_to_text(tmp_path, tree, plot, text):
    root = copy(tree, tmp_path)
    edit_film(0, plot=plot)(root)
    assert {f.id: f for f in read_films(root)}[IDS[0]].text == text


def test_reader_does_not_import_torch():
    assert heavy_modules_after("import pipeline.data.datasets.mmimdb") == []


# ---------------------------------------------------------------------------
# Faults: each edit of the clean tree and the reader's one line.


def copy(tree: Path, tmp_path: Path) -> Path:
    root = tmp_path / "mmimdb"
    shutil.copytree(tree, root)
    return root


def edit_split(change: Callable[[dict], Any]) -> Callable[[Path], None]:
    """Rewrite split.json as `change(splits)` returns it (or edit in place)."""

    def edit(root: Path) -> None:
        path = root / "split.json"
        splits = json.loads(path.read_text())
        changed = change(splits)
        path.write_text(json.dumps(splits if changed is None else changed))

    return edit


def edit_film(k: int, **changes: Any) -> Callable[[Path], None]:
    """Set `changes` in film k's JSON; a value of `...` deletes the key."""

    def edit(root: Path) -> None:
        path = root / "dataset" / f"{IDS[k]}.json"
        film = json.loads(path.read_text())
        for key, value in changes.items():
            if value is ...:
                film.pop(key, None)
            else:
                film[key] = value
        path.write_text(json.dumps(film))

    return edit


def write(rel: str, data: bytes) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / rel).write_bytes(data)

    return edit


def delete(rel: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / rel).unlink()

    return edit


@dataclass(frozen=True)
class Fault:
    name: str
    edit: Callable[[Path], None]
    message: str  # {root}: the tree's folder, {split}: its split.json


SPLIT, FILM = "{split}", "{root}/dataset/" + IDS[0] + ".json"
ID = repr(IDS[0])
FAULTS = [
    Fault("no split.json", delete("split.json"), f"{SPLIT}: file not found"),
    Fault(
        "split.json malformed",
        write("split.json", b'{"train": ['),
        f"{SPLIT}: malformed JSON at line 1 column 12: Expecting value",
    ),
    Fault(
        "split.json not UTF-8",
        write("split.json", b'{"train": ["\xff"]}'),
        f"{SPLIT}: not UTF-8 text (invalid start byte)",
    ),
    Fault(
        "split.json a list",
        write("split.json", json.dumps(TRAIN).encode()),
        f"{SPLIT}: expected an object mapping train, dev, test to lists of film ids",
    ),
    Fault(
        "an unknown split",
        edit_split(lambda s: {"train": s["train"], "val": s["dev"], "test": s["test"]}),
        f"{SPLIT}: unknown split 'val' (use train, dev, test)",
    ),
    Fault(
        "a split missing",
        edit_split(lambda s: {"train": s["train"], "dev": s["dev"]}),
        f"{SPLIT}: no 'test' split (it needs train, dev, test)",
    ),
    Fault(
        "a split not a list",
        edit_split(lambda s: s | {"dev": DEV[0]}),
        f"{SPLIT}: 'dev' is not a list of film ids",
    ),
    Fault(
        "an id as a number",
        edit_split(lambda s: s | {"test": [*TEST, 300961]}),
        f"{SPLIT}: 'test' item 3 is 300961, not a film id (a string of digits)",
    ),
    Fault(
        "an id that is a path",
        edit_split(lambda s: s | {"train": ["../0300961"]}),
        f"{SPLIT}: 'train' item 0 is '../0300961', not a film id (a string of digits)",
    ),
    Fault(
        "an id twice in a split",
        edit_split(lambda s: s | {"dev": [*DEV, DEV[0]]}),
        f"{SPLIT}: film {DEV[0]!r} is listed twice in 'dev'",
    ),
    Fault(
        "an id in two splits",
        edit_split(lambda s: s | {"test": [*TEST, TRAIN[2]]}),
        f"{SPLIT}: film {TRAIN[2]!r} is listed in 'train' and in 'test'",
    ),
    Fault(
        "a film without its JSON",
        delete(f"dataset/{IDS[0]}.json"),
        f"{FILM}: file not found",
    ),
    Fault(
        "a film's JSON malformed",
        write(f"dataset/{IDS[0]}.json", b'{"genres": ["Drama"],}'),
        f"{FILM}: malformed JSON at line 1 column 22: Expecting property name "
        "enclosed in double quotes",
    ),
    Fault(
        "a film's JSON not UTF-8",
        write(f"dataset/{IDS[0]}.json", b'{"genres": ["Drama"], "plot": ["\xe9"]}'),
        f"{FILM}: not UTF-8 text (invalid continuation byte)",
    ),
    Fault(
        "a film's JSON not an object",
        write(f"dataset/{IDS[0]}.json", b'["Drama"]'),
        f"{FILM}: film {ID}: expected a JSON object",
    ),
    Fault(
        "a film without genres",
        edit_film(0, genres=...),
        f"{FILM}: film {ID} has no 'genres'",
    ),
    Fault(
        "a film with no genre",
        edit_film(0, genres=[]),
        f"{FILM}: film {ID} has an empty 'genres' list",
    ),
    Fault(
        "genres a string",
        edit_film(0, genres="Drama"),
        f"{FILM}: film {ID}: 'genres' is not a list of strings",
    ),
    Fault(
        "a genre not a string",
        edit_film(0, genres=["Drama", 3]),
        f"{FILM}: film {ID}: 'genres' is not a list of strings",
    ),
    Fault(
        "an unknown genre",
        edit_film(0, genres=["Drama", "Scifi"]),
        f"{FILM}: film {ID} has genre 'Scifi', which is none of the 23 MM-IMDb genres",
    ),
    Fault(
        "only genres beyond the 23",
        edit_film(0, genres=["News", "Talk-Show"]),
        f"{FILM}: film {ID} has none of the 23 MM-IMDb genres (only News, Talk-Show)",
    ),
    Fault(
        "plot a string",
        edit_film(0, plot="A plot."),
        f"{FILM}: film {ID}: 'plot' is not a list of strings",
    ),
    Fault(
        "a plot not a string",
        edit_film(0, plot=["A plot.", None]),
        f"{FILM}: film {ID}: 'plot' is not a list of strings",
    ),
]


@pytest.mark.parametrize("fault", FAULTS, ids=[f.name for f in FAULTS])
def test_fault_is_one_line(tmp_path, tree, fault):
    root = copy(tree, tmp_path)
    fault.edit(root)
    message = fault.message.format(root=root, split=root / "split.json")
    with pytest.raises(DatasetError, match=f"^{re.escape(message)}$"):
        read_films(root)


def test_no_root_folder(tmp_path):
    message = f"data.root: dataset folder {tmp_path / 'nowhere'} not found"
    with pytest.raises(DatasetError, match=f"^{re.escape(message)}$"):
        read_films(tmp_path / "nowhere")
