"""The params reference, made from the dataclasses that load each section
(`pipeline.sections.PARAM_CLASSES`): every key with its type, default, what
it changes (the comment beside it in the class) and the stages that read it
(their `params:` in dvc.yaml). Two files come of it, kept true by
tests/test_params_reference.py:

* docs/PARAMS.md, the reference a user reads;
* docs/params.schema.json, a JSON Schema of a params file for editors (the
  YAML language server: `# yaml-language-server: $schema=docs/params.schema.json`).

    python -m pipeline.params_reference      # writes both

No stage imports this module.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import json
import textwrap
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from pipeline.sections import PARAM_CLASSES

ROOT = Path(__file__).resolve().parents[1]
MARKDOWN = "docs/PARAMS.md"
SCHEMA = "docs/params.schema.json"


@dataclasses.dataclass(frozen=True)
class Key:
    """One key of a section, as the reference shows it."""

    name: str
    type: Any
    default: Any
    note: str
    run_only: bool


def keys(cls: type) -> list[Key]:
    """The keys of section class `cls`, each with the comment that explains
    it: the one on its line, else the comment block above it (shared by the
    keys that follow the block with none of their own, up to a blank line).
    A comment line below a key is never its note: write a longer note above."""
    notes = _comments(cls)
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        out.append(
            Key(
                f.name,
                hints[f.name],
                default,
                notes.get(f.name, ""),
                bool(f.metadata.get("run_only")),
            )
        )
    return out


def _comments(cls: type) -> dict[str, str]:
    source = textwrap.dedent(inspect.getsource(cls))
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    block: list[str] = []  # the comment lines above the current key
    shared = ""
    notes: dict[str, str] = {}
    line_of: dict[int, str] = {}  # line → the key it starts
    depth = 0
    for tok in tokens:
        if tok.type == tokenize.INDENT:
            depth += 1
        elif tok.type == tokenize.DEDENT:
            depth -= 1
        elif tok.type == tokenize.COMMENT and depth == 1:
            text = tok.string.lstrip("#").strip()
            if tok.start[0] in line_of:  # beside a key
                notes[line_of[tok.start[0]]] = text
            else:
                block.append(text)
        elif tok.type == tokenize.NAME and depth == 1 and tok.start[1] == 4:
            if tok.string in ("def", "class") or tok.start[0] in line_of:
                block, shared = [], ""
                continue
            line_of[tok.start[0]] = tok.string
            if block:
                shared, block = " ".join(block), []
            if shared:
                notes.setdefault(tok.string, shared)
        elif tok.type == tokenize.NL and tok.line.strip() == "":
            shared = ""  # a blank line ends a shared block
    return notes


def readers(root: Path = ROOT) -> dict[str, list[str]]:
    """'section.key' or 'section' → the dvc.yaml stages whose `params:`
    name it."""
    stages = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    out: dict[str, list[str]] = {}
    for name, stage in stages.items():
        for entry in stage.get("do", stage).get("params") or []:
            # a key, or {params file: [keys]}
            for key in [entry] if isinstance(entry, str) else sum(entry.values(), []):
                out.setdefault(key, []).append(name)
    return out


def _type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return " \\| ".join(json.dumps(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin in (list, tuple):
        inner = args[0] if args and args[0] is not Ellipsis else Any
        return f"list of {_type_name(inner)}"
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def markdown(root: Path = ROOT) -> str:
    """docs/PARAMS.md: a table per section."""
    read = readers(root)
    lines = [
        "# Params reference",
        "",
        "Every key of `params.yaml`, section by section: its type, its default,",
        "what it changes and the `dvc.yaml` stages that read it. Made from the",
        "classes that load each section (`python -m pipeline.params_reference`",
        "writes this file and `docs/params.schema.json`); a test keeps it true.",
        "Keys marked *run only* change speed, never a result. `ablation` and",
        "`pipelines` (the variants and their lists) are in docs/USAGE.md.",
    ]
    for section, cls in PARAM_CLASSES.items():
        lines += ["", f"## `{section}`", "", (inspect.getdoc(cls) or "").split("\n")[0]]
        lines += [
            "",
            "| key | type | default | what | read by |",
            "|---|---|---|---|---|",
        ]
        for k in keys(cls):
            stages = read.get(f"{section}.{k.name}", []) + read.get(section, [])
            note = k.note + (" *(run only)*" if k.run_only else "")
            by = ", ".join(sorted(set(stages))) or "–"
            default = json.dumps(k.default) if k.default is not None else "null"
            lines.append(
                f"| `{k.name}` | {_type_name(k.type)} | `{default}` | {note} | {by} |"
            )
    return "\n".join(lines) + "\n"


def _schema_of(tp: Any) -> dict[str, Any]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        return {"anyOf": [_schema_of(a) for a in args]}
    if origin in (list, tuple):
        inner = args[0] if args and args[0] is not Ellipsis else Any
        return {"type": "array", "items": _schema_of(inner)}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if tp is type(None):
        return {"type": "null"}
    return {"type": simple[tp]} if tp in simple else {}


def _section_schema(cls: type) -> dict[str, Any]:
    props = {k.name: {**_schema_of(k.type), "description": k.note} for k in keys(cls)}
    return {
        "type": ["object", "null"],
        "description": inspect.getdoc(cls) or "",
        "properties": props,
        "additionalProperties": False,
    }


def schema() -> dict[str, Any]:
    """A JSON Schema of a params file: every section's keys and types (the
    values' ranges are the loaders' to check), the variants' rows."""
    sections = {s: _section_schema(c) for s, c in PARAM_CLASSES.items()}
    changes = {
        "type": ["object", "null"],
        "properties": sections,
        "additionalProperties": False,
    }
    row = {
        "type": "object",
        "required": ["label", "changes"],
        "properties": {
            "label": {"type": "string"},
            "paper": {"type": ["string", "object"]},
            "head": {"enum": ["analytic", "bp"]},
            "bp": {"type": "object", "required": ["label"]},
            "changes": changes,
        },
        "additionalProperties": False,
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "PAL pipeline params file",
        "type": "object",
        "properties": {
            **sections,
            "ablation": {"type": "object", "additionalProperties": row},
            "pipelines": {
                "type": "object",
                "additionalProperties": {"type": "array", "items": {"type": "string"}},
            },
        },
        "additionalProperties": False,
    }


def schema_text() -> str:
    return json.dumps(schema(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    (ROOT / MARKDOWN).write_text(markdown(), encoding="utf-8")
    (ROOT / SCHEMA).write_text(schema_text(), encoding="utf-8")
    print(f"wrote {MARKDOWN} and {SCHEMA}")
