"""The control loop: leadership first, then one reconcile tick.

Once a tick:
- a leader checks it still holds the lock; if not, it stops acting at once
  (becomes a standby) rather than write over a successor;
- a standby tries to take the lock; when it wins it reloads everything from
  the store before acting, since the old leader may have written up to its
  last moment, and records the URL it is reachable at (leaderlink.py); otherwise
  it reloads every `standby_reload_s` to serve reads, the leader's URL with it;
- a leader then plans the tick (tick/plan.py, pure) and commits the plan in
  one transaction, together with the heartbeat timestamps due for flushing;
- and deletes a batch of token usage, and one of events, past their retention
  when one is due (tick/retention.py).

A failed tick (database unreachable) is logged (once, then every few minutes while
the same failure repeats: runtime/repeats.py) and retried next tick; so is one that
crashes (its traceback with the first line only), and a leader URL not recorded. Its write
may have committed all the same (the connection dropped after the COMMIT went
out), so the next tick first reads the store again (Fleet.resync).
"""

from __future__ import annotations

import asyncio
import logging

from llmgw.controller.config import ControllerConfig
from llmgw.controller.errors import NotLeading, StoreUnavailable
from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.fleet.records import Changes
from llmgw.controller.idle import IdleTracker
from llmgw.controller.leaderlink import LeaderLink
from llmgw.controller.store import Leadership, StoreError
from llmgw.controller.tick.plan import plan_tick
from llmgw.controller.tick.retention import EventRetention, UsageRetention
from llmgw.runtime.clock import Clock
from llmgw.runtime.logs import kv
from llmgw.runtime.repeats import FailureLog

log = logging.getLogger(__name__)


