"""What a client key may do, enforced per router (docs/tenants.md).

A key without a model list, a limit or an expiry costs nothing here: the proxy
looks at `Tenant.guarded` (a plain attribute) and goes on. A guarded key is
admitted or refused in OpenAI's shapes:

    model outside the key's list   403 model_not_allowed
    requests per minute spent      429 rate_limit_exceeded   (Retry-After, x-ratelimit-*)
    tokens per minute spent        429 rate_limit_exceeded   (Retry-After, x-ratelimit-*)
    token budget of the period     429 insufficient_quota
    leased allowance spent, more   429 rate_limit_exceeded   (Retry-After: 2)
    held elsewhere in the fleet

RPM and TPM are token buckets that hold a minute's worth and refill evenly, so
a key may burst its whole minute and then goes at its rate. TPM admission can
only estimate the request (its body's bytes / 4, the usual size of a token)
before the engine has counted it; `Charge.settle` puts the engine's count in its
place once the answer is in, so a key that under-estimated pays it back before
its next request is admitted. Budgets count the engine's usage per calendar
period (UTC).

Counts live in this router's memory, and a restart forgets them. With workers
(`--workers N`), a key's buckets, its budget's spend and its leased allowance are
one per router, in the memory the workers share (workers/keytable.py): each admit,
settle and refund of such a key holds its row's lock for those few float
operations. (The buckets themselves: buckets.py.) A key the
controller gave is enforced at this router's *share* of its RPM and TPM, leased
by the controller with the answer to each usage report (control/leases.py keeps
the lease; controller/leasebook.py decides it): the buckets' rates are the
shares, so the check per request stays local, the same few float operations.
Its budget is an allowance of tokens the controller leases from what the fleet
has left, spent down here and replaced by each answer (counted from when the
report was built): with workers, the row's, which any worker may spend whole. A
file's key, or any under a controller that leases nothing, is enforced at its
whole limit.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable

from llmgw.router.http.answers import Whole
from llmgw.router.request.buckets import (
    NO_SHARE_RETRY_S,
    Bucket,
    SharedBucket,
    duration,
    relimited,
)
from llmgw.router.request.refusals import error_response, model_not_allowed, retry_after
from llmgw.router.workers import keytable
from llmgw.router.workers.keytable import KeyRow, KeyTable
from llmgw.runtime.clock import Clock
from llmgw.runtime.logs import kv
from llmgw.wire.answerusage import Usage
from llmgw.wire.keys import BudgetPeriod, ClientKey

log = logging.getLogger(__name__)

# Bytes of a request body per token, for the TPM estimate before the engine counts.
BYTES_PER_TOKEN = 4
# This router's (rpm, tpm) per minute of one key; the whole limit where nothing is leased.
Share = tuple[float, float]


class Tenant:
    """One key as the proxy reads it on every request (plain attributes, no properties)."""

    __slots__ = ("budget", "expires_at", "guarded", "key", "models", "name", "team")

    def __init__(self, key: ClientKey) -> None:
        self.key = key
        self.name = key.name
        self.team = key.team
        # None: every model.
        self.models: frozenset[str] | None = frozenset(key.models) if key.models else None
        self.budget = key.budget
        # Unix seconds; None: never expires (KeyRing.check refuses it after).
        self.expires_at = key.expires_at
        # Whether a request of this key needs `Tenants.admit` at all.
        self.guarded = self.models is not None or key.limited


class _Account:
    """The counts of one key (by its hash), kept across endpoint-list updates."""

    __slots__ = (
        "allowance",
        "asked_requests",
        "asked_tokens",
        "elsewhere",
        "limits",
        "period",
        "report_spent",
        "requests",
        "row",
        "spent",
        "tokens",
    )

    def __init__(self, key: ClientKey, now: float, share: Share, row: KeyRow | None) -> None:
        self.limits = (key.rpm, key.tpm, key.budget)
        # The key's row in the workers' shared table; None: this process alone counts.
        self.row = row
        rpm, tpm = share
        self.requests: Bucket | None = None
        self.tokens: Bucket | None = None
        if row is not None:
            cells = row.cells
            if key.rpm is not None:
                self.requests = SharedBucket(key.rpm, rpm, cells, keytable.RPM_LEVEL)
            if key.tpm is not None:
                self.tokens = SharedBucket(key.tpm, tpm, cells, keytable.TPM_LEVEL)
        else:
            self.requests = Bucket(key.rpm, rpm, now) if key.rpm is not None else None
            self.tokens = Bucket(key.tpm, tpm, now) if key.tpm is not None else None
        # The budget period the spend counts in ("" before the first request), and it.
        self.period = ""
        self.spent = 0
        # Asked of this router since the last demand report (admitted or not): what
        # the controller splits the limits by (control/leases.py).
        self.asked_requests = 0
        self.asked_tokens = 0
        # A leased budget: tokens of this process's allowance not spent yet (None: none
        # leased yet; with a row, the row's counts instead), what the rest of the fleet
        # may still spend, and the tokens spent since the last report was built (the
        # next allowance counts from it).
        self.allowance: float | None = None
        self.elsewhere = 0.0
        self.report_spent = 0

    def reshare(self, share: Share, now: float) -> None:
        row = self.row
        if row is not None:
            row.lock()
        try:
            # A row freed meanwhile (the key revoked) is another key's now: not written.
            if row is not None and not row.mine():
                return
            if self.requests is not None:
                self.requests.reshare(share[0], now)
            if self.tokens is not None:
                self.tokens.reshare(share[1], now)
        finally:
            if row is not None:
                row.unlock()

    def relimit(self, key: ClientKey, share: Share, now: float) -> None:
        """`key`'s limits changed (a reload, the controller's list): its buckets keep what
        they hold (never grown) and what it spent stays spent, as in keytable._relimit."""
        self.limits = (key.rpm, key.tpm, key.budget)
        self.requests = relimited(self.requests, key.rpm, share[0], now)
        self.tokens = relimited(self.tokens, key.tpm, share[1], now)


class Charge:
    """One admitted request of a limited key: its estimate, its headers, and its settling."""

    __slots__ = ("_account", "_budget_per", "_estimate", "_settled", "headers")

    def __init__(
        self,
        account: _Account,
        estimate: int,
        headers: dict[str, str],
        budget_per: BudgetPeriod | None,
    ) -> None:
        self._account = account
        self._estimate = estimate
        self._budget_per = budget_per
        self._settled = False
        # The x-ratelimit-* headers every answer to this request carries.
        self.headers = headers

    def header_lines(self) -> bytes:
        return b"".join(f"{k}: {v}\r\n".encode() for k, v in self.headers.items())

    def settle(self, usage: Usage | None) -> None:
        """The engine's count replaces the estimate (once; None: the estimate stands)."""
        if self._settled:
            return
        self._settled = True
        used = self._estimate if usage is None else usage.prompt + usage.completion
        acc = self._account
        row = acc.row
        if row is not None:
            row.lock()
        try:
            if row is None or row.mine():
                if acc.tokens is not None:
                    acc.tokens.level -= used - self._estimate
                if self._budget_per is not None:
                    if row is None:
                        acc.spent += used
                    else:
                        row.cells[keytable.SPENT] += used
                        row.spend(used)
        finally:
            if row is not None:
                row.unlock()
        if self._budget_per is not None and row is None:
            acc.report_spent += used
            if acc.allowance is not None:
                acc.allowance -= used

    def refund(self) -> None:
        """The request reached no engine (refused while it waited, or its client left
        first): it costs the key nothing, so its request and estimate go back to the
        buckets and no budget is spent; `headers` then say what is left. Once, in place
        of `settle`: a client that flow control refuses and that retries, as the openai
        package does, must not spend its own limits on answers it never got."""
        if self._settled:
            return
        self._settled = True
        acc = self._account
        requests, tokens, row = acc.requests, acc.tokens, acc.row
        if row is not None:
            row.lock()
        try:
            if row is not None and not row.mine():
                return
            if requests is not None:
                requests.level = min(requests.size, requests.level + 1.0)
            if tokens is not None:
                tokens.level = min(tokens.size, tokens.level + self._estimate)
            self.headers = _headers(acc)
        finally:
            if row is not None:
                row.unlock()


