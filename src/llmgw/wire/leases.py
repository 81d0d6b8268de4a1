"""Shares of client keys' limits, leased by the controller to each router
(docs/tenants.md#limits-and-several-routers).

A router says, per limited key, what it was asked for and what share it enforces
now (`KeyDemand`, in its usage report); the controller answers with this router's
share of every limited key (`LeaseAnswer`, the answer to that report). Shares are
rates (per minute) and may be fractions: a limit of 2 rpm over three routers is
leased as shares below 1.
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from llmgw.wire.keys import Sha256

# A rate per minute: never negative; below a few billion like the limits it splits.
Rate = Annotated[float, msgspec.Meta(ge=0.0, le=2.0**40)]


class KeyDemand(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What one router saw of one limited key lately, and the share it enforces now."""

    sha256: Sha256
    # Requests asked of this router (admitted and refused), per minute, smoothed.
    requests: Rate = 0.0
    # Tokens asked (the admission estimates), per minute, smoothed.
    tokens: Rate = 0.0
    # The shares this router enforces now; None: it holds none of that limit.
    rpm_held: Rate | None = None
    tpm_held: Rate | None = None
    # Tokens of its budget allowance it had not spent yet; None: it holds none.
    budget_held: Rate | None = None


class KeyLease(msgspec.Struct, frozen=True, kw_only=True):
    """One router's share of one key's limits; None where the key has no such limit.

    Unknown fields are ignored: routers read this from a controller that may be newer
    (controllers are upgraded first), and refusing a field they did not know dropped
    every answer, so each router fell back to limit / routers for the whole upgrade.
    A limit the router does not know is not lost here: the key carrying it is refused
    in the endpoint list (router/control/listread.py).
    """

    sha256: Sha256
    rpm: Rate | None = None
    tpm: Rate | None = None
    # The whole limits, so that a router cut off can fall back to limit / routers.
    rpm_limit: int | None = None
    tpm_limit: int | None = None
    # Tokens of the key's budget this router may spend from the report on (until the
    # next answer replaces it); None: no budget.
    budget: Rate | None = None
    # Tokens of the budget left this period, fleet-wide, as the controller counts them.
    budget_left: Rate | None = None


class LeaseAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of `POST /v1/usage`: this router's share of every limited key."""

    leases: list[KeyLease] = []
    # How long the shares hold without a newer answer; after it a router enforces
    # min(share, limit / routers) until it hears from the controller again.
    lease_s: float
    # Routers the controller counts now (this one included): the fallback's divisor.
    routers: int
