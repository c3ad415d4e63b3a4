"""The variants of PAL: the rows `ablation.<name>` of the params (DESIGN §6)
and the lists `pipelines.<name>` that run them.

A row is the one home of its variant's words: the keys it changes, its
label in the report, the paper's name of its row, the head its row reports
and, for PAL, the row of its BP head.
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from palcore.errors import ParamsError
from palcore.paramsfile import read_params_file, shown

HEADS = ("analytic", "bp")  # the heads whose predictions a variant's row reports
_ROW_KEYS = ("label", "changes", "paper", "head", "bp")
_ROW_FORM = "{label: TEXT, changes: {section: {key: value}}}"


@dataclasses.dataclass(frozen=True)
class VariantRow:
    """A variant of PAL: its row `ablation.<name>` of the params (DESIGN §6),
    the one home of the words its table row is shown with."""

    label: str  # the row's label in the report's tables and plots
    changes: dict[str, dict[str, Any]]  # section -> the keys it changes
    # the paper's name of the row: one text, or result id -> text where the
    # paper's tables name it differently (None: the paper has no such row)
    paper: str | dict[str, str] | None = None
    head: str = "analytic"  # analytic: the AL classifier's predictions; bp: BP head's
    # its BP head as a row of its own, `bp`, besides the variant's (PAL's
    # "w/o AL module"): {label, paper}
    bp: VariantRow | None = None


def variant_row(raw: dict[str, Any], name: str) -> VariantRow:
    """The row `ablation.<name>` of the params (errors name the key)."""
    rows = raw.get("ablation")
    if not isinstance(rows, Mapping) or name not in rows:
        known = ", ".join(sorted(rows)) if isinstance(rows, Mapping) else "none"
        raise ParamsError(f"unknown variant 'ablation.{name}' (known: {known})")
    row = rows[name]
    key = f"ablation.{name}"
    if not isinstance(row, Mapping) or not {"label", "changes"} <= set(row):
        raise ParamsError(
            f"{key} must hold a label and the changes it makes: {_ROW_FORM}"
        )
    _check_row_keys(row, key, _ROW_KEYS)
    head = row.get("head", "analytic")
    if head not in HEADS:
        raise ParamsError(
            f"{key}.head must be one of {', '.join(HEADS)}, got {shown(head)}"
        )
    return VariantRow(
        label=_text_of(row["label"], f"{key}.label"),
        changes=_changes(row["changes"] or {}, key),
        paper=_paper_name(row.get("paper"), f"{key}.paper"),
        head=head,
        bp=_bp_row(row.get("bp"), f"{key}.bp"),
    )


def _check_row_keys(row: Mapping[str, Any], key: str, known: Sequence[str]) -> None:
    for k in row:
        if k not in known:
            near = difflib.get_close_matches(str(k), known, n=1)
            hint = (
                f"did you mean '{near[0]}'?" if near else f"known: {', '.join(known)}"
            )
            raise ParamsError(f"{key}.{k}: unknown key ({hint})")


def _text_of(value: Any, key: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ParamsError(f"{key} must be a text, got {shown(value)}")
    return value


def _changes(changes: Any, key: str) -> dict[str, dict[str, Any]]:
    if not isinstance(changes, Mapping):
        raise ParamsError(f"{key}.changes must map sections to the keys it changes")
    for section, values in changes.items():
        if section in ("protocol", "ablation", "pipelines") or not isinstance(
            values, Mapping
        ):
            raise ParamsError(
                f"{key}.changes.{section} must be a mapping of keys of "
                "a stage's section"
            )
    return dict(changes)


def _paper_name(value: Any, key: str) -> str | dict[str, str] | None:
    """`paper`: absent, a text, or a mapping result id -> text."""
    if value is None or isinstance(value, str):
        return None if value is None else _text_of(value, key)
    if not isinstance(value, Mapping) or not value:
        raise ParamsError(
            f"{key} must be a text or map result ids to texts, got {shown(value)}"
        )
    return {
        _text_of(r, f"{key} (a result id)"): _text_of(v, f"{key}.{r}")
        for r, v in value.items()
    }


def _bp_row(value: Any, key: str) -> VariantRow | None:
    """`bp`: absent, or {label, paper} of the variant's BP-head row."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or "label" not in value:
        raise ParamsError(f"{key} must hold a label: {{label: TEXT, paper: TEXT}}")
    _check_row_keys(value, key, ("label", "paper"))
    return VariantRow(
        label=_text_of(value["label"], f"{key}.label"),
        changes={},
        paper=_paper_name(value.get("paper"), f"{key}.paper"),
        head="bp",
    )


def pipeline_variants(path: str | Path, name: str) -> list[str]:
    """The variants pipeline `name` runs, in table order: `pipelines.<name>`,
    each a row of `ablation`."""
    path = Path(path)
    raw = read_params_file(path)
    lists = raw.get("pipelines")
    try:
        if not isinstance(lists, Mapping) or name not in lists:
            known = ", ".join(sorted(lists)) if isinstance(lists, Mapping) else "none"
            raise ParamsError(f"unknown pipeline 'pipelines.{name}' (known: {known})")
        names = lists[name]
        if not isinstance(names, list) or not names:
            raise ParamsError(f"pipelines.{name} must list at least one variant")
        for variant in names:
            variant_row(raw, str(variant))
        if len(set(names)) != len(names):
            raise ParamsError(f"pipelines.{name} lists a variant twice")
    except ParamsError as exc:
        raise ParamsError(f"{path}: {exc}") from None
    return [str(v) for v in names]


def variant_label(path: str | Path, name: str) -> str:
    """The table label of variant `name` (`ablation.<name>.label`)."""
    return variant_rows(path, [name])[name].label


def variant_rows(path: str | Path, names: Sequence[str]) -> dict[str, VariantRow]:
    """The rows `ablation.<name>` of the params file, for each of `names`."""
    path = Path(path)
    raw = read_params_file(path)
    try:
        return {name: variant_row(raw, name) for name in names}
    except ParamsError as exc:
        raise ParamsError(f"{path}: {exc}") from None
