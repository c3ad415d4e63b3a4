"""The params reference (docs/PARAMS.md) and the params schema
(docs/params.schema.json) are what the section classes say; every key has
a note; the schema takes every committed params file and refuses a
misspelt key and a wrong type."""

from __future__ import annotations

import dataclasses
import json

import jsonschema
import pytest
import yaml
from helpers import committed, committed_files

from pipeline import params_reference as ref
from pipeline.sections import PARAM_CLASSES


def test_the_committed_reference_and_schema_are_the_classes() -> None:
    assert committed(ref.MARKDOWN) == ref.markdown(), (
        "docs/PARAMS.md is stale: python -m pipeline.params_reference"
    )
    assert committed(ref.SCHEMA) == ref.schema_text()


def test_every_key_of_every_section_has_a_note() -> None:
    count = 0
    for section, cls in PARAM_CLASSES.items():
        for key in ref.keys(cls):
            assert key.note, f"{section}.{key.name} has no comment in its class"
            count += 1
    fields = sum(
        1 for cls in PARAM_CLASSES.values() for f in dataclasses.fields(cls) if f.init
    )
    assert count == fields >= 80


def test_notes_come_from_the_line_or_the_block_above() -> None:
    @dataclasses.dataclass
    class Toy:
        """A toy section."""

        a: int = 1  # beside a
        # above b, and c shares it
        b: int = 2
        c: int = 3

        d: int = 4
        # above e
        e: str = "x"  # beside e wins

    notes = {k.name: k.note for k in ref.keys(Toy)}
    assert notes == {
        "a": "beside a",
        "b": "above b, and c shares it",
        "c": "above b, and c shares it",
        "d": "",
        "e": "beside e wins",
    }


def test_readers_come_from_dvc_yaml() -> None:
    read = ref.readers()
    assert sorted(read["solve"]) == ["evaluate", "solve"]
    assert "prepare" in read["data"]  # a foreach stage's params
    assert read["tune.epochs"] == ["tune"]


@pytest.mark.parametrize(
    "name",
    ["params.yaml", *[f for f in committed_files("configs") if f.endswith(".yaml")]],
)
def test_the_schema_takes_every_committed_params_file(name: str) -> None:
    jsonschema.validate(yaml.safe_load(committed(name)), ref.schema())


def test_the_schema_refuses_a_misspelt_key_and_a_wrong_type() -> None:
    params = yaml.safe_load(committed("params.yaml"))
    validator = jsonschema.Draft202012Validator(ref.schema())
    params["tune"]["epoch"] = 3
    params["solve"]["width"] = "wide"
    params["ablation"]["pal"]["changes"] = {"tune": {"lr": "fast"}}
    found = sorted(
        (list(e.absolute_path), e.validator) for e in validator.iter_errors(params)
    )
    assert found == [
        (["ablation", "pal", "changes", "tune", "lr"], "type"),
        (["solve", "width"], "type"),
        (["tune"], "additionalProperties"),
    ]
    assert json.loads(committed(ref.SCHEMA))["additionalProperties"] is False
