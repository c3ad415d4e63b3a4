"""Output contracts: what keys the outputs of the expensive stages (DESIGN §2).

`pixels`, `frozen`, `tune` and `extract` take hours on a GPU for a real
dataset. dvc.yaml keys them on their data, the backbone, the params that can
change their output and a *contract*: a version per stage and, for tune and
extract, one per prompt method (`contracts.yaml`), not the bytes of their
code. A refactor that makes the same outputs (`pipeline.sameness`) keeps
every version, so no researcher's features are discarded for it; a change of
outputs raises exactly the stages and methods it changes. The code a unit
covers and its record are `contract_code`'s; the guard and the stamps each
contracted output depends on (and keeps as `contract.json`),
`stages.contracts`'; the proof, `stages.contract_proof`'s.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from palcore.errors import PalError
from palcore.outputs import write_bytes_atomic

ROOT = Path(__file__).resolve().parents[1]  # the folder holding the packages
STAGES = ("pixels", "frozen", "tune", "extract")
METHOD_STAGES = ("tune", "extract")  # stages whose output depends on the method
VERSIONS_FILE = "contracts.yaml"
RECORD_FILE = "contracts.lock"
STAMP_NAME = "contract.json"  # in each contracted output folder


class ContractError(PalError):
    """The code differs from what its contract was verified with, or the
    contract files are damaged."""


@dataclass(frozen=True)
class Versions:
    """contracts.yaml: each unit's version and the stated reasons of bumps
    whose outputs are byte-identical (`"tune.pal@2": why`)."""

    versions: dict[str, int]
    reasons: dict[str, str]

    def of(self, unit: str) -> int:
        if unit not in self.versions:
            stage, _, method = unit.partition(".")
            if not method:
                raise ContractError(
                    f"{VERSIONS_FILE}: no version for '{unit}': "
                    f"`git checkout {VERSIONS_FILE}`"
                )
            raise ContractError(
                f"{VERSIONS_FILE}: no version for '{unit}' (a new method's "
                "outputs): `pal contracts raise "
                f"{' '.join(f'{s}.{method}' for s in METHOD_STAGES)}` starts "
                'them at 1 (docs/USAGE.md, "Add a method")'
            )
        return self.versions[unit]


def parse_versions(text: str, where: str = VERSIONS_FILE) -> Versions:
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError:
        raise ContractError(f"{where}: not valid YAML") from None
    if not isinstance(raw, Mapping) or not isinstance(raw.get("versions"), Mapping):
        raise ContractError(f"{where}: expected a mapping 'versions: {{unit: N}}'")
    versions = dict(raw["versions"])
    for unit, value in versions.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ContractError(f"{where}: versions.{unit} must be a whole number ≥ 1")
    reasons = raw.get("reasons") or {}
    if not isinstance(reasons, Mapping):
        raise ContractError(f"{where}: expected a mapping 'reasons: {{unit@N: why}}'")
    return Versions(versions, {str(k): str(v) for k, v in reasons.items()})


def add_version(text: str, unit: str, version: int) -> str:
    """contracts.yaml's `text` with the line `unit: version` added under
    `versions`, after the last line of `unit`'s stage (`tune.toy` after the
    last `tune.*`), else after the last version."""
    lines = text.splitlines(keepends=True)
    head = [i for i, line in enumerate(lines) if re.match(r"versions:\s*$", line)]
    entry = re.compile(r"(\s+)([\w.]+):\s*\d+\s*(#.*)?$")
    last = last_of_stage = None
    for i in range(head[0] + 1 if head else len(lines), len(lines)):
        if re.match(r"[^\s#]", lines[i]):  # the next top-level key
            break
        if found := entry.match(lines[i]):
            indent, last = found[1], i
            if found[2].split(".")[0] == unit.split(".")[0]:
                last_of_stage = i
    if last is None:
        raise ContractError(
            f"{VERSIONS_FILE}: no 'versions:' block of 'unit: N' lines to add "
            f"'{unit}: {version}' to; add it under versions by hand"
        )
    at = (last if last_of_stage is None else last_of_stage) + 1
    lines.insert(at, f"{indent}{unit}: {version}\n")
    return "".join(lines)


def read_versions(root: Path = ROOT) -> Versions:
    path = root / VERSIONS_FILE
    if not path.is_file():
        raise ContractError(f"{path}: not found (the output contracts, DESIGN §2)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ContractError(f"{path}: not UTF-8 text: `git checkout` it") from None
    return parse_versions(text, str(path))


def stamp(stage: str, method: str | None, versions: Versions) -> dict[str, Any]:
    """The contract an output of `stage` made with prompt method `method`
    (None: no prompts, or a stage without methods) is made under."""
    out: dict[str, Any] = {"stage": stage, "version": versions.of(stage)}
    if stage in METHOD_STAGES:
        out["method"] = method
        out["method_version"] = (
            None if method is None else versions.of(f"{stage}.{method}")
        )
    return out


def stamp_bytes(record: Mapping[str, Any]) -> bytes:
    return (json.dumps(record, sort_keys=True) + "\n").encode()


def check_stamp(stage: str, method: str | None = None) -> None:
    """Stop now, in one line, if `stage` with `method` has no contract (a new
    method before `pal contracts raise`), not after its hours of work."""
    stamp(stage, method, read_versions())


def write_stamp(out: Path, stage: str, method: str | None = None) -> None:
    """`contract.json` in output folder `out`: the contract it was made under."""
    record = stamp(stage, method, read_versions())
    write_bytes_atomic(Path(out) / STAMP_NAME, stamp_bytes(record))


def prompt_method(prompt: Any) -> str | None:
    """The method whose code makes a variant's output (`prompt` params, or
    their record in a checkpoint); None without prompts."""
    if isinstance(prompt, Mapping):
        return prompt.get("method", "pal") if prompt.get("enabled", True) else None
    return prompt.method if prompt.enabled else None
