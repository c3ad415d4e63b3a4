"""The code an output contract covers, and its record (DESIGN §2).

A *unit* is a contracted stage (`tune`: its import closure without the method
modules) or a stage's method (`tune.pal`: the method modules that
`pipeline.methods.pal` imports, transitively). `contracts.lock` holds each
unit's version and the sha256 of the code of each of its files as last
verified by `pal contracts verify`; code means a file's lines without
comments, docstrings, trailing spaces and blank lines, so an edit of either
is no change.
`guard_problem` is the workspace's check of the code against that record
(`pal contracts stamp`, the dvc.yaml stage upstream of the contracted ones,
and `pal check`).
"""

from __future__ import annotations

import hashlib
import io
import json
import tokenize
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from palcore.outputs import write_bytes_atomic
from pipeline.closure import code_closure, imported_modules
from pipeline.contracts import (
    METHOD_STAGES,
    RECORD_FILE,
    ROOT,
    STAGES,
    VERSIONS_FILE,
    ContractError,
    read_versions,
)


def method_names(root: Path = ROOT) -> tuple[str, ...]:
    """The prompt methods (`prompt.method`) of the tree at `root`, in
    `pipeline.params.method_names`' order (the paper's six first)."""
    from pipeline.params import method_names as names

    return names(root / "pipeline" / "methods")


def method_file(method: str) -> str:
    return f"pipeline/methods/{method}.py"


def _closure(module: str, root: Path) -> list[str]:
    return [p.relative_to(root).as_posix() for p in code_closure(module, root)]


def unit_files(root: Path = ROOT) -> dict[str, list[str]]:
    """Each unit's code files, relative to `root`: a stage's import closure
    (for tune and extract with every method module's closure, less the
    method modules: what a method builds on, pipeline/model/prompts.py, is
    the stage's), and per method of tune and extract the method modules its
    own closure holds (RebQ builds on PAL's module, DualPrompt on L2P's)."""
    methods = method_names(root)
    own = {method_file(m) for m in methods}
    units: dict[str, list[str]] = {}
    for stage in STAGES:
        files = _closure(f"pipeline.stages.{stage}", root)
        if stage not in METHOD_STAGES:
            units[stage] = files
            continue
        # the registry imports a method module only when it builds it
        reached = {f for m in methods for f in _closure(f"pipeline.methods.{m}", root)}
        units[stage] = sorted(f for f in {*files, *reached} if f not in own)
        for method in methods:
            units[f"{stage}.{method}"] = _method_closure(method, root)
    return units


def _method_closure(method: str, root: Path) -> list[str]:
    """The method modules that method `method`'s module imports, transitively."""
    names = {f"pipeline.methods.{m}": m for m in method_names(root)}
    seen, todo = set(), [method]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        path = root / method_file(name)
        found = imported_modules(path, f"pipeline.methods.{name}", root)
        todo.extend(names[m] for m in found if m in names)
    return sorted(method_file(m) for m in seen)


def watched_files(root: Path = ROOT) -> list[str]:
    """Every file of every unit: what the `contracts` stage depends on."""
    return sorted({f for files in unit_files(root).values() for f in files})


