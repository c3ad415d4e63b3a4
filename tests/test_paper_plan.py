"""`pal-paper plan`: a grid priced per card and per prompt method, the card
filled with J tunings, card files checked, the whole paper in one command;
`pal-paper run`'s workers filling the cards torch sees.

The prices are closed forms of a card file written here (CARD), so they do not
move when palpaper/costs.yaml's figures are replaced by a measurement; the
packaged cards are checked against their stated projection.
"""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers import committed, pal_paper

from palpaper.backbone import Shape
from palpaper.grids import RESULTS
from palpaper.overrides import GridError, make_cell
from palpaper.plan import (
    CARD_KEYS,
    Variant,
    card,
    check_card,
    costs,
    extract_seconds,
    tune_seconds,
)
from palpaper.sizes import Size
from pipeline.data.protocol import class_order
from pipeline.fakes.trees import make_files_tree

# the paper's results on Food101: every result but `heads`, beyond the paper
PAPER_FOOD101 = [r for r in RESULTS if r != "heads"]
FOOD = yaml.safe_load(committed("configs/food101.yaml"))
NEWS = yaml.safe_load(committed("configs/n24news.yaml"))
# Food101's recorded size: 100 classes of equal counts
SIZE = Size(
    [f"{i:04d}" for i in range(100)],
    {"train": [611.27] * 100, "test": [227.16] * 100},
    "test",
)
METHODS = ("pal", "map", "msp", "rebq", "l2p", "dualprompt")
# GF a sample of each method's step now (palpaper/costs.yaml h200's basis); PAL's
# was 199.0 when its step ran 405 samples/s on an H200
GF = {
    "pal": 160.1,
    "rebq": 186.3,
    "map": 80.9,
    "msp": 108.8,
    "l2p": 63.6,
    "dualprompt": 53.7,
}
# a card of round figures: 90 % of 20 GiB holds two 5-GiB PAL tunings, not
# four; four 2-GiB MAP tunings
CARD = {
    "name": "a test card",
    "memory_gib": 20.0,
    "status": "measured",
    "commit": "abc1234",
    "basis": "the test's figures",
    "steps": 500,
    "tune_startup_s": 20.0,
    "first_batch_s": 2.0,
    "capture_s_per_task": 1.0,
    "frozen_rows_per_s": 600.0,
    "extract_startup_s": 30.0,
    "extract_per_s": 2000.0,
    "tune_per_s": {
        "pal": 400.0,
        "rebq": 400.0,
        "msp": 800.0,
        "map": 1000.0,
        "l2p": 1250.0,
        "dualprompt": 1250.0,
    },
    "tuning_gib": {
        "pal": 5.0,
        "rebq": 5.0,
        "msp": 3.0,
        "map": 2.0,
        "l2p": 2.0,
        "dualprompt": 2.0,
    },
    "packing": {1: 1.0, 2: 1.6, 4: 2.0},
}
ENV = {
    "PATH": "/usr/bin:/bin",
    "HOME": os.environ.get("HOME", "/tmp"),
    "DVC_NO_ANALYTICS": "1",
}


def tune(method: str, k: int = 10, epochs: int = 10, train: int = 61127) -> float:
    """CARD's seconds of one tuning: start-up, per task a first batch and a
    capture, then the steady steps."""
    return 20.0 + k * (2.0 + 1.0) + epochs * train / CARD["tune_per_s"][method]


def extract(k: int = 10, train: int = 61127, test: int = 22716) -> float:
    return 30.0 + (train + test * (k + 1) / 2) / 2000.0


FROZEN_H = 3 * (61127 + 22716) / 600.0 / 3600  # Food101's frozen queries, once


