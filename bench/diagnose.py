"""Why the prompts help or hurt the analytic classifier: the numbers of a run.

For a finished tune + extract (default: the demo's data/), per task i:

- drift: how far task i's test features move from the step that learnt the
  task to the last step, mean ‖x_K − x_i‖ / ‖x_i‖ over its test samples (the
  analytic classifier was fitted on x_i, so drift is what it cannot follow);
- new share: at the last step, on task i's test samples, the share of the
  prompt that comes from the components of later tasks, ‖Σ_{n>i} w_n P_n‖ /
  ‖Σ_n w_n P_n‖ (text and image pools, all prompt layers);
- moved: how far task i's own slice moved in training, ‖P − P_init‖ / ‖P_init‖
  (the init rebuilt exactly as `pal tune` draws it);
- recon: the reconstruction loss of task i's first and last epoch (log.jsonl).

    .venv/bin/python bench/diagnose.py --prepare data/prepare/0 \\
        --root data/demo/dataset --tune data/tune/pal/0 --features data/extract/pal/0
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from pipeline.data.loader import SampleDataset, make_loader
from pipeline.data.samples import read_prepare, select
from pipeline.methods import build_model
from pipeline.model.backbone import load_backbone
from pipeline.model.checkpoint import checkpoint_path, load_checkpoint, restore
from pipeline.model.device import autocast
from pipeline.model.network import PalModel
from pipeline.model.train import task_seed
from pipeline.params import PromptParams
from solver.shard_readers import open_features


def drift(features: Path) -> list[float]:
    """Mean relative change of task i's test features, step i → step K."""
    steps = open_features(features)
    last = steps[-1]
    out = []
    for s in steps[:-1]:
        x_i = s.test[s.step].read_all()[0].astype(np.float64)
        x_k = last.test[s.step].read_all()[0].astype(np.float64)
        out.append(
            float(
                np.mean(np.linalg.norm(x_k - x_i, axis=1) / np.linalg.norm(x_i, axis=1))
            )
        )
    return out


def _model(ckpt: dict, backbone) -> PalModel:
    p = ckpt["params"]["prompt"]
    prompt = PromptParams(**{**p, "layers": tuple(p["layers"])})
    return build_model(backbone, prompt, ckpt["tasks"]["classes_per_task"])


def new_share(prepare: Path, root: Path, tune: Path, backbone, K: int) -> list[float]:
    """Share of the last step's prompt from later tasks' components, per task."""
    samples, tasks = read_prepare(prepare, root)
    ckpt = load_checkpoint(checkpoint_path(tune, K))
    model = _model(ckpt, backbone)
    restore(model, ckpt["state"], K)
    per = model.prompts.text.per_task if hasattr(model.prompts, "text") else None
    out = []
    for i in range(1, K):
        test = select(samples, "test", [i])
        ds = SampleDataset(
            test,
            tasks.root,
            backbone.processor,
            backbone.max_text_len,
            backbone.image_side,
        )
        num = den = 0.0
        with torch.no_grad(), autocast(backbone.device):
            for batch in make_loader(ds, 64):
                q_t, q_v = model.batch_queries(batch)
                for pool, q in ((model.prompts.text, q_t), (model.prompts.image, q_v)):
                    w = pool.weights(q)  # (J, B, N)
                    P = torch.cat(list(pool.P), 1).float()  # (J, N, L, D)
                    J, N, L, D = P.shape
                    full = torch.bmm(w, P.view(J, N, -1))
                    cut = i * per
                    later = torch.bmm(w[:, :, cut:], P[:, cut:].reshape(J, N - cut, -1))
                    num += float(later.norm(dim=-1).sum())
                    den += float(full.norm(dim=-1).sum())
        out.append(num / den)
    return out


def moved(tune: Path, backbone, K: int, seed: int) -> list[float]:
    """‖P − P_init‖ / ‖P_init‖ of task i's text-pool slice after its training."""
    out = []
    for i in range(1, K + 1):
        ckpt = load_checkpoint(checkpoint_path(tune, i))
        model = _model(ckpt, backbone)
        if i > 1:
            prev = load_checkpoint(checkpoint_path(tune, i - 1))
            restore(model, prev["state"], i - 1)
        s = task_seed(seed, i)
        torch.manual_seed(s)
        model.add_task(torch.Generator().manual_seed(s))
        init = model.prompts.text.P[i - 1].detach().clone()
        trained = ckpt["state"][f"prompts.text.P.{i - 1}"]
        out.append(float((trained - init).norm() / init.norm()))
    return out


def recon(tune: Path) -> dict[int, tuple[float, float]]:
    entries = [json.loads(x) for x in (tune / "log.jsonl").read_text().splitlines()]
    by_task: dict[int, list[float]] = {}
    for e in entries:
        by_task.setdefault(e["task"], []).append(e["recon"])
    return {t: (v[0], v[-1]) for t, v in by_task.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prepare", type=Path, default=Path("data/prepare/0"))
    ap.add_argument("--root", type=Path, default=Path("data/demo/dataset"))
    ap.add_argument("--tune", type=Path, default=Path("data/tune"))
    ap.add_argument("--features", type=Path, default=Path("data/extract"))
    a = ap.parse_args()
    first = load_checkpoint(checkpoint_path(a.tune, 1))
    m, t = first["params"]["model"], first["params"]["tune"]
    backbone = load_backbone(m["backbone"], m["max_text_len"])
    K = len(first["tasks"]["classes_per_task"])
    d = drift(a.features)
    share = new_share(a.prepare, a.root, a.tune, backbone, K)
    mv = moved(a.tune, backbone, K, t["seed"])
    rc = recon(a.tune)
    print(
        f"# tune.lr {t['lr']}, epochs {t['epochs']}, recon_weight {t['recon_weight']}"
    )
    print(
        "| task | drift to step K | later tasks' share of its prompt "
        "| slice moved | recon first → last epoch |"
    )
    print("|---|---|---|---|---|")
    for i in range(1, K + 1):
        dr = f"{100 * d[i - 1]:.1f} %" if i < K else ""
        sh = f"{100 * share[i - 1]:.1f} %" if i < K else ""
        r0, r1 = rc[i]
        change = 100 * (r1 - r0) / r0
        print(
            f"| {i} | {dr} | {sh} | {100 * mv[i - 1]:.2f} % | "
            f"{r0:.3f} → {r1:.3f} ({change:+.1f} %) |"
        )


if __name__ == "__main__":
    main()
