"""What a rehearsal's logs say (palbench/rehearsal.py): per-stage samples/s,
data wait and loader start from tune's and extract's log lines, and their
projection to a whole dataset's protocol, as a dict and as Markdown."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
# full datasets (after Food101's smallest class is dropped): training and test
# samples, tasks; the preset of each
FULL = {"UPMC-Food101": (61127, 22716, 10), "N24News": (48988, 6106, 6)}
PRESETS = {"UPMC-Food101": "food101.yaml", "N24News": "n24news.yaml"}


def tune_figures(work: Path, text: str) -> dict[str, Any]:
    """Tune's steady state from logs/tune.jsonl and its log lines: seconds in
    epochs (graph capture taken out), samples, data waits, graph replays, and
    the frozen queries' seconds and rate."""
    timings = [json.loads(x) for x in (work / "logs/tune.jsonl").open()]
    graphed = re.findall(
        r"(\d+) of (\d+) steps replayed a CUDA graph \(\d+ graphs, captured in "
        r"([\d.]+) s\)",
        text,
    )
    # graph capture happens once per task (its first steps of each shape): a
    # per-task cost, taken out of the epochs' time
    capture_s = sum(float(x[2]) for x in graphed)
    # before its epochs each task runs the frozen backbone once over its
    # training samples (the queries): a per-sample cost, projected at its rate
    queries = re.findall(r"frozen queries of (\d+) samples in ([\d.]+) s", text)
    query_s = sum(float(q[1]) for q in queries)
    return {
        "busy": sum(t["seconds"] for t in timings) - capture_s,
        "done": sum(t["samples"] for t in timings),
        "wait": sum(t["data_wait"] for t in timings),
        "graphed": [sum(int(x[i]) for x in graphed) for i in (0, 1)]
        if graphed
        else None,
        "capture_s_per_task": capture_s / max(1, len(graphed)),
        "capture_s": capture_s,
        "query_s": query_s,
        "query_rate": sum(int(q[0]) for q in queries) / query_s if query_s else 0.0,
    }


def extract_figures(text: str) -> dict[str, Any]:
    """Extract's steady state from its per-split log lines: seconds, samples,
    data waits, and the start-up each step pays (its loader's workers)."""
    runs = re.findall(r"(\d+) samples in ([\d.]+) s, ([\d.]+) s of it waiting", text)
    out = {
        "busy": sum(float(r[1]) for r in runs),
        "done": sum(int(r[0]) for r in runs),
        "wait": sum(float(r[2]) for r in runs),
        "per_step": 0.0,
        "steps": len(runs),
    }
    # each extract step starts its loader's workers afresh: seconds = a + n/rate
    # over the steps (least squares, when they differ in size), a per step
    if len({int(r[0]) for r in runs}) >= 3:
        n = np.array([int(r[0]) for r in runs], float)
        t = np.array([float(r[1]) for r in runs])
        slope, per_step = np.polyfit(n, t, 1)
        if slope > 0 and per_step > 0:
            out["busy"] = float(slope) * out["done"]
            out["per_step"] = per_step
    return out


def stage_rows(
    wall: dict[str, float], figures: dict[str, dict], text: str
) -> tuple[dict[str, dict], dict[str, float], dict[str, float]]:
    """(stages, rate, startup): per stage its wall time, start-up (the wall
    time outside the steady state), samples/s, data wait and GPU peak."""
    tune, ext = figures["tune"], figures["extract"]
    peaks = dict(re.findall(r"(tune|extract): GPU memory peak ([\d.]+) GiB", text))
    rate = {s: f["done"] / f["busy"] for s, f in figures.items() if f["busy"] > 0}
    startup = {s: wall.get(s, 0.0) - f["busy"] for s, f in figures.items()}
    startup["tune"] -= tune["query_s"] + tune["capture_s"]
    startup["extract"] -= ext["per_step"] * ext["steps"]
    stages = {}
    for s in wall:
        stages[s] = {
            "wall_s": round(wall[s], 2),
            "startup_s": round(startup[s], 2) if s in startup else None,
            "samples_per_s": round(rate[s], 2) if s in rate else None,
            "data_wait_s": round(figures[s]["wait"], 2) if s in figures else None,
            "gpu_peak_gib": float(peaks[s]) if s in peaks else None,
        }
    return stages, rate, startup


def once_figures(wall: dict[str, float], text: str) -> dict[str, float]:
    """The stages a dataset runs once (`pal pixels`, `pal frozen`): their wall
    seconds per listed sample (0 when the rehearsal ran without them)."""
    listed = re.findall(r"wrote \S+: (\d+) samples, \d+ \(sample, state\) pairs", text)
    n = int(listed[-1]) if listed else 0
    seconds = wall.get("pixels", 0.0) + wall.get("frozen", 0.0)
    return {"samples": n, "s_per_sample": seconds / n if n else 0.0}


