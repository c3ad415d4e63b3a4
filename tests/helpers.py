"""Tiny offline test data for the model tests: a ViLT folder, a prepare folder,
a model and a params file, each built in a temporary folder in well under a
second. The session fixtures built from them live in conftest.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

from pipeline.fakes.trees import WORDS, make_hub_vilt, tiny_config  # noqa: F401

ROOT = Path(__file__).resolve().parents[1]


def committed(rel: str) -> str:
    """The text of the repository file `rel` as committed at HEAD.

    Tests check the committed params and results, never the workspace's
    copies: the README's `dvc exp run -S solve.eta=0.1` leaves a changed
    params.yaml and new results there, and `make test` must still pass.
    """
    return subprocess.run(
        ["git", "show", f"HEAD:{rel}"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        encoding="utf-8",
    ).stdout


def committed_params() -> dict:
    """The committed params.yaml, loaded."""
    return yaml.safe_load(committed("params.yaml"))


def committed_files(folder: str) -> list[str]:
    """The paths of the files committed at HEAD directly under `folder`."""
    out = subprocess.run(
        ["git", "ls-tree", "--name-only", "HEAD", f"{folder.rstrip('/')}/"],
        cwd=ROOT,
        capture_output=True,
        check=True,
        encoding="utf-8",
    ).stdout
    return out.split()


COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (30, 40, 220),
    "yellow": (230, 220, 20),
}
CLASSES = ["red cat", "green dog", "blue bird", "yellow fish", "red car", "blue tree"]


def make_vilt(
    folder: Path,
    *,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    image: int = 32,
    patch: int = 8,
    seed: int = 0,
) -> Path:
    """Save a random tiny ViLT + processor (BertTokenizer, PIL image processor)."""
    import torch
    from transformers import (
        BertTokenizer,
        ViltImageProcessorPil,
        ViltModel,
        ViltProcessor,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    cfg = tiny_config(folder, hidden, layers, heads, image, patch)
    torch.manual_seed(seed)
    ViltModel(cfg).eval().save_pretrained(folder)
    tok = BertTokenizer(
        vocab=str(folder / "vocab.txt"), do_lower_case=True, model_max_length=40
    )
    ip = ViltImageProcessorPil(
        size={"shortest_edge": image}, size_divisor=patch, do_pad=True
    )
    ViltProcessor(image_processor=ip, tokenizer=tok).save_pretrained(folder)
    return folder


def make_prepare(
    folder: Path,
    *,
    n_tasks: int = 3,
    classes: int = 6,
    train: int = 6,
    test: int = 3,
    side: int = 32,
    seed: int = 0,
    missing_rate: float = 0.5,
) -> Path:
    """A dataset root with PNG images and its prepare outputs (DESIGN contract).

    Class c (task c // (classes / n_tasks) + 1) has images of one colour with
    noise and texts naming it; a seeded half of each split misses text or image.
    """
    from PIL import Image

    rng = np.random.default_rng(seed)
    root = folder / "dataset"
    (root / "images").mkdir(parents=True, exist_ok=True)
    per_task = classes // n_tasks
    rows = []
    for split, count in (("train", train), ("test", test)):
        for label in range(classes):
            name = CLASSES[label]
            colour = np.array(COLOURS[name.split()[0]], dtype=float)
            for i in range(count):
                sid = f"{split}-{label}-{i}"
                pix = np.clip(
                    colour
                    + rng.normal(0, 25, (side, side, 3))
                    + 60 * (label % 2) * np.eye(side)[..., None],
                    0,
                    255,
                )
                rel = f"images/{sid}.png"
                Image.fromarray(pix.astype(np.uint8)).save(root / rel)
                code = 0
                if rng.random() < missing_rate:
                    code = 1 if rng.random() < 0.5 else 2
                rows.append(
                    {
                        "id": sid,
                        "split": split,
                        "task": label // per_task + 1,
                        "label": label,
                        "class_name": name,
                        "image": rel,
                        "text": f"a photo of the {name}",
                        "missing": code,
                    }
                )
    out = folder / "prepare"
    out.mkdir(parents=True, exist_ok=True)
    with (out / "samples.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    tasks = [
        {"task": k + 1, "labels": list(range(k * per_task, (k + 1) * per_task))}
        for k in range(n_tasks)
    ]
    (out / "tasks.json").write_text(
        json.dumps(
            {
                "class_order": CLASSES[:classes],
                "tasks": tasks,
                "data": {"root": str(root), "tasks": n_tasks},
            }
        )
    )
    return out


# the fixtures' prompt params: small pools at both layers of the tiny ViLT
PROMPT = {
    "enabled": True,
    "pools": "modality",
    "pool_size": 6,
    "length": 4,
    "layers": [0, 1],
    "position": "prefix",
}


def make_model(backbone, tasks, steps: int = 1, **prompt):
    """A PalModel on `backbone` with `PROMPT` (overridden by `prompt`) and the
    first `steps` tasks added."""
    import torch

    from pipeline.methods import build_model
    from pipeline.params import PromptParams

    params = {**PROMPT, "layers": tuple(PROMPT["layers"]), **prompt}
    model = build_model(backbone, PromptParams(**params), tasks.classes_per_task)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        model.add_task(g)
    return model


def random_head(model) -> None:
    """Give `model`'s head random rows (seed 1, std 0.3), so the loss's
    gradient reaches the prompts (a zero head passes none back)."""
    import torch

    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.head.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def two_epochs(model, cache, dummy, task: int, batches, rows: int, graphed: bool):
    """Two epochs of PAL's static step (λ 0.01, AdamW at lr 1e-2, halved in
    the second) over `batches`, each as static inputs of `rows` rows:
    replayed as CUDA graphs (`graphed`, at most 2 shapes) or run eagerly.
    Returns (the trained parameters on the CPU, each step's `ce`, the graph
    runner or None)."""
    from pipeline.model.device import autocast
    from pipeline.model.graphs import GraphedSteps, capturable_adamw, set_lr
    from pipeline.model.losses import static_inputs, static_loss

    params = model.trainable_parameters()
    device = model.backbone.device
    opt = capturable_adamw([{"params": params, "lr": 1e-2}], device)

    def step(inputs):
        with autocast(device, cache_enabled=False):
            loss, parts = static_loss(model, inputs, cache, dummy, task, 0.01)
        loss.backward()
        opt.step()
        return parts

    runner = GraphedSteps(step, opt, max_graphs=2) if graphed else None
    ces = []
    for epoch in range(2):
        for batch in batches:
            set_lr(opt, [1e-2 / (epoch + 1)])
            with autocast(device):
                inputs = static_inputs(model, batch, rows)
            if runner is not None:
                parts = runner(inputs)
            else:
                opt.zero_grad(set_to_none=True)
                parts = step(inputs)
            ces.append(parts["ce"].item())
    return [p.detach().float().cpu() for p in params], ces, runner


def sync_counter():
    """A dispatch mode (enter it with `with`) whose `syncs` lists, by aten
    name, the ops run inside it that make the host wait for the device
    (`pipeline.model.vision.SYNC_OPS`) and boolean-mask indexing (a hidden
    `nonzero`). It sees the ops on the CPU too, so CPU tests catch them."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from pipeline.model import vision

    class SyncCounter(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.syncs: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func._schema.name.replace("::", ".")
            bool_index = name == "aten.index" and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool
                for i in (args[1] if len(args) > 1 else [])
                if i is not None
            )
            if name in vision.SYNC_OPS or bool_index:
                self.syncs.append(name)
            return func(*args, **(kwargs or {}))

    return SyncCounter()


