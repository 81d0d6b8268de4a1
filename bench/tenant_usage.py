"""What counting a client key's usage adds to each of its requests, in-process.

Per call, best of five runs of 200,000: the router's existing per-request recording
(`RouterMetrics.request_done` and `tokens`) for scale, then what a request of a
client key adds on top: its team's series (`RouterMetrics.team_done`) and its row
of the usage report (`TokenCounts.count`). Prints one line; the modules run as
Python or compiled, as `compiled.STATUS` says.

    .venv/bin/python bench/tenant_usage.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

from llmgw.router import compiled
from llmgw.router.control.tokenusage import TokenCounts
from llmgw.router.metrics import RouterMetrics
from llmgw.runtime.clock import SYSTEM_CLOCK
from llmgw.wire.answerusage import Usage

CALLS = 200_000


def per_call_us(f: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(CALLS):
            f()
        best = min(best, (time.perf_counter() - t) / CALLS * 1e6)
    return best


def main() -> None:
    m = RouterMetrics(snapshots=list, held=dict)
    counts = TokenCounts(clock=SYSTEM_CLOCK)
    u = Usage(prompt=100, completion=20, cached=0)

    def existing() -> None:
        m.request_done("m1", "e0", 200, 0.01, outcome="ok")
        m.tokens("m1", 100, 20, 0)

    base = per_call_us(existing)
    team = per_call_us(lambda: m.team_done("research", "m1", "ok", u))
    count = per_call_us(lambda: counts.count("alice", "research", "m1", u))
    built = "compiled" if compiled.STATUS.modules else "python"
    print(
        f"modules={built} request_done+tokens {base:.2f} us; "
        f"team_done {team:.2f} us; TokenCounts.count {count:.2f} us"
    )


if __name__ == "__main__":
    main()
