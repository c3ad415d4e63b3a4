"""Progress off a terminal: a log line at start, at most every INTERVAL s and
at the end (palcore.progress), on a fake clock."""

from __future__ import annotations

import io
import logging

import pytest

from palcore import progress


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    monkeypatch.setattr(progress, "clock", fake)
    monkeypatch.setattr(progress, "INTERVAL", 30.0)
    return fake


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "palcore.progress"]


def test_a_loop_off_a_terminal_logs_every_interval_and_at_the_end(clock, caplog):
    caplog.set_level(logging.INFO)
    for _ in progress.tqdm(range(100), desc="demo images", unit="image", leave=False):
        clock.now += 1.0  # one item a second
    assert _lines(caplog) == [
        "demo images: 0% (0/100 image) [00:00<?, ?image/s]",
        "demo images: 30% (30/100 image) [00:30<01:10, 1.00image/s]",
        "demo images: 60% (60/100 image) [01:00<00:40, 1.00image/s]",
        "demo images: 90% (90/100 image) [01:30<00:10, 1.00image/s]",
        "demo images: 100% (100/100 image) [01:40<00:00, 1.00image/s]",
    ]


def test_a_postfix_off_a_terminal_waits_for_a_true_count(clock, caplog):
    """A loop that sets its loss each item logs the count with it, never the
    last line's count beside a newer loss."""
    caplog.set_level(logging.INFO)
    bar = progress.tqdm(range(60), desc="pre-train", unit="it")
    for i in bar:
        clock.now += 1.0
        bar.set_postfix(loss=f"{i / 100:.2f}")
    assert _lines(caplog) == [
        "pre-train: 0% (0/60 it) [00:00<?, ?it/s]",
        "pre-train: 50% (30/60 it) [00:30<00:30, 1.00it/s, loss=0.29]",
        "pre-train: 100% (60/60 it) [01:00<00:00, 1.00it/s, loss=0.59]",
    ]


def test_updates_within_the_interval_log_nothing_more(clock, caplog):
    caplog.set_level(logging.INFO)
    with progress.tqdm(total=10, desc="solve", unit="row", disable=None) as bar:
        for _ in range(10):
            clock.now += 2.9
            bar.update()
    assert _lines(caplog) == [
        "solve: 0% (0/10 row) [00:00<?, ?row/s]",
        "solve: 100% (10/10 row) [00:29<00:00, 2.90s/row]",
    ]


def test_disable_true_and_a_terminal_log_nothing(clock, caplog, monkeypatch):
    caplog.set_level(logging.INFO)
    for _ in progress.tqdm(range(5), disable=True):
        clock.now += 100
    tty = io.StringIO()
    monkeypatch.setattr(tty, "isatty", lambda: True, raising=False)
    for _ in progress.tqdm(range(5), file=tty, mininterval=0):
        clock.now += 100
    assert _lines(caplog) == []
    assert "5/5" in tty.getvalue()  # tqdm's own bar, on the terminal
