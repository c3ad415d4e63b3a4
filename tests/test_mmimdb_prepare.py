"""MM-IMDb as multi-label samples: the reader's genres kept
(`data.label_count`), `pal prepare`'s placing of each film in one task, the
`labels` of samples.jsonl read back, and `pal check` on a generated tree
(`pipeline.fakes.trees.make_mmimdb_tree`, seed 0: 60 train, 10 dev, 40 test
films)."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml
from click.testing import CliRunner

from pipeline.cli import main
from pipeline.data.datasets.base import DatasetError
from pipeline.data.datasets.mmimdb import GENRES, read, read_films
from pipeline.data.protocol import class_order
from pipeline.data.samples import PrepareError, label_sets, multi_hot, read_prepare
from pipeline.fakes.trees import make_mmimdb_tree
from pipeline.stages.check import check_data

KEYS = ["id", "split", "task", "label", "class_name", "image", "text", "missing"]


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mmimdb") / "mmimdb"
    return make_mmimdb_tree(root, train=60, val=10, test=40)


def top_genres(tree: Path, n: int) -> list[str]:
    """The n genres most frequent in the training films (ties: GENRES' order)."""
    counts = Counter(
        g for f in read_films(tree) if f.split == "train" for g in f.genres
    )
    return sorted(GENRES, key=lambda g: (-counts[g], GENRES.index(g)))[:n]


def run_prepare(tmp_path: Path, tree: Path, **data):
    params = tmp_path / "params.yaml"
    data = {"dataset": "mmimdb", "root": str(tree), **data}
    params.write_text(yaml.safe_dump({"data": data}))
    out = tmp_path / "prepare"
    r = CliRunner().invoke(
        main, ["prepare", "--params", str(params), "--out", str(out)]
    )
    return r, out


def test_label_count_keeps_the_most_frequent_training_genres(tree):
    listing = read(tree, 8)
    kept = top_genres(tree, 8)
    assert listing.classes == sorted(kept)
    assert listing.dropped_classes == sorted(set(GENRES) - set(kept))
    films = {f.id: f for f in read_films(tree)}
    expected = {
        f.id: tuple(g for g in f.genres if g in kept)
        for f in films.values()
        if set(f.genres) & set(kept)
    }
    assert {s.id: s.labels for s in listing.samples} == expected
    assert len(expected) < len(films)  # some film had none of the 8: dropped
    for s in listing.samples:
        assert s.class_name == s.labels[0]
        assert (s.split, s.image, s.text) == (
            films[s.id].split,
            films[s.id].image,
            films[s.id].text,
        )


def test_every_genre_without_label_count(tree):
    listing = read(tree)
    assert listing.dropped_classes == []
    assert len(listing.samples) == len(read_films(tree))


@pytest.mark.parametrize("n", [0, 24])
def test_label_count_outside_the_genres_is_one_line(tree, n):
    with pytest.raises(DatasetError) as e:
        read(tree, n)
    assert str(e.value) == (
        f"data.label_count: must be 1..23 (MM-IMDb's genres), got {n}"
    )


def test_prepare_places_each_film_in_its_first_genres_task(tmp_path, tree):
    r, out = run_prepare(tmp_path, tree, tasks=2, label_count=8, missing_rate=0.5)
    assert r.exit_code == 0, r.output
    kept = top_genres(tree, 8)
    order = class_order(kept, 0)
    lines = (out / "samples.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    films = {f.id: f for f in read_films(tree)}
    # prepare keeps a film with a genre kept and an image or a text
    # (`data.absent: missing` drops a sample lacking both)
    listed = [f for f in films.values() if set(f.genres) & set(kept)]
    both = [f for f in listed if f.image is None and f.text is None]
    assert both and len(rows) == len(listed) - len(both)
    for row in rows:
        assert list(row) == [*KEYS, "labels"]
        labels = sorted(order.index(g) for g in films[row["id"]].genres if g in kept)
        assert row["labels"] == labels
        assert row["label"] == labels[0]
        assert row["class_name"] == order[labels[0]]
        assert row["task"] == labels[0] // 4 + 1
    doc = json.loads((out / "tasks.json").read_text())
    assert doc["class_order"] == order
    assert doc["data"]["label_count"] == 8
    assert [t["labels"] for t in doc["tasks"]] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    samples, tasks = read_prepare(out, tree)
    by_id = {s.id: s for s in samples}
    for row in rows:
        s = by_id[row["id"]]
        assert s.labels == tuple(row["labels"])
        end = 4 * s.task  # the end of the film's task's labels
        assert s.targets(end) == tuple(v for v in row["labels"] if v < end)


def test_a_single_label_dataset_writes_no_labels_key(tmp_path):
    """samples.jsonl of the single-label datasets keeps its keys, and tasks.json
    names no label_count (`pal contracts verify` holds their bytes)."""
    from pipeline.fakes.trees import make_food101_tree

    root = tmp_path / "food"
    make_food101_tree(root, classes=5, train=2, test=1)  # the 5th is dropped
    params = tmp_path / "p.yaml"
    params.write_text(
        yaml.safe_dump({"data": {"dataset": "food101", "root": str(root), "tasks": 2}})
    )
    out = tmp_path / "out"
    r = CliRunner().invoke(
        main, ["prepare", "--params", str(params), "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    rows = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    assert {tuple(row) for row in rows} == {tuple(KEYS)}
    assert "label_count" not in json.loads((out / "tasks.json").read_text())["data"]
    samples, _ = read_prepare(out, root)
    assert all(s.labels == () and s.targets(99) == (s.label,) for s in samples)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (
            [5, 1],
            "labels must be a list of distinct labels in ascending order, got [5, 1]",
        ),
        (
            [1, 1],
            "labels must be a list of distinct labels in ascending order, got [1, 1]",
        ),
        ([], "labels must be a list of distinct labels in ascending order, got []"),
        (
            ["1"],
            "labels must be a list of distinct labels in ascending order, got ['1']",
        ),
        ("__first_plus_one", None),
        ("__past_the_classes", None),
    ],
)
def test_a_bad_labels_line_is_one_line(tmp_path, tree, labels, message):
    r, out = run_prepare(tmp_path, tree, tasks=2, label_count=8)
    assert r.exit_code == 0, r.output
    path = out / "samples.jsonl"
    lines = path.read_text().splitlines()
    row = json.loads(lines[0])
    if labels == "__first_plus_one":
        labels = [v + 1 for v in row["labels"]]
        message = (
            f"labels {labels} must start at label {row['label']} and end below 8 "
            "(tasks.json's classes)"
        )
    elif labels == "__past_the_classes":
        labels = [row["label"], 8]
        message = (
            f"labels {labels} must start at label {row['label']} and end below 8 "
            "(tasks.json's classes)"
        )
    row["labels"] = labels
    lines[0] = json.dumps(row)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(PrepareError) as e:
        read_prepare(out, tree)
    assert str(e.value) == f"{path}:1: {message}"


def test_pal_check_lists_the_tree_and_names_a_single_label_solve(
    tmp_path, monkeypatch, tree
):
    """The committed pipeline files with data.dataset mmimdb: the listing's
    line, no problem at the committed fixed η, and one line for each of
    `solve.eta: auto` and `solve.heads`, which score single-label rows."""
    from helpers import committed

    for rel in ("dvc.yaml", "params.yaml"):
        (tmp_path / rel).write_text(committed(rel))
    monkeypatch.chdir(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    params["data"].update(dataset="mmimdb", root=str(tree), tasks=2, label_count=8)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    listing = read(tree, 8)
    mean = sum(len(s.labels) for s in listing.samples) / len(listing.samples)
    n = Counter(s.split for s in listing.samples)
    summary = (
        f"data: mmimdb, 8 labels (multi-label, {mean:.2f} a sample) in 2 tasks; "
        f"{n['test']} test, {n['train']} train, {n['val']} val"
    )
    assert check_data(Path("params.yaml")) == ([], summary)
    params["solve"].update(eta="auto", heads=["ridge", "ncm"])
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    r = CliRunner().invoke(main, ["check"])
    problems = [
        f"params.yaml: {key}: data.dataset mmimdb is multi-label; the η rules "
        "and heads score single-label rows (a fixed solve.eta, or a list, fits it)"
        for key in ("solve.eta: auto", "solve.heads")
    ]
    assert (r.exit_code, r.stdout) == (1, "")
    kept = set(top_genres(tree, 8))
    lost = sum(1 for f in read_films(tree) if not set(f.genres) & kept)
    assert r.stderr.strip().splitlines() == [
        f"INFO pipeline.data.datasets.mmimdb: data.label_count 8: {lost} films "
        "have none of the genres kept; dropped",
        *(f"Error: {p}" for p in problems),
    ]
    assert check_data(Path("params.yaml")) == (problems, summary)


def test_a_multi_label_prepare_reads_its_label_sets_and_multi_hot_rows(tmp_path, tree):
    """read_prepare's label width (the most labels a film has), each film's
    label set (its labels of its own task's range, −1 padded) and their
    multi-hot rows over the classes seen."""
    r, out = run_prepare(tmp_path, tree, tasks=2, label_count=8)
    assert r.exit_code == 0, r.output
    samples, tasks = read_prepare(out, tree)
    assert tasks.label_width == max(len(s.labels) for s in samples) > 1
    assert [tasks.end(k) for k in (1, 2)] == [4, 8]
    sets = label_sets(samples, tasks.label_width, tasks)
    assert sets.shape == (len(samples), tasks.label_width)
    for s, row in zip(samples, sets, strict=True):
        end = tasks.end(s.task)
        want = [v for v in s.labels if v < end] or [s.label]
        assert row.tolist() == want + [-1] * (tasks.label_width - len(want))
    hot = multi_hot(sets, 8)
    assert hot.dtype == np.uint8 and hot.shape == (len(samples), 8)
    assert (hot.sum(1) == (sets >= 0).sum(1)).all()
    assert hot[np.arange(len(samples)), [s.label for s in samples]].all()
    assert (multi_hot(sets, 4)[:, :4] == hot[:, :4]).all()
    one = [dataclasses.replace(s, labels=()) for s in samples]
    assert label_sets(one, 1, tasks)[:, 0].tolist() == [s.label for s in samples]
