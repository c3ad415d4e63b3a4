"""`pal prepare`: index a dataset into samples, tasks and missing-modality tables.

Writes two files (torch-free, byte-identical for the same params and dataset):

`samples.jsonl`, one JSON object per sample, ordered by task, split (train, val,
test), then id, with exactly the keys
    id          str, unique
    split       "train" | "val" | "test"
    task        int, 1-based
    label       int, incremental class index (task k owns a contiguous range)
    class_name  str
    image       str, path relative to `data.root`; null when there is none
    text        str; "" when there is none
    missing     int, 0 complete, 1 text missing, 2 image missing
and, on a multi-label sample's line only (MM-IMDb),
    labels      [int], its labels ascending: `label` (the one that places it
                in its task, `pipeline.data.protocol`) and the others

`image` and `text` say what the dataset has; `missing` says what the model may
see: a consumer replaces the missing modality by its dummy (empty text, white
image) whatever the row holds. Only a naturally absent modality is null / "".

`tasks.json`:
    class_order      class names by label
    tasks            per task: `task`, `labels`, `classes`, and `counts` per split:
                     {"total": n, "by_missing": [n_code0, n_code1, n_code2]}
    dropped_classes  classes the reader dropped (Food101's smallest)
    absent           samples the dataset lacks a modality of, per `data.absent`:
                     {"image"|"text"|"both"|"unreadable": {"count", "first_ids"}}
    data             the `data` params used, but `root` (where the data is kept
                     does not change the outputs; the readers resolve `image`
                     paths under their own params' `data.root`)
    images           sha256 of the image files' bytes (path and content): later
                     stages depend on the images' content through this file

Naturally absent modalities (an image listed but not on disk or not decoding,
an empty text) follow `data.absent`: `missing` keeps the sample with its code
set (a sample lacking both is dropped, and reported), `reject` stops with an
error. How the protocol counts them is described in `pipeline.data.protocol`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections import defaultdict
from pathlib import Path

import click
import numpy as np

from palcore.cliutil import clean_errors, folder_option, run_params_option
from palcore.codes import Missing
from palcore.outputs import write_bytes_atomic
from palcore.params import outcome_record
from pipeline.data import protocol
from pipeline.data.listing import listed
from pipeline.data.samples import (
    LABELS_KEY,
    SAMPLE_KEYS,
    SAMPLES_FILE,
    SPLITS,
    TASKS_FILE,
    PrepareError,
    Sample,
)
from pipeline.params import DataParams, load

log = logging.getLogger(__name__)


def split_protocol(params: DataParams, split: str) -> tuple[str, float]:
    """(missing type, missing rate) of `split`; test_missing_* apply to test only."""
    if split != "test":
        return params.missing_type, params.missing_rate
    mtype = params.test_missing_type or params.missing_type
    rate = params.test_missing_rate
    return mtype, params.missing_rate if rate is None else rate


def prepare(params: DataParams) -> tuple[list[dict], dict]:
    """Read the dataset and apply the protocol.

    Returns:
        (rows, tasks): the samples.jsonl rows in file order (each
        `dataclasses.asdict` of a `Sample`) and the tasks.json document.
    """
    listing, kept, absent, images = listed(params)
    order = protocol.class_order(listing.classes, params.class_order_seed)
    label_of = {name: i for i, name in enumerate(order)}
    kept = [(_placed(s, label_of), *rest) for s, *rest in kept]
    sizes = protocol.task_sizes(len(order), params.tasks, params.allow_uneven)
    groups = _group_by_task(kept, order, sizes)
    pairs = ((s.class_name, s.split) for s, *_ in kept)
    empty = protocol.empty_tasks(pairs, order, sizes)
    if empty:  # known before any GPU work: no stage after this could run it
        raise PrepareError(
            f"data (class_order_seed {params.class_order_seed}): "
            + protocol.empty_task_line(*empty[0])
        )
    rows, tasks, first_label = [], [], 0
    for task, size in enumerate(sizes, start=1):
        counts = {}
        for split in SPLITS:
            group = sorted(groups.get((task, split), []), key=lambda g: g[0])
            codes = _missing_codes(group, params, task, split)
            rows += _rows(group, codes, task, split, label_of)
            counts[split] = {
                "total": len(group),
                "by_missing": np.bincount(codes, minlength=len(Missing)).tolist(),
            }
        labels = list(range(first_label, first_label + size))
        first_label += size
        classes = [order[i] for i in labels]
        tasks.append(
            {"task": task, "labels": labels, "classes": classes, "counts": counts}
        )
    doc = {
        "class_order": order,
        "tasks": tasks,
        "dropped_classes": listing.dropped_classes,
        "absent": absent,
        # where the dataset is kept is no part of the output (tune and extract
        # take it from their params file): a byte-identical copy elsewhere
        # leaves tasks.json, and so every later stage, as it was
        "data": _data_record(params),
        "images": images,
    }
    return rows, doc


def _data_record(params: DataParams) -> dict:
    """tasks.json's `data`: the params but `root`, a key newer than the
    outputs only when set (`palcore.params.outcome_record`)."""
    return {k: v for k, v in outcome_record(params).items() if k != "root"}


def _placed(s, label_of: dict[str, int]):
    """A multi-label sample with `class_name` its class first in the order
    (the task it joins, `protocol.placing_class`); others as they are."""
    if not s.labels:
        return s
    return dataclasses.replace(
        s, class_name=protocol.placing_class(s.labels, s.class_name, label_of)
    )


def _group_by_task(
    kept: list, order: list[str], sizes: list[int]
) -> dict[tuple[int, str], list]:
    """(task, split) → [(id, label, RawSample, natural code, image, text)], in
    listing order; labels follow the class order, tasks own contiguous labels."""
    label_of = {name: i for i, name in enumerate(order)}
    task_of = protocol.task_of_label(sizes)
    groups: dict[tuple[int, str], list] = defaultdict(list)
    for s, code, image, text in kept:
        label = label_of[s.class_name]
        groups[(task_of[label], s.split)].append((s.id, label, s, code, image, text))
    return groups


def _missing_codes(group: list, params: DataParams, task: int, split: str):
    """The missing-modality codes (n,) int8 of one (task, split) group, sorted
    by id: the protocol's table over the natural codes (warns when the
    naturally missing samples alone exceed the table's targets)."""
    mtype, rate = split_protocol(params, split)
    natural = np.array([g[3] for g in group], dtype=np.int8)
    codes = protocol.missing_table(natural, mtype, rate, params.seed, task, split)
    t1, t2 = protocol.missing_targets(len(group), mtype, rate)
    n_text = int(np.sum(codes == Missing.TEXT))
    n_image = int(np.sum(codes == Missing.IMAGE))
    if n_text > t1 or n_image > t2:
        log.warning(
            "task %d %s: naturally missing samples exceed the table's %d/%d "
            "(text/image missing); got %d/%d",
            task,
            split,
            t1,
            t2,
            n_text,
            n_image,
        )
    return codes