class Tenants:
    """Every limited key's counts on this router, and the verdict on each request.

    `shares`: sha256 → this router's (rpm, tpm) of a key the controller leases;
    `leased`: the keys that must have a share (the controller's, with an rpm or
    tpm) while `leasing` is on. Both are set by control/leases.py. `table`: the
    workers' shared key rows (None: one process, which counts alone); `workers`:
    how many processes a key without a row splits the budget allowances over (each
    spends 1/workers: a key in the table spends the row's, all of it).
    """

    def __init__(self, *, clock: Clock, table: KeyTable | None = None, workers: int = 1) -> None:
        self.clock = clock
        self.table = table
        self.workers = workers
        # Whether a key found the shared table full (warned once).
        self._table_full = False
        self._accounts: dict[str, _Account] = {}
        self.shares: dict[str, Share] = {}
        # sha256 → (this router's budget allowance, what the rest of the fleet holds),
        # from the answer to the supervisor's report number `allowed` (0: one process).
        self.allowances: dict[str, tuple[float, float]] = {}
        self.allowed = 0
        self.leased: frozenset[str] = frozenset()
        # Whether the controller leases shares: None until its first answer (no share
        # yet), False when it answers without any (a controller from before leases).
        self.leasing: bool | None = None

    def retain(self, keys: Iterable[ClientKey], *, leased: Iterable[ClientKey] = ()) -> None:
        """Forget the counts of keys no longer listed (revoked ones); `leased`: the
        controller's keys, enforced at the share it leases this router."""
        keep = {k.sha256.lower() for k in keys}
        for digest in [d for d in self._accounts if d not in keep]:
            if self._accounts.pop(digest).row is not None and self.table is not None:
                self.table.free(digest)
        self.leased = frozenset(k.sha256.lower() for k in leased if k.limited)

    def share_of(self, key: ClientKey, digest: str) -> Share:
        """What this router enforces of `key` now: its share, or the whole limit."""
        return self._enforced(digest, key.rpm, key.tpm)

    def _enforced(self, digest: str, rpm: int | None, tpm: int | None) -> Share:
        if digest not in self.leased or self.leasing is False:
            return (float(rpm or 0), float(tpm or 0))
        return self.shares.get(digest, (0.0, 0.0))

    def reshare(self, shares: dict[str, Share]) -> None:
        """New shares (a lease, or its fallback, or none from a controller that leases
        nothing): the accounts' buckets follow. Each gets what `share_of` says, so a key
        counted before such a controller's first answer (at a share of zero, which never
        refills) is enforced at its whole limit from then on, not refused for good."""
        self.shares = shares
        now = self.clock.monotonic()
        for digest, acc in self._accounts.items():
            if digest in self.leased:
                acc.reshare(self._enforced(digest, acc.limits[0], acc.limits[1]), now)

    def reallow(self, allowances: dict[str, tuple[float, float]], report: int = 0) -> None:
        """New budget allowances, each counted from when report number `report` was
        built (a worker's supervisor numbers them; 0: one process)."""
        self.allowances, self.allowed = allowances, report
        for digest, acc in self._accounts.items():
            got = allowances.get(digest)
            if got is not None:
                acc.elsewhere = got[1]
                if acc.row is None:
                    acc.allowance = got[0] / self.workers - acc.report_spent
                else:
                    _allow(acc.row, report, got[0])

    def asked(self, report: int = 0) -> dict[str, tuple[int, int, float | None]]:
        """sha256 → (requests, tokens) asked since the last call, and the allowance
        left, of leased keys; resets the counts (report number `report` is being
        built). A row's allowance is said by the first worker asked (`KeyRow.cut`)."""
        out: dict[str, tuple[int, int, float | None]] = {}
        for digest, acc in self._accounts.items():
            if digest in self.leased:
                held = acc.allowance
                if acc.row is not None and acc.limits[2] is not None:
                    held = _cut(acc.row, report)
                out[digest] = (acc.asked_requests, acc.asked_tokens, held)
            acc.asked_requests = acc.asked_tokens = acc.report_spent = 0
        return out

    def admit(self, tenant: Tenant, model: str, body_bytes: int) -> Charge | Whole | None:
        """A refusal, or None (nothing to count), or the Charge to settle after the answer."""
        if tenant.models is not None and model not in tenant.models:
            return model_not_allowed(tenant.name, model)
        key = tenant.key
        if not key.limited:
            return None
        now = self.clock.monotonic()
        digest = key.sha256.lower()
        acc = self._accounts.get(digest)
        if acc is None:
            acc = self._accounts[digest] = self._account(key, digest, now)
        elif acc.limits != (key.rpm, key.tpm, key.budget):
            if acc.row is None:
                acc.relimit(key, self.share_of(key, digest), now)
            else:
                # The shared row takes the new limits as `relimit` does (keytable.find).
                acc = self._again(acc, key, digest, now)
        # No bytes to count: a request that only counts tokens (proxy.admit), no tokens.
        estimate = max(1, body_bytes // BYTES_PER_TOKEN) if body_bytes else 0
        acc.asked_requests += 1
        acc.asked_tokens += estimate
        if acc.row is not None:
            got = self._locked(acc, tenant, digest, estimate, now)
            if got is not None:
                return got
            # Freed meanwhile by a worker that saw the key revoked first (this one has
            # not yet): the key's row is found again, and the request counted there.
            acc = self._again(acc, key, digest, now)
            got = self._locked(acc, tenant, digest, estimate, now)
            if got is not None:
                return got
        return self._verdict(acc, tenant, digest, estimate, now)

    def _locked(
        self, acc: _Account, tenant: Tenant, digest: str, estimate: int, now: float
    ) -> Charge | Whole | None:
        """The verdict under the key's shared row lock; None: no row, or it is not the
        key's any more."""
        row = acc.row
        if row is None:
            return None
        row.lock()
        try:
            return self._verdict(acc, tenant, digest, estimate, now) if row.mine() else None
        finally:
            row.unlock()

    def _verdict(
        self, acc: _Account, tenant: Tenant, digest: str, estimate: int, now: float
    ) -> Charge | Whole:
        """The budget's and the buckets' verdict (under the row's lock where shared)."""
        if tenant.key.budget is not None:
            leased = self.leasing is not False and digest in self.leased
            refused = _leased_budget(acc, tenant) if leased else self._budget(acc, tenant)
            if refused is not None:
                return refused
        return _take(acc, tenant, estimate, now)

    def _again(self, acc: _Account, key: ClientKey, digest: str, now: float) -> _Account:
        """`acc` found again in the shared table (`key` as now listed), its counts kept."""
        fresh = self._accounts[digest] = self._account(key, digest, now)
        fresh.asked_requests, fresh.asked_tokens = acc.asked_requests, acc.asked_tokens
        return fresh

    def _account(self, key: ClientKey, digest: str, now: float) -> _Account:
        share = self.share_of(key, digest)
        row = None
        if self.table is not None:
            row = self.table.find(digest, _limits(key), share, now)
            if row is None and not self._table_full:
                self._table_full = True
                log.warning(kv("key counted per worker only", table_full=self.table.capacity))
        acc = _Account(key, now, share, row)
        got = self.allowances.get(digest)
        if got is not None:
            acc.elsewhere = got[1]
            if row is None:
                acc.allowance = got[0] / self.workers
            else:
                # A fresh row has none yet; an old one may have missed the last answer.
                _allow(row, self.allowed, got[0])
        return acc

    def _budget(self, acc: _Account, tenant: Tenant) -> Whole | None:
        """The budget counted here alone: a file's key, or a controller that leases none."""
        budget = tenant.key.budget
        assert budget is not None
        period = period_of(budget.per, self.clock.wall())
        row = acc.row
        if row is None:
            if acc.period != period:
                acc.period, acc.spent = period, 0
            spent = float(acc.spent)
        else:
            if row.period != period:
                row.period, row.cells[keytable.SPENT] = period, 0.0
            spent = row.cells[keytable.SPENT]
        if spent < budget.tokens:
            return None
        return _spent(tenant, f" ({period}, UTC)")


def _limits(key: ClientKey) -> keytable.Limits:
    """A key's limits as its shared row records them (NaN: none)."""
    budget = key.budget
    return (
        math.nan if key.rpm is None else float(key.rpm),
        math.nan if key.tpm is None else float(key.tpm),
        math.nan if budget is None else float(budget.tokens),
        math.nan if budget is None else float(("day", "week", "month").index(budget.per)),
    )


def _allow(row: KeyRow, report: int, tokens: float) -> None:
    """`KeyRow.allow` under the row's lock, unless the row is another key's now."""
    row.lock()
    try:
        if row.mine():
            row.allow(report, tokens)
    finally:
        row.unlock()


def _cut(row: KeyRow, report: int) -> float | None:
    """`KeyRow.cut` under the row's lock; None also when the row is another key's now."""
    row.lock()
    try:
        return row.cut(report) if row.mine() else None
    finally:
        row.unlock()


def _leased_budget(acc: _Account, tenant: Tenant) -> Whole | None:
    """The budget as the controller leases it: this router's allowance, fleet-wide
    (under the row's lock where shared)."""
    left = acc.allowance if acc.row is None else acc.row.allowance()
    if left is not None and left > 0:
        return None
    if left is None or acc.elsewhere > 0:
        # Not spent fleet-wide: this router's part is, and the next lease may bring more.
        return error_response(
            429,
            f"Rate limit reached for the API key {tenant.name!r} on this router's share "
            f"of its budget. Please try again in {duration(NO_SHARE_RETRY_S)}.",
            type="tokens",
            code="rate_limit_exceeded",
            headers=retry_after(math.ceil(NO_SHARE_RETRY_S)),
        )
    return _spent(tenant, " (UTC)")


def _spent(tenant: Tenant, when: str) -> Whole:
    """429 insufficient_quota: the key's budget is spent until its period ends.

    With `x-should-retry: false`, which the openai and anthropic packages obey: they
    retry every other 429 on their own (twice by default), and a budget spent for the
    day is spent for their retries a second later too."""
    budget = tenant.key.budget
    assert budget is not None
    return error_response(
        429,
        f"The API key {tenant.name!r} has used its budget of {budget.tokens} "
        f"tokens this {budget.per}{when}.",
        type="insufficient_quota",
        code="insufficient_quota",
        headers={"x-should-retry": "false"},
    )


def _take(acc: _Account, tenant: Tenant, estimate: int, now: float) -> Charge | Whole:
    """Take one request and its estimate from the key's buckets, or refuse with 429."""
    key = tenant.key
    requests, tokens = acc.requests, acc.tokens
    wait_s = 0.0
    # OpenAI's error type names the limit that was hit: "requests" or "tokens".
    kind = what = ""
    if requests is not None:
        requests.refill(now)
        if requests.level < 1.0:
            wait_s, what = requests.wait_s(1.0), f"requests per minute ({key.rpm})"
            kind = "requests"
    if tokens is not None:
        tokens.refill(now)
        # A request larger than the whole bucket waits for a full one, never forever.
        estimate = min(estimate, int(tokens.size))
        # No estimate (a count of tokens) takes none: an overdrawn bucket does not refuse it.
        if estimate and tokens.level < estimate and tokens.wait_s(estimate) > wait_s:
            wait_s, what = tokens.wait_s(estimate), f"tokens per minute ({key.tpm})"
            kind = "tokens"
    if what:
        headers = _headers(acc)
        # A wait past a minute (a bucket overdrawn by a long answer) is the
        # application's to make: retry_after says so to the SDKs.
        headers.update(retry_after(max(1, math.ceil(wait_s))))
        return error_response(
            429,
            f"Rate limit reached for the API key {tenant.name!r} on {what}. "
            f"Please try again in {duration(wait_s)}.",
            type=kind,
            code="rate_limit_exceeded",
            headers=headers,
        )
    if requests is not None:
        requests.level -= 1.0
    if tokens is not None:
        tokens.level -= estimate
    budget = key.budget
    return Charge(acc, estimate, _headers(acc), None if budget is None else budget.per)


def _headers(acc: _Account) -> dict[str, str]:
    """OpenAI's x-ratelimit-* trio for each limit the key has."""
    out: dict[str, str] = {}
    for kind, bucket in (("requests", acc.requests), ("tokens", acc.tokens)):
        if bucket is None:
            continue
        out[f"x-ratelimit-limit-{kind}"] = str(bucket.limit)
        out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(bucket.level)))
        out[f"x-ratelimit-reset-{kind}"] = duration(bucket.reset_s())
    return out


def period_of(per: BudgetPeriod, wall: float) -> str:
    """The calendar period (UTC) `wall` falls in: `2026-12-06`, `2026-W49`, `2026-12`."""
    t = time.gmtime(wall)
    if per == "day":
        return time.strftime("%Y-%m-%d", t)
    if per == "week":
        return time.strftime("%G-W%V", t)
    return time.strftime("%Y-%m", t)
