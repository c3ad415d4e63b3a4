"""Params sections of the pipeline stages, as frozen, validated dataclasses.

One dataclass per params.yaml section (`demo`, `data`, `pixels`, `model`,
`prompt`, `tune`, `extract`); the `solve` section lives in `solver.params`. Load
one with `load(path, "data")`; errors name the file and `section.key`.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Literal

from palcore.errors import ParamsError
from palcore.params import RECORDED_IF_SET, RUN_ONLY, Device, check, load_section


@dataclasses.dataclass(frozen=True)
class DemoParams:
    """`demo:` — the synthetic image–text dataset and tiny ViLT of `pal demo`."""

    seed: int = 0  # everything the demo draws comes from this seed
    n_classes: int = 20  # classes of the demo dataset, 4..32
    train_per_class: int = 40  # training samples per class
    val_per_class: int = 0  # validation samples per class
    test_per_class: int = 20  # test samples per class
    image_size: int = 64  # square PNG side, pixels
    image_noise: float = 0.06  # std of the pixel noise, as a fraction of 255
    text_noise: float = 0.1  # probability that a caption names another flavour
    patch_size: int = 8  # ViLT patch side, pixels (image_size / patch_size per axis)
    hidden_size: int = 64  # tiny ViLT width
    num_layers: int = 4  # tiny ViLT depth
    num_heads: int = 4  # tiny ViLT attention heads
    intermediate_size: int = 128  # tiny ViLT MLP width
    # Designs of a gap between pre-training and the demo's classes (bench/README,
    # "Demos with a gap"); the defaults are the committed demo.
    variants: int = 1  # classes per visible class, told apart by texture and cooking
    colour_free: bool = False  # colour drawn per sample; looks are shape + texture
    side_dish: bool = False  # a smaller second object of a random look in a corner
    pretrain_steps: int = 300  # optimiser steps of the backbone pre-training (0: none)
    pretrain_batch: int = 32  # samples per pre-training step
    pretrain_lr: float = 2.0e-3  # AdamW learning rate of the pre-training
    pretrain_drop: float = 0.15  # per modality: chance a pre-training sample lacks it

    def __post_init__(self) -> None:
        for key in (
            "train_per_class",
            "test_per_class",
            "image_size",
            "patch_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "intermediate_size",
            "pretrain_batch",
        ):
            value = getattr(self, key)
            check(value > 0, f"demo.{key}", f"must be > 0, got {value}")
        check(
            4 <= self.n_classes <= 32,
            "demo.n_classes",
            f"must lie in [4, 32], got {self.n_classes}",
        )
        check(self.val_per_class >= 0, "demo.val_per_class", "must be >= 0")
        check(self.pretrain_steps >= 0, "demo.pretrain_steps", "must be >= 0")
        check(self.pretrain_lr > 0, "demo.pretrain_lr", "must be > 0")
        check(
            self.image_size % self.patch_size == 0,
            "demo.image_size",
            f"must be a multiple of demo.patch_size ({self.patch_size})",
        )
        check(
            self.hidden_size % self.num_heads == 0,
            "demo.hidden_size",
            f"must be divisible by demo.num_heads ({self.num_heads})",
        )
        check(
            1 <= self.variants <= 3,
            "demo.variants",
            f"must lie in [1, 3], got {self.variants}",
        )
        check(
            self.n_classes % self.variants == 0 and self.n_classes >= 4 * self.variants,
            "demo.n_classes",
            f"must be a multiple of demo.variants ({self.variants}) and at least "
            f"{4 * self.variants}, got {self.n_classes}",
        )
        check(
            not (self.colour_free and self.variants > 1),
            "demo.colour_free",
            "cannot be combined with demo.variants > 1 (both take over texture)",
        )
        for key in ("image_noise", "text_noise"):
            value = getattr(self, key)
            check(
                0.0 <= value <= 1.0, f"demo.{key}", f"must lie in [0, 1], got {value}"
            )
        check(
            0.0 <= self.pretrain_drop <= 0.5,
            "demo.pretrain_drop",
            f"must lie in [0, 0.5], got {self.pretrain_drop}",
        )


# the dataset readers (`pipeline.data.datasets.READERS` has one each); files:
# a listing beside the images, the layout of a dataset of one's own
Dataset = Literal["demo", "food101", "n24news", "mmimdb", "files"]
MissingType = Literal["none", "text", "image", "both"]


@dataclasses.dataclass(frozen=True)
class DataParams:
    """`data:` — which dataset, its task split and the missing-modality protocol."""

    dataset: Dataset = "demo"  # demo, food101, n24news, mmimdb or files (a listing)
    root: str = "data/demo/dataset"  # dataset folder
    tasks: int = 5  # number of tasks K; classes split evenly in class order
    class_order_seed: int = 0  # seed of the class order (task assignment)
    missing_type: MissingType = "both"  # which modality goes missing
    missing_rate: float = 0.7  # fraction of each (task, split) with a modality missing
    seed: int = 0  # seed of the missing tables
    text_field: str = "headline"  # N24News text: a field, or several joined by "+"
    test_missing_type: MissingType | None = None  # test split; None: missing_type
    test_missing_rate: float | None = None  # test split; None: missing_rate
    # image file absent or text empty: keep as naturally missing (code set,
    # counted toward the table; a sample lacking both is dropped and reported),
    # or reject with an error
    absent: Literal["missing", "reject"] = "missing"
    # tasks need not divide the classes: the first C mod K tasks get one more
    allow_uneven: bool = False
    # keep at most this many samples per class and split (the first by id): a
    # small run of a real dataset, e.g. on a CPU
    per_class: int | None = None
    # MM-IMDb (multi-label): keep the genres most frequent in the training
    # split, this many (RebQ: 20 of the 23); null: every genre. Newer than
    # the prepare outputs: tasks.json names it only when set
    label_count: int | None = dataclasses.field(default=None, metadata=RECORDED_IF_SET)

    def __post_init__(self) -> None:
        check(self.tasks > 0, "data.tasks", f"must be > 0, got {self.tasks}")
        if self.label_count is not None:
            check(
                self.label_count > 0,
                "data.label_count",
                f"must be > 0 (or null: every label), got {self.label_count}",
            )
        if self.per_class is not None:
            check(
                self.per_class > 0,
                "data.per_class",
                f"must be > 0 (or null: every sample), got {self.per_class}",
            )
        check(self.seed >= 0, "data.seed", f"must be >= 0, got {self.seed}")
        check(
            self.class_order_seed >= 0,
            "data.class_order_seed",
            f"must be >= 0, got {self.class_order_seed}",
        )
        fields = ("headline", "abstract", "caption", "body", "article")
        check(
            all(f.strip() in fields for f in self.text_field.split("+")),
            "data.text_field",
            f"must be one of {', '.join(fields)} or several "
            f"joined by '+', got {self.text_field!r}",
        )
        check(
            0.0 <= self.missing_rate <= 1.0,
            "data.missing_rate",
            f"must lie in [0, 1], got {self.missing_rate}",
        )
        if self.test_missing_rate is not None:
            check(
                0.0 <= self.test_missing_rate <= 1.0,
                "data.test_missing_rate",
                f"must lie in [0, 1], got {self.test_missing_rate}",
            )


@dataclasses.dataclass(frozen=True)
class ModelParams:
    """`model:` — the frozen ViLT backbone."""

    backbone: str = "data/demo/vilt"  # local folder or hub id (dandelin/vilt-b32-mlm)
    max_text_len: int = 40  # text tokens; above 40 the position table is interpolated

    def __post_init__(self) -> None:
        check(
            self.max_text_len >= 2,
            "model.max_text_len",
            f"must be >= 2, got {self.max_text_len}",
        )


# The prompt methods (DESIGN §5): a method is one module of pipeline/methods
# that declares `METHOD = <its Method subclass>`; the module's file name is its
# `prompt.method` name. The names are read from the files (no import: params
# load without torch); `pipeline.methods.registry` imports a module when its
# method is built.
METHODS_FOLDER = Path(__file__).resolve().parent / "methods"
# PAL, then the paper's baselines in its order: the order of every list of
# methods (tables, cards, contracts); any other method follows, alphabetically
PAPER_METHODS = ("pal", "map", "msp", "rebq", "l2p", "dualprompt")


def method_names(folder: Path = METHODS_FOLDER) -> tuple[str, ...]:
    """Every prompt method's name: the stems of the modules in `folder` (not
    `_*.py`) that assign `METHOD` at their top level, `PAPER_METHODS` first."""
    found = {
        path.stem
        for path in folder.glob("*.py")
        if not path.stem.startswith("_") and _declares_method(path)
    }
    paper = [name for name in PAPER_METHODS if name in found]
    return (*paper, *sorted(found - set(paper)))


def check_method(name: str) -> None:
    """`ParamsError` unless `name` is a prompt method's name."""
    names = method_names()
    check(
        name in names,
        "prompt.method",
        f"must be one of {', '.join(map(repr, names))}, got {name!r}",
    )


