"""What the HTTP handlers call: each command is decide (pure) → commit (store, then memory).

Every command runs under the fleet's lock, decides from the current state
with fleet/commands.py, and commits one Batch in one transaction. A standby refuses
before deciding anything (503 not_leader), so a write never lands on a
controller that would not keep it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from llmgw.controller.api.views import node_view
from llmgw.controller.config import ControllerConfig
from llmgw.controller.errors import DoesNotExist, StoreUnavailable
from llmgw.controller.fleet import commands, keys
from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.fleet.records import Event, FleetState, Model, Node, OperatorState, Replica
from llmgw.controller.idle import IdleFor, IdleTracker
from llmgw.controller.leaderlink import LeaderLink
from llmgw.controller.leasebook import LeaseBook
from llmgw.controller.logasks import LogAsks
from llmgw.controller.store import StoreError
from llmgw.runtime.clock import Clock
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.admin import NodeView, WaitingModel
from llmgw.wire.keys import KeyCreate, KeyCreated
from llmgw.wire.models import ModelSpec, ScaleRequest


class Services:
    def __init__(
        self, fleet: Fleet, usage: IdleTracker, *, config: ControllerConfig, clock: Clock
    ) -> None:
        self.fleet = fleet
        self.usage = usage
        self.config = config
        self.clock = clock
        # Each router's share of each limited key (leasebook.py), answered to its reports.
        self.leases = LeaseBook(clock=clock)
        # Engine logs asked of agents, answered through their heartbeats (logasks.py).
        self.log_asks = LogAsks()
        # A standby's relay of usage reports to the leader (leaderlink.py).
        self.link = LeaderLink(fleet.store, own_url=config.advertise_url, clock=clock)

    # -- reads ---------------------------------------------------------------

    def idle_for(self, now: float) -> IdleFor:
        usage = self.usage
        return lambda rid: usage.idle_for(rid, now=now)

    def unplaceable(self) -> dict[str, str]:
        return {name: u.reason for name, u in self.fleet.memory.unplaceable.items()}

    def waiting_unplaceable(self) -> list[WaitingModel]:
        """Models with router demand whose requests are refused: the endpoint list says
        cannot_place for them (the same outlook, not computed again)."""
        demand = self.usage.demand()
        out: list[WaitingModel] = []
        for look in self.fleet.last_outlook:
            if look.state != "cannot_place":
                continue
            name = look.models[0]
            asked = sum(demand.get(n, 0) for n in look.models)
            if asked:
                out.append(WaitingModel(model=name, requests=asked, reason=look.reason))
        return out

    def node_view(self, node: Node) -> NodeView:
        return node_view(
            node,
            self.fleet.state,
            now=self.clock.wall(),
            heartbeat_timeout_s=self.config.heartbeat_timeout_s,
            unplaceable=self.unplaceable(),
        )

    async def events(
        self,
        *,
        model: str | None,
        replica: str | None,
        node: str | None,
        limit: int,
        event_id: int | None = None,
    ) -> list[Event]:
        """The matching events; with `event_id`, DoesNotExist when none matches (saying
        so when the retention deleted it)."""
        store = self.fleet.store
        try:
            found = await asyncio.to_thread(
                lambda: store.events(
                    model=model, replica=replica, node=node, limit=limit, event_id=event_id
                )
            )
            if found or event_id is None:
                return found
            pruned = await asyncio.to_thread(store.events_pruned_through)
        except StoreError as exc:
            raise StoreUnavailable(f"cannot read events: {exc}") from exc
        if event_id > pruned:
            filtered = model is not None or replica is not None or node is not None
            raise DoesNotExist(
                f"no event {event_id}" + (" that matches the filters" if filtered else ""),
                param="id",
            )
        raise DoesNotExist(f"event {event_id} is no longer kept: {self._kept()}", param="id")

    def _kept(self) -> str:
        """What the event retention keeps, in words with the flags that set it."""
        days, rows = self.config.event_retention_days, self.config.event_retention_rows
        rules = [f"{days:g} days (--event-retention-days {days:g})"] if days > 0 else []
        rules += [f"the newest {rows} (--event-retention-rows {rows})"] if rows > 0 else []
        if not rules:
            return "the event retention deleted it (now off: --event-retention-days 0)"
        return "events are kept " + " and at most ".join(rules)

    # -- commands ------------------------------------------------------------

    async def _run(self, decide: Callable[[FleetState, float], Batch]) -> None:
        fleet = self.fleet
        fleet.require_leader()
        async with fleet.lock:
            await fleet.resync()
            batch = decide(fleet.state, self.clock.wall())
            await fleet.commit(batch.changes)

    async def operator_state(
        self,
        name: str,
        to: OperatorState,
        *,
        grace_s: float | None = None,
        force: bool = False,
        evict_idle: bool = False,
    ) -> Node:
        await self._run(
            lambda s, now: commands.set_operator_state(
                s, name, to, now=now, grace_s=grace_s, force=force, evict_idle=evict_idle
            )
        )
        return self.fleet.state.nodes[name]

    async def apply_models(self, specs: list[ModelSpec | AdapterSpec]) -> list[Model]:
        """The applied models; an adapter's entry answers with its base (which lists it)."""
        policies = self.fleet.policies
        await self._run(lambda s, now: commands.apply_models(s, specs, now=now, policies=policies))
        models = self.fleet.state.models
        return [
            models[spec.adapter_of if isinstance(spec, AdapterSpec) else spec.name]
            for spec in specs
        ]

    async def delete_model(self, name: str) -> str | None:
        """Delete the model or LoRA adapter `name`; the adapter's base when it was one.

        Whether it is an adapter is decided under the lock, with the deletion: read
        before, a concurrent apply or delete could make the answer name a model where
        an adapter was deleted, or the other way round.
        """
        grace = self.config.drain_grace_s
        fleet = self.fleet
        base: str | None = None

        def decide(s: FleetState, now: float) -> Batch:
            nonlocal base
            adapter = s.adapters.get(name)
            base = adapter.base if adapter is not None else None
            # The index as of the decision, not of the call: a resync under the lock
            # replaces it together with the state.
            return commands.delete_model(s, fleet.index, name, now=now, grace_s=grace)

        await self._run(decide)
        return base

    async def scale_model(self, name: str, req: ScaleRequest) -> Model:
        await self._run(lambda s, now: commands.scale_model(s, name, req, now=now))
        return self.fleet.state.models[name]

    async def set_weight(
        self, rid: str, weight: float, *, capacity_tok_s: float | None = None
    ) -> Replica:
        await self._run(
            lambda s, now: commands.set_weight(
                s, rid, weight, now=now, capacity_tok_s=capacity_tok_s
            )
        )
        return self.fleet.state.replicas[rid]

    async def create_key(self, req: KeyCreate) -> KeyCreated:
        """Store the new key's hash and limits; the answer is the only copy of the key."""
        key = keys.new_key()
        await self._run(lambda s, now: keys.create_key(s, req, now=now, key=key))
        view = keys.key_view(self.fleet.state.keys[req.name])
        return KeyCreated(**{f: getattr(view, f) for f in view.__struct_fields__}, key=key)

    async def revoke_key(self, name: str) -> None:
        await self._run(lambda s, now: keys.revoke_key(s, name, now=now))
