"""params.yaml and the presets survive DVC's rewrite: `dvc exp run -S key=value`
changes the value's lines and nothing else, and setting it back restores the
file byte for byte.

DVC rewrites the file with ruamel (`dvc.utils.hydra.apply_overrides`, what
`dvc exp run -S` calls): every list it re-emits in block style at its key's
indent, comments after a list's last item and flow mappings wider than 80
columns are lost or rewrapped, and null is written as an empty value. The
committed files are laid out as it writes them.
"""

from __future__ import annotations

import pytest
import yaml
from helpers import committed

FILES = ("params.yaml", "configs/food101.yaml", "configs/n24news.yaml")

# (override, params.yaml's text it changes)
CASES = [
    ("solve.eta=0.1", ("\n  eta: 1.0\n", "\n  eta: 0.1\n")),
    ("solve.width=4096", ("  width: 1024 ", "  width: 4096 ")),
    ("protocol.runs=[0]", ("runs: [0, 1, 2]", "runs: [0]")),
    (
        "pipelines.main=[pal]",
        ("  - pal\n  - init\n  - frozen\n", "  - pal\n"),
    ),
    ("data.per_class=1", ("  per_class:    ", "  per_class: 1  ")),
]


def _flow(value) -> str:
    """A value as `-S key=value` writes it (YAML flow style)."""
    if isinstance(value, list):
        return "[" + ",".join(_flow(v) for v in value) + "]"
    if value is None:
        return "null"
    return repr(value) if isinstance(value, float) else str(value)


def _apply(path, override: str) -> str:
    from dvc.utils.hydra import apply_overrides

    apply_overrides(path, [override])
    return path.read_text(encoding="utf-8")


def _changed(before: str, after: str) -> list[str]:
    import difflib

    diff = difflib.ndiff(before.splitlines(), after.splitlines())
    return [d[2:] for d in diff if d[0] in "+-"]


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("override, change", CASES, ids=[c[0] for c in CASES])
def test_dvc_set_param_changes_only_the_value(tmp_path, name, override, change):
    text = committed(name)
    key = override.split("=")[0]
    value = yaml.safe_load(text)
    for part in key.split("."):
        value = value[part]
    path = tmp_path / "params.yaml"
    path.write_text(text, encoding="utf-8")
    after = _apply(path, override)
    old, new = change
    if name == "params.yaml":
        assert text.count(old) == 1
        assert after == text.replace(old, new)
    else:  # the presets' values differ: only the key's line or its items change
        changed = _changed(text, after)
        assert changed and all(
            f"{key.rsplit('.', 1)[-1]}:" in line or line.startswith("  - ")
            for line in changed
        ), changed
    assert _apply(path, f"{key}={_flow(value)}") == text