def _declares_method(path: Path) -> bool:
    stat = path.stat()
    return _assigns_method(str(path), stat.st_mtime_ns, stat.st_size)


@functools.cache  # keyed on the file's time and size: an edit reads it again
def _assigns_method(path: str, mtime_ns: int, size: int) -> bool:
    import ast

    try:
        tree = ast.parse(Path(path).read_bytes(), path)
    except SyntaxError as err:
        raise ParamsError(
            f"{path}: not Python (line {err.lineno}: {err.msg}), so no "
            "prompt method can be listed"
        ) from None
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        if any(isinstance(t, ast.Name) and t.id == "METHOD" for t in targets):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class PromptParams:
    """`prompt:` — the prompt method and its prompts (PAL: CODA-style pools)."""

    enabled: bool = True  # false: frozen features only (the ACIL baseline)
    method: str = "pal"  # the prompt method: a module of pipeline/methods (DESIGN §5)
    pools: Literal["modality", "shared", "vector"] = "modality"  # ablation variants
    pool_size: int = 20  # components N per pool; N // K per task
    length: int = 8  # prompt tokens L_p per layer (prefix: L_p/2 keys, L_p/2 values)
    layers: tuple[int, ...] = (0, 1)  # encoder layers that get prompts
    position: Literal["prefix", "input"] = "prefix"  # prefix-tuning or input tokens
    top_n: int = 5  # l2p: prompts each sample takes from the pool (N of top-N)
    g_layers: tuple[int, ...] = (0, 1)  # dualprompt: the G-prompt's layers
    g_length: int = 10  # dualprompt: G-prompt tokens per layer (half keys, half values)

    def __post_init__(self) -> None:
        check_method(self.method)
        check(
            self.pool_size > 0, "prompt.pool_size", f"must be > 0, got {self.pool_size}"
        )
        check(self.length > 0, "prompt.length", f"must be > 0, got {self.length}")
        check(
            self.position != "prefix" or self.length % 2 == 0,
            "prompt.length",
            f"must be even for prefix prompts, got {self.length}",
        )
        check(self.top_n > 0, "prompt.top_n", f"must be > 0, got {self.top_n}")
        check(
            self.g_length > 0 and self.g_length % 2 == 0,
            "prompt.g_length",
            f"must be even and > 0 (keys, values), got {self.g_length}",
        )
        check(
            len(set(self.g_layers)) == len(self.g_layers)
            and min(self.g_layers, default=0) >= 0,
            "prompt.g_layers",
            f"must be distinct layer indices >= 0, got {list(self.g_layers)}",
        )
        check(len(self.layers) > 0, "prompt.layers", "must list at least one layer")
        check(
            len(set(self.layers)) == len(self.layers) and min(self.layers) >= 0,
            "prompt.layers",
            f"must be distinct layer indices >= 0, got {list(self.layers)}",
        )

    def check_depth(self, depth: int) -> None:
        """Every prompt layer must exist in a backbone of `depth` layers."""
        too_deep = [layer for layer in self.layers if layer >= depth]
        if too_deep:
            raise ParamsError(
                f"prompt.layers {list(self.layers)}: layer {too_deep[0]} is "
                f"beyond the backbone's {depth} layers (0..{depth - 1})"
            )


