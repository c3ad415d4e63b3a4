"""`data.dataset: files`: a listing (JSONL or CSV) beside the images, read,
checked by `pal check` and prepared by `pal prepare` on a generated tree of
12 classes (pipeline.fakes.trees.make_files_tree).

`LISTING_FAULTS` is imported by fault_scenes.py: the fault table
(tests/test_faults.py) runs some of them through the CLI as a user meets them.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from helpers import committed

from pipeline.cli import main
from pipeline.data.datasets import DatasetError, read_dataset
from pipeline.fakes.trees import make_files_tree
from pipeline.params import DataParams

SIZES = [(40, 32), (32, 48)]  # small photos: the layout, not the decoding cost
CLASSES, TASKS = 12, 4
PER_SPLIT = {"train": 4, "val": 1, "test": 2}


def rows(root: Path) -> list[dict]:
    text = (root / "listing.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines()]


def write_rows(root: Path, items: list[dict]) -> None:
    lines = [json.dumps(r) + "\n" for r in items]
    (root / "listing.jsonl").write_text("".join(lines), encoding="utf-8")


def edit_row(line: int, **changes) -> Callable[[Path], None]:
    """Set `changes` in the row on `line` (1-based) of listing.jsonl."""

    def edit(root: Path) -> None:
        items = rows(root)
        items[line - 1] = {**items[line - 1], **changes}
        write_rows(root, items)

    return edit


def drop_key(line: int, key: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        items = rows(root)
        del items[line - 1][key]
        write_rows(root, items)

    return edit


def truncate_line(line: int) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        lines = (root / "listing.jsonl").read_text().splitlines(keepends=True)
        lines[line - 1] = lines[line - 1][:20] + "\n"
        (root / "listing.jsonl").write_text("".join(lines))

    return edit


def no_test_rows(cls: str) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        items = rows(root)
        write_rows(
            root, [r for r in items if (r["class"], r["split"]) != (cls, "test")]
        )

    return edit


def delete_image(line: int) -> Callable[[Path], None]:
    def edit(root: Path) -> None:
        (root / rows(root)[line - 1]["image"]).unlink()

    return edit


@dataclass(frozen=True)
class ListingFault:
    name: str
    edit: Callable[[Path], None]
    message: str  # the reader's one line; {listing}: the file, {root}: its folder


LISTING = "{listing} line"
LISTING_FAULTS = [
    ListingFault(
        "unknown split",
        edit_row(2, split="dev"),
        f"{LISTING} 2: split 'dev' is none of train, val, test",
    ),
    ListingFault(
        "a class with no test sample",
        no_test_rows("kind 05"),
        "{listing}: class 'kind 05' has no test sample; every class needs both "
        "train and test samples",
    ),
    ListingFault(
        "an image path outside the root",
        edit_row(3, image="../elsewhere/photo.jpg"),
        f"{LISTING} 3: image '../elsewhere/photo.jpg' is outside the dataset "
        "folder; image paths are relative to it",
    ),
    ListingFault(
        "an absolute image path",
        edit_row(3, image="/etc/passwd"),
        f"{LISTING} 3: image '/etc/passwd' is outside the dataset folder; image "
        "paths are relative to it",
    ),
    ListingFault(
        "an image named but not on disk",
        delete_image(1),
        f"{LISTING} 1: image 'images/00/c00-train-0.jpg' is not in {{root}}; "
        "leave the field empty for a sample without an image",
    ),
    ListingFault(
        "a duplicate id",
        edit_row(3, id="c00-train-0"),
        f"{LISTING} 3: id 'c00-train-0' is listed twice (first on line 1)",
    ),
    ListingFault(
        "a missing column",
        drop_key(4, "class"),
        f"{LISTING} 4: no 'class' (each row has the columns id, image, text, "
        "class, split)",
    ),
    ListingFault(
        "an unreadable row",
        truncate_line(5),
        f"{LISTING} 5: not a JSON object (Expecting property name enclosed in "
        "double quotes at column 21)",
    ),
    ListingFault(
        "an empty class",
        edit_row(6, **{"class": " "}),
        f"{LISTING} 6: class must be a non-empty string",
    ),
    ListingFault(
        "an empty list of classes",
        edit_row(6, **{"class": []}),
        f"{LISTING} 6: class must be a non-empty string or a non-empty list of them",
    ),
    ListingFault(
        "a class listed twice in a row",
        edit_row(6, **{"class": ["kind 00", "kind 03", "kind 00"]}),
        f"{LISTING} 6: class lists 'kind 00' twice",
    ),
]


def message(fault: ListingFault, root: Path) -> str:
    return fault.message.format(listing=root / "listing.jsonl", root=root)


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """The clean JSONL tree and its counts (copied by each test that edits)."""
    root = tmp_path_factory.mktemp("files") / "dataset"
    counts = make_files_tree(root, CLASSES, PER_SPLIT, sizes=SIZES)
    return root, counts


def broken(tree, tmp_path: Path, fault: ListingFault) -> Path:
    root = tmp_path / "dataset"
    shutil.copytree(tree[0], root)
    fault.edit(root)
    return root


def read(root: Path):
    return read_dataset(DataParams(dataset="files", root=str(root), tasks=TASKS))


def params_file(folder: Path, root: Path, **data) -> Path:
    """The committed params with `data` set to the files dataset at `root`."""
    params = yaml.safe_load(committed("params.yaml"))
    own = {"dataset": "files", "root": str(root), "tasks": TASKS}
    params["data"].update(own | data)
    path = folder / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


@pytest.fixture
def project(tmp_path, monkeypatch) -> Path:
    """A folder with the committed dvc.yaml, for `pal check` to run in. The
    contracts' guard is tests/test_contracts.py's: here it is taken as
    clean, so the data's lines are the only ones."""
    import pipeline.stages.check as check

    (tmp_path / "dvc.yaml").write_text(committed("dvc.yaml"))
    monkeypatch.setattr(check, "guard_problem", lambda: None)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pal(*args) -> object:
    return CliRunner().invoke(main, [str(a) for a in args])


