"""`pal-paper plan`: a grid priced per card and per prompt method, the card
filled with J tunings, card files checked, the whole paper in one command;
`pal-paper run`'s workers filling the cards torch sees.

The prices are closed forms of a card file written here (CARD), so they do not
move when palpaper/costs.yaml's figures are replaced by a measurement; the
packaged cards are checked against their stated projection.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from helpers import committed, pal_paper

from palpaper.grids import RESULTS, GridError, make_cell
from palpaper.plan import (
    CARD_KEYS,
    Variant,
    card,
    check_card,
    costs,
    extract_seconds,
    tune_seconds,
)

FOOD = yaml.safe_load(committed("configs/food101.yaml"))
NEWS = yaml.safe_load(committed("configs/n24news.yaml"))
SIZE = {"train": 61127, "test": 22716, "classes": 100}  # Food101
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
        lines = plan(
            tmp_path, "tasks", "--params", f"{method}.yaml", "--card", "card.yaml"
        )
        got = re.search(
            r"  tasks: 4 cells, 9 tunings, 9 extractions: ([\d.]+) h", lines[3]
        )
        assert got, lines
        hours[method] = float(got[1])
    # tasks: K = 5, 20, 50 are new cells (10 is the committed one), PAL alone
    # (here the pal variant with method map or pal); J = 2 for pal, 4 for map
    work = {
        m: sum(3 * (tune(m, k) + extract(k)) for k in (5, 20, 50)) / 3600
        for m in ("pal", "map")
    }
    assert hours["pal"] == round(work["pal"] / 1.6, 1)
    assert hours["map"] == round(work["map"] / 2.0, 1)
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
    assert lines[0] == (
        "food101, a test card (tune.device cuda; card.yaml): measured on a test "
        "card at abc1234, 500 steps"
    )
    assert lines[1] == (
        "  2 tunings at once a card, at 1.6x the samples/s of one alone (2 x 5 GiB, "
        "the largest tuning of pal, map, msp, l2p, dualprompt, rebq, within 90 % of "
        "20 GiB; packing figures for J = 1, 2, 4): hours below are card-hours, wall "
        "times on 2 slots a card"
    )
    minutes = ", ".join(f"{m} {tune(m) / 60:.1f}" for m in ("pal", *baselines))
    extracts = ", ".join(f"{m} {extract() / 60:.1f}" for m in ("pal", *baselines))
    assert lines[2] == (
        f"  per (variant, run) at the committed params: tune {minutes} min; extract "
        f"{extracts} min, without prompts (ACIL) 0.5 min (a gather of the "
        f"frozen queries); the frozen queries {FROZEN_H * 60:.1f} min once (shared "
        "by every cell)"
    )
    assert lines[3:] == [
        "  --baselines measured (the default): the five compared methods run too",
        f"    missing: 15 cells, {42 + 45 * 5} tunings, {126 + 45 * 5} extractions: "
        f"{missing:.1f} h",
        "    upsampling: 5 cells, 0 tunings, 0 extractions: 0.0 h",
        f"    all of them: {missing + FROZEN_H:.1f} h (cells shared between results "
        "and the frozen queries counted once)",
        f"    on 4 cards: {wall:.1f} h wall (8 slots; 20 cells, the longest "
        f"{cell * 2 / 1.6:.1f} h)",
        f"    a cluster job's time limit needs {cell * 2 / 1.6:.1f} h: the longest "
        f"cell, 2 at once on its card ({cell:.1f} h alone, as a `pal-paper submit` "
        "task runs it)",
        "  --baselines cited: MAP, MSP, L2P, DualPrompt and RebQ not run (Tables "
        "1-2 cite the paper)",
        f"    missing: 15 cells, 42 tunings, 126 extractions: {14 * cited / 1.6:.1f} h",
        "    upsampling: 5 cells, 0 tunings, 0 extractions: 0.0 h",
        f"    all of them: {14 * cited / 1.6 + FROZEN_H:.1f} h (cells shared between "
        "results and the frozen queries counted once)",
        # 14 cells with work on 8 slots: two on six of them
        f"    on 4 cards: {FROZEN_H + 2 * cited * 2 / 1.6:.1f} h wall (8 slots; 19 "
        f"cells, the longest {cited * 2 / 1.6:.1f} h)",
        f"    a cluster job's time limit needs {cited * 2 / 1.6:.1f} h: the longest "
        f"cell, 2 at once on its card ({cited:.1f} h alone, as a `pal-paper submit` "
        "task runs it)",
        "  largest solve: width 20000, a 20000 x 20000 float64 Gram matrix of 3.2 GB "
        "per solve (solve.device auto)",
    ]


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
    lines = plan(tmp_path, "upsampling", "tasks", "--params", "p.yaml")
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
    assert lines[0].startswith(
        "food101, a 2-core AMD EPYC (Zen 4) CPU (tune.device cpu; "
        "palpaper/costs.yaml cpu): measured on"
    )
    assert lines[1] == (
        "  1 tuning at once a card, at 1x the samples/s of one alone (its memory not "
        "recorded; packing figures for J = 1): hours below are card-hours, wall "
        "times on 1 slot a card"
    )
    assert lines[3:] == [
        "  upsampling: 5 cells, 0 tunings, 0 extractions: 0.0 h",
        f"  tasks: 4 cells, 3 tunings, 3 extractions: {work:.1f} h",
        f"  all of them: {work + frozen / 60:.1f} h (cells shared between results "
        "and the frozen queries counted once)",
        # 8 cells: Table 4's 15k cell and Table 5's K = 5 are the committed one
        f"  on 1 card: {work + frozen / 60:.1f} h wall (1 slot; 8 cells, the "
        f"longest {hours(50):.1f} h)",
        f"  a cluster job's time limit needs {hours(50):.1f} h: the longest cell, 1 "
        f"at once on its card ({hours(50):.1f} h alone, as a `pal-paper submit` "
        "task runs it)",
        "  largest solve: width 20000, a 20000 x 20000 float64 Gram matrix of 3.2 GB "
        "per solve (solve.device auto)",
    ]


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
    lines = plan(tmp_path, "paper", "--card", "card.yaml", "--cards", "4")
    assert lines[0] == (
        "the paper, a test card (card.yaml): measured on a test card at abc1234, "
        "500 steps"
    )
    assert lines[1].startswith("  2 tunings at once a card, at 1.6x")
    heads = [x for x in lines if re.match(r"  \w+ \(configs/", x)]
    assert heads == [
        "  food101 (configs/food101.yaml): " + ", ".join(RESULTS),
        "  n24news (configs/n24news.yaml): missing, steps",
    ]
    # each dataset's block is `pal-paper plan` of its preset, indented
    for path, ids in (
        ("configs/food101.yaml", list(RESULTS)),
        ("configs/n24news.yaml", ["missing", "steps"]),
    ):
        alone = plan(
            tmp_path, *ids, "--params", path, "--card", "card.yaml", "--cards", "4"
        )
        start = lines.index(next(x for x in heads if path in x)) + 1
        assert lines[start : start + len(alone) - 2] == ["  " + x for x in alone[2:]]
    totals = [
        float(x) for x in re.findall(r"    all of them: ([\d.]+) h", "\n".join(lines))
    ]
    cells = [int(x) for x in re.findall(r"slots; (\d+) cells", "\n".join(lines))]
    assert len(totals) == len(cells) == 4  # food101 measured, cited; n24news too
    measured, cited = lines[-2:]
    got = re.fullmatch(
        r"  the paper, --baselines measured: ([\d.]+) card-hours; on 4 cards: "
        r"([\d.]+) h wall \((\d+) cells, the longest ([\d.]+) h\)",
        measured,
    )
    assert got, measured
    # the total is the sum of the datasets' (each printed to 0.1 h)
    assert abs(float(got[1]) - (totals[0] + totals[2])) <= 0.1 + 1e-9
    assert int(got[3]) == cells[0] + cells[2]
    got = re.fullmatch(
        r"  the paper, --baselines cited: ([\d.]+) card-hours; on 4 cards: "
        r"([\d.]+) h wall \((\d+) cells, the longest ([\d.]+) h\)",
        cited,
    )
    assert got, cited
    assert abs(float(got[1]) - (totals[1] + totals[3])) <= 0.1 + 1e-9
    assert int(got[3]) == cells[1] + cells[3]


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