def write(folder: Path, name: str, data: object) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def plan(folder: Path, *args: str) -> list[str]:
    out = pal_paper(folder, ENV, "plan", *args)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_a_map_tuning_costs_less_than_a_pal_one_by_their_rates() -> None:
    c = check_card(CARD, "card.yaml")
    cell = make_cell(FOOD, {"data.missing_rate": 0.1})
    pal = tune_seconds(cell, FOOD, Variant("pal", True, 10), c, SIZE)
    map_ = tune_seconds(cell, FOOD, Variant("map", True, 10), c, SIZE)
    assert pal == pytest.approx(20 + 10 * 3 + 10 * 61127 / 400)
    assert map_ == pytest.approx(20 + 10 * 3 + 10 * 61127 / 1000)
    # the steady steps scale by the rates' ratio; start-ups and first batches not
    assert (pal - 50) / (map_ - 50) == pytest.approx(1000 / 400)
    # an extraction is the same for both; without prompts a start-up only
    assert extract_seconds(cell, FOOD, Variant("map", True, 10), c, SIZE) == (
        pytest.approx(extract())
    )
    assert extract_seconds(cell, FOOD, Variant("pal", False, 0), c, SIZE) == 30.0
    # a card with an extraction rate per method prices each at its own
    per_method = check_card(
        {
            **CARD,
            "extract_per_s": {
                **dict.fromkeys(CARD["tune_per_s"], 2000.0),
                "map": 4000.0,
            },
        },
        "card.yaml",
    )
    embeddings = 61127 + 22716 * 11 / 2
    got = {
        m: extract_seconds(cell, FOOD, Variant(m, True, 10), per_method, SIZE)
        for m in ("pal", "map")
    }
    assert got == pytest.approx(
        {"pal": 30 + embeddings / 2000, "map": 30 + embeddings / 4000}
    )


def test_one_map_cell_against_one_pal_cell(tmp_path: Path) -> None:
    """`plan tasks` with K = 5 only, on a preset whose main is [map] or [pal]:
    its one new cell, 3 runs of one variant, costs what the rates say."""
    write(tmp_path, "card.yaml", CARD)
    hours = {}
    for method in ("pal", "map"):
        params = yaml.safe_load(committed("configs/food101.yaml"))
        params["ablation"]["pal"]["changes"] = {"prompt": {"method": method}}
        write(tmp_path, f"{method}.yaml", params)
        args = ["tasks", "--params", f"{method}.yaml", "--card", "card.yaml"]
        report = json.loads("\n".join(plan(tmp_path, *args, "--json")))
        (tasks,) = report["datasets"][0]["routes"]["measured"]["results"]
        assert (tasks["cells"], tasks["tunings"], tasks["extractions"]) == (4, 9, 9)
        hours[method] = tasks["card_hours"]
    # tasks: K = 5, 20, 50 are new cells (10 is the committed one), PAL alone
    # (here the pal variant with method map or pal); J = 2 for pal, 4 for map
    work = {
        m: sum(3 * (tune(m, k) + extract(k)) for k in (5, 20, 50)) / 3600
        for m in ("pal", "map")
    }
    assert hours["pal"] == approx(work["pal"] / 1.6)
    assert hours["map"] == approx(work["map"] / 2.0)
    steady = 3 * 3 * 10 * 61127 / 3600  # 9 tunings' steps, seconds x rate
    assert work["pal"] - work["map"] == pytest.approx(steady * (1 / 400 - 1 / 1000))


def test_the_card_is_filled_with_as_many_tunings_as_its_memory_holds() -> None:
    c = check_card(CARD, "card.yaml")
    # 90 % of 20 GiB = 18: 2 x 5 GiB fit, 4 x 5 do not; 4 x 4.5 just do
    gib = (5.0, 4.6, 4.5, 9.0, 9.5, 30.0)
    assert [c.slots(g) for g in gib] == [2, 2, 4, 2, 1, 1]
    assert c.slots(5.0, memory=80.0) == 4  # a card torch sees, of its own memory
    assert c.largest(["map", "msp"]) == 3.0 and c.largest([]) == 0.0


