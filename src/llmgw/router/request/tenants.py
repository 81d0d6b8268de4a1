"""What a client key may do, enforced per router (docs/tenants.md).

A key without a model list, a limit or an expiry costs nothing here: the proxy
looks at `Tenant.guarded` (a plain attribute) and goes on. A guarded key is
admitted or refused in OpenAI's shapes:

    model outside the key's list   403 model_not_allowed
    requests per minute spent      429 rate_limit_exceeded   (Retry-After, x-ratelimit-*)
    tokens per minute spent        429 rate_limit_exceeded   (Retry-After, x-ratelimit-*)
    token budget of the period     429 insufficient_quota

RPM and TPM are token buckets that hold a minute's worth and refill evenly, so
a key may burst its whole minute and then goes at its rate. TPM admission can
only estimate the request (its body's bytes / 4, the usual size of a token)
before the engine has counted it; `Charge.settle` puts the engine's count in its
place once the answer is in, so a key that under-estimated pays it back before
its next request is admitted. Budgets count the engine's usage per calendar
period (UTC).

Counts live in this router's memory: with several routers each enforces the
whole limit on its own share of the traffic, and a restart forgets them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from aiohttp import web

from llmgw.router.errors import error_response
from llmgw.router.request.usagetypes import Usage
from llmgw.runtime.clock import Clock
from llmgw.wire.keys import BudgetPeriod, ClientKey

# Bytes of a request body per token, for the TPM estimate before the engine counts.
BYTES_PER_TOKEN = 4


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


class _Bucket:
    """A token bucket: `size` per minute, refilled evenly, starting full."""

    __slots__ = ("at", "level", "rate", "size")

    def __init__(self, size: int, now: float) -> None:
        self.size = float(size)
        self.rate = size / 60.0
        self.level = float(size)
        self.at = now

    def refill(self, now: float) -> None:
        self.level = min(self.size, self.level + (now - self.at) * self.rate)
        self.at = now

    def wait_s(self, need: float) -> float:
        """Seconds until `need` is in the bucket (0 when it is now)."""
        return max(0.0, (need - self.level) / self.rate)

    def reset_s(self) -> float:
        """Seconds until the bucket is full again."""
        return self.wait_s(self.size)


class _Account:
    """The counts of one key (by its hash), kept across endpoint-list updates."""

    __slots__ = ("limits", "period", "requests", "spent", "tokens")

    def __init__(self, key: ClientKey, now: float) -> None:
        self.limits = (key.rpm, key.tpm, key.budget)
        self.requests = _Bucket(key.rpm, now) if key.rpm is not None else None
        self.tokens = _Bucket(key.tpm, now) if key.tpm is not None else None
        # The budget period the spend counts in ("" before the first request), and it.
        self.period = ""
        self.spent = 0


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
        if acc.tokens is not None:
            acc.tokens.level -= used - self._estimate
        if self._budget_per is not None:
            acc.spent += used


class Tenants:
    """Every limited key's counts on this router, and the verdict on each request."""

    def __init__(self, *, clock: Clock) -> None:
        self.clock = clock
        self._accounts: dict[str, _Account] = {}

    def retain(self, keys: Iterable[ClientKey]) -> None:
        """Forget the counts of keys no longer listed (revoked ones)."""
        keep = {k.sha256.lower() for k in keys}
        for digest in [d for d in self._accounts if d not in keep]:
            del self._accounts[digest]

    def admit(self, tenant: Tenant, model: str, body_bytes: int) -> Charge | web.Response | None:
        """A refusal, or None (nothing to count), or the Charge to settle after the answer."""
        if tenant.models is not None and model not in tenant.models:
            return error_response(
                403,
                f"The API key {tenant.name!r} may not use the model {model!r}.",
                type="invalid_request_error",
                code="model_not_allowed",
                param="model",
            )
        key = tenant.key
        if not key.limited:
            return None
        now = self.clock.monotonic()
        digest = key.sha256.lower()
        acc = self._accounts.get(digest)
        if acc is None or acc.limits != (key.rpm, key.tpm, key.budget):
            acc = self._accounts[digest] = _Account(key, now)
        budget = key.budget
        if budget is not None:
            period = period_of(budget.per, self.clock.wall())
            if acc.period != period:
                acc.period, acc.spent = period, 0
            if acc.spent >= budget.tokens:
                return error_response(
                    429,
                    f"The API key {tenant.name!r} has used its budget of {budget.tokens} "
                    f"tokens this {budget.per} ({period}, UTC).",
                    type="insufficient_quota",
                    code="insufficient_quota",
                )
        estimate = max(1, body_bytes // BYTES_PER_TOKEN)
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
            if tokens.level < estimate and tokens.wait_s(estimate) > wait_s:
                wait_s, what = tokens.wait_s(estimate), f"tokens per minute ({key.tpm})"
                kind = "tokens"
        if what:
            headers = _headers(acc)
            headers["Retry-After"] = str(max(1, math.ceil(wait_s)))
            return error_response(
                429,
                f"Rate limit reached for the API key {tenant.name!r} on {what}. "
                f"Please try again in {_duration(wait_s)}.",
                type=kind,
                code="rate_limit_exceeded",
                headers=headers,
            )
        if requests is not None:
            requests.level -= 1.0
        if tokens is not None:
            tokens.level -= estimate
        return Charge(acc, estimate, _headers(acc), None if budget is None else budget.per)


def _headers(acc: _Account) -> dict[str, str]:
    """OpenAI's x-ratelimit-* trio for each limit the key has."""
    out: dict[str, str] = {}
    for kind, bucket in (("requests", acc.requests), ("tokens", acc.tokens)):
        if bucket is None:
            continue
        out[f"x-ratelimit-limit-{kind}"] = str(int(bucket.size))
        out[f"x-ratelimit-remaining-{kind}"] = str(max(0, math.floor(bucket.level)))
        out[f"x-ratelimit-reset-{kind}"] = _duration(bucket.reset_s())
    return out


def _duration(seconds: float) -> str:
    """OpenAI's reset format: `250ms`, `12s`, `1m30s`."""
    if seconds < 1.0:
        return f"{math.ceil(seconds * 1000)}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


def period_of(per: BudgetPeriod, wall: float) -> str:
    """The calendar period (UTC) `wall` falls in: `2026-12-06`, `2026-W49`, `2026-12`."""
    t = time.gmtime(wall)
    if per == "day":
        return time.strftime("%Y-%m-%d", t)
    if per == "week":
        return time.strftime("%G-W%V", t)
    return time.strftime("%Y-%m", t)