# ------------------------------------------------------------ the reader


def test_jsonl_and_csv_list_the_same_samples(tree, tmp_path):
    csv_root = tmp_path / "csv"
    make_files_tree(csv_root, CLASSES, PER_SPLIT, fmt="csv", sizes=SIZES)
    a, b = read(tree[0]), read(csv_root)
    assert (a.samples, a.classes) == (b.samples, b.classes)
    assert a.classes == [f"kind {c:02d}" for c in range(CLASSES)]
    assert (a.source, b.source) == (
        str(tree[0] / "listing.jsonl"),
        str(csv_root / "listing.csv"),
    )
    assert len(a.samples) == tree[1]["rows"] == CLASSES * sum(PER_SPLIT.values())


def test_empty_fields_are_the_datasets_own_missing_modalities(tree):
    samples = read(tree[0]).samples
    assert sum(s.image is None for s in samples) == tree[1]["image"] == 12
    assert sum(s.text is None for s in samples) == tree[1]["text"] == 15
    assert not any(s.image is None and s.text is None for s in samples)


@pytest.mark.parametrize("fault", LISTING_FAULTS, ids=[f.name for f in LISTING_FAULTS])
def test_each_listing_fault_is_one_line(fault, tree, tmp_path):
    root = broken(tree, tmp_path, fault)
    with pytest.raises(DatasetError) as err:
        read(root)
    assert str(err.value) == message(fault, root)


def test_numbers_as_ids_and_paths_written_loosely(tree, tmp_path):
    """A JSONL id may be a number; './images//x.jpg' is 'images/x.jpg'; a
    blank text is no text; extra columns are ignored."""
    root = tmp_path / "dataset"
    shutil.copytree(tree[0], root)
    items = rows(root)
    items[0].update(id=7, image="./" + items[0]["image"].replace("/", "//"))
    items[2].update(text="  ", note="an extra column")
    write_rows(root, items)
    s = read(root).samples
    assert (s[0].id, s[0].image) == ("7", "images/00/c00-train-0.jpg")
    assert s[2].text is None


