"""`pal backbone`: a hub id's snapshot in the local HF cache as a folder.

`dvc repro` takes `model.backbone` as the stages' dependency path, so it needs
a folder, not a hub id. `pal backbone dandelin/vilt-b32-mlm --link
models/vilt-b32-mlm` finds the id's snapshot in the local HF cache (offline)
and links the folder to it; with `model.backbone: models/vilt-b32-mlm` the
stages then depend on the snapshot's files (DVC follows the link), load them
without asking the Hub, and rerun when the link points at another snapshot.
No stage imports this module.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import click

from palcore.cliutil import clean_errors
from palcore.errors import PalError

log = logging.getLogger(__name__)


class HubError(PalError):
    """The hub id is not in the local HF cache, or the link cannot be made."""


def snapshot(repo_id: str, revision: str | None = None) -> Path:
    """The folder of `repo_id`'s snapshot in the local HF cache (no network)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(repo_id, revision=revision, local_files_only=True)
        )
    except Exception:  # not cached, or not a valid id
        at = f" at revision '{revision}'" if revision else ""
        raise HubError(
            f"'{repo_id}'{at}: not in the local HF cache (on a machine with "
            f"internet: `huggingface-cli download {repo_id}`, then copy the cache "
            "or the folder here)"
        ) from None


def link(repo_id: str, dst: Path, revision: str | None = None) -> Path:
    """Make `dst` a link to the cached snapshot of `repo_id`; returns it.

    An existing link is replaced; an existing folder or file is not touched.
    """
    target = snapshot(repo_id, revision).resolve()
    if dst.exists() or dst.is_symlink():
        if not dst.is_symlink():
            raise HubError(f"{dst}: exists and is no link; remove it or pick another")
        if dst.resolve() == target:
            return target
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f"{dst.name}.tmp-link")
    if tmp.is_symlink():
        tmp.unlink()
    os.symlink(target, tmp, target_is_directory=True)
    os.replace(tmp, dst)
    return target


@click.command("backbone")
@click.argument("repo_id", metavar="HUB_ID")
@click.option(
    "--link",
    "dst",
    required=True,
    type=click.Path(path_type=Path),
    help="The folder to make: a link to the snapshot (e.g. models/vilt-b32-mlm).",
)
@click.option(
    "--revision",
    default=None,
    help="A branch, tag or commit of the cached repo. Default: main.",
)
@clean_errors
def cli(repo_id: str, dst: Path, revision: str | None) -> None:
    """Link a folder to HUB_ID's snapshot in the local HF cache, for
    `model.backbone` under `dvc repro` (which needs a folder)."""
    target = link(repo_id, dst, revision)
    log.info(
        "backbone: %s -> snapshot %s of %s; set model.backbone: %s",
        dst,
        target.name[:12],
        repo_id,
        dst.as_posix(),
    )