def test_plan_prices_each_variant_and_fills_the_card(tmp_path: Path) -> None:
    """Tables 1-2 and Table 4 on Food101's preset, on 4 cards of CARD."""
    write(tmp_path, "card.yaml", CARD)
    write(tmp_path, "food.yaml", FOOD)
    args = ["missing", "upsampling", "--params", "food.yaml", "--card", "card.yaml"]
    lines = plan(tmp_path, *args, "--cards", "4")
    baselines = FOOD["pipelines"]["baselines"]
    assert baselines == ["map", "msp", "l2p", "dualprompt", "rebq"]
    # a cell off the committed scenario: 3 runs of pal (tune and extract),
    # init (extract), frozen (a start-up: a gather of the frozen queries) and
    # each baseline (tune and extract at its rate); the committed cell (70 %
    # both) adds the baselines only
    five = sum(tune(m) + extract() for m in baselines)
    cell = 3 * (tune("pal") + 2 * extract() + 30.0 + five) / 3600
    base = 3 * five / 3600
    # J = 2 (PAL's 5 GiB), 1.6x: card-hours are work / 1.6, a cell's wall on
    # its slot work x 2 / 1.6; 15 cells and 5 empty ones on 8 slots: two of
    # the 14 equal cells on six slots, the committed one beside one of them
    missing = (14 * cell + base) / 1.6
    wall = FROZEN_H + max(2 * cell, cell + base) * 2 / 1.6
    cited = 3 * (tune("pal") + 2 * extract() + 30.0) / 3600
    report = json.loads("\n".join(plan(tmp_path, *args, "--cards", "4", "--json")))
    assert report["card"] == {
        "name": "a test card",
        "file": "card.yaml",
        "figures": "measured on a test card at abc1234, 500 steps",
        "cards": 4,
        "memory_gib": 20.0,
        "tunings_at_once": 2,
        "packing_factor": 1.6,
        "largest_tuning_gib": 5.0,
        "methods": ["pal", *baselines],
        "at_pal_rates": [],
        "packing_figures_for": [1, 2, 4],
    }
    (grid,) = report["datasets"]
    assert grid["minutes"] == {
        "tune": {m: approx(tune(m) / 60) for m in ("pal", *baselines)},
        "extract": {m: approx(extract() / 60) for m in ("pal", *baselines)},
        "extract_without_prompts": 0.5,
        "frozen_queries_once": approx(FROZEN_H * 60),
    }
    assert grid["largest_solve"] == {
        "width": 20000,
        "dtype": "float64",
        "gram_gb": 3.2,
        "device": "auto",
    }
    measured, cited_route = grid["routes"]["measured"], grid["routes"]["cited"]
    assert measured == {
        "results": [
            row("missing", 15, 42 + 45 * 5, 126 + 45 * 5, missing),
            row("upsampling", 5, 0, 0, 0.0),
        ],
        "card_hours": approx(missing + FROZEN_H),
        "wall_hours": approx(wall),
        "slots": 8,
        "cells": 20,
        "longest_cell_hours": approx(cell * 2 / 1.6),
        "longest_cell_alone_hours": approx(cell),
    }
    # 14 cells with work on 8 slots: two on six of them
    assert cited_route == {
        "results": [
            row("missing", 15, 42, 126, 14 * cited / 1.6),
            row("upsampling", 5, 0, 0, 0.0),
        ],
        "card_hours": approx(14 * cited / 1.6 + FROZEN_H),
        "wall_hours": approx(FROZEN_H + 2 * cited * 2 / 1.6),
        "slots": 8,
        "cells": 19,
        "longest_cell_hours": approx(cited * 2 / 1.6),
        "longest_cell_alone_hours": approx(cited),
        "not_run": ["MAP", "MSP", "L2P", "DualPrompt", "RebQ"],
    }
    # the text: the answer first, each route's table, within 100 columns
    assert lines[:2] == [
        f"food101 (food.yaml): {missing + FROZEN_H:.1f} card-hours, {wall:.1f} h wall "
        "on 4 cards",
        f"  with --baselines cited: {14 * cited / 1.6 + FROZEN_H:.1f} card-hours, "
        f"{FROZEN_H + 2 * cited * 2 / 1.6:.1f} h wall",
    ]
    assert max(len(x) for x in lines) <= 100
    table = [x.split() for x in lines if x.startswith(("    missing ", "    all "))]
    assert table == [
        ["missing", "15", str(42 + 45 * 5), str(126 + 45 * 5), f"{missing:.1f}"],
        ["all", "20", f"{missing + FROZEN_H:.1f}", *SHARED],
        ["missing", "15", "42", "126", f"{14 * cited / 1.6:.1f}"],
        ["all", "19", f"{14 * cited / 1.6 + FROZEN_H:.1f}", *SHARED],
    ]


