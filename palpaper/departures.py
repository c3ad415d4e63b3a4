"""How a run departs from the paper's protocol, for the captions and CSVs
that set its numbers beside the paper's.

The paper's protocol per dataset is `protocol:` in published.yaml (tasks,
classes, epochs, up-sampling width, runs, device). A key the result varies
(the width of Table 4, the tasks of Table 5) is no departure; the others are
read from the committed params, the runs from the cells' metrics, and the
classes from the prepare output of one cell (in DVC's cache) when it is there.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from palpaper.grids import Column
from palpaper.overrides import GridError, get
from palpaper.packaged import published

DEVICES = {"cpu": "CPU", "cuda": "GPU"}


def paper_protocol(dataset: str) -> dict[str, Any] | None:
    """The paper's protocol for `dataset` (published.yaml), or None."""
    return (published().get("protocol") or {}).get(dataset)


def _value(params: Mapping[str, Any], key: str) -> Any:
    try:
        return get(params, key)
    except GridError:
        return None


def departures(
    params: Mapping[str, Any],
    columns: Sequence[Column],
    runs: Sequence[int],
    classes: int | None,
) -> list[str]:
    """Phrases such as '5 tasks (the paper: 10)', one per departure; [] when
    the run follows the paper's protocol or the paper has none for it."""
    paper = paper_protocol(str(get(params, "data.dataset")))
    if paper is None:
        return []
    # what the result varies: the keys whose value differs between its cells
    # (not the runs or variants that every cell of it sets alike)
    values: dict[str, set[str]] = {}
    for c in columns:
        for key in {k for col in columns for k, _ in col.cell.overrides}:
            values.setdefault(key, set()).add(repr(c.cell.value(params, key)))
    varied = {k for k, v in values.items() if len(v) > 1}
    out = []

    def differs(key: str, mine: Any, theirs: Any, one: str, many: str) -> None:
        if key not in varied and mine is not None and mine != theirs:
            words = (one if mine == 1 else many).format(mine)
            out.append(f"{words} (the paper: {theirs})")

    tasks = _value(params, "data.tasks")
    differs("data.tasks", tasks, paper["tasks"], "{} task", "{} tasks")
    differs("classes", classes, paper["classes"], "{} class", "{} classes")
    per_class = _value(params, "data.per_class")
    if per_class is not None and "data.per_class" not in varied:
        sample = "sample" if per_class == 1 else "samples"
        out.append(f"at most {per_class} {sample} per class and split (the paper: all)")
    epochs = _value(params, "tune.epochs")
    differs(
        "tune.epochs", epochs, paper["epochs"], "{} epoch a task", "{} epochs a task"
    )
    width = _value(params, "solve.width")
    differs("solve.width", width, paper["width"], "width {}", "width {}")
    differs("protocol.runs", len(runs), paper["runs"], "{} run", "{} runs")
    devices = {
        DEVICES.get(str(_value(params, f"{s}.device"))) for s in ("tune", "extract")
    }
    if "CPU" in devices:
        out.append(f"tune and extract on CPU (the paper: {paper['device']})")
    return out


def sentence(parts: Sequence[str]) -> str:
    """The caption's sentence, '' when there is nothing to say."""
    if not parts:
        return ""
    return " This run departs from the paper's protocol: " + "; ".join(parts) + "."


def prepared_classes(root: Path, lock_text: str | None) -> int | None:
    """The number of classes in a cell's prepare output, read from DVC's
    cache through the experiment's dvc.lock (None when either is missing)."""
    import yaml

    if lock_text is None:
        return None
    try:
        stages = yaml.safe_load(lock_text)["stages"]
        prepare = next(v for k, v in stages.items() if k.startswith("prepare@"))
        folder_md5 = prepare["outs"][0]["md5"]
        cache = root / ".dvc" / "cache" / "files" / "md5"
        entries = json.loads((cache / folder_md5[:2] / folder_md5[2:]).read_text())
        md5 = next(e["md5"] for e in entries if e["relpath"] == "tasks.json")
        doc = json.loads((cache / md5[:2] / md5[2:]).read_text())
        return len(doc["class_order"])
    except (OSError, ValueError, KeyError, TypeError, StopIteration, IndexError):
        return None
