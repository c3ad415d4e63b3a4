"""palbench/gpu_check.py's report: report.json as Markdown, and both files
rewritten in place after each part (a run cut short still leaves a report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from palbench import gpu_pace, gpu_paths
from pipeline.sameness import GPU_RTOL, RTOL

ROOT = Path(__file__).resolve().parents[1]


def render(report: dict[str, Any]) -> str:
    """report.json's content as Markdown."""
    v = report["versions"]
    card = v["card"] or "no GPU (CPU only)"
    lines = [
        f"# GPU check on {card}",
        "",
        f"Scale `{report['scale']}`, device `{report['device']}`. Python "
        f"{v['python']}, torch {v['torch']} (CUDA {v['cuda']}), transformers "
        f"{v['transformers']}, numpy {v['numpy']}, CuPy {v['cupy']}"
        + (f"; {v['gpu_memory_gib']} GiB of GPU memory." if v["card"] else "."),
    ]
    if "tests" in report:
        t = report["tests"]
        done = f"{t['summary']} (exit {t['exit']}, {t['wall_s']:.0f} s)."
        lines += ["", "## `pytest -m gpu tests`", "", done]
    if "solver" in report:
        s = report["solver"]
        solve_s = f"{s['solve_s']:.1f} s" if s["solve_s"] is not None else "–"
        lines += [
            "",
            f"## Solver: {s['rows']} rows of D = {s['dim']}, width {s['width']}, "
            f"{s['classes']} classes in {s['steps']} steps",
            "",
            f"Ran on {s['backend']}. `python -m solver solve` took "
            f"{s['wall_s']:.1f} s as a process, {solve_s} of it fitting "
            f"(exit {s['exit']}; synthetic features made in "
            f"{s['features_made_s']:.0f} s).",
        ]
    lines += gpu_paths.markdown(report)
    if "pace" in report:
        lines += [
            "",
            "## Pace: each method's steady step, and tunings side by side",
            "",
        ]
        lines += gpu_pace.markdown(report["pace"])
    for key, title, log in (
        ("rehearsal_before", " (before: the --baseline tree)", "rehearsal-before.log"),
        ("rehearsal", "", "rehearsal.log"),
    ):
        if key not in report:
            continue
        r = report[key]
        lines += ["", f"## Rehearsal: one run of PAL on a Food101-shaped tree{title}"]
        lines.append("")
        if r["exit"]:
            lines.append(f"Failed: {r['error']} (see {log}).")
        else:
            from palbench import rehearsal

            st = r["setup"]
            lines.append(
                f"{st['config']} backbone, {st['classes']} classes, {st['photos']} "
                f"photos, width {st['width']}, {st['loader_workers']} loader "
                f"workers, {st['runner']} runner, CUDA graphs "
                f"{'on' if st['cuda_graphs'] else 'off'}; {r['wall_s']:.0f} s in all, "
                f"accuracy {r['accuracy']} % (random weights)."
            )
            lines += ["", *rehearsal.markdown(r)]
    if "cells" in report:
        lines += cells_lines(report["cells"])
    if "contracts" in report:
        lines += contracts_lines(report["contracts"])
    return "\n".join(lines) + "\n"


def contracts_lines(c: dict[str, Any]) -> list[str]:
    """The `contracts` part (the contracts' fixture on the card) as Markdown."""
    lines = ["", f"## Output contracts' fixture on `{c['device']}` (DESIGN §2)", ""]
    if c["exit"]:
        return [*lines, f"Failed: {c['error']} (see contracts.log)."]
    pairs = (("repeat", "the same code twice"), ("reference", "against reference/"))
    for key, title in pairs:
        if key not in c:
            continue
        r = c[key]
        lines.append(
            f"- {title}: {len(r['identical'])} of {c['jobs']} jobs the same "
            f"(floats within {RTOL:g} of their scale), "
            f"{len(r['within_gpu_rtol'])} within the card's {GPU_RTOL:g}"
            + "".join(f"; {job}: {', '.join(fs)}" for job, fs in r["differ"].items())
        )
    return [*lines, "", f"{c['wall_s']:.0f} s in all."]


def cells_lines(cells: dict[str, Any]) -> list[str]:
    """The `cells` part (N tunes side by side on one card) as Markdown."""
    lines = ["", "## Several cells on one card (`pal-paper run -j N`)", ""]
    lines += gpu_paths.md_table(
        [
            "tunes side by side",
            "exit",
            "wall s",
            "samples/s (all)",
            "speed-up",
            "samples/s (steady)",
            "GPU peak GiB each",
        ],
        [
            [
                n,
                j["exit"],
                j["wall_s"],
                j["samples_per_s"],
                j["speedup"],
                j["steady_samples_per_s"],
                j["gpu_peak_gib_each"],
            ]
            for n, j in cells["jobs"].items()
        ],
    )
    return lines


def write_report(out: Path, report: dict[str, Any]) -> None:
    for name, text in (
        ("report.json", json.dumps(report, indent=2) + "\n"),
        ("report.md", render(report)),
    ):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(out / name)
