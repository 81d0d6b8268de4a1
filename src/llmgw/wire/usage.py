"""Usage report (router → controller), once a tick (docs/architecture.md), and the
token usage the controller keeps from it (docs/tenants.md#usage).

A map per tick, never a message per request: it costs the same on four replicas
as on four hundred.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.wire.leases import KeyDemand
from llmgw.wire.names import END

# Unix seconds at the start of a UTC hour: how token usage is bucketed.
HOUR_S = 3600
# No control character: these names are stored (PostgreSQL's text holds no NUL) and
# shown in tables and logs. In the published schema too, so a client knows the rule.
PRINTABLE = r"^[^\x00-\x1f\x7f]*" + END
# Names in token usage (a key, a team, a model): a router file's key names are free
# text, so only their length and their characters are bounded.
UsageName = Annotated[str, msgspec.Meta(max_length=256, pattern=PRINTABLE)]
# A router's id: bounded as the names in `tokens` are, and never empty. Its config
# (router.config) takes the same type: an id the controller refuses made every report a 422.
RouterId = Annotated[UsageName, msgspec.Meta(min_length=1)]
# The longest `counter_id` (router.control.usagereports.counter_id keeps within it).
MAX_COUNTER_ID = 128
# Counts in token usage: never negative, and small enough that a sum stays exact.
MAX_COUNT = 2**53
Count = Annotated[int, msgspec.Meta(ge=0, le=MAX_COUNT)]
# The last hour a row may name: 9999-12-31 23:00 UTC. Hours are stored as 64-bit
# integers; a larger one would fail the store's write instead of the report's check.
MAX_HOUR = 253_402_297_200
# What `GET /admin/usage` groups by.
UsageBy = Literal["key", "team", "model"]
# Its `since_s` when absent (the last day), and the furthest back it may reach (ten
# years: a larger number is a typo).
DEFAULT_SINCE_S = 86_400
MAX_SINCE_S = 10 * 366 * 86_400
# Its `limit` (rows) when absent, and the largest it takes: months of a thousand keys are
# millions of rows, which one answer would hold in the controller's memory at once.
DEFAULT_USAGE_LIMIT = 10_000
MAX_USAGE_LIMIT = 100_000


class ModelLoad(msgspec.Struct, frozen=True, kw_only=True):
    """What one router saw of one model during the last report interval."""

    # Requests in flight to this model's replicas at report time.
    inflight: int = 0
    # Requests held because no replica was available, at report time.
    held: int = 0
    # Requests started during the interval, and the interval's length.
    requests: int = 0
    interval_s: float = 0.0


class TokenUsage(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One key's use of one model in one UTC hour, as one router process counted it.

    In a report each figure is the running total of the hour so far since this
    router process started (`UsageReport.counter_id`), never the change since the
    last report: a report sent twice, or late, carries nothing new, and the
    controller keeps the largest figure it has seen of each (docs/tenants.md#usage).
    """

    # Unix seconds at the start of the UTC hour (a multiple of HOUR_S).
    hour: Annotated[int, msgspec.Meta(ge=0, le=MAX_HOUR, multiple_of=HOUR_S)]
    key: Annotated[UsageName, msgspec.Meta(min_length=1)]
    # "" for a router file's key without a team.
    team: UsageName = ""
    model: Annotated[UsageName, msgspec.Meta(min_length=1)]
    # Requests routed to the model (every outcome), after the key's limits admitted them.
    requests: Count = 0
    # The engines' own counts (usage.prompt_tokens, usage.completion_tokens); an answer
    # without usage adds a request and no tokens.
    prompt_tokens: Count = 0
    completion_tokens: Count = 0


class FlowQueued(msgspec.Struct, frozen=True, kw_only=True):
    """Requests waiting in a router's flow control (every replica of their model at
    capacity), for one priority band and team (docs/tenants.md#flow-control)."""

    band: UsageName
    # The key's team; its name for a key without one; "" for requests without a key.
    team: UsageName = ""
    requests: Count


class UsageReport(msgspec.Struct, frozen=True, kw_only=True):
    """Body of `POST /v1/usage`."""

    # Stable for one router process; a restarted router gets a new one. Bounded as the
    # names in `tokens` are: it is their counter when `counter_id` is "" (a store
    # column, where PostgreSQL's text holds no NUL), and `ctl keys list` shows it.
    router_id: RouterId
    # Unix seconds when the router built this report.
    sent_at: float
    # Endpoint id → unix seconds of the last dispatch there. Endpoints never used
    # since this router started are ABSENT, never 0: unknown is not idle.
    last_used: dict[str, float] = {}
    # Endpoint id → requests in flight there now.
    inflight: dict[str, int] = {}
    # Model name → requests held now for lack of a replica (scale from zero).
    demand: dict[str, int] = {}
    # Model name → load during the last interval (autoscaling).
    load: dict[str, ModelLoad] = {}
    # Running token totals of this router process per hour, key, team and model:
    # each row is sent again, whole, until a report holding it was answered 2xx.
    tokens: list[TokenUsage] = []
    # Who counted `tokens`: new each time a router process starts, even one with a
    # configured `router_id`, whose totals start again at zero (under an id already
    # seen, the controller, keeping the largest figures, would miss them). "": router_id.
    counter_id: Annotated[str, msgspec.Meta(max_length=MAX_COUNTER_ID, pattern=PRINTABLE)] = ""
    # Limited client keys this router has seen or holds a share of: what it was asked
    # for and what it enforces; the answer leases it its shares (wire.leases).
    key_demand: list[KeyDemand] = []
    # Requests waiting in flow control now, by band and team; only those with any.
    flow_queued: list[FlowQueued] = []


class UsageRow(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One hour of `GET /admin/usage`: the figures of one key, team or model.

    Only what the rows are grouped by is present: `key` and `team` by key, `team`
    by team, `model` by model.
    """

    # Unix seconds at the start of the UTC hour.
    hour: int
    key: str | None = None
    team: str | None = None
    model: str | None = None
    requests: int
    prompt_tokens: int
    completion_tokens: int


class UsageAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of `GET /admin/usage`: rows by hour, then by name."""

    by: UsageBy
    # Unix seconds at the start of the first hour counted.
    since: int
    rows: list[UsageRow]
    # True: the hours from the one asked for held more rows than `limit`; only the
    # newest whole hours that fit are here, and `since` was moved to the first of them
    # (or, when the newest hour alone holds more, it is here cut after its first names).
    truncated: bool = False
