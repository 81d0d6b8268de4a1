"""One key's buckets shared by a router's workers (workers/keytable.py, request/tenants.py).

Two views of one memory file stand in for two workers (their record locks do not
exclude each other within one process; the integration tests run real workers).
"""

from __future__ import annotations

import json
import math
import os

import msgspec
from hypothesis import given
from hypothesis import strategies as st

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
    return (
        Tenants(clock=clock, table=first, workers=2),
        Tenants(clock=clock, table=second, workers=2),
    )


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


BUDGETED = key("spender", "d" * 64, budget={"tokens": 10_000, "per": "day"})


def leased_workers(capacity: int = 4) -> tuple[Tenants, Tenants]:
    """Two workers following a controller that leases the BUDGETED key."""
    w0, w1 = two_workers(ManualClock(), capacity)
    for w in (w0, w1):
        w.retain([BUDGETED], leased=[BUDGETED])
        w.leasing = True
    return w0, w1


def spend(w: Tenants, tokens: int, k: ClientKey = BUDGETED) -> str:
    """One request of `k` through worker `w` that uses `tokens`: "ok" or the refusal's code."""
    got = w.admit(Tenant(k), "m", 40)
    if not isinstance(got, Charge):
        return code(got)
    got.settle(Usage(prompt=tokens, completion=0, cached=0))
    return "ok"


def lease(workers: tuple[Tenants, ...], report: int, tokens: float, elsewhere: float = 0.0) -> None:
    """Report `report` answered: each worker takes the answer (the supervisor's Leased)."""
    for w in workers:
        w.reallow({BUDGETED.sha256: (tokens, elsewhere)}, report)


def held(w: Tenants, report: int) -> float | None:
    """What worker `w` says it holds of the key in report `report`."""
    return w.asked(report)[BUDGETED.sha256][2]


class TestSharedAllowance:
    """A leased budget's allowance is the router's, in the key's row: not 1/workers each."""

    def test_one_worker_spends_the_whole_allowance(self) -> None:
        """100 tokens leased to the router: one worker spends all of them, and then
        both refuse (each spent half before)."""
        w0, w1 = leased_workers()
        lease((w0, w1), 1, 100.0)
        assert [spend(w0, 60), spend(w0, 30)] == ["ok", "ok"]
        assert spend(w0, 20) == "ok"  # 10 left: admitted, and overdrawn by its answer
        assert spend(w0, 1) == "insufficient_quota"
        assert spend(w1, 1) == "insufficient_quota"

    def test_both_workers_spend_one_allowance(self) -> None:
        """Spent through both workers, the allowance runs out once for the router."""
        w0, w1 = leased_workers()
        lease((w0, w1), 1, 100.0)
        assert [spend(w0, 50), spend(w1, 50)] == ["ok", "ok"]
        assert [spend(w0, 1), spend(w1, 1)] == ["insufficient_quota"] * 2

    def test_held_is_said_once_per_report(self) -> None:
        """The first worker asked says what the router holds; the others say nothing,
        so the supervisor's sum of their reports counts it once."""
        w0, w1 = leased_workers()
        lease((w0, w1), 1, 100.0)
        spend(w0, 30)
        spend(w1, 1)
        assert (held(w0, 2), held(w1, 2)) == (69.0, None)
        assert (held(w1, 3), held(w0, 3)) == (69.0, None)

    def test_the_answer_counts_from_the_first_cut(self) -> None:
        """Spent after the first worker was asked, by either worker, comes off the
        answer's allowance, whichever worker takes it first; the second takes nothing."""
        w0, w1 = leased_workers()
        lease((w0, w1), 1, 1000.0)
        spend(w0, 1)
        spend(w1, 1)
        held(w0, 2)
        spend(w1, 10)
        held(w1, 2)
        spend(w0, 20)
        lease((w0,), 2, 100.0)
        spend(w1, 5)
        lease((w1,), 2, 100.0)
        assert held(w0, 3) == 100.0 - 10 - 20 - 5

    def test_an_answer_older_than_the_last_cut_is_not_taken(self) -> None:
        """Answer 2 taken only after report 3 was cut leaves the row as it was: the
        spend since the cut would count from too late."""
        w0, w1 = leased_workers()
        lease((w0, w1), 1, 100.0)
        spend(w0, 1)
        spend(w1, 1)
        held(w1, 2)
        held(w1, 3)
        spend(w1, 10)
        lease((w0,), 2, 500.0)
        assert held(w0, 4) == 100.0 - 12

    def test_a_row_made_after_the_answer_gets_it(self) -> None:
        """A worker that took the answer before it saw the key gives its row the
        allowance when it makes it: leased once, the other worker spends from it too."""
        w0, w1 = leased_workers()
        lease((w0, w1), 1, 100.0)
        assert spend(w1, 40) == "ok"
        assert spend(w0, 40) == "ok"
        assert held(w0, 2) == 20.0

    def test_a_key_without_a_row_spends_its_worker_part(self) -> None:
        """The table full, a key is counted per worker: each spends 1/workers of the
        allowance, so the workers together still spend no more than the router's."""
        w0, w1 = leased_workers(capacity=1)
        filler = key("filler", "e" * 64, rpm=10)
        assert spend(w0, 1, filler) == "ok"
        lease((w0, w1), 1, 100.0)
        assert [spend(w0, 50), spend(w0, 1)] == ["ok", "insufficient_quota"]
        assert [spend(w1, 50), spend(w1, 1)] == ["ok", "insufficient_quota"]


# One report round: where each of the two workers spends (before, between or after the
# asks and the takes: slot 0..4), how much, which worker is asked and takes first,
# and the allowance answered.
_ROUND = st.tuples(
    st.lists(st.tuples(st.integers(0, 1), st.integers(0, 4), st.integers(0, 50)), max_size=6),
    st.integers(0, 1),
    st.integers(0, 1),
    st.integers(0, 500),
)


class TestAllowanceRounds:
    """The row's allowance over report rounds, whatever the workers' order."""

    @given(st.lists(_ROUND, min_size=1, max_size=6))
    def test_the_allowance_is_the_lease_less_the_spend_since_the_first_cut(
        self, rounds: list[tuple[list[tuple[int, int, int]], int, int, int]]
    ) -> None:
        """After each answer the row holds exactly the lease less what both workers
        spent since the first of them was asked, and one worker said what it held."""
        t0 = table(4)
        t1 = keytable.KeyTable(t0.fd, offset=0, capacity=4)
        rows = [t.find("k", NOLIMITS, (6.0, 0.0), 0.0) for t in (t0, t1)]
        assert rows[0] is not None
        assert rows[1] is not None
        for report, (spends, asked_first, took_first, lease) in enumerate(rounds, start=1):
            since_cut = 0.0
            said: list[float | None] = []
            # The supervisor's order: both asked, then (the answer in) both take it.
            steps = [
                (True, rows[asked_first]),
                (True, rows[1 - asked_first]),
                (False, rows[took_first]),
                (False, rows[1 - took_first]),
            ]
            for slot in range(5):
                for who, at, tokens in spends:
                    if at == slot:
                        rows[who].spend(float(tokens))
                        since_cut += tokens if slot > 0 else 0
                if slot < 4:
                    cuts, row = steps[slot]
                    if cuts:
                        said.append(row.cut(report))
                    else:
                        row.allow(report, float(lease))
            assert rows[0].allowance() == rows[1].allowance() == lease - since_cut
            assert said[1] is None
            assert (said[0] is None) == (report == 1)
