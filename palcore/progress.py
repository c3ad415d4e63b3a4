"""Progress bars that still say how far a step is when nobody watches a terminal.

`tqdm` here is tqdm's bar on a terminal. Elsewhere (`dvc repro` into a log
file, a pipe, CI) tqdm's own bar would print nothing (`disable=None`) or
carriage returns that a log shows as one endless line; this one logs a line
instead (`INFO palcore.progress: demo images: 45% (360/800 image) [00:12<00:15,
29.1image/s]`) when it starts, at most every `INTERVAL` seconds while it runs
and when it ends. With steps shorter than 10 s, a long loop so logs at least
every 30 s. The lines go to the log (stderr), never into an output.

`disable=True` still silences a bar; `disable=None` (tqdm's "not on a
terminal") and the default give lines off a terminal.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from tqdm import tqdm as _tqdm

log = logging.getLogger(__name__)

INTERVAL = 20.0  # seconds between two lines of one bar, off a terminal
_LINE = "{desc}: {percentage:.0f}% ({n_fmt}/{total_fmt} {unit}) [{elapsed}<{remaining}, {rate_fmt}{postfix}]"  # noqa: E501
clock = time.time  # what the bars read the time from (tests replace it)


class _Nowhere:
    """A file that drops what tqdm writes: the lines go to the log instead."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def _on_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False


class tqdm(_tqdm):  # noqa: N801 - a drop-in for tqdm's class
    """tqdm on a terminal; elsewhere a log line at start, every INTERVAL s and
    at the end (`leave=False` too: the last line says where it stopped)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        disable = kwargs.pop("disable", None)
        self._lines = not disable and not _on_terminal(kwargs.get("file") or sys.stderr)
        if self._lines:
            kwargs.update(
                file=_Nowhere(),
                mininterval=INTERVAL,
                miniters=1,
                leave=True,
                bar_format=_LINE,
                delay=0,
            )
        super().__init__(*args, disable=bool(disable), **kwargs)
        if self._lines:  # the clock of this module, from the start
            self._time = clock
            self.start_t = self.last_print_t = clock()

    def set_postfix(
        self, ordered_dict: Any = None, refresh: bool = True, **kwargs: Any
    ) -> None:
        """Off a terminal the postfix waits for the next line: a refresh
        would log the count of the last line (tqdm's iterator keeps its
        count to itself between lines), a stale "0/300" with a new loss."""
        super().set_postfix(ordered_dict, refresh and not self._lines, **kwargs)

    def display(self, msg: str | None = None, pos: int | None = None) -> bool:
        if not self._lines:
            return super().display(msg, pos)
        # tqdm pads the rate to a width ("  1.00it/s"): one space in a log
        line = " ".join((self.__str__() if msg is None else msg).split())
        # "" clears a terminal's bar; the end's line may repeat the last one
        if msg != "" and line != getattr(self, "_logged", None):
            log.info("%s", line)
            self._logged = line
        return True
