"""A request's two waits before an attempt: for a replica, and for its turn.

`wait_for_replica`: its model has no replica that can take it (scale from zero,
every breaker open, another request holds the half-open probe), so it is held
(holding.py) until one can, or refused with a NoReplica saying why.
`wait_turn`: every replica of its model is at capacity, so flow control queues
it (flowgate.py) until granted, or refuses it with FlowRefused.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from llmgw.router.errors import (
    HoldQueueFull,
    KeyRevoked,
    ModelNotAllowed,
    ModelRemoved,
    NoReplica,
)
from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot
from llmgw.router.request import enginepriority
from llmgw.router.request.call import Call
from llmgw.router.request.flow import ANONYMOUS, BANDS, DEFAULT_BAND
from llmgw.router.request.holding import (
    held_too_long,
    hold_until,
    retry_after_s,
    unplaceable_retry_after_s,
)
from llmgw.router.request.tenants import Tenant
from llmgw.router.routing.affinity import RouteKey
from llmgw.router.routing.scheduler import Decision
from llmgw.router.wiring import Router
from llmgw.runtime.peers import Peer
from llmgw.wire.endpoints import ModelOutlook

# The first band: its requests at saturation go where they can start now.
CRITICAL: Final = BANDS[0]
# While held, look again this often even without a list change: a breaker leaving
# its cooldown makes a replica available without anyone saying so.
HOLD_POLL_S: Final = 0.5


async def wait_for_replica(
    st: Router, model: str, hashes: RouteKey, *, t0: float, deadline: float, peer: Peer | None
) -> tuple[Decision, list[Snapshot]]:
    """Wait for a replica of `model` that the policy chooses for `hashes` (the request
    came in at `t0`, must be answered by `deadline`, from `peer`); NoReplica when none
    comes in time, or none can; ModelRemoved once the router no longer knows `model`."""
    clock = st.clock
    hold_deadline = min(deadline, t0 + st.cfg.hold_timeout_s)
    # A probe is waited for at most one first cooldown (holding.hold_until).
    probe_wait_until = clock.monotonic() + st.cfg.breaker.cooldown_s
    snaps = st.registry.snapshots(model)
    opened = {s.id: s.opened_total for s in snaps}
    try:
        with st.holding.hold(model, peer):
            while True:
                if model not in st.known_models:
                    # Every change of the models wakes the wait (Router.apply_endpoints,
                    # apply_config): a request sent now is answered 404, so is this one.
                    raise ModelRemoved(model)
                now = clock.monotonic()
                look = st.outlook.get(model)
                until = hold_until(
                    snaps,
                    now=now,
                    deadline=hold_deadline,
                    opened=opened,
                    outlook=look,
                    probe_wait_until=probe_wait_until,
                )
                if until is None:
                    raise _hopeless(st, model, snaps, look)
                left = until - now
                if left > 0:
                    await st.holding.wait_changed(timeout_s=min(left, HOLD_POLL_S))
                # Also once the wait is over: its end may be the moment a probe opens.
                snaps = st.registry.snapshots(model)
                decision = st.policy.choose(snaps, hashes, _probing(st, snaps))
                if decision.endpoint_id is not None:
                    return decision, snaps
                if left <= 0:
                    raise _out_of_time(st, model, snaps, look, hold_deadline=hold_deadline)
    except HoldQueueFull as exc:
        why = (
            "too many requests from this client address are already waiting"
            if exc.share
            else "too many requests are already waiting"
        )
        raise NoReplica(model, why) from None


def _probing(st: Router, snaps: Sequence[Snapshot]) -> tuple[str, ...]:
    """The half-open replicas whose one probe is out: a choice of one would be refused
    at `acquire`, and a request handed it back would come straight back to wait,
    with no await between, for as long as the probe lasts past its hold deadline."""
    half_open = BreakerState.HALF_OPEN
    return tuple(s.id for s in snaps if s.breaker is half_open and not st.registry.admits(s.id))


def _hopeless(
    st: Router, model: str, snaps: Sequence[Snapshot], look: ModelOutlook | None
) -> NoReplica:
    """Why holding is over before its time (`hold_until` said so): the model cannot be
    placed (the controller's outlook), or the probe of its open breaker failed."""
    if not snaps and look is not None:
        st.holding.refused(model)
        return NoReplica(
            model,
            f"it cannot be placed: {look.reason}",
            retry_after_s=unplaceable_retry_after_s(look),
            code="model_unplaceable",
        )
    # Its replicas failed again just now: the client's retry would meet them as it did.
    return NoReplica(
        model,
        "the probe of its open breaker failed",
        retry_after_s=retry_after_s(snaps),
        again=False,
    )


def _out_of_time(
    st: Router,
    model: str,
    snaps: Sequence[Snapshot],
    look: ModelOutlook | None,
    *,
    hold_deadline: float,
) -> NoReplica:
    """Why holding ended with no replica chosen once its wait was over: every breaker
    open before the hold's deadline, else held too long. Either way the request waited
    as long as the router lets one wait: a client's retry would wait it again (not
    `again`), each SDK retry adding a hold to the call and one to the held queue."""
    if st.clock.monotonic() < hold_deadline:
        after = retry_after_s(snaps)
        return NoReplica(
            model,
            f"every replica's breaker is open (next probe in about {after}s)",
            retry_after_s=after,
            again=False,
        )
    why = held_too_long(st.cfg.hold_timeout_s, look)
    return NoReplica(model, why, retry_after_s=5, again=False)


def key_in_force(st: Router, tenant: Tenant | None, model: str) -> None:
    """KeyRevoked when the request's key left the keys in force while it waited: a wait
    may last minutes (a band's max_wait_s, a wake), and a revoke is refused within
    seconds (docs/tenants.md). ModelNotAllowed when the key stayed but its `models` no
    longer hold `model`: checked only at admission, a narrowed key's waiting requests
    went on to the engine."""
    if tenant is None:
        return
    if not st.keys.in_force(tenant):
        raise KeyRevoked(tenant.name)
    if not st.keys.allows(tenant, model):
        raise ModelNotAllowed(tenant.name, model)


def must_queue(
    st: Router,
    model: str,
    least: float | None,
    snaps: Sequence[Snapshot],
    *,
    tenant: Tenant | None,
) -> bool:
    """Whether flow control holds this request: its model's replicas are all at
    capacity (`least`: the chosen replica's load), or have no room beyond the
    critical reserve for a request below that band, or others already wait for them
    (and it must not pass them)."""
    return st.flow.must_wait(least, snaps, model=model, band=_band_of(tenant)[0])


def home_of(d: Decision, snaps: Sequence[Snapshot]) -> tuple[str, ...]:
    """The replicas holding the most of the request's prefix by `d`'s matches; () when
    none holds any, or all hold the same (no replica saves more than another)."""
    best = 0
    homes: list[str] = []
    for s in snaps:
        n = d.blocks_of(s.id)
        if n > best:
            best, homes = n, [s.id]
        elif n == best and n > 0:
            homes.append(s.id)
    if len(homes) == len(snaps):
        return ()
    return tuple(homes)


def is_critical(tenant: Tenant | None) -> bool:
    """Whether the request is in the first band (critical)."""
    return tenant is not None and tenant.key.priority == CRITICAL


def _band_of(tenant: Tenant | None) -> tuple[str, str]:
    """The request's band and the tenant it is queued as (its team, else its key)."""
    if tenant is None:
        return DEFAULT_BAND, ANONYMOUS
    return tenant.key.priority, tenant.team or tenant.name


async def wait_turn(st: Router, call: Call, peeked: Decision, deadline: float) -> str:
    """Wait in flow control's queue for the call's model (flowgate.py); FlowRefused at
    its bounds. `peeked`: the policy's choice when the call was held, whose prefix
    matches name its home. The request's band, once granted; its engine priority is
    then one later while its tenant has more queued (enginepriority.py)."""
    model = call.model
    band, who = _band_of(call.tenant)
    snapshots = st.registry.snapshots
    snaps = snapshots(model)
    since = st.clock.monotonic()
    await st.flow.wait_turn(
        model,
        band,
        who,
        deadline=deadline,
        snapshots=lambda: snapshots(model),
        running=sum(s.inflight for s in snaps),
        home=home_of(peeked, snaps),
    )
    # A key revoked while it waited is refused, and a refusal's wait is not counted
    # (nor does it bring back the series of a key that left: Router._set_keys).
    key_in_force(st, call.tenant, model)
    st.metrics.flow_waited(band, who, st.clock.monotonic() - since)
    backlogged = st.flow.backlogged(model, band, who)
    call.engine_priority = enginepriority.granted(call.engine_priority, backlogged=backlogged)
    return band
