"""One key's buckets shared by a router's workers (workers/keytable.py, request/tenants.py).

Two views of one memory file stand in for two workers (their record locks do not
exclude each other within one process; the integration tests run real workers).
"""

from __future__ import annotations

import json
import math
import os

import msgspec

from llmgw.router.http.answers import Whole
from llmgw.router.request.tenants import Charge, Tenant, Tenants
from llmgw.router.workers import keytable
from llmgw.router.workers.shared import SharedInflight
from llmgw.runtime.clock import ManualClock
from llmgw.wire.answerusage import Usage
from llmgw.wire.keys import ClientKey

NOLIMITS: keytable.Limits = (6.0, math.nan, math.nan, math.nan)


def key(name: str = "alice", digest: str = "a" * 64, **kw: object) -> ClientKey:
    return msgspec.convert({"name": name, "sha256": digest, **kw}, ClientKey)


def table(capacity: int) -> keytable.KeyTable:
    """A key table of `capacity` rows alone in a fresh memory file."""
    fd = os.memfd_create("test-keys", 0)
    os.ftruncate(fd, keytable.table_bytes(capacity))
    return keytable.KeyTable(fd, offset=0, capacity=capacity)


def two_workers(clock: ManualClock, capacity: int = 4) -> tuple[Tenants, Tenants]:
    """Two workers' Tenants over one shared table (a small one, for collisions)."""
    first = table(capacity)
    second = keytable.KeyTable(first.fd, offset=0, capacity=capacity)
    return Tenants(clock=clock, table=first), Tenants(clock=clock, table=second)


def status(resp: object) -> int:
    if isinstance(resp, Charge):
        return 200
    assert isinstance(resp, Whole)
    return resp.status


def code(resp: object) -> str:
    assert isinstance(resp, Whole)
    assert isinstance(resp.body, bytes)
    return str(json.loads(resp.body)["error"]["code"])


class TestKeyTable:
    """Rows found, claimed and freed by key."""

    def test_two_views_find_one_row(self) -> None:
        """A key claimed by one view is the same row, started once, in the other."""
        first = SharedInflight.create(2, capacity=4)
        second = SharedInflight(first.fd, workers=2, index=1, capacity=4)
        a = first.keys.find("k1", NOLIMITS, (6.0, 0.0), 10.0)
        assert a is not None
        a.cells[keytable.RPM_LEVEL] = 2.0
        b = second.keys.find("k1", NOLIMITS, (6.0, 0.0), 20.0)
        assert b is not None
        assert (b.index, b.cells[keytable.RPM_LEVEL], b.cells[keytable.RPM_AT]) == (
            a.index,
            2.0,
            10.0,
        )

    def test_new_limits_keep_what_the_row_holds_and_spent(self) -> None:
        """A key whose limits changed keeps its level (never grown) and its spend; a
        bucket it gains starts full."""
        t = table(4)
        row = t.find("k1", (6.0, math.nan, 100.0, 0.0), (6.0, 0.0), 0.0)
        assert row is not None
        row.cells[keytable.RPM_LEVEL] = 2.0
        row.cells[keytable.SPENT] = 40.0
        again = t.find("k1", (12.0, 50.0, 100.0, 0.0), (12.0, 50.0), 1.0)
        assert again is not None
        cells = again.cells
        assert (cells[keytable.RPM_LEVEL], cells[keytable.SPENT]) == (2.0, 40.0)
        assert (cells[keytable.TPM_LEVEL], cells[keytable.TPM_AT]) == (50.0, 1.0)
        lower = t.find("k1", (1.0, 50.0, 100.0, 0.0), (1.0, 50.0), 2.0)
        assert lower is not None
        assert lower.cells[keytable.RPM_LEVEL] == 1.0

    def test_a_full_table_answers_none_and_a_freed_row_is_reused(self) -> None:
        """Past capacity a key has no row; a revoked key's row goes to the next key, and
        the revoked key's old view no longer owns it."""
        t = table(2)
        rows = [t.find(f"k{i}", NOLIMITS, (6.0, 0.0), 0.0) for i in range(3)]
        assert rows[2] is None
        old = rows[0]
        assert old is not None
        assert old.mine()
        t.free("k0")
        assert not old.mine()
        newcomer = t.find("k9", NOLIMITS, (6.0, 0.0), 0.0)
        assert newcomer is not None
        assert newcomer.index == old.index
        assert not old.mine()
        # The other key is still found past the reused row (the chain is unbroken).
        other = t.find("k1", NOLIMITS, (6.0, 0.0), 0.0)
        assert other is not None
        assert rows[1] is not None
        assert other.index == rows[1].index

    def test_budget_period_round_trips(self) -> None:
        """The period is kept as the ASCII text it is compared with."""
        row = table(2).find("k", NOLIMITS, (1.0, 0.0), 0.0)
        assert row is not None
        assert row.period == ""
        row.period = "2026-W49"
        assert row.period == "2026-W49"


