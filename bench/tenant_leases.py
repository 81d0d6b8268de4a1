"""What a leased share costs: per request on the router, per report on the controller.

Per request, best of five runs of 200,000 (`Tenants.admit` then `Charge.settle`) for
one key with an rpm and a tpm: enforced at its whole limit (a router file's key,
or no controller), and at a share the controller leased. Both limits are too large
to refuse anything, so every call takes the admitting path.

Per report, best of five: `LeaseBook.report` (what the controller does per usage
report) with every limited key asked of every router, the routers reporting in turn
with the shares they were last granted, at three kinds of demand (`report_ms`).

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
from llmgw.wire.leases import KeyDemand, LeaseAnswer

CALLS = 200_000
# Seconds between one router's reports (the routers' default report_interval_s).
INTERVAL_S = 2.0
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


def leased_key(i: int) -> ClientKey:
    return msgspec.convert(
        {"name": f"k{i}", "sha256": f"{i:064x}", "rpm": 600, "tpm": 100_000}, ClientKey
    )


def ask(keys: list[ClientKey], requests: float, answer: LeaseAnswer | None) -> list[KeyDemand]:
    """A router's report: every key asked `requests` per minute, holding its last grant."""
    held = {} if answer is None else {ls.sha256: ls for ls in answer.leases}
    out = []
    for k in keys:
        got = held.get(k.sha256)
        out.append(
            KeyDemand(
                sha256=k.sha256,
                requests=requests,
                tokens=requests * 100,
                rpm_held=None if got is None else got.rpm,
                tpm_held=None if got is None else got.tpm,
            )
        )
    return out


def report_ms(keys_n: int, routers_n: int, mode: str, rounds: int) -> float:
    """Best of five: ms per `LeaseBook.report`, the routers reporting in turn.

    mode: `steady` (each router asks the same every report), `jitter` (each report
    moves every key's ask by 1 %, as smoothed rates do), `swing` (every key's ask
    jumps between 50 and 250 rpm on every report: every split is stale every time).
    The routers report in turn, one every INTERVAL_S / routers seconds. CPU time of
    this process (not wall time), as the machine it runs on may be shared.
    """
    clock = ManualClock()
    book = LeaseBook(clock=clock)
    clock.advance(20.0)
    keys = [leased_key(i) for i in range(keys_n)]
    routers = [f"r{i}" for i in range(routers_n)]
    asks = {"steady": (100.0, 100.0), "jitter": (100.0, 101.0), "swing": (50.0, 250.0)}[mode]
    last: dict[str, LeaseAnswer | None] = dict.fromkeys(routers)
    for _ in range(3):
        for r in routers:
            last[r] = book.report(r, ask(keys, asks[0], last[r]), keys)
    reports = {(r, i): ask(keys, asks[i], last[r]) for r in routers for i in range(len(asks))}
    best = float("inf")
    for _ in range(5):
        t = time.process_time()
        for n in range(rounds):
            for r in routers:
                clock.advance(INTERVAL_S / routers_n)
                book.report(r, reports[r, (n + 1) % 2], keys)
        best = min(best, (time.process_time() - t) / (rounds * routers_n) * 1e3)
    return best


def main() -> None:
    whole, share = admit_us(False), admit_us(True)
    print(f"admit+settle: whole limit {whole:.2f} us, leased share {share:.2f} us")
    print("| keys | routers | demand | ms per LeaseBook.report |")
    print("|---:|---:|---|---:|")
    for keys_n, routers_n in ((1_000, 3), (1_000, 10), (10_000, 3)):
        rounds = max(2, 4_000 // (keys_n * routers_n // 3))
        for mode in ("steady", "jitter", "swing"):
            ms = report_ms(keys_n, routers_n, mode, rounds)
            print(f"| {keys_n:,} | {routers_n} | {mode} | {ms:.2f} |", flush=True)


if __name__ == "__main__":
    main()