SHARED = ["(shared", "cells,", "frozen", "queries", "once)"]


def approx(x: float) -> pytest.approx:
    return pytest.approx(x, rel=1e-12)


def row(result: str, cells: int, tunings: int, extractions: int, hours: float) -> dict:
    """A result's row of a route in `pal-paper plan --json`."""
    return {
        "result": result,
        "cells": cells,
        "tunings": tunings,
        "extractions": extractions,
        "card_hours": approx(hours),
    }


def test_a_cpu_rehearsal_is_priced_on_the_cpu_card(tmp_path: Path) -> None:
    """A CPU rehearsal of the preset (one photo of each class and split, one
    epoch, one run, PAL alone) is priced on costs.yaml's cpu card, not at the
    preset's full-size GPU run: one tuning at a time."""
    params = yaml.safe_load(committed("configs/food101.yaml"))
    params["data"].update(per_class=1, tasks=5)
    params["tune"].update(device="cpu", epochs=1)
    params["extract"]["device"] = "cpu"
    params["protocol"]["runs"] = [0]
    params["pipelines"]["main"] = ["pal"]
    write(tmp_path, "p.yaml", params)
    args = ["upsampling", "tasks", "--params", "p.yaml"]
    lines = plan(tmp_path, *args)
    cpu = costs()["cards"]["cpu"]
    assert cpu["packing"] == {1: 1.0} and cpu["memory_gib"] is None
    rate, ext = cpu["tune_per_s"]["pal"], cpu["extract_per_s"]
    start, e_start = cpu["tune_startup_s"], cpu["extract_startup_s"]
    # 100 classes: 100 training and 100 test samples; K tasks, 1 epoch
    frozen = 3 * 200 / cpu["frozen_rows_per_s"] / 60

    def hours(k: int) -> float:  # step j embeds the test samples of tasks 1..j
        t = start + k * (cpu["first_batch_s"] + cpu["capture_s_per_task"]) + 100 / rate
        return (t + e_start + (100 + 100 * (k + 1) / 2) / ext) / 3600

    work = sum(hours(k) for k in (10, 20, 50))  # K = 5 is the committed cell
    report = json.loads("\n".join(plan(tmp_path, *args, "--json")))
    assert report["card"]["name"] == cpu["name"]
    assert report["card"]["file"] == "palpaper/costs.yaml cpu"
    assert report["card"]["tunings_at_once"] == 1
    (grid,) = report["datasets"]
    assert grid["tune_device"] == "cpu"
    # 8 cells: Table 4's 15k cell and Table 5's K = 5 are the committed one
    assert grid["routes"] == {
        "measured": {
            "results": [
                row("upsampling", 5, 0, 0, 0.0),
                row("tasks", 4, 3, 3, work),
            ],
            "card_hours": approx(work + frozen / 60),
            "wall_hours": approx(work + frozen / 60),
            "slots": 1,
            "cells": 8,
            "longest_cell_hours": approx(hours(50)),
            "longest_cell_alone_hours": approx(hours(50)),
        }
    }
    # one route: no line on the cited one, no route heading
    assert lines[0] == (
        f"food101 (p.yaml): {work + frozen / 60:.1f} card-hours, "
        f"{work + frozen / 60:.1f} h wall on 1 card"
    )
    assert not [x for x in lines if "--baselines" in x]
    assert max(len(x) for x in lines) <= 100


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"steps": None}, "card.yaml: no key 'steps'"),
        (
            {"tune_per_s": {m: 1.0 for m in METHODS if m != "l2p"}},
            "card.yaml: no key 'tune_per_s.l2p' (every prompt method: pal, map, msp, "
            "rebq, l2p, dualprompt)",
        ),
        (
            {"tuning_gib": {"pal": 1.0}},
            "card.yaml: no key 'tuning_gib.map' (every prompt method: pal, map, msp, "
            "rebq, l2p, dualprompt)",
        ),
        (
            {"status": "guessed"},
            "card.yaml: status is measured or projected, got 'guessed'",
        ),
        ({"extract_per_s": 0}, "card.yaml: extract_per_s is a positive number, got 0"),
        (
            {"extract_per_s": {"pal": 2000.0}},
            "card.yaml: no key 'extract_per_s.map' (every prompt method: pal, map, "
            "msp, rebq, l2p, dualprompt)",
        ),
        (
            {"first_batch_s": "3 s"},
            "card.yaml: first_batch_s is a number ≥ 0, got '3 s'",
        ),
        (
            {"packing": {2: 1.64}},
            "card.yaml: packing needs J = 1 (one tuning alone): 1: 1.0",
        ),
        (
            {"memory_gib": None},
            "card.yaml: memory_gib is empty, so packing names J = 1 only",
        ),
    ],
)
def test_a_card_file_missing_a_key_or_a_rate_is_one_line(
    tmp_path: Path, change: dict, message: str
) -> None:
    entry = {k: v for k, v in CARD.items() if change.get(k, 0) is not None}
    entry.update({k: v for k, v in change.items() if v is not None})
    if change.get("memory_gib", 0) is None:
        entry["memory_gib"] = None
    with pytest.raises(GridError) as err:
        check_card(entry, "card.yaml")
    assert str(err.value) == message
    write(tmp_path, "card.yaml", entry)
    write(tmp_path, "food.yaml", FOOD)
    out = pal_paper(
        tmp_path, ENV, "plan", "--params", "food.yaml", "--card", "card.yaml"
    )
    assert (out.returncode, out.stdout) == (1, "")
    assert out.stderr.strip() == f"Error: {message}"


