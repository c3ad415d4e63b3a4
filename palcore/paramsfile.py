"""A params file read as YAML, without aliases, and params values shown in
messages: what every params reader shares (`palcore.params` for the sections,
`palcore.variants` for the ablation rows)."""

from __future__ import annotations

import copy
import functools
import reprlib
from pathlib import Path
from typing import Any

import yaml

from palcore.errors import ParamsError


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: `*name` can make a few lines expand to 10⁸ values
    (an "anchor bomb"), and params never need one."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            raise ParamsError(
                f"line {mark.line + 1}: YAML aliases (*name) are not allowed in "
                "params; write the value out"
            )
        return super().compose_node(parent, index)


def read_params_file(path: str | Path) -> dict[str, Any]:
    """Parse a params YAML file into a dict of sections (aliases refused)."""
    path = Path(path)
    if not path.is_file():
        raise ParamsError(f"{path}: params file not found")
    try:
        raw = copy.deepcopy(_parse(path.read_text(encoding="utf-8")))
    except ParamsError as exc:
        raise ParamsError(f"{path}: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ParamsError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        raise ParamsError(f"{path}: not valid YAML{where}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}: expected a mapping of sections at the top level")
    return raw


@functools.lru_cache(maxsize=16)
def _parse(text: str) -> Any:
    """The YAML of `text`, parsed once per distinct text: `pal check` and a
    grid's check of every cell load one section at a time, over a hundred
    loads of the same file (about 60 ms each in PyYAML's Python loader).
    Callers get a deep copy."""
    return yaml.load(text, Loader=_NoAliasLoader)


_SHOW = reprlib.Repr()
_SHOW.maxlevel, _SHOW.maxlist, _SHOW.maxdict, _SHOW.maxstring = 3, 6, 6, 60


def shown(value: Any) -> str:
    """`repr(value)` bounded in length and depth, for messages: a params value
    may be large, and a message must stay one short line."""
    return _SHOW.repr(value)
