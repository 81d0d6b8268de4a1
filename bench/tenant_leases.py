"""What a leased share costs: per request on the router, per report on the controller.

Per request, best of five runs of 200,000 (`Tenants.admit` then `Charge.settle`) for
one key with an rpm and a tpm: enforced at its whole limit (a router file's key,
or no controller), and at a share the controller leased. Both limits are too large
to refuse anything, so every call takes the admitting path.

Per report, best of five: `LeaseBook.report` for one router of three, with KEYS
limited keys each asked of every router (what the controller does per usage report).

    .venv/bin/python bench/tenant_leases.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec

from llmgw.controller.leasebook import LeaseBook
from llmgw.router.request.tenants import Charge, Tenant, Tenants
from llmgw.runtime.clock import SYSTEM_CLOCK, ManualClock
from llmgw.wire.answerusage import Usage
from llmgw.wire.keys import ClientKey
from llmgw.wire.leases import KeyDemand

CALLS = 200_000
KEYS = 1_000
BIG = 2**40


def per_call_us(f: Callable[[], object], calls: int = CALLS) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(calls):
            f()
        best = min(best, (time.perf_counter() - t) / calls * 1e6)
    return best


def key(i: int) -> ClientKey:
    return msgspec.convert(
        {"name": f"k{i}", "sha256": f"{i:064x}", "rpm": BIG, "tpm": BIG}, ClientKey
    )


def admit_us(leased: bool) -> float:
    k = key(1)
    tenants = Tenants(clock=SYSTEM_CLOCK)
    tenants.retain([k], leased=[k] if leased else [])
    tenants.leasing = True
    tenants.reshare({k.sha256: (BIG / 3, BIG / 3)})
    t, u = Tenant(k), Usage(prompt=100, completion=20, cached=0)

    def one() -> None:
        got = tenants.admit(t, "m1", 400)
        assert isinstance(got, Charge)
        got.settle(u)

    return per_call_us(one)


def report_ms() -> float:
    clock = ManualClock()
    book = LeaseBook(clock=clock)
    clock.advance(20.0)
    keys = [key(i) for i in range(KEYS)]
    demand = [KeyDemand(sha256=k.sha256, requests=10.0, tokens=1e4) for k in keys]
    for r in ("r1", "r2", "r3"):
        book.report(r, demand, keys)
    return per_call_us(lambda: book.report("r2", demand, keys), calls=20) / 1000


def main() -> None:
    whole, share = admit_us(False), admit_us(True)
    print(
        f"admit+settle: whole limit {whole:.2f} us, leased share {share:.2f} us; "
        f"LeaseBook.report, {KEYS} keys x 3 routers: {report_ms():.1f} ms"
    )


if __name__ == "__main__":
    main()
