"""A fake engine for log tests: writes log lines to stdout, ignoring its arguments.

    SPEW_RATE     bytes per second (default 50e6)
    SPEW_SECONDS  how long it writes (default 3), then it idles until signalled
    SPEW_STATS    a file it writes `<bytes written> <slowest write in ms>` to when done
    SPEW_EXIT     when set, it then writes one line of this many bytes with no line
                  break (ANSI escapes, invalid UTF-8, then `RuntimeError: boom`) and
                  exits 3 instead of idling

Its slowest write tells whether the agent ever made it wait (a pipe nobody drains
blocks its writer; a file does not).
"""

from __future__ import annotations

import os
import time

LINE = b"INFO 12-07 11:43:46 engine.py:123 throughput 1234.5 tok/s, running: 17 reqs\n"
CHUNK = LINE * (65536 // len(LINE))


def main() -> None:
    rate = float(os.environ.get("SPEW_RATE", "50e6"))
    seconds = float(os.environ.get("SPEW_SECONDS", "3"))
    start = time.monotonic()
    written = 0
    slowest_s = 0.0
    while (now := time.monotonic()) - start < seconds:
        if written > rate * (now - start):
            time.sleep(0.001)
            continue
        before = time.monotonic()
        os.write(1, CHUNK)
        slowest_s = max(slowest_s, time.monotonic() - before)
        written += len(CHUNK)
    stats = os.environ.get("SPEW_STATS")
    if stats:
        with open(stats, "w") as f:
            f.write(f"{written} {slowest_s * 1000:.1f}\n")
    last = os.environ.get("SPEW_EXIT")
    if last:
        os.write(1, b"\x1b[2J\x1b[31m\xff\xfe" + b"x" * int(last) + b"RuntimeError: boom")
        os._exit(3)
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
