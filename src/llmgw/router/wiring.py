"""The router's live parts wired together, and the one place configuration lands.

`Router` owns the registry, prefix index, hold queue, policy, metrics,
usage tracker and the shared upstream session. Both endpoint sources (the
file, the controller) end in `apply_endpoints()`, which is the only caller of
`Registry.replace()`: removed endpoints lose their prefix entries and metric
series, and held requests are woken to look again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable

from llmgw.router.config import RouterConfig, in_force
from llmgw.router.control.leases import LeaseKeeper, ShareMetrics
from llmgw.router.control.tokenusage import TokenCounts
from llmgw.router.control.usagereports import LoadTracker, build_report
from llmgw.router.http.answers import HeldAnswers
from llmgw.router.metrics import RouterMetrics
from llmgw.router.replicas.breaker import BreakerConfig
from llmgw.router.replicas.registry import Registry
from llmgw.router.request import lora
from llmgw.router.request.auth import KeyRing
from llmgw.router.request.flow import ANONYMOUS, BandLimits
from llmgw.router.request.flowgate import FlowGate
from llmgw.router.request.holding import Holding
from llmgw.router.request.tenants import Tenants
from llmgw.router.request.tracing import Tracing
from llmgw.router.routing.affinity import SessionAffinity
from llmgw.router.routing.feedback import PredictionCheck
from llmgw.router.routing.kvevents import KVEventIndex
from llmgw.router.routing.policies import Policy, make_policy
from llmgw.router.routing.prefix import PrefixIndex
from llmgw.router.upstream.aiohttp_client import Upstream
from llmgw.router.upstream.base import Forwarder
from llmgw.router.upstream.fast import FastUpstream
from llmgw.router.workers.shared import SharedInflight
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.wire.endpoints import EndpointInfo, EndpointList, ModelOutlook
from llmgw.wire.keys import ClientKey
from llmgw.wire.leases import LeaseAnswer
from llmgw.wire.usage import UsageReport

log = logging.getLogger(__name__)


class Router:
    """Everything a request or a background loop of one router process touches."""

    def __init__(
        self,
        cfg: RouterConfig,
        *,
        clock: Clock = SYSTEM_CLOCK,
        shared: SharedInflight | None = None,
        router_id: str | None = None,
    ) -> None:
        self.cfg = cfg
        self.clock = clock
        # A restarted router is a new reporter: the controller must not merge its
        # empty last_used into the old one's.
        # A worker is given its supervisor's, so every worker reports as one router.
        self.router_id = router_id or cfg.router_id or f"router-{os.urandom(4).hex()}"
        # Which worker this is (--workers N; None: the only process), for the debug header.
        self.worker_index: int | None = None
        b = cfg.breaker
        self.registry = Registry(
            stale_after_s=cfg.stale_after_s,
            breaker=BreakerConfig(
                failure_threshold=b.failure_threshold,
                cooldown_s=b.cooldown_s,
                max_cooldown_s=b.max_cooldown_s,
            ),
            clock=clock,
            shared=shared,
        )
        self.prefix = PrefixIndex()
        self.holding = Holding(max_held=cfg.max_held, client_share=cfg.client_share, clock=clock)
        # Served name → what the controller does for that model while it has no
        # ready replica (wire.endpoints.ModelOutlook); empty for static endpoints.
        self.outlook: dict[str, ModelOutlook] = {}
        self.loads = LoadTracker(clock=clock)
        # Each key's requests and tokens since the last usage report (tokenusage.py).
        self.token_counts = TokenCounts(clock=clock)
        # Flow control: requests queued by band and tenant at saturation (flowgate.py).
        self.flow = FlowGate(
            {
                band: BandLimits(
                    max_queued=b.max_queued,
                    max_wait_s=b.max_wait_s,
                    max_wait_turnovers=b.max_wait_turnovers,
                )
                for band, b in cfg.flow.bands().items()
            },
            enabled=cfg.flow.enabled,
            critical_reserve=cfg.flow.critical_reserve,
            shown=self.registry.capacity_shown,
            clock=clock,
            # With workers, their queues act as one (flowgate.py, "Workers").
            peers=None if shared is None or shared.workers < 2 else self.registry,
        )
        self.metrics = RouterMetrics(
            snapshots=self.registry.snapshots, held=self.holding.demand, queued=self.flow.depth
        )
        # Client keys: the file's, and the controller's from its last list (kept while
        # it is unreachable, as the endpoints are); their counts (tenants.py).
        self._controller_keys: tuple[ClientKey, ...] = ()
        self._keys_required = False
        # With workers, a key's buckets are one per router, in their shared memory.
        table = shared.keys if shared is not None and shared.workers > 1 else None
        workers = 1 if shared is None else shared.workers
        self.tenants = Tenants(clock=clock, table=table, workers=workers)
        # This router's shares of the controller's limited keys (control/leases.py).
        self.leases = LeaseKeeper(clock=clock)
        # Asks for a usage report now (set by whoever reports): a key waits for its share.
        self.want_lease: Callable[[], None] = _nothing
        self.metrics.registry.register(
            ShareMetrics(lambda: self.tenants.shares, lambda: self._controller_keys)
        )
        self.keys = KeyRing(cfg.api_keys, clock=clock)
        # Spans of routing decisions (tracing.py); None: off, set by the app at start.
        self.tracing: Tracing | None = None
        # Kept across policy reloads, like the index: sessions and prediction counts.
        self.sessions = SessionAffinity()
        self.prediction = PredictionCheck(self.prefix)
        self.metrics.registry.register(self.prediction)
        # Engines' whole answers held at once (http/answers.py): this worker's share.
        workers = 1 if shared is None else max(1, shared.workers)
        self.answers = HeldAnswers(max(1, cfg.max_held_answer_bytes // workers))
        self.metrics.held_answers(lambda: self.answers.held_bytes)
        # Precise mode: the engines' own KV events, where they publish them
        # (kvevents.py; followed by kvfollow.py, started with the app).
        self.kv_events = KVEventIndex()
        self.metrics.registry.register(self.kv_events)
        self.policy: Policy = self._make_policy(cfg.policy)
        # aiohttp, for the scrape loop and the controller (off the request path) ...
        self.upstream = Upstream(connect_timeout_s=cfg.connect_timeout_s)
        # ... and the proxy's client (tests put the fake forwarder of llmgw.testing here).
        self.forward: Forwarder = FastUpstream(connect_timeout_s=cfg.connect_timeout_s)
        # Endpoint id → URL without trailing slash, rebuilt with the list.
        self.urls: dict[str, str] = {}
        # Endpoint id → the headers of a request to it: the router's own plus
        # `Authorization: Bearer <engine key>` for an engine that has one.
        self.engine_auth: dict[str, str] = {}
        # Endpoint id → adapter → its llama.cpp position (router/request/lora.py); only
        # llama.cpp replicas that serve adapters are in it.
        self.lora_ids: dict[str, dict[str, int]] = {}
        # Endpoints whose engine orders its queue by the request's `priority` field.
        self.prioritized: frozenset[str] = frozenset()
        self.known_models: frozenset[str] = frozenset()
        # Alias → the served name (an endpoint's first model name), for metric labels.
        self.served_name: dict[str, str] = {}
        self._file_models: frozenset[str] = cfg.known_models()
        self._controller_models: frozenset[str] = frozenset()
        # Following a controller whose first list has not come yet: which models
        # exist is unknown, so no request may be told 404 (proxy) and not ready.
        self.awaiting_list = cfg.controller is not None
        # Which source feeds the registry is fixed at start (`controller` is
        # restart-only): a reload that adds or drops the section changes nothing here.
        self._follows_controller = cfg.controller is not None
        # Called after a reload with the new config (the scraper, the reporter).
        self.on_config: list[Callable[[RouterConfig], None]] = []
        if cfg.controller is None:
            self.apply_endpoints(cfg.endpoint_infos())
        else:
            self._refresh_models()

    # -- clients -----------------------------------------------------------------

    async def start_clients(self) -> None:
        await self.upstream.start()
        await self.forward.start()

    async def close_clients(self) -> None:
        await self.forward.close()
        await self.upstream.close()

    # -- configuration ---------------------------------------------------------

    def apply_config(self, loaded: RouterConfig) -> None:
        """A reloaded file: swap what can change live; requests in flight keep going."""
        old = self.cfg
        cfg = self.cfg = in_force(old, loaded)
        self._set_keys()
        self.holding.max_held = cfg.max_held
        self.upstream.connect_timeout_s = cfg.connect_timeout_s
        self.forward.connect_timeout_s = cfg.connect_timeout_s
        if cfg.policy != old.policy:
            self.policy = self._make_policy(cfg.policy)
        self._file_models = cfg.known_models()
        if not self._follows_controller:
            # A file that now names a controller (which needs a restart) keeps the
            # endpoints in force: `in_force` kept them with the running `controller`.
            self.apply_endpoints(cfg.endpoint_infos())
        else:
            # Following a controller: its list stays in force until it changes it.
            self._refresh_models()
            self.holding.notify_changed()
        for hook in self.on_config:
            hook(cfg)

    def _make_policy(self, name: str) -> Policy:
        return make_policy(
            name, self.prefix, sessions=self.sessions, check=self.prediction, exact=self.kv_events
        )

    def apply_list(self, lst: EndpointList) -> None:
        """A list from the controller's EndpointSink."""
        self._controller_models = frozenset(lst.models)
        if lst.keys != self._controller_keys or lst.keys_required != self._keys_required:
            self._controller_keys = lst.keys
            self._keys_required = lst.keys_required
            self._set_keys()
        self.outlook = {name: o for o in lst.outlook for name in o.models}
        self.awaiting_list = False
        self.apply_endpoints(lst.endpoints)

    def _set_keys(self) -> None:
        keys = (*self.cfg.api_keys, *self._controller_keys)
        self.keys = KeyRing(keys, required=self._keys_required, clock=self.clock)
        self.tenants.retain(keys, leased=self._controller_keys)
        # Queued as their team, else their own name (waits.py); "": no key.
        self.metrics.retain_flow_teams({ANONYMOUS, *(k.team or k.name for k in keys)})
        # Not `leased - shares.keys()`: that is a set, and the compiled build checks the
        # frozenset its annotation promises (a TypeError that stopped every reload).
        shares = self.tenants.shares
        if self.tenants.leasing is not False and any(k not in shares for k in self.tenants.leased):
            self.want_lease()

    def leased(self, answer: LeaseAnswer | None, report: int = 0) -> None:
        """The controller's answer to a usage report (a worker's: the supervisor's
        report number `report`): this router's new shares."""
        shares = self.leases.answer(answer)
        self.tenants.leasing = self.leases.leasing
        self.tenants.reshare(dict(shares))
        self.tenants.reallow(dict(self.leases.allowances()), report)

    def lease_expire(self) -> None:
        """After every report: past the lease, fall back to limit / routers."""
        shares = self.leases.expire()
        if shares is not None:
            self.tenants.reshare(dict(shares))

    def apply_endpoints(self, infos: Iterable[EndpointInfo]) -> None:
        infos = tuple(infos)
        removed = self.registry.replace(infos)
        # A replica that left takes its cache with it; keeping its prefix entries
        # would only make the index lie if the id ever came back.
        self.prefix.retain(self.registry.ids())
        self.sessions.retain(self.registry.ids())
        self.flow.retain(frozenset(self.registry.ids()))
        for problem in self.kv_events.set_endpoints(infos):
            log.error(kv("kv events not followed, routing by guessing", problem=problem))
        self.metrics.forget(removed)
        self.urls = {i.id: i.url.rstrip("/") for i in infos}
        self.served_name = {n: i.models[0] for i in infos if i.models for n in i.models[1:]}
        self.engine_auth = {i.id: f"Bearer {i.api_key}" for i in infos if i.api_key}
        self.lora_ids = {i.id: lora.positions(i.lora_ids) for i in infos if i.lora_ids}
        self.prioritized = frozenset(i.id for i in infos if i.priority_scheduling)
        self._refresh_models()
        if removed:
            log.info(kv("endpoints removed", ids=",".join(removed)))
        self.holding.notify_changed()

    def _refresh_models(self) -> None:
        self.known_models = self._file_models | self._controller_models | self.registry.models()

    def observed(self, endpoint_id: str) -> None:
        """A new scrape of `endpoint_id` is in: flow control learns its hold point from
        it now, not when it next looks at the replica, so every worker of a router
        learns from every scrape and all keep the same points."""
        snap = self.registry.snapshot(endpoint_id)
        if snap is not None:
            self.flow.learn(snap)

    def engine_restarted(self, endpoint_id: str) -> None:
        """Its KV cache is empty: forget what we thought it held."""
        self.prefix.purge(endpoint_id)
        self.kv_events.engine_restarted(endpoint_id)

    # -- reads -------------------------------------------------------------------

    def ready(self) -> bool:
        """Ready when nothing is configured, or at least one endpoint has been scraped;
        never before the controller's first list when one is followed."""
        if self.awaiting_list:
            return False
        snaps = self.registry.snapshots()
        return not snaps or any(s.stats is not None for s in snaps)

    def usage_report(self, reset: bool = False, report: int = 0) -> UsageReport:
        demand = self.holding.demand()
        return build_report(
            router_id=self.router_id,
            sent_at=self.clock.wall(),
            last_used=self.registry.last_used(),
            inflight={
                **self.registry.departed_inflight(),
                # This process's own: a worker's report is added to the others'.
                **self.registry.own_inflight(),
            },
            demand=demand,
            load=self.loads.load(demand, reset=reset),
            key_demand=self.leases.demand(self.tenants.asked(report)) if reset else (),
            flow_queued=self.flow.depth(),
        )


def _nothing() -> None:
    """`Router.want_lease` where nobody reports (a worker: its supervisor does)."""