def code_digest(path: Path) -> str:
    """sha256 of a Python file's code: its lines without comments, docstrings
    (any statement that is a string alone) and trailing spaces, blank lines
    dropped. Both are found by Python's tokenizer, so a `#` or a triple quote
    inside a string is code."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError) as err:
        raise ContractError(f"{path}: not Python the tokenizer reads ({err})") from err
    spans = [(t.start, t.end) for t in tokens if t.type == tokenize.COMMENT]
    spans += _docstrings(tokens)
    for (row, col), (end_row, end_col) in sorted(spans, reverse=True):
        if row == end_row:  # from the end: earlier columns stay valid
            lines[row - 1] = lines[row - 1][:col] + lines[row - 1][end_col:]
            continue
        lines[row - 1] = lines[row - 1][:col]
        lines[row : end_row - 1] = [""] * (end_row - 1 - row)
        lines[end_row - 1] = lines[end_row - 1][end_col:]
    kept = [line.rstrip() for line in lines if line.strip()]
    return hashlib.sha256("\n".join(kept).encode()).hexdigest()


def _docstrings(tokens: list[tokenize.TokenInfo]) -> list[tuple[Any, Any]]:
    """The spans of the statements that are one string alone (a module's,
    class's or function's docstring, or a string used as a comment)."""
    skip = (tokenize.NL, tokenize.COMMENT)
    sig = [t for t in tokens if t.type not in skip]
    starts = (tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT)
    return [
        (t.start, t.end)
        for i, t in enumerate(sig)
        if t.type == tokenize.STRING
        and (i == 0 or sig[i - 1].type in starts)
        and i + 1 < len(sig)
        and sig[i + 1].type in (tokenize.NEWLINE, tokenize.ENDMARKER)
    ]


def read_record(root: Path = ROOT) -> dict[str, dict[str, Any]]:
    """contracts.lock: {unit: {"version": N, "code": {path: code sha256}}};
    empty when there is none."""
    path = root / RECORD_FILE
    if not path.is_file():
        return {}
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise ContractError(f"{path}: damaged ({err}); `git checkout` it") from err
    if not isinstance(record, dict) or not all(
        isinstance(e, dict) and isinstance(e.get("code"), dict) for e in record.values()
    ):
        raise ContractError(f"{path}: not a contracts record; `git checkout` it")
    return record


def current_record(
    root: Path = ROOT, units: list[str] | None = None
) -> dict[str, dict[str, Any]]:
    """The record of the code as it is now, for `units` (default: all): each
    unit's version, its files' code digests and, for a version set by a
    raise (`drafted`), `made_by`: the digest of the code that made it."""
    versions = read_versions(root)
    files = unit_files(root)
    digests = {f: code_digest(root / f) for fs in files.values() for f in fs}
    held = read_record(root)
    out = {}
    for u in sorted(files) if units is None else units:
        code = {f: digests[f] for f in files[u]}
        entry: dict[str, Any] = {"version": versions.of(u), "code": code}
        before = held.get(u, {})
        if before.get("version") != entry["version"]:
            entry["made_by"] = unit_digest(code)
        elif "made_by" in before:
            entry["made_by"] = before["made_by"]
        out[u] = entry
    return out


def unit_digest(code: Mapping[str, str]) -> str:
    """12 hex digits of a unit's code ({file: code digest})."""
    text = json.dumps(dict(code), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def changed_units(
    root: Path = ROOT, now: dict[str, dict[str, Any]] | None = None
) -> dict[str, list[str]]:
    """Units whose code or version differs from contracts.lock → the files
    that differ (new, changed or gone; [] when only the version moved);
    `now`: `current_record(root)`, when the caller has it."""
    record = read_record(root)
    out = {}
    for unit, entry in (now or current_record(root)).items():
        held = record.get(unit, {"version": None, "code": {}})
        now, then = entry["code"], held["code"]
        moved = sorted(f for f in set(now) | set(then) if now.get(f) != then.get(f))
        if moved or held["version"] != entry["version"]:
            out[unit] = moved
    return out


def drafted(
    root: Path = ROOT, now: dict[str, dict[str, Any]] | None = None
) -> dict[str, str]:
    """The units raised above contracts.lock's version and not yet proven →
    the digest of their code now. Their outputs are made again (the stamps
    name the version and this digest, so each further edit makes them
    again too); the proof runs once the change is committed."""
    record = read_record(root)
    return {
        unit: unit_digest(entry["code"])
        for unit, entry in (now or current_record(root)).items()
        if entry["version"] > record.get(unit, {}).get("version", 0)
    }


def made_by(root: Path = ROOT) -> dict[str, str]:
    """Per unit whose version was set by a raise since contracts.lock kept
    `made_by`: the digest of the code that makes its outputs (drafts: now)."""
    record = read_record(root)
    held = {u: e["made_by"] for u, e in record.items() if "made_by" in e}
    return held | drafted(root)


def guard_problem(root: Path = ROOT) -> str | None:
    """One line when the code of some unit differs from contracts.lock and
    its version was not raised (the features in the cache were not made by
    it), else None."""
    if not (root / RECORD_FILE).is_file():
        return (
            f"{root / RECORD_FILE}: not found (the code each contract was proven "
            f"with): `git checkout {RECORD_FILE}`"
        )
    try:
        now = current_record(root)  # the closures are computed once
    except ContractError as err:  # a unit with no version: a new method's
        return str(err)
    stray = sorted(set(read_versions(root).versions) - set(now))
    if stray:
        return (
            f"{root / VERSIONS_FILE}: versions.{stray[0]} is no unit (known: "
            f"{', '.join(sorted(now))}): a misspelt raise?"
        )
    raised = drafted(root, now)
    changed = {u: f for u, f in changed_units(root, now).items() if u not in raised}
    if not changed:
        return None
    files = sorted({f for fs in changed.values() for f in fs})
    if not files:
        names = ", ".join(sorted(changed))
        return (
            f"{VERSIONS_FILE}: the versions of {names} are below {RECORD_FILE}'s: "
            f"`git checkout {VERSIONS_FILE}`, or raise them above it"
        )
    units = sorted(changed)
    return (
        f"{', '.join(files)} changed: code of {_covered(changed)}. A "
        "refactor: `pal contracts verify` (proves the outputs the same, records "
        f"it). A change of outputs: `pal contracts raise {' '.join(units)}`, "
        'then `dvc repro` (docs/USAGE.md, "Output contracts")'
    )


def _covered(changed: Mapping[str, list[str]]) -> str:
    """Why each unit covers the changed files: 'tune.pal, extract.pal (pal.py
    is its module), tune.rebq, extract.rebq (rebq.py imports pal.py), tune
    (in its import closure)'."""
    groups: dict[str, list[str]] = {}
    for unit in sorted(changed, key=lambda u: (u.split(".")[-1], u)):
        stage, _, method = unit.partition(".")
        files = changed[unit]
        if not method:
            why = "in its stage's import closure"
        elif files == [method_file(method)]:
            why = f"{method}.py is its module"
        else:
            used = ", ".join(Path(f).name for f in files if f != method_file(method))
            why = f"{method}.py imports {used}"
        groups.setdefault(why, []).append(unit)
    return ", ".join(f"{', '.join(us)} ({why})" for why, us in groups.items())


def write_record(record: Mapping[str, Any], root: Path = ROOT) -> None:
    text = json.dumps(record, indent=1, sort_keys=True) + "\n"
    write_bytes_atomic(root / RECORD_FILE, text.encode())
