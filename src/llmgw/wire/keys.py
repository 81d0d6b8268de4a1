"""Client API keys with an owner and limits (docs/tenants.md).

One shape, `ClientKey`, is what a router enforces: the controller sends it in the
endpoint list and a standalone router reads it from `api_keys[]`. It carries the
key's SHA-256, never the key: the key itself leaves the controller exactly once,
in the answer that created it (`KeyCreated`).

Unset limits are `None` (no limit), never 0: a key with `rpm: 0` would refuse
every request, which is what revoking it is for.
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec

from llmgw.wire.names import END, LABEL_PATTERN, MODEL_NAME_PATTERN

# Strict priority bands, first served first (flow control; docs/tenants.md).
Priority = Literal["critical", "standard", "batch"]
# What a token budget is counted over: calendar periods in UTC (a week starts Monday).
BudgetPeriod = Literal["day", "week", "month"]

KeyName = Annotated[str, msgspec.Meta(pattern=LABEL_PATTERN)]
Sha256 = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-fA-F]{64}" + END)]
# Limits: at least 1; below a few billion so a sum of them stays exact.
Limit = Annotated[int, msgspec.Meta(ge=1, le=2**40)]
ModelName = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
# The most models a new key may name: the list goes to every router with each
# endpoint list; a key for more models than this should name none (every model).
MAX_KEY_MODELS = 1024
# The longest a new key may live: a hundred years (36600 days), in seconds.
MAX_EXPIRES_IN_S = 100 * 366 * 86400


class BudgetView(msgspec.Struct, frozen=True, kw_only=True):
    """A budget as a key view shows it (KeyView): what `Budget` holds, read leniently."""

    tokens: int
    # A BudgetPeriod; a str in views: ctl reads them from a controller that may be newer.
    per: str


class Budget(BudgetView, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Tokens (prompt + completion) a key may use per calendar period (UTC)."""

    tokens: Limit
    per: BudgetPeriod


class KeyLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What a key may do; every field's default is "no limit" (or every model)."""

    # Served names (models, aliases, adapters) the key may use; empty: every model.
    models: tuple[ModelName, ...] = ()
    # Requests per minute; None: unlimited.
    rpm: Limit | None = None
    # Tokens (prompt + completion) per minute; None: unlimited.
    tpm: Limit | None = None
    # None: no budget.
    budget: Budget | None = None
    priority: Priority = "standard"

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for m in self.models:
            if m in seen:
                raise ValueError(f"models must not repeat a name: {m!r} is there twice")
            seen.add(m)

    @property
    def limited(self) -> bool:
        """Whether any request of this key needs counting (rpm, tpm or a budget)."""
        return self.rpm is not None or self.tpm is not None or self.budget is not None


class ClientKey(KeyLimits, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A key as routers enforce it: who owns it, its hash, its limits."""

    # Who the key belongs to; logged instead of the key. (The controller's keys are
    # named as KeyCreate says; a router file's may be any non-empty string.)
    name: Annotated[str, msgspec.Meta(min_length=1)]
    # Hex SHA-256 of the key: neither the controller nor a router file holds the key.
    sha256: Sha256
    # The team the key's usage counts towards; "" when none was given (a file key).
    team: str = ""
    # Unix seconds after which the key is refused; None: never.
    expires_at: float | None = None


class KeyCreate(KeyLimits, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Body of `POST /admin/keys`."""

    # Served names, each as a model, alias or adapter may be named (wire.names): a key
    # for "a b" or "[/]" could use nothing, and shows its models in ctl and events.
    # Checked here, where a key comes in; KeyLimits (stored keys, router files) takes any.
    models: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=MODEL_NAME_PATTERN)], ...],
        msgspec.Meta(max_length=MAX_KEY_MODELS),
    ] = ()
    name: KeyName
    team: Annotated[str, msgspec.Meta(pattern=LABEL_PATTERN)]
    # Seconds from now until the key expires; None: never.
    expires_in_s: Annotated[float, msgspec.Meta(gt=0, le=MAX_EXPIRES_IN_S)] | None = None


class KeyShare(msgspec.Struct, frozen=True, kw_only=True):
    """One router's share of a key's limits, as the controller last leased it
    (docs/tenants.md#limits-and-several-routers)."""

    router: str
    # Per minute; None: the key has no such limit.
    rpm: float | None = None
    tpm: float | None = None
    # Tokens of the budget the router may spend until its next answer; None: no budget.
    budget: float | None = None


class KeyView(msgspec.Struct, frozen=True, kw_only=True):
    """A key as `GET /admin/keys` shows it: never the key, never its hash.

    KeyLimits' fields, read leniently: ctl reads this from a controller that may be
    newer (controllers are upgraded first), and a field, a band or a budget period it
    did not know failed `keys list`, and `keys create` after the key was made. Unknown
    fields are ignored, and the band and period are strings.
    """

    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    budget: BudgetView | None = None
    # A Priority ("standard" when the key names none).
    priority: str = "standard"
    name: str
    team: str
    created_at: float
    # None: never expires.
    expires_at: float | None = None
    # Each router's share of its limits, by router; empty: the key has no limit, or
    # no router has reported since the controller started (shares live in memory).
    shares: tuple[KeyShare, ...] = ()


class KeyCreated(KeyView, frozen=True, kw_only=True):
    """Answer of `POST /admin/keys`: the only time the key itself is shown."""

    key: str


class KeyRevoked(msgspec.Struct, frozen=True, kw_only=True):
    """Answer of `DELETE /admin/keys/{name}`."""

    revoked: str