class TestSharedBuckets:
    """Two workers' Tenants spend one bucket per key."""

    def test_a_limits_change_keeps_the_spend_in_both_workers(self) -> None:
        """A reload that changes a shared key's limits keeps what it spent, as with one
        process: a spent budget stays spent whichever worker sees the new limits."""
        clock = ManualClock()
        w0, w1 = two_workers(clock)
        budget = {"tokens": 100, "per": "day"}
        charge = w0.admit(Tenant(key(budget=budget)), "m", 10)
        assert isinstance(charge, Charge)
        charge.settle(Usage(prompt=100, completion=0, cached=0))
        relimited = Tenant(key(budget=budget, rpm=10))
        assert code(w1.admit(relimited, "m", 10)) == "insufficient_quota"
        assert code(w0.admit(relimited, "m", 10)) == "insufficient_quota"

    def test_rpm_is_spent_once_for_both_workers(self) -> None:
        """rpm 4 alternating between workers: four admitted in all, then 429 in both."""
        clock = ManualClock()
        w0, w1 = two_workers(clock)
        t = Tenant(key(rpm=4))
        got = [status((w0, w1)[i % 2].admit(t, "m", 10)) for i in range(6)]
        assert got == [200, 200, 200, 200, 429, 429]
        clock.advance(15.0)
        assert status(w1.admit(t, "m", 10)) == 200
        assert status(w0.admit(t, "m", 10)) == 429

    def test_settle_and_refund_reach_the_shared_bucket(self) -> None:
        """A charge settled by one worker is seen by the other; a refund gives back."""
        clock = ManualClock()
        w0, w1 = two_workers(clock)
        t = Tenant(key(tpm=100))
        charge = w0.admit(t, "m", 40)  # estimate 10
        assert isinstance(charge, Charge)
        charge.settle(Usage(prompt=95, completion=0, cached=0))
        refused = w1.admit(t, "m", 40)
        assert status(refused) == 429
        clock.advance(60.0)
        again = w1.admit(t, "m", 400)  # estimate 100: the whole bucket
        assert isinstance(again, Charge)
        assert again.headers["x-ratelimit-remaining-tokens"] == "0"
        again.refund()
        assert again.headers["x-ratelimit-remaining-tokens"] == "100"

    def test_budget_spend_is_the_routers(self) -> None:
        """A file key's budget spent through one worker is spent for the other."""
        clock = ManualClock()
        w0, w1 = two_workers(clock)
        t = Tenant(key(budget={"tokens": 100, "per": "day"}))
        charge = w0.admit(t, "m", 10)
        assert isinstance(charge, Charge)
        charge.settle(Usage(prompt=100, completion=0, cached=0))
        assert code(w1.admit(t, "m", 10)) == "insufficient_quota"

    def test_a_revoked_key_freed_by_one_worker_is_found_again_by_the_other(self) -> None:
        """A worker that still enforces a key another worker forgot claims a row again."""
        clock = ManualClock()
        w0, w1 = two_workers(clock)
        k = key(rpm=2)
        t = Tenant(k)
        assert status(w0.admit(t, "m", 10)) == 200
        assert status(w1.admit(t, "m", 10)) == 200
        w0.retain([])
        # Freed: w1 starts the key afresh rather than writing into a row not its own.
        assert status(w1.admit(t, "m", 10)) == 200

    def test_one_process_has_no_table(self) -> None:
        """Without workers the buckets are this process's own, as before."""
        tenants = Tenants(clock=ManualClock())
        t = Tenant(key(rpm=1))
        assert status(tenants.admit(t, "m", 10)) == 200
        assert status(tenants.admit(t, "m", 10)) == 429

    def test_a_charge_of_a_freed_row_writes_nothing(self) -> None:
        """A request in flight when its key's row went to another key settles into
        nothing: the new key's bucket is not charged (one row: bob's is alice's was)."""
        clock = ManualClock()
        w0, w1 = two_workers(clock, capacity=1)
        charge = w0.admit(Tenant(key(tpm=100)), "m", 40)
        assert isinstance(charge, Charge)
        w1.admit(Tenant(key(tpm=100)), "m", 40)
        w0.retain([])
        w1.retain([])
        other = Tenant(key("bob", "b" * 64, tpm=100))
        first = w1.admit(other, "m", 4)
        assert isinstance(first, Charge)
        charge.settle(Usage(prompt=1000, completion=0, cached=0))
        second = w1.admit(other, "m", 4)
        assert isinstance(second, Charge)
        assert second.headers["x-ratelimit-remaining-tokens"] == "98"