def _rows(
    group: list, codes, task: int, split: str, label_of: dict[str, int]
) -> list[dict]:
    """The samples.jsonl rows of one (task, split) group: `Sample`s as dicts
    (a multi-label sample's labels sorted, its placing label first)."""
    return [
        dataclasses.asdict(
            Sample(
                id=sid,
                split=split,
                task=task,
                label=label,
                class_name=s.class_name,
                image=image,
                text=text,
                missing=int(code),
                labels=tuple(sorted(label_of[n] for n in s.labels)),
            )
        )
        for (sid, label, s, _, image, text), code in zip(group, codes, strict=True)
    ]


def write_outputs(rows: list[dict], doc: dict, out: str | Path) -> None:
    """Write samples.jsonl and tasks.json into `out`, each via a temp file + rename."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    encode = json.JSONEncoder(ensure_ascii=False).encode  # one encoder for all rows
    files = {
        SAMPLES_FILE: "".join(encode(_line(r)) + "\n" for r in rows),
        TASKS_FILE: json.dumps(doc, indent=2, ensure_ascii=False) + "\n",
    }
    for name, text in files.items():
        write_bytes_atomic(out / name, text.encode("utf-8"))


def _line(row: dict) -> dict:
    """A samples.jsonl line: SAMPLE_KEYS, then a multi-label row's labels."""
    line = {k: row[k] for k in SAMPLE_KEYS}
    if row["labels"]:
        line[LABELS_KEY] = list(row["labels"])
    return line


@click.command("prepare")
@run_params_option
@folder_option("out", "data/prepare", "Output folder for samples.jsonl and tasks.json.")
@clean_errors
def cli(params_file: str, out: str) -> None:
    """Index a dataset into samples, tasks and missing-modality tables.

    Reads the `data` section: which dataset (demo, food101, n24news) at which
    root, the number of tasks, the class-order seed and the missing-modality
    protocol (type none/text/image/both, rate, seed; test_missing_* for test).
    Writes <out>/samples.jsonl (one row per sample: id, split, task, label,
    class_name, image, text, missing) and <out>/tasks.json (class order, labels
    and counts per task, the params used). Every listed image file is decoded
    once (JPEGs at 1/8 scale, one thread per core); one that is absent or does
    not decode, or an empty text, is kept as naturally missing or rejected
    (every such file named at once), per data.absent. Same params, same bytes.
    """
    params = load(params_file, "data")
    rows, doc = prepare(params)
    write_outputs(rows, doc, out)
    n_tasks = len(doc["tasks"])
    log.info(
        "wrote %d samples of %d classes in %d tasks to %s",
        len(rows),
        len(doc["class_order"]),
        n_tasks,
        out,
    )