class ControlLoop:
    def __init__(
        self,
        fleet: Fleet,
        leadership: Leadership,
        usage: IdleTracker,
        *,
        clock: Clock,
        config: ControllerConfig,
        link: LeaderLink,
    ) -> None:
        self.fleet = fleet
        self.link = link
        # Whether this term's leader URL is in the store (retried each tick until it is).
        self._advertised = False
        self._advertising = FailureLog(
            "leader url not recorded; retrying next tick",
            cleared="leader url recorded",
            count_as="tries_failed",
            logger=log,
        )
        self.leadership = leadership
        self.usage = usage
        self.clock = clock
        self.config = config
        self._last_reload = -float("inf")
        self.ticks = 0
        # No line when a tick works again: a standby's tick between two reloads works
        # while the store is still down, and would say so at every reload.
        self._failures = FailureLog(
            "tick failed", cleared=None, count_as="ticks_failed", logger=log
        )
        # The database behind the lock down: the check fails at every tick.
        self._checks = FailureLog(
            "leadership check failed",
            cleared="leadership check answers again",
            count_as="checks_failed",
            logger=log,
        )
        # A defect that every tick meets. Cleared only by a whole tick (a leader's, or
        # a standby's that reloaded): a standby's tick between reloads does too little
        # to say whether a crash in its reload is gone.
        self._crashes = FailureLog(
            "tick crashed", cleared="ticks run again", count_as="ticks_crashed", logger=log
        )
        # Whether the tick under way did everything a tick does (see _crashes).
        self._whole = False
        self.retention = UsageRetention(
            fleet.store, retention_days=config.usage_retention_days, clock=clock
        )
        self.event_retention = EventRetention(
            fleet.store,
            retention_days=config.event_retention_days,
            max_rows=config.event_retention_rows,
            clock=clock,
        )

    async def tick(self) -> None:
        self._whole = False
        await self.check_leadership()
        if self.fleet.leading and not self._advertised:
            await self._advertise()
        if self.fleet.leading:
            await self.reconcile()
            # The leader alone, so standbys sharing the database do not repeat it.
            await self.retention.tick()
            await self.event_retention.tick()
            self._whole = True
        self.ticks += 1

    async def run(self) -> None:
        """Tick every `tick_s` until cancelled; a tick that fails is retried, never fatal."""
        while True:
            elapsed = await self.step()
            await asyncio.sleep(max(0.0, self.config.tick_s - elapsed))

    async def step(self) -> float:
        """One tick, its failure logged (runtime/repeats.py) and its time observed; the
        seconds it took."""
        started = self.clock.monotonic()
        try:
            await self.tick()
        except (StoreUnavailable, NotLeading) as exc:
            self._failures.failed(exc.message, now=self.clock.monotonic())
        except Exception as exc:  # noqa: BLE001 - a defect must not end the loop; logged with its traceback
            self._crashes.failed(repr(exc), now=self.clock.monotonic(), exc=exc)
        else:
            if self._whole:
                self._crashes.worked()
        elapsed = self.clock.monotonic() - started
        self.fleet.decisions.tick.observe(elapsed)
        return elapsed

    async def check_leadership(self) -> None:
        fleet = self.fleet
        if fleet.leading:
            try:
                held = await asyncio.to_thread(self.leadership.still_leader)
                self._checks.worked()
            except StoreError as exc:
                self._checks.failed(str(exc), now=self.clock.monotonic())
                held = False
            if not held:
                fleet.end_term()
                log.warning("leadership lost; standing by")
            return
        try:
            won = await asyncio.to_thread(self.leadership.try_acquire)
            self._checks.worked()
        except StoreError as exc:
            self._checks.failed(str(exc), now=self.clock.monotonic())
            won = False
        if won:
            await self._take_over()
            return
        now = self.clock.monotonic()
        if now - self._last_reload >= self.config.standby_reload_s:
            self._last_reload = now
            await fleet.load()
            await self.link.reload()
            self._whole = True

    async def _take_over(self) -> None:
        fleet = self.fleet
        self._advertised = False  # a new term records its URL again
        async with fleet.lock:
            try:
                await fleet.load()
            except StoreUnavailable:
                # Leading without the latest state would undo the old leader's
                # last writes: let go and try again next tick.
                await asyncio.to_thread(self.leadership.release)
                raise
            fleet.begin_term()
            batch = Batch(fleet.state, self.clock.wall())
            batch.event(
                "controller.leader",
                "controller",
                "controller",
                f"leading: {len(fleet.state.nodes)} nodes, {len(fleet.state.models)} models, "
                f"{len(fleet.state.replicas)} replicas loaded",
                model=None,
            )
            await fleet.commit(batch.changes)
        log.info(kv("leading", nodes=len(fleet.state.nodes), models=len(fleet.state.models)))

    async def _advertise(self) -> None:
        try:
            await self.link.advertise()
        except StoreError as exc:
            # Standbys answer reports alone meanwhile (or relay to a dead URL and
            # then do): nothing is lost, so the tick goes on.
            self._advertising.failed(str(exc), now=self.clock.monotonic())
            return
        self._advertising.worked()
        self._advertised = True

    async def flush_heartbeats(self) -> None:
        """Store every heartbeat timestamp held only in memory (graceful stop): a controller
        restarted soon after then shows its nodes as they were, not as unreachable."""
        fleet = self.fleet
        if not fleet.leading:
            return
        async with fleet.lock:
            await fleet.resync()
            nodes = fleet.heartbeats_to_flush(now=self.clock.wall(), all_=True)
            await fleet.commit(Changes(nodes=nodes))
            fleet.flushed(n.name for n in nodes)

    async def reconcile(self) -> None:
        fleet = self.fleet
        async with fleet.lock:
            # A write of unknown outcome since the last tick: plan from the store.
            await fleet.resync()
            now = self.clock.wall()
            dirty = fleet.take_dirty()
            plan = plan_tick(
                fleet.state,
                fleet.index,
                self.usage,
                fleet.memory,
                now=now,
                config=self.config,
                dirty=dirty,
            )
            flush = fleet.heartbeats_to_flush(now=now)
            # Flushed timestamps first: a node the plan itself changes wins (last by key).
            plan.changes.nodes[:0] = flush
            try:
                await fleet.commit(plan.changes)
            except BaseException:
                fleet.restore_dirty(dirty)
                raise
            fleet.flushed(n.name for n in flush)
            fleet.memory = plan.memory
            fleet.outlook_changed()
        for rid in plan.forgotten:
            self.usage.forget(rid)
