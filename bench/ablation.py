"""The paper's prompt-module ablation on the demo: tune → extract → solve → evaluate.

Runs the chain once per variant in a scratch folder (reusing one demo dataset
and one prepare output) and prints a table of Acc / FG / AIA / Last, with the
BP head's own scores ("w/o AL") taken from the PAL run's `bp_logits`:

    PYTHONPATH=. python bench/ablation.py                      # pal + acil
    PYTHONPATH=. python bench/ablation.py --variants pal,acil,shared,vector
    PYTHONPATH=. python bench/ablation.py --set tune.lr=1e-3 --set tune.epochs=5

Variants: pal (params as given), acil (prompt.enabled false: AL on frozen
features), shared (prompt.pools shared), vector (prompt.pools vector),
input (prompt.position input). It ends with the three checks of the ablation
pattern: PAL Acc > ACIL Acc, PAL Acc > BP head Acc, PAL FG < BP head FG.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

VARIANTS = {
    "pal": ("PAL (prompts + AL)", {}),
    "acil": ("prompts off + AL (ACIL)", {"prompt": {"enabled": False}}),
    "shared": ("shared pool + AL", {"prompt": {"pools": "shared"}}),
    "vector": ("prompt vector + AL", {"prompt": {"pools": "vector"}}),
    "input": ("input-position prompts + AL", {"prompt": {"position": "input"}}),
}


def run(args: list[str], log_file: Path) -> float:
    """Run `python -m <args>`, appending its output to `log_file`; seconds."""
    t0 = time.perf_counter()
    with log_file.open("a") as log:
        log.write(f"$ {' '.join(args)}\n")
        log.flush()
        done = subprocess.run(
            [sys.executable, "-m", *args], stdout=log, stderr=subprocess.STDOUT
        )
    if done.returncode:
        sys.exit(f"failed ({done.returncode}): {' '.join(args)}; see {log_file}")
    return time.perf_counter() - t0


def parse_set(items: list[str]) -> dict:
    """["tune.lr=1e-3", …] → {"tune": {"lr": 0.001}, …} (values parsed as YAML)."""
    out: dict = {}
    for item in items:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        out.setdefault(section, {})[name] = yaml.safe_load(value)
    return out


def merged(base: dict, *overrides: dict) -> dict:
    params = {k: dict(v) if isinstance(v, dict) else v for k, v in base.items()}
    for over in overrides:
        for section, values in over.items():
            params.setdefault(section, {}).update(values)
    return params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--work", default="data/ablation", help="scratch folder")
    ap.add_argument(
        "--prepare",
        default=None,
        help="existing prepare folder (default: make demo + prepare inside --work)",
    )
    ap.add_argument("--variants", default="pal,acil")
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override a param for every variant",
    )
    args = ap.parse_args()

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    log_file = work / "ablation.log"
    base = merged(yaml.safe_load(Path(args.params).read_text()), parse_set(args.set))
    if args.prepare:
        prepare = Path(args.prepare)
    else:
        demo, prepare = work / "demo", work / "prepare"
        base = merged(
            base,
            {
                "data": {"root": str(demo / "dataset")},
                "model": {"backbone": str(demo / "vilt")},
            },
        )
        base_file = work / "params.yaml"
        base_file.write_text(yaml.safe_dump(base, sort_keys=False))
        if not (demo / "vilt" / "config.json").is_file():
            run(
                ["pipeline", "demo", "--params", str(base_file), "--out", str(demo)],
                log_file,
            )
        if not (prepare / "samples.jsonl").is_file():
            run(
                [
                    "pipeline",
                    "prepare",
                    "--params",
                    str(base_file),
                    "--out",
                    str(prepare),
                ],
                log_file,
            )

    rows, results = [], {}
    for name in args.variants.split(","):
        label, over = VARIANTS[name]
        folder = work / name
        folder.mkdir(parents=True, exist_ok=True)
        pfile = folder / "params.yaml"
        pfile.write_text(yaml.safe_dump(merged(base, over), sort_keys=False))
        p = ["--params", str(pfile)]
        t_tune = run(
            [
                "pipeline",
                "tune",
                *p,
                "--prepare",
                str(prepare),
                "--out",
                str(folder / "tune"),
                "--fresh",
            ],
            log_file,
        )
        t_extract = run(
            [
                "pipeline",
                "extract",
                *p,
                "--prepare",
                str(prepare),
                "--tune",
                str(folder / "tune"),
                "--out",
                str(folder / "extract"),
            ],
            log_file,
        )
        run(
            [
                "solver",
                "solve",
                *p,
                "--features",
                str(folder / "extract"),
                "--out",
                str(folder / "solve"),
            ],
            log_file,
        )
        run(
            [
                "solver",
                "evaluate",
                *p,
                "--features",
                str(folder / "extract"),
                "--weights",
                str(folder / "solve" / "weights.h5"),
                "--out",
                str(folder / "results"),
            ],
            log_file,
        )
        m = json.loads((folder / "results" / "metrics.json").read_text())
        results[name] = m
        rows.append((label, m, t_tune + t_extract))
        if name == "pal" and m.get("bp"):
            rows.append(("BP head alone (w/o AL)", m["bp"], None))

    print("\n| variant | Acc | FG | AIA | Last | tune+extract s |")
    print("|---|---|---|---|---|---|")
    for label, m, seconds in rows:
        s = f"{seconds:.0f}" if seconds is not None else "(same run)"
        print(
            f"| {label} | {m['acc']:.2f} | {m['fg']:.2f} | {m['aia']:.2f} | "
            f"{m['last']:.2f} | {s} |"
        )
    if "pal" in results and "acil" in results and results["pal"].get("bp"):
        pal, acil, bp = results["pal"], results["acil"], results["pal"]["bp"]
        print()
        for text, ok in (
            (
                f"PAL Acc {pal['acc']:.2f} > ACIL Acc {acil['acc']:.2f}",
                pal["acc"] > acil["acc"],
            ),
            (
                f"PAL Acc {pal['acc']:.2f} > BP head Acc {bp['acc']:.2f}",
                pal["acc"] > bp["acc"],
            ),
            (
                f"AL FG {pal['fg']:.2f} < BP head FG {bp['fg']:.2f}",
                pal["fg"] < bp["fg"],
            ),
        ):
            print(f"{'holds' if ok else 'FAILS'}: {text}")
    print(f"\nlogs: {log_file}")


if __name__ == "__main__":
    main()