def test_a_card_that_is_neither_named_nor_a_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("name: [unclosed\n")
    with pytest.raises(GridError) as err:
        card(str(tmp_path / "bad.yaml"))
    assert str(err.value) == f"{tmp_path / 'bad.yaml'}: not valid YAML"
    with pytest.raises(GridError) as err:
        card("a100")
    assert str(err.value) == (
        "--card: no card 'a100' (palpaper/costs.yaml has h200, h100, cpu) and no "
        "such file"
    )
    assert set(CARD) == set(CARD_KEYS)


def test_the_packaged_cards_check_and_follow_their_projection(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cards = costs()["cards"]
    for name in cards:
        assert card(name).where == f"palpaper/costs.yaml {name}"
    h200, h100 = cards["h200"], cards["h100"]
    assert h200["status"] == h100["status"] == "projected"
    # every method at the FLOP rate of PAL's measured step (405 samples/s at
    # 199.0 GF a sample); an H100 at 1.05x an H200's time
    for m, gf in GF.items():
        assert h200["tune_per_s"][m] == round(405 * 199.0 / gf, 1), m
        assert h100["tune_per_s"][m] == round(405 * 199.0 / gf / 1.05, 1), m
    # extraction at the FLOP rate of the measured forward (2223.4/s at 111.9 GF
    # a sample, the frozen pass included), each method's forward now
    gfx = {"pal": 65.84, "rebq": 65.81, "map": 52.50, "msp": 66.08}
    gfx |= {"l2p": 44.02, "dualprompt": 39.37}
    for m, gf in gfx.items():
        assert h200["extract_per_s"][m] == round(2223.4 * 111.89 / gf, 1), m
        assert h100["extract_per_s"][m] == round(2223.4 * 111.89 / gf / 1.05, 1), m
    assert h200["packing"] == {1: 1.0, 2: 1.64}  # 4 at once: not measured
    # the default on a GPU: h200, or the card PAL_PAPER_CARD names
    assert card(None, "GPU").where == "palpaper/costs.yaml h200"
    assert card(None, "CPU").where == "palpaper/costs.yaml cpu"
    path = write(tmp_path, "card.yaml", CARD)
    monkeypatch.setenv("PAL_PAPER_CARD", str(path))
    assert card(None, "GPU").where == str(path)
    assert card(None, "CPU").where == "palpaper/costs.yaml cpu"


def test_plan_paper_prices_both_datasets_and_their_sum(tmp_path: Path) -> None:
    write(tmp_path, "card.yaml", CARD)
    write(tmp_path, "configs/food101.yaml", FOOD)
    write(tmp_path, "configs/n24news.yaml", NEWS)
    args = ["--card", "card.yaml", "--cards", "4"]
    report = json.loads("\n".join(plan(tmp_path, "paper", *args, "--json")))
    assert [(g["dataset"], g["params"], g["results"]) for g in report["datasets"]] == [
        ("food101", "configs/food101.yaml", PAPER_FOOD101),
        ("n24news", "configs/n24news.yaml", ["missing", "steps"]),
    ]
    # each dataset's grid is `pal-paper plan` of its preset
    for grid in report["datasets"]:
        alone = plan(
            tmp_path, *grid["results"], "--params", grid["params"], *args, "--json"
        )
        assert json.loads("\n".join(alone))["datasets"] == [grid]
    # the paper's card-hours are the sum of the datasets'; its cells both
    for route in ("measured", "cited"):
        each = [g["routes"][route] for g in report["datasets"]]
        paper = report["paper"][route]
        assert paper["card_hours"] == approx(sum(r["card_hours"] for r in each))
        assert paper["cells"] == sum(r["cells"] for r in each)
        assert paper["longest_cell_hours"] == max(r["longest_cell_hours"] for r in each)
        # the wall time places every cell on the 8 slots at once: no longer
        # than the two datasets one after the other
        assert paper["wall_hours"] <= sum(r["wall_hours"] for r in each) + 1e-9
    lines = plan(tmp_path, "paper", *args)
    assert lines[:2] == [
        f"the paper: {report['paper']['measured']['card_hours']:.1f} card-hours, "
        f"{report['paper']['measured']['wall_hours']:.1f} h wall on 4 cards",
        f"  with --baselines cited: {report['paper']['cited']['card_hours']:.1f} "
        f"card-hours, {report['paper']['cited']['wall_hours']:.1f} h wall",
    ]
    assert [x for x in lines if re.match(r"\w+ \(configs/", x)] == [
        "food101 (configs/food101.yaml): " + ", ".join(PAPER_FOOD101),
        "n24news (configs/n24news.yaml): missing, steps",
    ]
    assert max(len(x) for x in lines) <= 100


def test_plan_paper_is_named_alone(tmp_path: Path) -> None:
    out = pal_paper(tmp_path, ENV, "plan", "paper", "missing")
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "Error: plan: paper (the whole paper) is named alone, got paper missing"
    )
    out = pal_paper(tmp_path, ENV, "plan", "paper")
    assert out.stderr.strip() == "Error: configs/food101.yaml: params file not found"