@pytest.mark.parametrize(
    ("found", "which"),
    [((), "neither"), (("listing.jsonl", "listing.csv"), "both")],
)
def test_exactly_one_listing(tmp_path, found, which):
    for name in found:
        (tmp_path / name).write_text("")
    with pytest.raises(DatasetError) as err:
        read(tmp_path)
    assert str(err.value) == (
        f"{tmp_path}: holds {which} of listing.jsonl and listing.csv; a files "
        "dataset has exactly one listing"
    )


CSV_HEADER = "id,image,text,class,split\n"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "id,image,text,split\n",
            "{path} line 1: the header has no column 'class' (it needs id, image, "
            "text, class, split)",
        ),
        (
            CSV_HEADER + "a,,hello,x,train\nb,,hi,x\n",
            "{path} line 3: 4 fields, but the header has 5",
        ),
        (
            CSV_HEADER + 'a,,"hello,x,train\n',
            "{path} line 2: malformed CSV (unexpected end of data)",
        ),
        (
            CSV_HEADER.encode() + b"a,,h\xffllo,x,train\n",
            "{path} line 2: not UTF-8 text",
        ),
        (CSV_HEADER, "{path}: no rows"),
    ],
    ids=["no column", "short row", "open quote", "not utf-8", "empty"],
)
def test_csv_faults_name_the_line(tmp_path, text, expected):
    path = tmp_path / "listing.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(DatasetError) as err:
        read(tmp_path)
    assert str(err.value) == expected.format(path=path)


def test_a_lone_surrogate_in_a_text_is_refused_by_check_and_prepare(
    tree, tmp_path, project
):
    """Checked after the reader, as for every dataset (JSON's escape)."""
    root = broken(tree, tmp_path, ListingFault("", edit_row(2, text="\udcff"), ""))
    listing = root / "listing.jsonl"
    line = f"{listing}: sample 2 ('c00-train-1'): text holds \\udcff at character 1, "
    line += "not valid Unicode"
    params_file(project, root)
    r = pal("check")
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [f"Error: params.yaml: {line}"]
    r = pal("prepare", "--params", "params.yaml", "--out", tmp_path / "out")
    assert r.exit_code == 1 and r.output.splitlines()[-1] == f"Error: {line}"
    for line in (2, 6):  # a train and a test row of class 0 (lines 1-4: train)
        edit_row(line, text="fine", **{"class": ["kind 00", "kind \udcff"]})(root)
    r = pal("check")
    assert r.stderr.splitlines() == [
        f"Error: params.yaml: {listing}: sample 2 ('c00-train-1'): label holds "
        "\\udcff at character 6, not valid Unicode"
    ]


def multi_label(root: Path) -> list[dict]:
    """listing.jsonl made multi-label: every third row also carries the next
    class (its class a list); the other rows keep one class as a string."""
    items = rows(root)
    for n, item in enumerate(items):
        if n % 3 == 0:
            k = int(item["class"].split()[1])
            item["class"] = [item["class"], f"kind {(k + 1) % CLASSES:02d}"]
    write_rows(root, items)
    return items


def test_a_jsonl_class_list_makes_multi_label_samples(tree, tmp_path, project):
    """A list in `class` makes the listing multi-label: each sample's labels
    (a one-class row's its one class), the first its class; `pal check`
    counts labels a sample, and prepare writes each line's labels."""
    root = tmp_path / "dataset"
    shutil.copytree(tree[0], root)
    items = multi_label(root)
    listing = read(root)
    assert listing.classes == [f"kind {c:02d}" for c in range(CLASSES)]
    for item, s in zip(items, listing.samples, strict=True):
        want = item["class"] if isinstance(item["class"], list) else [item["class"]]
        assert (list(s.labels), s.class_name) == (want, want[0])
    mean = sum(len(s.labels) for s in listing.samples) / len(listing.samples)
    params_file(project, root, missing_rate=0.0)
    r = pal("check")
    assert r.stdout.splitlines()[0] == (
        f"data: files, 12 labels (multi-label, {mean:.2f} a sample) in 4 tasks; "
        "24 test, 48 train, 12 val"
    )
    out = tmp_path / "out"
    r = pal("prepare", "--params", "params.yaml", "--out", out)
    assert r.exit_code == 0, r.output
    lines = [json.loads(x) for x in (out / "samples.jsonl").read_text().splitlines()]
    by_id = {x["id"]: x for x in lines}
    order = json.loads((out / "tasks.json").read_text())["class_order"]
    for item in items:
        names = item["class"] if isinstance(item["class"], list) else [item["class"]]
        got = by_id[str(item["id"])]["labels"]
        assert sorted(got) == sorted(order.index(c) for c in names)


