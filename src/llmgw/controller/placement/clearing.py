"""Clearing ahead: an idle replica sleeps before the sleeper under it is asked for.

A wake onto free cards costs the wake (a 235B on four cards: about 6 s); a wake
that must first put the awake replica on its cards to sleep costs that sleep
too (another 235B: about 6 s more), and whoever asked waits for both (a swap,
swaps.py). So where a replica is idle past its model's `sleep_after_s` and
another model's sleeper waits on its cards, the replica sleeps now, and the
sleeper's next wake is a plain one.

Its own next request then waits for its own wake instead of the sleeper's
asking waiting for its sleep. The two cost about the same (a sleep and a wake
of one engine move the same weights), so a replica is cleared only for a
sleeper that wakes no faster than it does: a swap costs most when the one
waking is large, and clearing never trades a fast wake for a slow one. And
only as eviction would take it for that sleeper (eviction.py): known idle past
its timeout (a replica just woken counts as idle only since it woke), nothing
in flight, never below its model's `min_replicas`, never for a sleeper of a
lower priority; only where it may sleep (wakes.py: memory), never stopped for
it; and only when that frees every card of the sleeper, since a wake that
still needs a swap waits for that swap all the same.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from llmgw.controller.fleet.endpoints import wake_estimate_s
from llmgw.controller.fleet.records import Replica
from llmgw.controller.idle import IdleFor, idle_fn
from llmgw.controller.placement.swaps import current_replicas, lower_desired, sleep_or_drain
from llmgw.controller.placement.wakes import card_holders, falling_asleep, sleep_room
from llmgw.controller.tick.context import TickContext
from llmgw.wire.models import ModelSpec


def clear_ahead(t: TickContext) -> None:
    """Sleep the idle replicas in the way of a sleeper's next wake (module docstring)."""
    batch = t.batch
    if not t.index.in_state("sleeping"):
        return  # a fleet without sleepers pays nothing per tick
    now = batch.now
    current = current_replicas(t)
    specs = {name: m.spec for name, m in batch.base.models.items()}
    held = card_holders(current.values())
    idle = idle_fn(t.usage, now=now)
    spare = Counter(r.model for r in current.values() if r.state == "ready")
    for name, m in batch.base.models.items():
        spare[name] -= m.spec.min_replicas
    sleepers = [
        r
        for r in current.values()
        if r.state == "sleeping" and not falling_asleep(r) and not batch.touched(r.id)
    ]
    for s in sorted(sleepers, key=lambda r: r.id):
        s_spec = specs.get(s.model)
        if s_spec is None or not _node_ready(t, s):
            continue
        ways = _in_the_way(t, s, s_spec, current, held, specs, idle, spare)
        if not ways:
            continue
        for h in ways:
            why = f"cleared ahead for {s.model}: its sleeper {s.id} would wait for this one's sleep"
            sleep_or_drain(t, h, f"idle; {why}")
            lower_desired(t, h.model)
            spare[h.model] -= 1
        current = current_replicas(t)
        held = card_holders(current.values())


def _in_the_way(
    t: TickContext,
    s: Replica,
    spec: ModelSpec,
    current: Mapping[str, Replica],
    held: Mapping[tuple[str, int], Iterable[Replica]],
    specs: Mapping[str, ModelSpec],
    idle: IdleFor,
    spare: Counter[str],
) -> list[Replica]:
    """The awake replicas on `s`'s cards to clear; empty when none, or when any one of
    them may not be cleared (then clearing the others would not spare a swap)."""
    wake_s = wake_estimate_s(spec, s.sleep_level or 2)
    if wake_s is None:
        return []
    out: dict[str, Replica] = {}
    for shard in s.shards:
        for gpu in shard.gpus:
            for h in held.get((shard.node, gpu), ()):
                if h.id == s.id or h.id in out or falling_asleep(h):
                    continue  # one falling asleep gives the card back on its own
                if not _clearable(t, h, s, wake_s, current, specs, idle, spare):
                    return []
                out[h.id] = h
    return sorted(out.values(), key=lambda r: r.id)


def _clearable(
    t: TickContext,
    h: Replica,
    sleeper: Replica,
    wake_s: float,
    current: Mapping[str, Replica],
    specs: Mapping[str, ModelSpec],
    idle: IdleFor,
    spare: Counter[str],
) -> bool:
    """Whether `h` may sleep now so that `sleeper` wakes on free cards."""
    batch = t.batch
    spec = specs.get(h.model)
    for_spec = specs.get(sleeper.model)
    if (
        spec is None
        or for_spec is None
        or h.state != "ready"
        or batch.touched(h.id)
        or h.model == for_spec.name
        or not spec.sleep_mode
        or spec.priority > for_spec.priority
        or spare[h.model] <= 0
    ):
        return False
    idle_s = idle(h.id)
    if idle_s is None:
        return False  # unknown is never idle
    idle_s = min(idle_s, max(0.0, batch.now - h.state_since))
    if idle_s < spec.evictable_after_s:
        return False
    # Routers report only replicas with requests in flight: absent is none there.
    busy = t.usage.inflight(h.id)
    if busy is not None and busy > 0:
        return False
    room = sleep_room(h, spec, current, batch.base.nodes, specs)
    # Never by stopping the very sleeper it makes way for (memory: wakes.py).
    if room is None or sleeper.id in room.stop:
        return False
    own = wake_estimate_s(spec, room.level)
    # Never a fast wake traded for a slow one (module docstring).
    return own is not None and own <= wake_s


def _node_ready(t: TickContext, r: Replica) -> bool:
    cfg = t.config
    for s in r.shards:
        node = t.batch.node(s.node)
        if node is None:
            return False
        shown = node.shown_state(now=t.batch.now, heartbeat_timeout_s=cfg.heartbeat_timeout_s)
        if shown != "ready":
            return False
    return True