def write_params(path: Path, backbone: Path, **sections) -> Path:
    """A params.yaml for tune/extract tests; `sections` override keys."""
    params = {
        "model": {"backbone": str(backbone), "max_text_len": 12},
        "prompt": dict(PROMPT),
        "tune": {
            "epochs": 1,
            "batch_size": 4,
            "lr": 1e-3,
            "recon_weight": 0.01,
            "seed": 0,
            "device": "cpu",
        },
        "extract": {"batch_size": 8, "dtype": "float32", "device": "cpu"},
    }
    for section, values in sections.items():
        params[section].update(values)
    path.write_text(yaml.safe_dump(params))
    return path


def heavy_modules_after(imports: str) -> list[str]:
    """Which of torch, transformers a fresh interpreter has loaded after
    running `imports` (e.g. "import solver.cli")."""
    import subprocess
    import sys

    code = (
        f"import sys; {imports}; "
        "print(','.join(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    return [m for m in r.stdout.strip().split(",") if m]


def pal_paper(
    cwd: Path, env: dict[str, str], *args: str
) -> subprocess.CompletedProcess:
    """`pal-paper ARGS` run by its path in the venv, in `cwd` with `env`."""
    return subprocess.run(
        [str(Path(sys.executable).parent / "pal-paper"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
    )


def flip_keeping_mtime(path: Path) -> None:
    """One bit of the middle byte flipped, the mtime as it was (disk rot,
    `rsync -t`): DVC, which trusts mtime and size, sees no change."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


# PAL's classification pass as pipeline/methods/pal.py writes it: tests that
# edit it (to move PAL's outputs) assert it is there first, so an edit that
# finds nothing fails instead of testing unchanged code
PAL_JOINT = "return backbone.encode(h, mask, prompts, read=(0,))[:, 0].float()"


def reproduced_as_committed(clone: Path, env: dict[str, str] | None = None) -> str:
    """'' when a clone's `dvc repro` keeps the rule for results (DESIGN §2,
    "The same output"): the committed bytes, or, on a CPU kind that takes
    other float paths, only dvc.lock's hashes and results/demo moved, the
    headline results within `pal-solver compare`'s tolerance; else what broke
    it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=clone, capture_output=True, text=True, env=env
        ).stdout

    other = git("status", "--porcelain", "--", ".", ":!dvc.lock", ":!results/demo")
    if other:
        return f"dirty beyond dvc.lock and results/demo: {other}"
    lock = lock_moves(clone, env)
    if lock:
        return f"dvc.lock moved beyond its hashes: {lock[:3]}"
    done = subprocess.run(
        [str(Path(sys.executable).parent / "pal-solver"), "compare", "--check"],
        cwd=clone,
        capture_output=True,
        text=True,
        env=env,
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def lock_moves(clone: Path, env: dict[str, str] | None = None) -> list[str]:
    """The lines of dvc.lock's diff from HEAD other than hashes and sizes
    (what another CPU kind moves): params, commands, paths."""
    diff = subprocess.run(
        ["git", "diff", "-U0", "dvc.lock"],
        cwd=clone,
        capture_output=True,
        text=True,
        env=env,
    ).stdout
    return [
        line
        for line in diff.splitlines()
        if line[:2] in ("- ", "+ ")
        and line[1:].strip().split(":")[0] not in ("md5", "size", "nfiles")
    ]


def table_means_close(got: str, want: str, tolerance: float) -> str:
    """'' when two markdown tables have the same rows and labels and every
    'mean ± std' cell's mean within `tolerance` points; else the first
    difference."""
    a, b = got.strip().splitlines(), want.strip().splitlines()
    if len(a) != len(b):
        return f"{len(a)} lines against {len(b)}"
    for x, y in zip(a, b, strict=True):
        cx, cy = x.split("|"), y.split("|")
        if len(cx) != len(cy):
            return f"{x!r} against {y!r}"
        for p, q in zip(cx, cy, strict=True):
            if "±" not in p or "±" not in q:
                if p.strip() != q.strip():
                    return f"{x!r} against {y!r}"
            elif abs(float(p.split("±")[0]) - float(q.split("±")[0])) > tolerance:
                return f"{x!r} against {y!r}: beyond {tolerance} points"
    return ""
