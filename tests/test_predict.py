"""`pal predict`: the test samples' predictions reproduce `evaluate`'s accuracy;
rows in order; one-line errors."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from PIL import Image

from pipeline import params as pparams
from pipeline.data.samples import read_prepare
from pipeline.stages.extract import extract
from pipeline.stages.predict import cli, predict
from solver.evaluate import evaluate
from solver.params import SolveParams
from solver.solve import solve
from solver.synthetic import make_features

WIDTH = 64


@pytest.fixture(scope="module")
def solved(tuned, tmp_path_factory):
    """(prepare, tune, weights, metrics.json path) of the tiny pipeline at width 64."""
    params, prepare, tune_dir = tuned
    root = tmp_path_factory.mktemp("predict")
    extract(prepare, tune_dir, root / "extract", pparams.load(params, "extract"))
    (weights,) = solve(
        root / "extract", root / "solve", SolveParams(width=WIDTH, device="cpu")
    )
    (metrics,) = evaluate(root / "extract", [weights], root / "results")
    return prepare, tune_dir, weights, metrics


def _test_rows(prepare: Path, folder: Path) -> tuple[list[dict], list[str]]:
    """The test samples as predict input rows for an input file in `folder`
    (image paths relative to it, in a copy of the dataset's images: a link
    out of the folder is refused; a missing modality left out) and their
    class names."""
    import shutil

    samples, tasks = read_prepare(prepare)
    if not (folder / "images").exists():
        shutil.copytree(tasks.root / "images", folder / "images")
    rows, names = [], []
    for s in samples:
        if s.split != "test":
            continue
        row = {"id": s.id}
        if s.missing != 2:
            row["image"] = s.image
        if s.missing != 1:
            row["text"] = s.text
        rows.append(row)
        names.append(s.class_name)
    return rows, names


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_predictions_reproduce_evaluate_accuracy(solved, tmp_path):
    prepare, tune_dir, weights, metrics = solved
    rows, names = _test_rows(prepare, tmp_path)
    preds, summary = predict(_jsonl(tmp_path / "in.jsonl", rows), tune_dir, weights)
    assert [p["row"] for p in preds] == list(range(1, len(rows) + 1))
    assert [p["id"] for p in preds] == [r["id"] for r in rows]
    assert all(len(p["top"]) == 5 for p in preds)
    hits = sum(p["top"][0]["class"] == y for p, y in zip(preds, names, strict=True))
    # evaluate's accuracy over every seen task's test samples after the last step
    last = (metrics.parent / "step_accuracy.csv").read_text().splitlines()[-1]
    step, al, _ = last.split(",")
    assert summary["step"] == int(step) == 3 and summary["rows"] == len(rows)
    assert f"{100 * hits / len(rows):.4f}" == al


def test_csv_input_gives_the_jsonl_predictions(solved, tmp_path):
    prepare, tune_dir, weights, _ = solved
    rows, _ = _test_rows(prepare, tmp_path)
    path = tmp_path / "in.csv"
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["id", "image", "text"])
        writer.writeheader()
        writer.writerows(rows)
    a, _ = predict(path, tune_dir, weights, step=2, top_k=3)
    b, _ = predict(
        _jsonl(tmp_path / "in.jsonl", rows), tune_dir, weights, step=2, top_k=3
    )
    assert [p["top"] for p in a] == [p["top"] for p in b]
    assert all(len(p["top"]) == 3 for p in a)


def _cli(*args):
    result = CliRunner().invoke(cli, [str(a) for a in args])
    return result.exit_code, result.output.strip().splitlines()


def test_rows_that_cannot_be_predicted_are_reported_per_row(solved, tmp_path):
    """An image that does not decode and a row with neither modality get an
    error line; every other row is predicted; an image file that does not
    exist is a missing image, as in prepare. --strict stops at the first bad
    row, naming the file and the row."""
    prepare, tune_dir, weights, _ = solved
    rows, _ = _test_rows(prepare, tmp_path)
    rows = [r for r in rows if "image" in r and "text" in r][:4]
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not an image")
    rows[1]["image"] = bad.name
    rows[2]["image"] = "gone.jpg"
    rows.append({"id": "empty"})
    base = ["--tune", tune_dir, "--weights", weights, "--params", tmp_path / "none"]
    path = _jsonl(tmp_path / "a.jsonl", rows)
    code, out = _cli(path, *base)
    assert code == 0
    preds = [json.loads(line) for line in out]
    assert [p["row"] for p in preds] == [1, 2, 3, 4, 5]
    assert preds[1] == {
        "row": 2,
        "id": rows[1]["id"],
        "error": f"cannot read image {bad} (cannot identify image file '{bad}')",
    }
    assert preds[4] == {
        "row": 5,
        "id": "empty",
        "error": "the row has neither an image (on disk) nor a text",
    }
    assert preds[2]["missing"] == "image_missing" and len(preds[2]["top"]) == 5
    assert preds[0]["missing"] == preds[3]["missing"] == "complete"
    alone = json.loads(_cli(_jsonl(tmp_path / "one.jsonl", rows[:1]), *base)[1][0])
    assert alone["top"] == preds[0]["top"]  # the other rows change nothing
    code, out = _cli(path, *base, "--strict")
    assert (code, out) == (1, [f"Error: {path}: row 2: {preds[1]['error']}"])


def test_errors_are_one_line(solved, tmp_path):
    prepare, tune_dir, weights, _ = solved
    rows, _ = _test_rows(prepare, tmp_path)
    base = ["--tune", tune_dir, "--weights", weights, "--params", tmp_path / "none"]
    code, out = _cli(_jsonl(tmp_path / "b.jsonl", rows[:1]), *base, "--step", 7)
    assert (code, out) == (1, [f"Error: --step 7: {tune_dir} has the checkpoints "
                               "of steps 1..3"])  # fmt: skip
    params = tmp_path / "params.yaml"
    params.write_text(f"solve:\n  width: {2 * WIDTH}\n")
    code, out = _cli(tmp_path / "b.jsonl", *base[:4], "--params", params)
    assert out == [
        f"Error: {weights}: weights of width {WIDTH}, but solve.width is "
        f"{2 * WIDTH} (rerun `pal-solver solve`, or pass --weights)"
    ]
    other = make_features(tmp_path / "feat", [30, 30, 30], [2, 2, 2], feature_dim=24)
    (w24,) = solve(other, tmp_path / "w24", SolveParams(width=WIDTH, device="cpu"))
    code, out = _cli(tmp_path / "b.jsonl", *base[:2], "--weights", w24, *base[4:])
    assert out == [f"Error: {w24}: weights of feature_dim 24, but the model's "
                   "embeddings have 32"]  # fmt: skip
    code, out = _cli(tmp_path / "b.jsonl", *base, "--threshold", "nan")
    assert (code, out) == (1, ["Error: --threshold must be a finite number, got nan"])
    code, out = _cli(tmp_path / "b.jsonl", *base, "--threshold", 0.3)
    assert code == 1
    assert out == [
        f"Error: --threshold: {tune_dir} was tuned on single-label data; its "
        "rows get their top classes, no threshold"
    ]


def test_rows_are_numbered_from_one_in_both_formats(tmp_path):
    """A CSV row may span lines (a quoted line break); its header and blank
    JSONL lines are no rows."""
    from pipeline.stages.predict_rows import read_rows

    path = tmp_path / "in.csv"
    path.write_text('image,text\n,"two\nlines"\n,third\n')
    assert read_rows(path) == [
        (1, {"image": "", "text": "two\nlines"}),
        (2, {"image": "", "text": "third"}),
    ]
    path = tmp_path / "in.jsonl"
    path.write_text('{"text": "a"}\n\n[1]\n{"text": "b"\n')
    assert read_rows(path) == [
        (1, {"text": "a"}),
        (2, "expected a JSON object"),
        (3, "not valid JSON"),
    ]


def test_input_that_is_not_utf8_is_one_line(tmp_path):
    from pipeline.stages.predict_rows import PredictError, read_rows

    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(
        PredictError, match=rf"^{re.escape(str(path))}: not UTF-8 text \(byte 13\)$"
    ):
        read_rows(path)


def test_hostile_rows_are_refused_per_row_and_the_others_predicted(
    solved, tmp_path, caplog
):
    """Text that is not valid Unicode, image paths outside the input's folder
    (absolute, with .., or a symlink in the folder pointing out: the path is
    resolved first) are row errors (read with --allow-outside-paths), and so
    are a directory, a FIFO and an image over the pixel cap, each in its own
    words; an image file that does not exist is a warning naming the row."""
    import os

    prepare, tune_dir, weights, _ = solved
    rows, _ = _test_rows(prepare, tmp_path)
    rows = [r for r in rows if "image" in r and "text" in r][:5]
    inside = _jsonl(tmp_path / "inside.jsonl", rows[1:3])  # the same rows, in place
    rows += [dict(rows[n], id=f"more {n}") for n in range(3)]  # rows 6 to 8
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "images").symlink_to((tmp_path / "images").resolve())
    (outside / "a folder.png").mkdir()
    os.mkfifo(outside / "pipe.png")
    shutil.copy(tmp_path / rows[7]["image"], outside / "photo.png")
    rows[0]["text"] = "caf\udcff"  # json.dumps writes the escape "\udcff"
    rows[1]["image"] = str((tmp_path / rows[1]["image"]).resolve())
    rows[2]["image"] = "../" + rows[2]["image"]
    rows[3]["image"] = "gone.png"
    rows[5]["image"], rows[6]["image"] = "a folder.png", "pipe.png"
    rows[7]["image"] = "photo.png"
    path = _jsonl(outside / "in.jsonl", rows)
    with caplog.at_level("WARNING", logger="pipeline.stages.predict"):
        preds, summary = predict(path, tune_dir, weights, max_pixels=100)
    assert summary["errors"] == 7 and [p["row"] for p in preds] == list(range(1, 9))
    assert preds[0]["error"] == "text holds \\udcff at character 4, not valid Unicode"
    out = "outside the input's folder (--allow-outside-paths reads it)"
    assert preds[1]["error"] == f"image {rows[1]['image']} lies {out}"
    assert preds[2]["error"] == f"image {rows[2]['image']} lies {out}"
    assert preds[3]["missing"] == "image_missing" and len(preds[3]["top"]) == 5
    real = (tmp_path / rows[4]["image"]).resolve()
    assert preds[4]["error"] == f"image {rows[4]['image']} resolves to {real}, {out}"
    assert preds[5]["error"] == "image a folder.png is a directory"
    assert preds[6]["error"] == "image pipe.png is not a regular file"
    w, h = Image.open(outside / "photo.png").size
    assert preds[7]["error"] == (
        f"image {outside / 'photo.png'} has {w}×{h} pixels ({w * h / 1e6:.1f} MP), "
        "more than --max-megapixels 0.0001 allows"
    )
    assert caplog.messages == [
        f"{path}: row 4: image {outside / 'gone.png'} not found: predicted without it",
        *(
            f"{path}: row {n}: {preds[n - 1]['error']} (not predicted)"
            for n in (1, 2, 3, 5, 6, 7, 8)
        ),
    ]
    allowed, summary = predict(path, tune_dir, weights, allow_outside=True)
    assert summary["errors"] == 3  # the text, the folder, the FIFO
    reference, _ = predict(inside, tune_dir, weights)
    assert [p["top"] for p in allowed[1:3]] == [p["top"] for p in reference]


def test_a_head_of_solve_heads_ranks_as_evaluate_scored_it(solved, tmp_path):
    """`--head lda`: the top-1 class of every test sample is the head's,
    whose pooled accuracy after the last step is the one heads.json holds."""
    from solver.backend import get_backend
    from solver.head_eval import evaluate_heads
    from solver.shard_readers import open_features

    prepare, tune_dir, weights, _ = solved
    features = weights.parent.parent / "extract"
    params = SolveParams(width=WIDTH, device="cpu", heads=("ridge", "lda"))
    (own,) = solve(features, tmp_path / "solve", params)
    backend = get_backend("cpu")
    scored = evaluate_heads(
        open_features(features), tmp_path / "solve", tmp_path / "ev", backend, 64
    )
    lda = json.loads(scored.read_text())["lda"]
    rows, names = _test_rows(prepare, tmp_path)
    inp = _jsonl(tmp_path / "in.jsonl", rows)
    preds, summary = predict(inp, tune_dir, own, head="lda")
    hits = sum(p["top"][0]["class"] == y for p, y in zip(preds, names, strict=True))
    assert summary["head"] == "lda" and summary["step"] == 3
    assert abs(100 * hits / len(rows) - lda["step_accuracy"][-1]) < 1e-4
    base = ["--tune", tune_dir, "--weights", own, "--params", tmp_path / "none"]
    code, out = _cli(inp, *base, "--head", "air")
    assert code == 1
    assert out[-1] == (
        f"Error: {tmp_path / 'solve' / 'heads.h5'}: no head 'air' (it holds ridge, "
        "lda; add it to solve.heads and rerun `pal-solver solve`)"
    )
