"""`pal prepare` end to end on fake trees: files, counts, determinism, bad input."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import heavy_modules_after
from PIL import Image
from test_readers import (
    SMALLEST,
    TEST,
    TRAIN,
    VAL,
    make_food101_split_json,
    make_food101_titles_csv,
    make_n24news,
)

from pipeline.cli import main

KEYS = ["id", "split", "task", "label", "class_name", "image", "text", "missing"]


def run_prepare(tmp_path: Path, out: Path, **data):
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump({"data": data}))
    return CliRunner().invoke(
        main, ["prepare", "--params", str(params), "--out", str(out)]
    )


def read_out(out: Path):
    rows = [
        json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()
    ]
    return rows, json.loads((out / "tasks.json").read_text())


@pytest.fixture(scope="module")
def food_a(tmp_path_factory) -> Path:
    return make_food101_split_json(tmp_path_factory.mktemp("food_a"))


def test_per_class_keeps_the_first_samples_of_each_class_and_split(tmp_path, food_a):
    """data.per_class 1: one sample of each (class, split), the first by id,
    and the protocol applied to those alone."""
    full, small = tmp_path / "full", tmp_path / "small"
    common = dict(dataset="food101", root=str(food_a), tasks=10, missing_type="none")
    assert run_prepare(tmp_path, full, **common).exit_code == 0
    r = run_prepare(tmp_path, small, per_class=1, **common)
    assert r.exit_code == 0, r.output
    rows, doc = read_out(small)
    everything, _ = read_out(full)
    assert len(rows) == 100 * 3  # train, val and test of each class
    for key in {(row["class_name"], row["split"]) for row in everything}:
        ids = sorted(
            x["id"] for x in everything if (x["class_name"], x["split"]) == key
        )
        mine = [x["id"] for x in rows if (x["class_name"], x["split"]) == key]
        assert mine == ids[:1]
    assert doc["data"]["per_class"] == 1
    bad = run_prepare(tmp_path, tmp_path / "bad", per_class=0, **common)
    assert bad.exit_code == 1
    assert bad.output.endswith(
        "data.per_class must be > 0 (or null: every sample), got 0\n"
    )


def test_food101_outputs(tmp_path, food_a):
    out = tmp_path / "out"
    r = run_prepare(
        tmp_path,
        out,
        dataset="food101",
        root=str(food_a),
        tasks=10,
        missing_type="both",
        missing_rate=0.7,
    )
    assert r.exit_code == 0, r.output
    rows, doc = read_out(out)
    assert all(list(row) == KEYS for row in rows)
    assert len(rows) == 100 * (TRAIN + VAL + TEST)
    assert len({row["id"] for row in rows}) == len(rows)
    assert len(doc["class_order"]) == 100 and SMALLEST not in doc["class_order"]
    assert doc["dropped_classes"] == [SMALLEST]
    assert "root" not in doc["data"] and doc["data"]["tasks"] == 10
    assert len(doc["images"]) == 64  # sha256 hex of the images' bytes
    # contiguous label ranges per task, labels follow the class order
    for t in doc["tasks"]:
        k = t["task"]
        assert t["labels"] == list(range(10 * (k - 1), 10 * k))
        assert t["classes"] == doc["class_order"][10 * (k - 1) : 10 * k]
    for row in rows:
        assert row["task"] == row["label"] // 10 + 1
        assert doc["class_order"][row["label"]] == row["class_name"]
    # rows ordered by task, split, id
    split_rank = {"train": 0, "val": 1, "test": 2}
    keys = [(row["task"], split_rank[row["split"]], row["id"]) for row in rows]
    assert keys == sorted(keys)
    # per (task, split): 30 train, 10 val, 20 test; int(n*0.7) missing, half image
    for t in doc["tasks"]:
        for split, n in (("train", 10 * TRAIN), ("val", 10 * VAL), ("test", 10 * TEST)):
            m = int(n * 0.7)
            expected = [n - m, m - m // 2, m // 2]
            assert t["counts"][split] == {"total": n, "by_missing": expected}
            got = Counter(
                row["missing"]
                for row in rows
                if row["task"] == t["task"] and row["split"] == split
            )
            assert [got[c] for c in range(3)] == expected


@pytest.mark.parametrize(
    ("mtype", "rate", "test_type", "test_rate"),
    [
        ("text", 0.3, None, None),
        ("image", 0.5, None, None),
        ("both", 1.0, None, None),
        ("none", 0.7, None, None),
        ("both", 0.7, "image", 0.9),
        ("text", 0.4, None, 0.0),
    ],
)
def test_exact_missing_counts(tmp_path, food_a, mtype, rate, test_type, test_rate):
    out = tmp_path / "out"
    extra = {}
    if test_type is not None:
        extra["test_missing_type"] = test_type
    if test_rate is not None:
        extra["test_missing_rate"] = test_rate
    r = run_prepare(
        tmp_path,
        out,
        dataset="food101",
        root=str(food_a),
        tasks=5,
        missing_type=mtype,
        missing_rate=rate,
        **extra,
    )
    assert r.exit_code == 0, r.output
    rows, doc = read_out(out)
    for t in doc["tasks"]:
        for split, per_class in (("train", TRAIN), ("val", VAL), ("test", TEST)):
            n = 20 * per_class
            typ = (test_type or mtype) if split == "test" else mtype
            rt = test_rate if (split == "test" and test_rate is not None) else rate
            m = 0 if typ == "none" else int(n * rt)
            expected = {
                "none": [n, 0, 0],
                "text": [n - m, m, 0],
                "image": [n - m, 0, m],
                "both": [n - m, m - m // 2, m // 2],
            }[typ]
            got = Counter(
                row["missing"]
                for row in rows
                if row["task"] == t["task"] and row["split"] == split
            )
            assert [got[c] for c in range(3)] == expected
            assert t["counts"][split]["by_missing"] == expected


def test_same_params_same_bytes_other_seed_other_tables(tmp_path, food_a):
    args = dict(dataset="food101", root=str(food_a), tasks=4, missing_rate=0.5)
    for name in ("a", "b"):
        assert run_prepare(tmp_path, tmp_path / name, **args).exit_code == 0
    for f in ("samples.jsonl", "tasks.json"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    assert run_prepare(tmp_path, tmp_path / "c", seed=1, **args).exit_code == 0
    rows_a, doc_a = read_out(tmp_path / "a")
    rows_c, doc_c = read_out(tmp_path / "c")
    assert doc_a["class_order"] == doc_c["class_order"]  # seed moves only the tables
    assert [r["missing"] for r in rows_a] != [r["missing"] for r in rows_c]
    assert [t["counts"] for t in doc_a["tasks"]] == [
        t["counts"] for t in doc_c["tasks"]
    ]
    assert (
        run_prepare(tmp_path, tmp_path / "d", class_order_seed=1, **args).exit_code == 0
    )
    assert read_out(tmp_path / "d")[1]["class_order"] != doc_a["class_order"]


def test_titles_csv_layout(tmp_path):
    root = make_food101_titles_csv(tmp_path / "food_b")
    out = tmp_path / "out"
    r = run_prepare(tmp_path, out, dataset="food101", root=str(root), tasks=10)
    assert r.exit_code == 0, r.output
    rows, doc = read_out(out)
    assert len(rows) == 100 * (TRAIN + TEST)
    assert all(
        t["counts"]["val"] == {"total": 0, "by_missing": [0, 0, 0]}
        for t in doc["tasks"]
    )


def test_n24news(tmp_path):
    root = make_n24news(tmp_path / "n24")
    out = tmp_path / "out"
    r = run_prepare(
        tmp_path,
        out,
        dataset="n24news",
        root=str(root),
        tasks=6,
        text_field="headline+caption",
        missing_type="text",
        missing_rate=0.5,
    )
    assert r.exit_code == 0, r.output
    rows, doc = read_out(out)
    assert len(doc["class_order"]) == 24 and len(doc["tasks"]) == 6
    assert all(len(t["labels"]) == 4 for t in doc["tasks"])
    # 4 classes per task: train 16, val 4, test 8 samples
    assert [
        doc["tasks"][0]["counts"][s]["total"] for s in ("train", "val", "test")
    ] == [16, 4, 8]
    # the table only marks text missing; the row still says what the dataset has
    assert all(r["text"].startswith("head ") for r in rows if r["missing"] == 1)
    complete = next(r for r in rows if r["missing"] == 0)
    image_id = complete["id"].split("/")[1]
    assert complete["text"] == f"head {image_id} cap {image_id}"


def test_absent_image_kept_as_missing(tmp_path):
    root = make_food101_split_json(tmp_path / "food", no_text=("dish_003_0.jpg",))
    (root / "images" / "test" / "dish_005" / "dish_005_4.jpg").unlink()
    out = tmp_path / "out"
    r = run_prepare(
        tmp_path, out, dataset="food101", root=str(root), tasks=10, missing_type="none"
    )
    assert r.exit_code == 0, r.output
    assert (
        "1 sample has no image file, kept with that modality missing (first: "
        "test/dish_005_4.jpg)" in (r.output)
    )
    rows, doc = read_out(out)
    by_id = {row["id"]: row for row in rows}
    assert by_id["test/dish_005_4.jpg"]["missing"] == 2
    assert by_id["test/dish_005_4.jpg"]["image"] is None
    assert by_id["train/dish_003_0.jpg"]["missing"] == 1
    assert by_id["train/dish_003_0.jpg"]["text"] == ""
    assert doc["absent"]["image"] == {"count": 1, "first_ids": ["test/dish_005_4.jpg"]}
    assert doc["absent"]["text"] == {"count": 1, "first_ids": ["train/dish_003_0.jpg"]}
    assert sum(row["missing"] != 0 for row in rows) == 2  # type none adds nothing


def _earlier_output(tmp_path: Path, root: Path) -> tuple[Path, dict[str, bytes]]:
    out = tmp_path / "out"
    r = run_prepare(tmp_path, out, dataset="food101", root=str(root), tasks=10)
    assert r.exit_code == 0, r.output
    return out, {f: (out / f).read_bytes() for f in ("samples.jsonl", "tasks.json")}


def _assert_clean_failure(r, match: str, out: Path, before: dict[str, bytes]) -> None:
    assert r.exit_code == 1, r.output
    assert "Traceback" not in r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: ")
    assert match in last, last
    assert {f: (out / f).read_bytes() for f in before} == before
    assert sorted(p.name for p in out.iterdir()) == ["samples.jsonl", "tasks.json"]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (
            {"root": "{tmp}/nowhere"},
            "data.root: dataset folder {tmp}/nowhere not found",
        ),
        ({"tasks": 3}, "data.tasks: 3 does not divide the 100 classes evenly"),
        ({"missing_rate": 1.5}, "data.missing_rate must lie in [0, 1], got 1.5"),
        (
            {"test_missing_rate": -0.1},
            "data.test_missing_rate must lie in [0, 1], got -0.1",
        ),
        ({"missing_type": "audio"}, "data.missing_type must be one of"),
        (
            {"dataset": "imagenet"},
            "data.dataset must be one of 'demo', 'food101', 'n24news'",
        ),
        ({"text_field": "title"}, "data.text_field must be one of headline"),
        ({"tasks": 0}, "data.tasks must be > 0, got 0"),
        ({"colour": 1}, "unknown key 'data.colour'"),
    ],
)
def test_bad_params(tmp_path, food_a, data, match):
    out, before = _earlier_output(tmp_path, food_a)
    args = {"dataset": "food101", "root": str(food_a), "tasks": 10}
    args.update(
        {
            k: v.format(tmp=tmp_path) if isinstance(v, str) else v
            for k, v in data.items()
        }
    )
    r = run_prepare(tmp_path, out, **args)
    _assert_clean_failure(r, match.format(tmp=tmp_path), out, before)


def test_images_that_do_not_decode_are_missing_or_all_named(tmp_path):
    """An HTML page saved as .jpg and a truncated JPEG: with data.absent
    missing their samples keep their text with the image missing, counted
    under absent.unreadable; with reject, one line names both files."""
    root = make_food101_split_json(tmp_path / "food")
    page = root / "images" / "train" / "dish_003" / "dish_003_0.jpg"
    page.write_text("<html><body>404 Not Found</body></html>")
    cut = sorted((root / "images" / "test" / "dish_007").glob("*.jpg"))[0]
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (10, 200, 30)).save(buf, format="JPEG")
    cut.write_bytes(buf.getvalue()[:200])
    out = tmp_path / "out"
    args = {"dataset": "food101", "root": str(root), "tasks": 10}
    r = run_prepare(tmp_path, out, missing_type="none", **args)
    assert r.exit_code == 0, r.output
    rows, doc = read_out(out)
    assert doc["absent"]["unreadable"] == {
        "count": 2,
        "first_ids": [f"test/{cut.name}", "train/dish_003_0.jpg"],
    }
    bad = {
        row["id"]: row
        for row in rows
        if row["id"] in doc["absent"]["unreadable"]["first_ids"]
    }
    assert [(row["image"], row["missing"]) for row in bad.values()] == [
        (None, 2),
        (None, 2),
    ]
    assert (
        "2 samples have an image file that does not decode, kept with the image "
        f"missing (first: test/{cut.name}, train/dish_003_0.jpg)" in r.output
    )
    r = run_prepare(tmp_path, tmp_path / "rejected", absent="reject", **args)
    assert r.exit_code == 1
    assert r.stderr.splitlines()[-1] == (
        f"Error: {root}: 2 image files do not decode: images/test/dish_007/"
        f"{cut.name}, images/train/dish_003/dish_003_0.jpg; set data.absent: "
        "missing to keep those samples with the image missing"
    )


def test_bad_files(tmp_path):
    root = make_food101_split_json(tmp_path / "food")
    out, before = _earlier_output(tmp_path, root)
    args = {"dataset": "food101", "root": str(root), "tasks": 10}

    text = (root / "text.json").read_text()
    (root / "text.json").write_text(text[:-5])
    _assert_clean_failure(
        run_prepare(tmp_path, out, **args),
        "text.json: malformed JSON at line 1",
        out,
        before,
    )
    (root / "text.json").write_text(text)

    (root / "images" / "train" / "dish_009" / "dish_009_1.jpg").unlink()
    r = run_prepare(tmp_path, out, absent="reject", **args)
    _assert_clean_failure(
        r,
        "1 sample has no image file (first: train/dish_009_1.jpg); "
        "set data.absent: missing",
        out,
        before,
    )

    csv_root = make_food101_titles_csv(tmp_path / "food_b")
    with (csv_root / "texts" / "train_titles.csv").open("a") as f:
        f.write("x_1.jpg,a dish,pizza\n")
    r = run_prepare(tmp_path, out, dataset="food101", root=str(csv_root), tasks=10)
    _assert_clean_failure(
        r, "unknown class 'pizza' (no folder images/train/pizza)", out, before
    )


def test_prepare_does_not_import_torch(tmp_path, food_a):
    params = tmp_path / "params.yaml"
    params.write_text(
        yaml.safe_dump(
            {"data": {"dataset": "food101", "root": str(food_a), "tasks": 10}}
        )
    )
    code = (
        "import sys\n"
        "from pipeline.params import load\n"
        "from pipeline.stages.prepare import prepare, write_outputs\n"
        f"rows, doc = prepare(load({str(params)!r}, 'data'))\n"
        f"write_outputs(rows, doc, {str(tmp_path / 'out')!r})\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert (tmp_path / "out" / "samples.jsonl").exists()


def test_duplicate_listing_is_an_error(tmp_path):
    root = make_food101_split_json(tmp_path / "food")
    splits = json.loads((root / "split.json").read_text())
    splits["train"].append(splits["train"][0])
    (root / "split.json").write_text(json.dumps(splits))
    r = run_prepare(
        tmp_path, tmp_path / "out", dataset="food101", root=str(root), tasks=10
    )
    assert r.exit_code == 1
    assert "split.json: sample id 'train/dish_000_0.jpg' is listed twice" in r.output
    assert not (tmp_path / "out").exists()


def test_sample_lacking_both_modalities_is_dropped_and_reported(tmp_path):
    root = make_food101_split_json(tmp_path / "food", no_text=("dish_001_0.jpg",))
    (root / "images" / "train" / "dish_001" / "dish_001_0.jpg").unlink()
    out = tmp_path / "out"
    r = run_prepare(tmp_path, out, dataset="food101", root=str(root), tasks=10)
    assert r.exit_code == 0, r.output
    assert "dropping 1 sample with neither image nor text" in r.output
    rows, doc = read_out(out)
    assert len(rows) == 100 * (TRAIN + VAL + TEST) - 1
    assert doc["absent"]["both"] == {"count": 1, "first_ids": ["train/dish_001_0.jpg"]}
    r = run_prepare(tmp_path, out, dataset="food101", root=str(root), tasks=10,
                    absent="reject")  # fmt: skip
    assert r.exit_code == 1
    assert (
        "1 sample has neither image nor text (first: train/dish_001_0.jpg); "
        "set data.absent: missing to drop them" in r.output
    )


def test_prepare_and_the_samples_contract_never_import_torch():
    """The data layer's contract (samples.jsonl, tasks.json, Batch) and the
    prepare stage load without torch: `pal prepare` runs on a machine without it."""
    assert (
        heavy_modules_after("import pipeline.data.samples, pipeline.stages.prepare")
        == []
    )


def test_a_copy_of_the_data_elsewhere_gives_the_same_bytes(tmp_path, food_a):
    """Where the dataset is kept is no part of prepare's outputs (so moving
    data.root reruns nothing after prepare); what its images hold is."""
    import shutil

    copy = tmp_path / "elsewhere" / "food101"
    shutil.copytree(food_a, copy)
    common = dict(dataset="food101", tasks=10, missing_type="none")
    outs = {}
    for name, root in (("a", food_a), ("copy", copy)):
        r = run_prepare(tmp_path, tmp_path / name, root=str(root), **common)
        assert r.exit_code == 0, r.output
        outs[name] = {
            f: (tmp_path / name / f).read_bytes()
            for f in ("samples.jsonl", "tasks.json")
        }
    assert outs["copy"] == outs["a"]
    first = sorted(copy.rglob("*.jpg"))[0]
    first.write_bytes(first.read_bytes() + b"\0")  # the same photo, other bytes
    r = run_prepare(tmp_path, tmp_path / "changed", root=str(copy), **common)
    assert r.exit_code == 0, r.output
    _, doc = read_out(tmp_path / "changed")
    assert (tmp_path / "changed/samples.jsonl").read_bytes() == outs["a"][
        "samples.jsonl"
    ]
    before = json.loads(outs["a"]["tasks.json"])
    assert {k: v for k, v in doc.items() if k != "images"} == {
        k: v for k, v in before.items() if k != "images"
    }
    assert doc["images"] != before["images"]


def test_a_task_without_test_samples_is_refused_before_any_gpu_work(tmp_path):
    """No params make an empty task; a layout can: N24News whose test split
    lacks a section (a small section with no test article). With one section
    a task, that section's task has no test samples in every class order:
    `pal prepare` and `pal check` refuse it, naming the task (and the run)."""
    root = make_n24news(tmp_path / "n24")
    test = root / "news" / "nytimes_test.json"
    items = json.loads(test.read_text())
    test.write_text(json.dumps([i for i in items if i["section"] != "Section 07"]))
    data = {"dataset": "n24news", "root": str(root), "tasks": 24}
    r = run_prepare(tmp_path, tmp_path / "out", **data, class_order_seed=0)
    assert r.exit_code == 1
    from pipeline.data.protocol import class_order

    sections = sorted({i["section"] for i in items})
    task = class_order(sections, 0).index("Section 07") + 1
    line = (
        f"Error: data (class_order_seed 0): task {task} has no test samples (its "
        "classes: Section 07): every task needs both; the dataset's test split "
        "lacks these classes"
    )
    assert r.output.strip().splitlines()[-1] == line
    assert not (tmp_path / "out").exists()
    from helpers import committed_params

    full = committed_params()
    full["data"].update(data, root=str(root))
    full["protocol"]["runs"] = [0, 1]
    params = tmp_path / "check.yaml"
    params.write_text(yaml.safe_dump(full))
    r = CliRunner().invoke(main, ["check", "--params", str(params)])
    assert r.exit_code == 1
    for run in (0, 1):
        task = class_order(sections, run).index("Section 07") + 1
        assert (
            f"Error: {params}: run {run}: data: task {task} has no test samples"
            in r.output
        )
