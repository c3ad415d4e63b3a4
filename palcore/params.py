"""Strict params loading: one params.yaml section into one frozen dataclass;
the runs of the protocol and the variants of PAL (`Source`, `ablation`,
`pipelines`).

Every stage reads only the sections it needs. Unknown keys, wrong types and
out-of-range values are `ParamsError`s that name the file and `section.key`.
Section dataclasses validate their own ranges in `__post_init__` by calling
`check(...)`; types are checked here from the field annotations.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from palcore.errors import ParamsError
from palcore.paramsfile import read_params_file, shown
from palcore.variants import variant_row

T = TypeVar("T")

DEFAULT_PARAMS = Path("params.yaml")  # every command's --params default


# where a stage computes (tune.device, extract.device, solve.device,
# evaluate.device): auto picks a GPU when one works, each package resolving it
# for its own array library
DEVICES = ("auto", "cpu", "cuda")
Device = Literal[DEVICES]  # type: ignore[valid-type]  # Literal["auto", "cpu", "cuda"]

# protocol.vary names → the seed each one moves: run r adds r to it; the one
# list of those names (`RunSeed` and `protocol.vary`'s default follow it)
RUN_SEEDS = {
    "class_order": ("data", "class_order_seed"),  # which classes form each task
    "missing": ("data", "seed"),  # which samples lose a modality
    "prompts": ("tune", "seed"),  # prompt init, batch order, patch order
    "upsampling": ("solve", "seed"),  # the analytic classifier's W_up
}


@dataclasses.dataclass(frozen=True)
class Source:
    """A params file as one run of the protocol and one ablation variant read it.

    `run` r adds r to each seed that `protocol.vary` names (`RUN_SEEDS`);
    `variant` overlays the section→keys mapping `ablation.<variant>`. Without
    either, the file's sections as written. `os.fspath(source)` is the file.
    """

    path: Path
    run: int | None = None
    variant: str | None = None

    def __fspath__(self) -> str:
        return str(self.path)

    def args(self) -> list[str]:
        """The command-line options that name this source again."""
        out = ["--params", str(self.path)]
        if self.run is not None:
            out += ["--run", str(self.run)]
        if self.variant is not None:
            out += ["--variant", self.variant]
        return out


def _as_run(raw: dict[str, Any], source: Source) -> dict[str, Any]:
    """The sections of `raw` as `source.run` and `source.variant` see them
    (errors name the key, the caller adds the file)."""
    raw = {k: dict(v) if isinstance(v, Mapping) else v for k, v in raw.items()}
    if source.variant is not None:
        changes = variant_row(raw, source.variant).changes
        for section, values in changes.items():
            raw[section] = {**(raw.get(section) or {}), **values}
    if source.run is not None:
        protocol = section_from_mapping(
            ProtocolParams, "protocol", raw.get("protocol", {})
        )
        for name in protocol.vary:
            section, key = RUN_SEEDS[name]
            found = raw.get(section)
            if not isinstance(found, Mapping):
                continue  # a missing section is reported by its loader
            seed = found.get(key, 0)  # every seed defaults to 0
            if isinstance(seed, int) and not isinstance(seed, bool):
                raw[section] = {**found, key: seed + source.run}
            # else: left as written, for the section's own check to name
    return raw


def section_value(source: Source, section: str, key: str) -> Any:
    """The raw value of `section.key` as `source`'s run and variant see it
    (None when absent), for a stage that needs one key of another's section."""
    raw = read_params_file(source.path)
    try:
        values = _as_run(raw, source).get(section)
    except ParamsError as exc:
        raise ParamsError(f"{source.path}: {exc}") from None
    return values.get(key) if isinstance(values, Mapping) else None


def load_section(path: str | Path | Source, section: str, cls: type[T]) -> T:
    """Load `section` of the params file at `path` into the dataclass `cls`;
    for a `Source`, as its run and variant see it."""
    source = path if isinstance(path, Source) else Source(Path(path))
    raw = read_params_file(source.path)
    try:
        raw = _as_run(raw, source)
        if section not in raw:
            raise ParamsError(f"missing section '{section}'")
        return section_from_mapping(cls, section, raw[section])
    except ParamsError as exc:
        raise ParamsError(f"{source.path}: {exc}") from None