def projections(
    rate: dict[str, float],
    startup: dict[str, float],
    figures: dict[str, dict],
    once: dict[str, float],
) -> dict[str, dict]:
    """Minutes of tune and extract, hours of the protocol, per full dataset.
    The preset's protocol: PAL tunes once per run; PAL, init and frozen each
    extract once per run (init's and frozen's tune stages only start up); the
    pixel cache and the frozen queries once, scaled by the listed samples."""
    tune, ext = figures["tune"], figures["extract"]
    out = {}
    for name, (train, test, k) in FULL.items():
        preset = yaml.safe_load((ROOT / "configs" / PRESETS[name]).read_text())
        epochs, runs = preset["tune"]["epochs"], len(preset["protocol"]["runs"])
        n_ext = train + sum(j * test / k for j in range(1, k + 1))
        t = startup["tune"] + train * epochs / rate["tune"]
        t += train / tune["query_rate"] if tune["query_rate"] else 0.0
        t += k * round(tune["capture_s_per_task"], 2)
        e = startup["extract"] + k * ext["per_step"] + n_ext / rate["extract"]
        first = once["s_per_sample"] * (train + test)
        out[name] = {
            "epochs": epochs,
            "runs": runs,
            "tune_min": round(t / 60, 1),
            "extract_min": round(e / 60, 1),
            "once_min": round(first / 60, 1),
            "protocol_h": round(
                (first + runs * (t + 2 * startup["tune"] + 3 * e)) / 3600, 2
            ),
        }
    return out


def analyse(
    work: Path, params: dict[str, Any], text: str, wall: dict[str, float]
) -> dict[str, Any]:
    """Per-stage figures from the stages' logs and the projections."""
    samples = [json.loads(x) for x in (work / "data/prepare/0/samples.jsonl").open()]
    n_train = sum(s["split"] == "train" for s in samples)
    n_test = sum(s["split"] == "test" for s in samples)
    tasks = params["data"]["tasks"]
    # extraction embeds each step's training samples and every seen task's test
    n_extract = n_train + sum(k * n_test / tasks for k in range(1, tasks + 1))
    # steady state: tune's epochs and extract's batches; the rest of a stage's
    # wall time is start-up (imports, model loading, graph capture, workers)
    figures = {"tune": tune_figures(work, text), "extract": extract_figures(text)}
    stages, rate, startup = stage_rows(wall, figures, text)
    tune, ext = figures["tune"], figures["extract"]
    result: dict[str, Any] = {
        "stages": stages,
        "graphed_steps": tune["graphed"],
        "train_samples": n_train,
        "epochs": params["tune"]["epochs"],
        "extracted_samples": round(n_extract),
        "queries": {
            "seconds": round(tune["query_s"], 2),
            "samples_per_s": round(tune["query_rate"], 2),
        },
        "capture_s_per_task": round(tune["capture_s_per_task"], 2),
        "extract_s_per_step": round(float(ext["per_step"]), 2),
        "projections": {},
    }
    if "tune" in rate and "extract" in rate:  # else no steady time to project
        once = once_figures(wall, text)
        result["projections"] = projections(rate, startup, figures, once)
    return result


def markdown(result: dict[str, Any]) -> list[str]:
    """The per-stage table and the projections, as Markdown lines."""
    g = result["graphed_steps"]
    share = f"{100 * g[0] / g[1]:.1f} % ({g[0]} of {g[1]})" if g else "– (none)"
    lines = [
        "| stage | wall s | start-up s | samples/s (steady) "
        "| graphed steps | GPU peak GiB | data wait s |",
        "|---|---|---|---|---|---|---|",
    ]

    def cell(v: Any) -> str:
        return "" if v is None else f"{v:.1f}" if isinstance(v, float) else str(v)

    for s, f in result["stages"].items():
        lines.append(
            f"| {s} | {f['wall_s']:.1f} | {cell(f['startup_s'])} "
            f"| {cell(f['samples_per_s'])} | {share if s == 'tune' else ''} "
            f"| {cell(f['gpu_peak_gib'])} | {cell(f['data_wait_s'])} |"
        )
    q = result["queries"]
    lines.append("")
    lines.append(
        f"{result['train_samples']} training samples × {result['epochs']} epochs "
        f"tuned, {result['extracted_samples']} samples extracted; tune's frozen "
        f"queries took {q['seconds']:.1f} s ({q['samples_per_s']:.1f} samples/s); "
        f"graph capture {result['capture_s_per_task']:.1f} s per task; extract's "
        f"loader start {result['extract_s_per_step']:.1f} s per step."
    )
    if not result["projections"]:
        lines.append("No steady tune or extract time was measured: nothing to project.")
    for name, p in result["projections"].items():
        lines.append(
            f"Projected {name}, one run of PAL: tune {p['tune_min']:.0f} min "
            f"({p['epochs']} epochs), extract {p['extract_min']:.1f} min; the "
            f"pixel cache and frozen queries once: {p['once_min']:.1f} min; the "
            f"protocol ({p['runs']} runs of PAL, init, frozen): about "
            f"{p['protocol_h']:.1f} h."
        )
    return lines