# ------------------------------------------------------------ pal check


def test_check_is_ready_on_the_tree(tree, project):
    params_file(project, tree[0])
    r = pal("check")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines() == [
        "data: files, 12 classes in 4 tasks; 24 test, 48 train, 12 val",
        "params.yaml: ready for dvc repro",
    ]


@pytest.mark.parametrize("fault", LISTING_FAULTS, ids=[f.name for f in LISTING_FAULTS])
def test_check_refuses_each_fault_in_one_line(fault, tree, tmp_path, project):
    root = broken(tree, tmp_path, fault)
    params_file(project, root)
    r = pal("check")
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [f"Error: params.yaml: {message(fault, root)}"]


def test_classes_that_do_not_divide_into_the_tasks(tree, tmp_path, project):
    params_file(project, tree[0], tasks=5)
    r = pal("check")
    assert r.exit_code == 1
    assert r.stderr.splitlines() == [
        "Error: params.yaml: data.tasks: 5 does not divide the 12 classes evenly "
        "(set data.allow_uneven: true to give the first tasks one class more)"
    ]
    params_file(project, tree[0], tasks=5, allow_uneven=True)
    r = pal("check")
    assert r.exit_code == 0, r.output
    assert r.stdout.startswith("data: files, 12 classes in 5 tasks;")


# ------------------------------------------------------------ pal prepare


@pytest.mark.parametrize("fault", LISTING_FAULTS, ids=[f.name for f in LISTING_FAULTS])
def test_prepare_refuses_each_fault_and_writes_nothing(fault, tree, tmp_path):
    root = broken(tree, tmp_path, fault)
    out = tmp_path / "out"
    r = pal("prepare", "--params", params_file(tmp_path, root), "--out", out)
    assert r.exit_code == 1
    assert "Traceback" not in r.output
    assert r.output.splitlines()[-1] == f"Error: {message(fault, root)}"
    assert not out.exists()


def test_prepare_on_the_tree(tree, tmp_path):
    """12 classes in 4 tasks; class names kept in tasks.json and
    samples.jsonl; the dataset's own missing images and texts counted under
    `absent` and kept apart from the protocol's rate (missing_type none:
    only those samples have a code)."""
    root, counts = tree
    out = tmp_path / "out"
    params = params_file(tmp_path, root, missing_type="none")
    r = pal("prepare", "--params", params, "--out", out)
    assert r.exit_code == 0, r.output
    doc = json.loads((out / "tasks.json").read_text())
    samples = [
        json.loads(x) for x in (out / "samples.jsonl").read_text().split("\n")[:-1]
    ]
    assert sorted(doc["class_order"]) == [f"kind {c:02d}" for c in range(CLASSES)]
    assert [len(t["classes"]) for t in doc["tasks"]] == [3, 3, 3, 3]
    assert {k: v["count"] for k, v in doc["absent"].items()} == {
        "image": counts["image"],
        "text": counts["text"],
        "both": 0,
        "unreadable": 0,
    }
    assert len(samples) == counts["rows"]
    missing = [s["missing"] for s in samples]
    assert (missing.count(2), missing.count(1)) == (counts["image"], counts["text"])
    assert all(s["class_name"] == doc["class_order"][s["label"]] for s in samples)
    no_image = {s["id"] for s in samples if s["image"] is None}
    assert no_image == {s.id for s in read(root).samples if s.image is None}


def test_every_missing_image_is_counted_in_the_one_line(tree, tmp_path):
    root = tmp_path / "dataset"
    shutil.copytree(tree[0], root)
    for line in (1, 2, 3):
        delete_image(line)(root)
    with pytest.raises(DatasetError) as err:
        read(root)
    assert str(err.value) == (
        f"{root / 'listing.jsonl'} line 1: image 'images/00/c00-train-0.jpg' is "
        f"not in {root} (and 2 more); leave the field empty for a sample without "
        "an image"
    )