def section_from_mapping(cls: type[T], section: str, raw: Any) -> T:
    """Build `cls` from a mapping, checking keys and types (errors name section.key)."""
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ParamsError(f"section '{section}' must be a mapping of keys")
    fields = {
        f.name: f
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]  # T: a params dataclass
        if f.init
    }
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        near = difflib.get_close_matches(unknown[0], list(fields), n=1)
        hint = (
            f"did you mean '{section}.{near[0]}'?"
            if near
            else f"known keys: {', '.join(sorted(fields))}"
        )
        raise ParamsError(f"unknown key '{section}.{unknown[0]}' ({hint})")
    hints = typing.get_type_hints(cls)
    values = {}
    for name, value in raw.items():
        values[name] = _coerce(value, hints[name], f"{section}.{name}")
    try:
        return cls(**values)
    except ParamsError:
        raise
    except TypeError as exc:  # a required field without a default
        raise ParamsError(f"section '{section}': {exc}") from None


RUN_ONLY = {"run_only": True}  # field metadata: changes speed, never a result
# field metadata of a key added after outputs were recorded: the records that
# outputs hold (`outcome_record`) name it only when it differs from its
# default, so the outputs of params that leave it alone keep their bytes
RECORDED_IF_SET = {"recorded_if_set": True}


def outcome_keys(cls: type) -> tuple[str, ...]:
    """The keys of a section dataclass that can change a stage's results: all
    but those marked `metadata=RUN_ONLY` (e.g. DataLoader workers). These are
    the keys a stage's dvc.yaml entry declares and its resume signature holds."""
    return tuple(
        f.name for f in dataclasses.fields(cls) if not f.metadata.get("run_only")
    )


def outcome_record(params: Any) -> dict[str, Any]:
    """`params` as plain JSON-able data, restricted to its `outcome_keys`; a
    `RECORDED_IF_SET` key only when it differs from its default."""
    values = dataclasses.asdict(params)
    unset = {
        f.name
        for f in dataclasses.fields(params)
        if f.metadata.get("recorded_if_set") and values[f.name] == f.default
    }
    return {k: values[k] for k in outcome_keys(type(params)) if k not in unset}


def check(ok: bool, key: str, message: str) -> None:
    """Raise `ParamsError("<key> <message>")` unless `ok`."""
    if not ok:
        raise ParamsError(f"{key} {message}")


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """`value` checked against the annotation `hint` of params key `key`:
    unions, literals and lists here, one value in `_scalar`."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        errors = []
        for a in inner:
            try:
                return _coerce(value, a, key)
            except ParamsError as exc:
                errors.append(str(exc))
        raise ParamsError(errors[0])
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ParamsError(f"{key} must be one of {choices}, got {shown(value)}")
        return value
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ParamsError(f"{key} must be a list, got {shown(value)}")
        item = args[0] if args else Any
        return tuple(_coerce(v, item, f"{key}[{i}]") for i, v in enumerate(value))
    return _scalar(value, hint, key)


def _scalar(value: Any, hint: Any, key: str) -> Any:
    """`value` as a bool, int, float or str hint takes it (a float also from
    YAML 1.1's "1e-4" string), else one line naming `key`."""
    if hint is bool:
        if not isinstance(value, bool):
            raise ParamsError(f"{key} must be true or false, got {shown(value)}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ParamsError(f"{key} must be an integer, got {shown(value)}")
        return value
    if hint is float:
        if isinstance(value, bool):
            raise ParamsError(f"{key} must be a number, got {shown(value)}")
        if isinstance(value, str):  # YAML 1.1 reads "1e-4" as a string
            try:
                value = float(value)
            except ValueError:
                raise ParamsError(
                    f"{key} must be a number, got {shown(value)}"
                ) from None
        if not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ParamsError(f"{key} must be a finite number, got {shown(value)}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ParamsError(f"{key} must be a string, got {shown(value)}")
        return value
    if hint is Any:
        return value
    raise TypeError(f"unsupported params annotation {hint!r} for {key}")


if TYPE_CHECKING:  # a Literal built at run time is a str to the checker
    RunSeed = str
else:
    RunSeed = Literal[tuple(RUN_SEEDS)]


@dataclasses.dataclass(frozen=True)
class ProtocolParams:
    """`protocol:` — the runs the results are averaged over (the paper: 3)."""

    runs: tuple[int, ...] = (0, 1, 2)  # run ids r; run r adds r to each seed in vary
    vary: tuple[RunSeed, ...] = tuple(RUN_SEEDS)  # every seed of RUN_SEEDS

    def __post_init__(self) -> None:
        check(len(self.runs) > 0, "protocol.runs", "must list at least one run")
        check(
            min(self.runs) >= 0 and len(set(self.runs)) == len(self.runs),
            "protocol.runs",
            f"must be distinct ids >= 0, got {list(self.runs)}",
        )
        check(
            len(set(self.vary)) == len(self.vary),
            "protocol.vary",
            f"names a seed twice: {list(self.vary)}",
        )
