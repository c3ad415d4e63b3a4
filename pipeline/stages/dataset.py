"""`pal dataset NAME`: a dataset's run on its own git branch; `pal dataset
demo` goes back.

A dataset's run changes params.yaml whole (a preset differs from the demo in
dozens of keys) and writes its own dvc.lock. On the branch the project was on
(its *home*, `main` in a clone) that would rewrite the demo's tracked files, so
each dataset gets a branch, `dataset/NAME`, made from home with params.yaml
copied from `configs/NAME.yaml` (or `--params FILE`, a researcher's own) and
committed. There `dvc repro`, `dvc exp run -S key=value` sweeps and `pal-paper`
grids work as on the demo, every experiment a one-line change of that branch's
params.yaml; DVC's cache is the checkout's, shared by every branch, so going
back and forth reruns nothing.

Leaving a dataset's branch commits its run record there (params.yaml,
dvc.lock and what the run and its grids wrote under results/: what a run
puts in git), so coming back finds it and nothing of it follows you to the
demo; any other uncommitted change of a tracked file stops the switch with
one line naming it. After each switch `dvc checkout` puts the branch's outputs back
from the cache.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
import yaml

from palcore.cliutil import clean_errors
from palcore.errors import PalError

PREFIX = "dataset/"
HOME_KEY = "pal.home"  # git config (local): the branch `pal dataset demo` goes to
# what a run changes in git: its params, its lock, and the reports under
# results/ (evaluate's, uncached by DVC; pal-paper's tables)
RUN_RECORD = ("params.yaml", "dvc.lock", "results")


class DatasetSwitchError(PalError):
    """The switch cannot be made without losing or mixing work."""


def git(root: Path, *args: str, check: bool = True, strip: bool = True) -> str:
    """Run git in `root`; its stdout (stripped). A failure is one line."""
    done = subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=False
    )
    if check and done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise DatasetSwitchError(f"git {' '.join(args)}: {last}")
    return done.stdout.strip() if strip else done.stdout


def current_branch(root: Path) -> str:
    name = git(root, "branch", "--show-current")
    if not name:
        raise DatasetSwitchError(
            "git: HEAD is detached: `git switch` to a branch first"
        )
    return name


def home_branch(root: Path) -> str:
    """The branch `pal dataset demo` returns to: recorded when the first
    dataset branch was made from it, else `main`."""
    return git(root, "config", "--get", HOME_KEY, check=False) or "main"


def changed_tracked(root: Path) -> list[str]:
    """Tracked files with uncommitted changes (staged or not); a staged
    rename or copy names its new path, then its source."""
    out = git(root, "status", "--porcelain", "-z", "--untracked-files=no", strip=False)
    entries = iter(out.split("\0"))
    paths = []
    for entry in entries:
        if not entry.strip():
            continue
        paths.append(entry[3:])
        if {"R", "C"} & set(entry[:2]):  # -z: the source follows, unprefixed
            paths.append(next(entries))
    return paths


def leave(root: Path, branch: str) -> None:
    """Make the branch safe to leave: on a dataset's branch, commit its run
    record; anything else uncommitted stops the switch."""
    changed = changed_tracked(root)
    others = [f for f in changed if not _recorded(f)]
    if others or (changed and not branch.startswith(PREFIX)):
        raise DatasetSwitchError(
            f"{branch}: uncommitted changes to {', '.join(others or changed)}: "
            "commit or `git stash` them first"
        )
    if not branch.startswith(PREFIX):
        return
    present = [p for p in RUN_RECORD if (root / p).exists() or git(root, "ls-files", p)]
    git(root, "add", "-A", "--", *present)
    staged = git(root, "diff", "--cached", "--name-only", "-z").split("\0")
    staged = [path for path in staged if path]
    if staged:
        git(root, "commit", "-q", "-m", f"{branch[len(PREFIX) :]}: the run's record")
        click.echo(f"{branch}: committed the run's record ({len(staged)} files)")


def _recorded(path: str) -> bool:
    """Whether `path` is part of a run's record (RUN_RECORD)."""
    return path in RUN_RECORD or path.startswith("results/")


def preset(root: Path, name: str, params: Path | None) -> Path:
    """The params file a new dataset branch starts from."""
    path = params if params is not None else root / "configs" / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (root / "configs").glob("*.yaml"))
        raise DatasetSwitchError(
            f"{path}: no such params file (presets: {', '.join(known)}; "
            "--params FILE for your own)"
        )
    return path


def enter(root: Path, name: str, params: Path | None, settings: Sequence[str]) -> str:
    """Switch to `dataset/NAME`, making it from home when new."""
    branch = PREFIX + name
    if git(root, "branch", "--list", branch):
        if params is not None or settings:
            raise DatasetSwitchError(
                f"{branch}: exists already; --params and -S only make a new one "
                "(edit its params.yaml there, or `git branch -D` it first)"
            )
        git(root, "switch", "-q", branch)
        return branch
    source = preset(root, name, params)
    text = with_settings(source, settings)
    git(root, "switch", "-q", "-c", branch, home_branch(root))
    (root / "params.yaml").write_text(text, encoding="utf-8")
    git(root, "add", "params.yaml")
    changed = f", {len(settings)} keys set" if settings else ""
    git(root, "commit", "-q", "-m", f"{name}: params.yaml from {source.name}{changed}")
    click.echo(f"{branch}: new, params.yaml from {source}{changed}")
    return branch


