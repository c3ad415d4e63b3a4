"""The longest silence in a log: timestamps each line read from stdin.

    make run 2>&1 | python3 .ci/log_gaps.py [--limit 30] [--echo]

Reads lines as they arrive, stamps each with the seconds since the start
and, at the end, prints the largest gaps between consecutive lines (and
before the first), each with the line that ended it. With `--limit S`, exits
1 when a gap exceeds S seconds. `--echo` passes each line through first, so
the log is still seen as it runs. Carriage returns count as line ends: a
progress bar redrawn in place is output too.
"""

from __future__ import annotations

import argparse
import sys
import time


def gaps(stream, clock=time.monotonic, echo=None) -> tuple[list, float]:
    """(gap seconds, line number, line) for each line of `stream` and the total
    seconds; a line ends at '\\n' or '\\r'."""
    start = last = clock()
    found = []
    n = 0
    buf = ""
    while True:
        chunk = stream.read(1)
        if not chunk:
            break
        if echo is not None:
            echo.write(chunk)
            echo.flush()
        if chunk not in "\r\n":
            buf += chunk
            continue
        now = clock()
        n += 1
        found.append((now - last, n, buf))
        last, buf = now, ""
    now = clock()
    if buf:
        found.append((now - last, n + 1, buf))
    return found, now - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=float, default=None, help="fail above S s")
    ap.add_argument("--top", type=int, default=5, help="how many gaps to list")
    ap.add_argument("--echo", action="store_true", help="pass the log through")
    args = ap.parse_args()
    stream = open(sys.stdin.fileno(), encoding="utf-8", errors="replace", newline="")
    found, total = gaps(stream, echo=sys.stdout if args.echo else None)
    print(f"{len(found)} lines in {total:.1f} s; the longest gaps:")
    for gap, n, line in sorted(found, reverse=True)[: args.top]:
        print(f"  {gap:6.1f} s before line {n}: {line.strip()[:100]}")
    worst = max((g for g, _, _ in found), default=total)
    if args.limit is not None and worst > args.limit:
        print(f"FAIL: a silence of {worst:.1f} s, over {args.limit:g} s")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