@dataclasses.dataclass(frozen=True)
class TuneParams:
    """`tune:` — per-task prompt tuning by backprop."""

    epochs: int = 3  # epochs per task; 0: prompts and head stay at their init
    batch_size: int = 4  # samples per optimiser step (before reconstruction copies)
    lr: float = 1e-4  # AdamW learning rate
    head_lr: float | None = None  # the head's learning rate (None: same as lr)
    weight_decay: float = 0.0  # AdamW weight decay (active slice and head only)
    warmup: float = 0.1  # fraction of a task's steps spent in linear warm-up
    # the lr after warm-up: cosine to 0, or kept ("none"); AdamW's beta2 (beta1
    # 0.9); the max global gradient norm (None: no clipping). Added after tune's
    # outputs were first recorded: named in them only when set (RECORDED_IF_SET)
    decay: Literal["cosine", "none"] = dataclasses.field(
        default="cosine", metadata=RECORDED_IF_SET
    )
    beta2: float = dataclasses.field(default=0.98, metadata=RECORDED_IF_SET)
    clip_norm: float | None = dataclasses.field(default=None, metadata=RECORDED_IF_SET)
    recon_weight: float = 0.01  # λ, weight of the reconstruction loss
    # beyond the paper, 0 (the paper): the prompts train in every task; n > 0:
    # only in the first n tasks, later tasks add their slices at init and train
    # their head rows only, so old features stay as the analytic classifier saw
    # them (first-session adaptation)
    prompt_tasks: int = 0
    seed: int = 0  # seed of prompt init, batch order and patch order
    device: Device = "auto"  # auto: cuda when available
    cuda_graphs: bool = True  # on a GPU, replay each training step as a CUDA graph
    # DataLoader workers decoding images (run-only: batches are the same)
    num_workers: int = dataclasses.field(default=0, metadata=RUN_ONLY)

    def __post_init__(self) -> None:
        check(self.epochs >= 0, "tune.epochs", f"must be >= 0, got {self.epochs}")
        check(
            self.batch_size > 0,
            "tune.batch_size",
            f"must be > 0, got {self.batch_size}",
        )
        check(self.lr > 0, "tune.lr", f"must be > 0, got {self.lr}")
        check(
            self.head_lr is None or self.head_lr > 0,
            "tune.head_lr",
            f"must be > 0, got {self.head_lr}",
        )
        check(self.weight_decay >= 0, "tune.weight_decay", "must be >= 0")
        check(0.0 <= self.warmup < 1.0, "tune.warmup", "must lie in [0, 1)")
        check(self.recon_weight >= 0, "tune.recon_weight", "must be >= 0")
        check(0.0 < self.beta2 < 1.0, "tune.beta2", "must lie in (0, 1)")
        check(
            self.clip_norm is None or self.clip_norm > 0,
            "tune.clip_norm",
            f"must be > 0 or null, got {self.clip_norm}",
        )
        check(self.prompt_tasks >= 0, "tune.prompt_tasks", "must be >= 0")
        check(self.num_workers >= 0, "tune.num_workers", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class ExtractParams:
    """`extract:` — dumping the prompted joint embeddings into shards."""

    batch_size: int = 32  # samples per forward pass
    dtype: Literal["float32", "float16"] = "float32"  # stored feature dtype
    device: Device = "auto"  # auto: cuda when available
    # ranks (GPUs); > 1: `pal extract` relaunches itself under torch.distributed.run
    # and each rank writes its own part files (same bytes as one shard)
    processes: int = 1
    # DataLoader workers decoding images (run-only: batches are the same)
    num_workers: int = dataclasses.field(default=0, metadata=RUN_ONLY)

    def __post_init__(self) -> None:
        check(self.processes > 0, "extract.processes", "must be > 0")
        check(
            self.batch_size > 0,
            "extract.batch_size",
            f"must be > 0, got {self.batch_size}",
        )
        check(self.num_workers >= 0, "extract.num_workers", "must be >= 0")


@dataclasses.dataclass(frozen=True)
class PixelsParams:
    """`pixels:` — the pixel cache of `pal pixels`: every listed image decoded
    and resized once, read by tune and extract instead of decoding."""

    # false: no cache (the folder holds a marker), tune and extract decode each
    # image every time they load it; true costs the disk 3·h·w bytes an image
    # (Food101 at ViLT-B/32's size: about 52 GB)
    enabled: bool = True
    # decoding processes (run-only: the cache's bytes are the same); 0: one a core
    workers: int = dataclasses.field(default=0, metadata=RUN_ONLY)

    def __post_init__(self) -> None:
        check(self.workers >= 0, "pixels.workers", f"must be >= 0, got {self.workers}")


SECTIONS = {
    "demo": DemoParams,
    "data": DataParams,
    "pixels": PixelsParams,
    "model": ModelParams,
    "prompt": PromptParams,
    "tune": TuneParams,
    "extract": ExtractParams,
}


def load(path: str | Path, section: str):
    """Load one pipeline section of the params file at `path`."""
    return load_section(path, section, SECTIONS[section])


def data_root(path: str | Path) -> str | None:
    """`data.root` of the params file at `path` (a `Source` too), None when it
    has no `data` section (tune and extract then take the root an older
    prepare folder recorded). Tune and extract read this one key to find the
    images, and on purpose declare no dependency on it: where the data is
    kept changes no result, what it holds reaches them through tasks.json's
    digest of the images (DESIGN §2)."""
    import os

    from palcore.errors import ParamsError
    from palcore.paramsfile import read_params_file

    section = read_params_file(os.fspath(path)).get("data")
    if section is None:
        return None
    root = section.get("root", DataParams.root) if isinstance(section, dict) else None
    if not isinstance(root, str) or not root:
        raise ParamsError(f"{os.fspath(path)}: data.root must be a folder path")
    return root