def with_settings(source: Path, settings: Sequence[str]) -> str:
    """The text of params file `source` with each `KEY=VALUE` of `settings`
    set (VALUE read as YAML, as `dvc exp run -S` reads it), comments and
    order kept. KEY must name a key the file has: a misspelt one is one
    line, not a new key nothing reads."""
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DatasetSwitchError(f"{source}: not UTF-8 text") from None
    if not settings:
        return text
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    rt = YAML()
    try:
        doc = rt.load(text)
    except YAMLError:
        raise DatasetSwitchError(f"{source}: not valid YAML") from None
    for setting in settings:
        key, eq, value = setting.partition("=")
        *parents, last = key.split(".")
        node = doc
        for part in parents:
            node = node.get(part) if hasattr(node, "get") else None
        if not eq or not hasattr(node, "get") or last not in node:
            raise DatasetSwitchError(
                f"-S {setting}: {source.name} has no key '{key}' (KEY=VALUE)"
            )
        try:
            node[last] = _flow(yaml.safe_load(value))
        except yaml.YAMLError:
            raise DatasetSwitchError(
                f"-S {setting}: '{value}' is not a YAML value"
            ) from None
    out = io.StringIO()
    rt.dump(doc, out)
    return out.getvalue()


def _flow(value: Any) -> Any:
    """A list or mapping set on one line (`[0, 1]`), as it was typed."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(value, (list, dict)):
        node = CommentedSeq(value) if isinstance(value, list) else CommentedMap(value)
        node.fa.set_flow_style()
        return node
    return value


def checkout_outputs(root: Path) -> None:
    """`dvc checkout`: the branch's outputs back from DVC's cache."""
    beside = Path(sys.executable).parent / "dvc"  # the venv's, unactivated
    dvc = str(beside) if beside.exists() else shutil.which("dvc") or "dvc"
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    try:
        done = subprocess.run(
            [dvc, "checkout", "-q"], cwd=root, capture_output=True, text=True, env=env
        )
    except FileNotFoundError:
        raise DatasetSwitchError(
            "dvc: not found: install the project (README)"
        ) from None
    if done.returncode != 0:
        click.echo(
            "dvc checkout: some outputs of this branch are not in the cache "
            "(`dvc repro` makes them, `dvc pull` fetches them)"
        )


def switch(
    root: Path, name: str, params: Path | None, settings: Sequence[str] = ()
) -> str:
    """The switch `pal dataset NAME` makes; the branch it lands on."""
    here = current_branch(root)
    if name == "demo":
        target = home_branch(root)
        if params is not None or settings:
            raise DatasetSwitchError(
                "demo: its params are its branch's (no --params, -S)"
            )
    else:
        target = PREFIX + name
    if here == target:
        click.echo(f"{here}: already here")
        return here
    leave(root, here)
    if not here.startswith(PREFIX):
        git(root, "config", HOME_KEY, here)
    if name == "demo":
        git(root, "switch", "-q", target)
    else:
        enter(root, name, params, settings)
    checkout_outputs(root)
    return target


@click.command(name="dataset")
@click.argument("name")
@click.option(
    "--params",
    "params_file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A new dataset branch's params file (default: configs/NAME.yaml).",
)
@click.option(
    "-S",
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Set a key of a new branch's params.yaml (data.root=data/raw/mine), "
    "as `dvc exp run -S` does; repeatable.",
)
@clean_errors
def cli(name: str, params_file: Path | None, settings: tuple[str, ...]) -> None:
    """Switch to dataset NAME's branch (`dataset/NAME`), or back with `demo`.

    NAME is a preset of configs/ (food101, n24news) or any name with --params
    FILE: the first switch makes the branch from the demo's branch (the one
    you leave, `main` in a clone), with params.yaml from the file and the
    -S KEY=VALUE settings, committed.
    There `pal check`, `dvc repro`, `dvc exp run -S` and `pal-paper` run as
    on the demo, without touching the demo's branch. Leaving commits the
    run's record there (params.yaml, dvc.lock, results/); `pal dataset demo`
    goes back, and `dvc checkout` puts each
    branch's outputs back from DVC's cache, so nothing is rerun.
    """
    if "/" in name or name.startswith("-") or not name.strip():
        raise DatasetSwitchError(f"'{name}': a dataset name is one word (food101)")
    root = Path(git(Path.cwd(), "rev-parse", "--show-toplevel"))
    if params_file is not None:
        params_file = params_file.resolve()
    branch = switch(root, name, params_file, settings)
    click.echo(f"on {branch}: `pal check` then `dvc repro` runs its pipeline")