# --- pal-paper run: every card torch sees, filled ---------------------------


def fake_cards(monkeypatch: pytest.MonkeyPatch, gib: list[float]) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: len(gib))
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(total_memory=int(gib[i] * 2**30)),
    )


def test_run_fills_each_card_torch_sees(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from palpaper import running
    from palpaper.workers import fill, fill_line

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("PAL_PAPER_CARD", raising=False)
    fake_cards(monkeypatch, [139.8, 139.8])
    packing = {1: 1.0, 2: 1.64}
    c = check_card({**CARD, "packing": packing}, "card.yaml")

    def slots(memory: float) -> int:
        return c.slots(3.9, memory)

    # 2 x 3.9 GiB within 90 % of 139.8: two a card, the cards round-robin
    assert fill(slots) == (["0", "1", "0", "1"], {"0": 2, "1": 2})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    assert fill(slots) == (["3", "5", "3", "5"], {"3": 2, "5": 2})
    fake_cards(monkeypatch, [139.8, 8.0])  # 2 x 3.9 > 90 % of 8 GiB: one there
    assert fill(slots) == (["3", "5", "3"], {"3": 2, "5": 1})
    assert fill_line({"3": 2, "5": 1}, packing, "x") == (
        "3 workers: cards 3 x 2, 5 x 1 tunings (packing by card's memory, x)"
    )
    fake_cards(monkeypatch, [])
    assert fill(slots) == ([], {})

    # Tables 1-2 on Food101's preset (tune.device cuda): palpaper/costs.yaml's
    # h200, its packing and its largest tuning
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    fake_cards(monkeypatch, [139.8, 139.8])
    with caplog.at_level("INFO", logger="palpaper.running"):
        got = running.fill_cards(["missing"], FOOD, None, False)
    assert got == ["0", "1", "0", "1"]
    assert caplog.messages == [
        "4 workers: cards 0,1 x 2 tunings each (packing 1.64x, palpaper/costs.yaml "
        "h200)"
    ]
    fake_cards(monkeypatch, [])
    assert running.fill_cards(["missing"], FOOD, None, False) is None
    cpu = {**FOOD, "tune": {**FOOD["tune"], "device": "cpu"}}
    fake_cards(monkeypatch, [139.8])
    assert running.fill_cards(["missing"], cpu, None, False) is None


def test_a_slurm_tasks_time_limit_is_its_longest_cell_alone_on_a_card() -> None:
    from palpaper.running import select_cells
    from palpaper.slurm import START_MIN, time_limit

    c = costs()["cards"]["h200"]
    rate = c["tune_per_s"]
    k, n, test = 10, 61127, 22716

    def t(m: str) -> float:
        per_task = c["first_batch_s"] + c["capture_s_per_task"]
        return c["tune_startup_s"] + k * per_task + 10 * n / rate[m]

    def e(m: str) -> float:
        return c["extract_startup_s"] + (n + test * (k + 1) / 2) / c["extract_per_s"][m]

    gather = c["extract_startup_s"]
    five = sum(t(m) + e(m) for m in FOOD["pipelines"]["baselines"])
    # the longest cell, per run: PAL trains and extracts, init extracts (at
    # PAL's rate: the same prompts, untrained), frozen gathers, and the five;
    # cited: the five not run
    pal = t("pal") + 2 * e("pal") + gather
    for runs, cite, minutes in (
        (None, False, 3 * (pal + five) / 60),
        ([0], False, (pal + five) / 60),
        (None, True, 3 * pal / 60),
        ([0], True, pal / 60),
    ):
        cells = select_cells(["missing"], FOOD, runs, None, None, cite)
        limit = time_limit(["missing"], cells, FOOD, 1, runs, cite)
        assert limit == math.ceil(1.25 * minutes) + START_MIN


def test_a_dataset_is_sized_from_its_listing(tmp_path: Path) -> None:
    """A dataset of one's own has a price: its counts per split and class
    come from its listing (rows with a modality missing count), and the
    price follows them."""
    make_files_tree(tmp_path / "mine", classes=12)  # 4 train, 1 val, 2 test
    params = yaml.safe_load(committed("params.yaml"))
    params["data"].update(dataset="files", root="mine", tasks=4)
    write(tmp_path, "params.yaml", params)
    report = json.loads("\n".join(plan(tmp_path, "missing", "--json")))
    (grid,) = report["datasets"]
    assert grid["size"] == {
        "train": 48,
        "test": 24,
        "classes": 12,
        "source": "its listing at mine",
    }
    # the demo's folders are not there: the tiny backbone's sizes come from
    # the demo params (64 wide, 4 layers, 128 MLP, 8x8 patches of 64 px)
    demo, b32 = Shape(64, 4, 128, 64), Shape(768, 12, 3072, 144)
    factor = b32.macs(40) / demo.macs(params["model"]["max_text_len"])
    assert grid["backbone"] == {"rate_factor": factor, "source": "the demo's params"}


def test_the_demo_is_sized_from_its_params_before_it_exists(tmp_path: Path) -> None:
    params = yaml.safe_load(committed("params.yaml"))
    params["demo"].update(n_classes=8, train_per_class=5, test_per_class=3)
    write(tmp_path, "params.yaml", params)
    report = json.loads("\n".join(plan(tmp_path, "missing", "--json")))
    assert report["datasets"][0]["size"] == {
        "train": 40,
        "test": 24,
        "classes": 8,
        "source": "the demo's params",
    }


def test_a_dataset_nothing_sizes_is_one_line(tmp_path: Path) -> None:
    params = yaml.safe_load(committed("params.yaml"))
    params["data"].update(dataset="files", root="nowhere")
    write(tmp_path, "params.yaml", params)
    out = pal_paper(tmp_path, ENV, "plan")
    assert (out.returncode, out.stderr.strip()) == (
        1,
        "Error: params.yaml: data.root 'nowhere': no dataset there to size "
        "data.dataset 'files' from (put its listing there, or `pal check` the "
        "params it runs with)",
    )


def test_test_embeddings_follow_the_class_order() -> None:
    """Step k embeds the test samples of tasks 1..k, the tasks cut from
    prepare's class order: with unequal classes the sum is not test·(K+1)/2."""
    names = ["a", "b", "c", "d"]
    size = Size(names, {"train": [1, 1, 1, 1], "test": [1, 2, 3, 10]}, "test")
    order = class_order(names, 5)
    counts = dict(zip(names, [1, 2, 3, 10], strict=True))
    first, second = (sum(counts[c] for c in order[i : i + 2]) for i in (0, 2))
    assert size.tested(2, 5) == first + (first + second)
    capped = {c: min(n, 2) for c, n in counts.items()}
    first = sum(capped[c] for c in order[:2])
    assert size.tested(2, 5, cap=2) == first + sum(capped.values())
    assert size.total("test", cap=2) == 7 and size.total("test") == 16


def test_a_method_the_card_lacks_is_priced_at_pals_figures() -> None:
    """A method added after the card was made (one module in
    pipeline/methods) costs what PAL costs on it, and says so."""
    c = check_card(CARD, "card.yaml")
    cell = make_cell(FOOD, {"data.missing_rate": 0.1})
    toy, pal = (
        tune_seconds(cell, FOOD, Variant(m, True, 10), c, SIZE) for m in ("toy", "pal")
    )
    assert toy == pal == pytest.approx(20 + 10 * 3 + 10 * 61127 / 400)
    assert c.priced_as("toy") == "pal" and c.priced_as("map") == "map"
    assert c.largest(["toy"]) == c.largest(["pal"])


def test_mmimdb_is_priced_with_its_caches_away_from_its_data(tmp_path: Path) -> None:
    """The MM-IMDb preset, its data absent: sized from split.json's totals
    (costs.yaml), Tables 1-2 priced, and the caches in closed form: the
    frozen queries 3 x 2 x 768 float32 a train or test film, the pixels a
    2:3 poster at 384 x 576 x 3 bytes."""
    write(tmp_path, "card.yaml", CARD)
    write(
        tmp_path,
        "configs/mmimdb.yaml",
        yaml.safe_load(committed("configs/mmimdb.yaml")),
    )
    args = ["missing", "--params", "configs/mmimdb.yaml", "--card", "card.yaml"]
    (grid,) = json.loads("\n".join(plan(tmp_path, *args, "--json")))["datasets"]
    n = 15552 + 7799
    assert grid["size"]["train"] == 15552 and grid["size"]["test"] == 7799
    assert grid["routes"]["measured"]["cells"] == 15
    assert grid["caches"]["samples"] == n
    assert grid["caches"]["frozen_gb"] == approx(n * 3 * 2 * 768 * 4 / 1e9)
    assert grid["caches"]["pixels_gb"] == approx(n * 384 * 576 * 3 / 1e9)
    lines = plan(tmp_path, *args)
    assert lines[0].startswith("mmimdb (configs/mmimdb.yaml): ")
    want = f"  caches for {n} train and test samples: the frozen queries 0.43 GB ("
    assert any(line.startswith(want) for line in lines)
