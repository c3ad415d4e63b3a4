"""Loading the frozen ViLT backbone from a folder or a cached hub id.

`load_backbone(model.backbone, model.max_text_len)` checks that `model.backbone`
names a ViLT (a local folder, or a hub id in the local HF cache:
`cached_snapshot`), loads `ViltModel` and its `ViltProcessor`, and wraps them
in the prompt-aware encoder `pipeline.model.encoder.Backbone`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from palcore.errors import PalError
from pipeline.model.encoder import Backbone

if TYPE_CHECKING:  # transformers is imported where a model is loaded
    from transformers import ViltModel, ViltProcessor

log = logging.getLogger(__name__)


class BackboneError(PalError):
    """The backbone folder/hub id is missing, not a ViLT, or unreadable."""


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The folder of hub id `repo_id`'s snapshot in the local HF cache (no
    network); None when it is not cached or not a valid id."""
    from huggingface_hub import snapshot_download

    try:
        return Path(
            snapshot_download(repo_id, revision=revision, local_files_only=True)
        )
    except Exception:  # not cached, or not a valid id
        return None


def backbone_folder(name: str) -> Path:
    """The folder `model.backbone` loads from: itself, or for a hub id its
    snapshot in the local HF cache."""
    if Path(name).exists():
        return Path(name)
    folder = cached_snapshot(name)
    if folder is None:
        raise BackboneError(
            f"model.backbone '{name}': no such folder, and no hub model of that id "
            "in the local HF cache"
        )
    return folder


def load_backbone(name: str, max_text_len: int) -> Backbone:
    """Load a frozen ViLT and its processor from a folder or a cached hub id.

    Raises `BackboneError` naming `model.backbone` when the folder does not
    exist (and no cached hub model has that id), is not a ViLT, or fails to
    load.
    """
    where = f"model.backbone '{name}'"
    if Path(name).exists():
        _check_vilt_folder(Path(name), where)
    else:
        _check_vilt_hub_id(name, where)
    vilt, processor, info = _load_vilt(name, where)
    n = sum(1 for _ in vilt.state_dict())
    log.info(
        "loaded ViLT %s: %d layers, hidden %d, %d tensors; ignored %s; "
        "randomly initialised %s",
        name,
        vilt.config.num_hidden_layers,
        vilt.config.hidden_size,
        n,
        _key_groups(info.get("unexpected_keys", [])),
        _key_groups(info.get("missing_keys", [])),
    )
    return Backbone(vilt, processor, name, max_text_len)


def _check_vilt_folder(path: Path, where: str) -> None:
    """A folder whose config.json says model_type vilt, else `BackboneError`."""
    if not path.is_dir():
        raise BackboneError(f"{where}: is a file, expected a ViLT folder")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise BackboneError(f"{where}: not a ViLT folder (no config.json)")
    try:
        model_type = json.loads(config_file.read_text()).get("model_type")
    except (json.JSONDecodeError, OSError) as exc:
        raise BackboneError(f"{where}: unreadable config.json ({exc})") from None
    if model_type != "vilt":
        raise BackboneError(
            f"{where}: not a ViLT (config.json model_type is {model_type!r})"
        )


def _check_vilt_hub_id(name: str, where: str) -> None:
    """A hub id in the local HF cache whose config is a ViLT's."""
    from transformers import AutoConfig

    try:
        model_type = AutoConfig.from_pretrained(name).model_type
    except (OSError, ValueError):
        raise BackboneError(
            f"{where}: no such folder, and no hub model of that id in the local "
            "HF cache"
        ) from None
    if model_type != "vilt":
        raise BackboneError(f"{where}: not a ViLT (model_type {model_type!r})")


def _load_vilt(
    name: str, where: str
) -> tuple[ViltModel, ViltProcessor, dict[str, Any]]:
    """(ViltModel, ViltProcessor, loading info) of a checked folder or hub id;
    HF's multi-line load report is silenced (`load_backbone` logs one line)."""
    from transformers import ViltModel, ViltProcessor
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        loaded = ViltModel.from_pretrained(name, output_loading_info=True)
        # with output_loading_info the call returns (model, loading info), a
        # dict of key sets and lists; its annotation names only the model
        vilt, info = cast("tuple[ViltModel, dict[str, Any]]", loaded)
        processor = ViltProcessor.from_pretrained(name)
    except Exception as exc:  # OSError, SafetensorError, ValueError…: a damaged folder
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc)
        raise BackboneError(
            f"{where}: cannot load the ViLT model or processor ({first})"
        ) from None
    finally:
        hf_logging.set_verbosity(verbosity)
    return vilt, processor, info


def _key_groups(keys) -> str:
    """'mlm_score (6 tensors)' for a list of state-dict keys; 'nothing' if none."""
    groups: dict[str, int] = {}
    for key in keys:
        head = key.split(".")[0] if not key.startswith("vilt.") else key.split(".")[1]
        groups[head] = groups.get(head, 0) + 1
    if not groups:
        return "nothing"
    return ", ".join(f"{k} ({v} tensors)" for k, v in sorted(groups.items()))
