"""Resuming an interrupted stage: what its result depends on, and where
its finished steps wait.

`dvc repro` deletes a stage's outputs before it runs the stage, so steps that
`pal tune` or `pal extract` finished before an interruption cannot wait in the
output folder. They wait in `<out>.partial/` (e.g. `data/tune/pal/0.partial/`),
a sibling that DVC does not track, together with the *signature* of the run
that wrote them: a hash of the stage's code, of its params and of its inputs.
A rerun with the same signature picks the finished steps up; any other
signature (a changed param, input or line of code) starts afresh. Both
stages that resume, tune and extract, have steps whose step k depends only on
the inputs of steps 1..k, so each signs every step: a rerun keeps the steps
whose own inputs did not change. When the run completes, its files move into
the output folder and the partial folder goes.

A finished step is *sealed*: `SHA256SUMS` in its folder lists the sha256 of
each of its files. A rerun reuses a step only when every file matches; a
truncated or altered file, or a step without its seal (killed between its
writes), is discarded with one line and the step computed again, so nothing
unverified moves into the output folder (and DVC's cache).

The stage's code in a signature is `pipeline.closure.code_closure(module)`:
its module and every project module it imports, transitively.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from palcore.outputs import write_bytes_atomic
from pipeline.closure import ROOT, code_closure

log = logging.getLogger(__name__)

SIGNATURE_FILE = "SIGNATURE"
SEAL_FILE = "SHA256SUMS"  # in a finished step's folder: {file name: sha256}


def files_digest(paths: Iterable[Path], root: Path) -> str:
    """sha256 over each file's path relative to `root` and its bytes."""
    h = hashlib.sha256()
    for path in sorted(paths):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(file_digest(path).encode())
    return h.hexdigest()


def file_digest(path: Path) -> str:
    """sha256 of one file's bytes, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def folder_digest(folder: Path) -> str:
    """sha256 over every file below `folder` (names and bytes)."""
    return files_digest((p for p in folder.rglob("*") if p.is_file()), folder)


def code_digest(module: str) -> str:
    """sha256 over the files of `code_closure(module)`."""
    return files_digest(code_closure(module), ROOT)


def run_environment(module: str, backbone: str, device: str) -> dict[str, Any]:
    """The signature parts tune and extract share: the stage's code
    (`code_digest(module)`), the files of backbone `backbone` (a folder or a
    cached hub id), the device type and the versions of torch and transformers."""
    import torch
    import transformers

    from pipeline.model.backbone import backbone_folder

    return {
        "code": code_digest(module),
        "backbone": folder_digest(backbone_folder(backbone)),
        "device": device,
        "versions": [torch.__version__, transformers.__version__],
    }


def hash_samples(h: Any, samples: Iterable[Any]) -> Any:
    """Feed each sample (a dataclass) to sha256 object `h` as sorted JSON;
    returns `h`. A single-label `Sample`'s empty `labels` is left out, as
    samples.jsonl leaves it out (its hash is the one before the field)."""
    for sample in samples:
        record = dataclasses.asdict(sample)
        if record.get("labels") == ():
            del record["labels"]
        h.update(json.dumps(record, sort_keys=True).encode())
    return h


def signature(parts: Mapping[str, Any]) -> str:
    """sha256 of `parts` (JSON-able: digests, params records, versions)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


class PartialRun:
    """`<out>.partial/`: the finished steps of a run that has not completed.

    `signature` is one string for the whole run, or one per step (step k's
    covers only what step k and the steps before it depend on). Opening it
    with `fresh`, or with a whole-run signature other than the one it holds,
    empties it first; with per-step signatures the steps 1..`kept` whose
    signatures still match are kept and the later ones are dropped. Steps are
    written into `path` (atomically, by their writers); `finish` moves them
    into the output folder.
    """

    def __init__(
        self,
        out: Path,
        signature: str | Sequence[str],
        fresh: bool = False,
        suffix: str = "",
    ) -> None:
        self.out = Path(out)
        self.path = self.out.with_name(f"{self.out.name}.partial{suffix}")
        marker = self.path / SIGNATURE_FILE
        held = marker.read_text().strip() if marker.is_file() else None
        text = signature if isinstance(signature, str) else json.dumps(list(signature))
        self.kept = 0
        if held is not None and not fresh and not isinstance(signature, str):
            self.kept = _matching_steps(held, list(signature))
        if held is not None and (fresh or held != text):
            if fresh:
                log.info("%s: discarding unfinished work (--fresh)", self.path)
            elif self.kept:
                log.info(
                    "%s: keeping steps 1-%d; the inputs of step %d on changed "
                    "(--fresh discards all)",
                    self.path,
                    self.kept,
                    self.kept + 1,
                )
            else:
                log.info(
                    "%s: discarding unfinished work (code, params or inputs changed)",
                    self.path,
                )
        if (fresh or held != text) and not self.kept:
            shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(marker, text.encode())

    def seal(self, folder: str, names: Iterable[str]) -> None:
        """Mark step folder `folder` finished: the sha256 of each of its files
        `names`, written after them."""
        where = self.path / folder
        sums = {name: file_digest(where / name) for name in names}
        write_bytes_atomic(where / SEAL_FILE, json.dumps(sums, sort_keys=True).encode())

    def reusable(self, folders: Sequence[str], names: Sequence[str]) -> set[str]:
        """The step folders among `folders` (in step order) whose files `names`
        are there and match their seal; the first `kept` may be; the files of
        the others, and of any damaged step, are deleted (one line each)."""
        ready = set()
        for i, folder in enumerate(folders):
            where = self.path / folder
            if i < self.kept:
                problem = _seal_problem(where, names)
                if problem is None:
                    ready.add(folder)
                    continue
                if problem:
                    log.warning(
                        "%s: %s; discarding the step and computing it again "
                        "(a damaged resume never reaches the output)",
                        where,
                        problem,
                    )
            for name in [*names, SEAL_FILE]:
                (where / name).unlink(missing_ok=True)
        return ready

    def finish(self, names: Iterable[str]) -> None:
        """Move the files `names` (relative paths) into the output folder,
        replacing what is there, then remove the partial folder."""
        for name in names:
            target = self.out / name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self.path / name, target)
        shutil.rmtree(self.path)


def _seal_problem(folder: Path, names: Sequence[str]) -> str | None:
    """None when the files `names` in `folder` match its seal; else why not
    ("" when the step has no file at all: nothing was started)."""
    seal = folder / SEAL_FILE
    if not seal.is_file():
        there = [n for n in names if (folder / n).is_file()]
        return f"{there[0]} without the seal of a finished step" if there else ""
    try:
        sums = json.loads(seal.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError):
        return f"{SEAL_FILE} is damaged"
    for name in names:
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        if not isinstance(sums, dict) or sums.get(name) != file_digest(path):
            return f"{name} does not match the sha256 written with it (damaged)"
    return None


def _matching_steps(held: str, signatures: list[str]) -> int:
    """How many leading steps' signatures in the held marker equal these."""
    try:
        old = json.loads(held)
    except ValueError:
        return 0
    if not isinstance(old, list):
        return 0
    n = 0
    for a, b in zip(old, signatures, strict=False):
        if a != b:
            break
        n += 1
    return n
