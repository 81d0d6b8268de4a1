"""The engines on this node: start what is desired, stop what is not, say how each is doing.

Shard identity is (replica_id, rank). Life of a shard here:

    apply() lists it ──► starting ──/health 200──► ready
                            │                        │
                            └──── process exits ─────┴──► failed (exit code, log tail)
    apply() omits it ──► SIGTERM to its group ──(grace)──► SIGKILL ──► stopped

A failed shard stays failed while the controller keeps listing it: restarts
are the controller's decision (a new replica id), never the agent's, so a
crashing engine cannot loop here unseen. A shard the controller stops listing
is dropped once its process is gone and it has been reported.

Only `apply()` (an actual answer from the controller) ever stops an engine;
an unreachable controller means no apply() at all, so engines keep running
("serving survives the control plane", docs/architecture.md).
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path

import msgspec

from llmgw.agent import logfiles, sleeping
from llmgw.agent.adapters import (
    AdapterClient,
    AdapterState,
    HttpAdapterClient,
    serves_at_start,
    sync,
    sync_due,
)
from llmgw.agent.enginecalls import CALL_WAIT_S, EngineCalls
from llmgw.agent.engineprocs import (
    KILL,
    TERM,
    ProcessHandle,
    Spawner,
    SpawnError,
    read_environ,
)
from llmgw.agent.metrics import EngineEvents
from llmgw.agent.policy import SpecPolicy, SpecRefused, check, policy_of
from llmgw.agent.ports import NoFreePort, PortAllocator, RendezvousPortTaken
from llmgw.agent.probe import HealthProbe
from llmgw.agent.secretrefs import SecretUnavailable, resolve, resolve_quietly
from llmgw.agent.shards import Shard
from llmgw.agent.statefile import ShardRecord, StateStore
from llmgw.agent.templates import DEFAULT_COMMANDS, KVEventPorts, kv_events_topic, render
from llmgw.runtime.clock import SYSTEM_CLOCK, Clock
from llmgw.runtime.logs import kv
from llmgw.wire.adapters import loads_at_run_time
from llmgw.wire.agent import EngineKind, ShardSpec, ShardStatus

log = logging.getLogger(__name__)


class Supervisor:
    def __init__(
        self,
        *,
        log_dir: Path,
        store: StateStore,
        ports: PortAllocator,
        spawner: Spawner,
        probe: HealthProbe,
        commands: Mapping[EngineKind, tuple[str, ...]] = DEFAULT_COMMANDS,
        host: str = "127.0.0.1",
        policy: SpecPolicy | None = None,
        private_paths: Sequence[Path] = (),
        private_values: Sequence[str] = (),
        engine_environ: Callable[[int], Mapping[str, str] | None] = read_environ,
        stop_grace_s: float = 10.0,
        log_max_bytes: int = logfiles.DEFAULT_MAX_BYTES,
        log_keep: int = logfiles.DEFAULT_KEEP,
        ended_logs_keep: int = logfiles.DEFAULT_ENDED_KEEP,
        clock: Clock = SYSTEM_CLOCK,
        adapter_client: AdapterClient | None = None,
        sleep_client: sleeping.SleepClient | None = None,
        call_wait_s: float = CALL_WAIT_S,
        patience: sleeping.Patience | None = None,
    ) -> None:
        self._sleep_client: sleeping.SleepClient = (
            sleep_client if sleep_client is not None else sleeping.HttpSleepClient()
        )
        self._log_dir = log_dir
        self._adapter_client: AdapterClient = (
            adapter_client if adapter_client is not None else HttpAdapterClient()
        )
        self._store = store
        self._ports = ports
        self._spawner = spawner
        self._probe = probe
        self._commands = commands
        # Engines listen here (the advertised address) and are probed here.
        self._host = host
        # What a spec may set here (policy.py); refused shards fail before starting. The
        # default is the agent's: no allowances, no variable env_from may read.
        self.policy = policy if policy is not None else policy_of((), ())
        # The agent's own files (token, state folder): no env_from may read them.
        self._private_paths = tuple(private_paths)
        # The agent's own token: no env_from value may hold it, and no log tail carries it.
        self._private_values = tuple(v for v in private_values if v)
        # An adopted engine's environment by pid: the secret values it really holds.
        self._engine_environ = engine_environ
        self._stop_grace_s = stop_grace_s
        self._logs = logfiles.LogKeeper(
            max_bytes=log_max_bytes, keep=log_keep, ended_keep=ended_logs_keep
        )
        self._clock = clock
        # Counted for /metrics (agent.metrics) as engines start, become ready and exit.
        self.events = EngineEvents()
        self._shards: dict[tuple[str, int], Shard] = {}
        # Sleeps, wakes and adapter loads in flight, one per engine (enginecalls.py).
        self._calls = EngineCalls()
        self._call_wait_s = call_wait_s
        # The quiet wait before a sleep, the warm-up's tries after a wake (sleeping.py).
        self._patience = patience if patience is not None else sleeping.Patience()
        # Rendezvous ports of the shards the controller last listed, including
        # those not started yet: no engine port may be one of them.
        self._rendezvous: frozenset[int] = frozenset()

    # -- the controller's word ------------------------------------------------

    def adopt(self, records: Sequence[ShardRecord]) -> None:
        """Take over engines a previous agent started (call once, before the first apply)."""
        for rec in records:
            proc = self._spawner.attach(rec.pid, rec.start_ticks)
            sh = Shard(
                spec=rec.spec,
                port=rec.port,
                log_path=Path(rec.log_path),
                health_path=rec.health_path,
                state="starting",
                api_key=rec.api_key,
                kv_ports=(
                    KVEventPorts(publish=rec.kv_events_port, replay=rec.kv_events_replay_port)
                    if rec.kv_events_port is not None and rec.kv_events_replay_port is not None
                    else None
                ),
                secret_values=self._adopted_secrets(rec, proc),
                proc=proc,
                started_at=rec.started_at,
                priority_scheduling=rec.priority_scheduling,
                # A start-only engine serves its spec's list (kept as it started);
                # one that loads at run time is asked again, and its "already
                # loaded" counts as served.
                started_adapters=(
                    {}
                    if loads_at_run_time(rec.spec.engine, rec.spec.env)
                    else serves_at_start(rec.spec)
                ),
            )
            if proc is None:
                sh.state = "failed"
                sh.log_tail = (
                    *logfiles.tail(sh.log_path, secrets=self._secrets(sh)),
                    f"llmgw agent: engine pid {rec.pid} exited while the agent was down",
                )
                log.warning(kv("engine gone at adoption", replica=rec.replica_id, pid=rec.pid))
            else:
                log.info(kv("engine adopted", replica=rec.replica_id, rank=rec.rank, pid=rec.pid))
            self._shards[sh.key] = sh
        self._logs.found(self._log_dir, {sh.log_path for sh in self._shards.values()})
        self._save()

    def apply(
        self, desired: Sequence[ShardSpec], *, unread: Collection[tuple[str, int]] = ()
    ) -> None:
        """Make the running set match `desired`, the controller's complete list for this node;
        `unread`: shards it also lists that this agent cannot read (replyread.py), left as
        they are."""
        want = {(s.replica_id, s.rank): s for s in desired}
        # Known before anything starts: the first shard of this list must not
        # take the port a later one's rank 0 is about to listen on.
        self._rendezvous = frozenset(s.master_port for s in desired if s.master_port is not None)
        for key, sh in list(self._shards.items()):
            if key in want:
                # Not part of the identity: a new list is loaded where the engine
                # runs (adapters.py), never a restart. An engine that takes adapters
                # at start only keeps the list it started with (the controller
                # replaces it): its spec must keep saying what it serves.
                if want[key].adapters != sh.spec.adapters and loads_at_run_time(
                    sh.spec.engine, sh.spec.env
                ):
                    sh.spec = msgspec.structs.replace(sh.spec, adapters=want[key].adapters)
                # Nor is sleeping: the engine is put to sleep or woken in place (tick).
                if want[key].sleep_level != sh.spec.sleep_level:
                    sh.spec = msgspec.structs.replace(sh.spec, sleep_level=want[key].sleep_level)
                continue
            if key in unread:
                continue
            if sh.proc is None:
                del self._shards[key]
                self._logs.ended(sh.log_path, self._secrets(sh))
            elif sh.stop_sent_at is None:
                self._stop(sh)
        for key in sorted(want):
            if key not in self._shards:
                self._start(want[key])
        self._save()

    # -- the loop ---------------------------------------------------------------

    async def tick(self) -> None:
        """Reap exits, escalate stops, probe starting engines, rotate logs, persist."""
        now = self._clock.monotonic()
        for sh in self._shards.values():
            if sh.proc is None:
                continue
            ex = sh.proc.poll()
            if ex is not None:
                self._exited(sh, ex.code)
            elif (
                sh.stop_sent_at is not None
                and not sh.kill_sent
                and now - sh.stop_sent_at >= self._stop_grace_s
            ):
                log.warning(kv("engine ignored SIGTERM, killing", replica=sh.spec.replica_id))
                sh.proc.signal_group(KILL)
                sh.kill_sent = True
        await self._probe_starting()
        await self._sync_sleep()
        await self._sync_adapters()
        await self.tidy_logs()
        self._save()

    async def tidy_logs(self) -> None:
        """Rotate logs past their limit, remove expired ones (also every CHECK_S, service.py)."""
        # Paths are read here, on the loop; the thread only touches files.
        await self._logs.tidy({sh.log_path for sh in self._shards.values()})

    async def _probe_starting(self) -> None:
        probed: list[tuple[Shard, int, str]] = []
        for sh in self._shards.values():
            if sh.state != "starting" or sh.proc is None or sh.stop_sent_at is not None:
                continue
            if self._calls.busy(sh.key):
                continue  # healthy, asked whether it is asleep (_ask_asleep)
            if sh.health_path is None or sh.port is None:
                # No HTTP to ask (vLLM headless ranks): alive is all we can know.
                self._ready(sh)
            else:
                probed.append((sh, sh.port, sh.health_path))
        results = await asyncio.gather(
            *(self._probe.check(self._host, port, path) for _, port, path in probed)
        )
        asked: list[asyncio.Task[None]] = []
        for (sh, port, _), ok in zip(probed, results, strict=True):
            # Re-check: while the probes ran, a heartbeat may have stopped it.
            if not (ok and self._still_starting(sh)):
                continue
            if sh.spec.sleep_mode:
                asked.append(self._calls.start(sh.key, self._ask_asleep(sh, port)))
            else:
                self._ready(sh)
        await self._calls.wait_started(asked, timeout_s=self._call_wait_s)

    def _still_starting(self, sh: Shard) -> bool:
        return sh.state == "starting" and sh.proc is not None and sh.stop_sent_at is None

    async def _ask_asleep(self, sh: Shard, port: int) -> None:
        """A healthy engine whose model may sleep is ready or sleeping as it says
        (sleeping.py): an engine call, since one that answers /health and never this
        would otherwise hold the tick. It stays `starting` until the answer, as
        reported ready it would be sent requests its paused queue never serves."""
        asleep = await self._sleep_client.is_sleeping(self._host, port, sh.api_key)
        # Re-check: while the question ran, a heartbeat may have stopped it.
        if self._still_starting(sh):
            self._ready(sh)
            if asleep:
                sh.state = "sleeping"

    async def _sync_sleep(self) -> None:
        """Put engines to sleep or wake them (and warm them up) as the controller listed:
        sleeps first, then the wakes whose cards no other engine is awake on (a swap
        lists both at once: the one leaving sleeps, then the other wakes)."""
        await self._sleep_step("sleep")
        await self._sleep_step("wake")

    async def _sleep_step(self, op: str) -> None:
        started = [
            self._calls.start(sh.key, self._sleep_call(sh, op))
            for sh in self._shards.values()
            if sh.proc is not None
            and sh.stop_sent_at is None
            and not self._calls.busy(sh.key)
            and sleeping.wants(sh.spec, sh.state) == op
            and (op == "sleep" or not self._card_taken(sh))
        ]
        await self._calls.wait_started(started, timeout_s=self._call_wait_s)

    async def _sleep_call(self, sh: Shard, op: str) -> None:
        now = self._clock.monotonic()
        if await sleeping.drive(
            self._sleep_client, self._patience, sh, op, host=self._host, now=now
        ):
            self.events.slept(sh.spec.engine, op)

    def _card_taken(self, sh: Shard) -> bool:
        """Another engine is awake (or still exiting) on one of `sh`'s GPUs."""
        mine = set(sh.spec.gpu_indices)
        return any(
            o is not sh
            and o.proc is not None
            and o.state in ("starting", "ready")
            and mine & set(o.spec.gpu_indices)
            for o in self._shards.values()
        )

    async def _sync_adapters(self) -> None:
        """Load and unload adapters on ready engines that take them at run time."""
        now = self._clock.monotonic()
        started = [
            self._calls.start(
                sh.key,
                sync(
                    self._adapter_client,
                    sh.adapters,
                    sh.spec,
                    host=self._host,
                    port=sh.port,
                    api_key=sh.api_key,
                    now=now,
                ),
            )
            for sh in self._shards.values()
            # health_path None: a headless rank, with no API server to load into.
            if sh.state == "ready"
            and sh.adapters is not None
            and sh.port is not None
            and sh.health_path is not None
            and not self._calls.busy(sh.key)
            and sync_due(sh.spec, sh.adapters, now)
        ]
        await self._calls.wait_started(started, timeout_s=self._call_wait_s)

    async def wait_call_finished(self, *, timeout_s: float) -> None:
        """Until a call to an engine ends (its outcome is then in `statuses()`), or
        `timeout_s`: the supervise loop's pause between ticks."""
        await self._calls.wait_finished(timeout_s=timeout_s)

    def _ready(self, sh: Shard) -> None:
        sh.state = "ready"
        sh.adapters = AdapterState(served=dict(sh.started_adapters))
        if sh.started_at is not None:
            self.events.ready(sh.spec.engine, self._clock.wall() - sh.started_at)
        log.info(kv("engine ready", replica=sh.spec.replica_id, rank=sh.spec.rank, port=sh.port))

    async def stop_all(self, *, grace_s: float | None = None, poll_s: float = 0.1) -> None:
        """SIGTERM every engine, SIGKILL after the grace (`--stop-engines-on-exit`)."""
        grace = self._stop_grace_s if grace_s is None else grace_s
        for sh in self._shards.values():
            if sh.proc is not None and sh.stop_sent_at is None:
                self._stop(sh)
        deadline = self._clock.monotonic() + grace
        while any(sh.proc is not None for sh in self._shards.values()):
            for sh in self._shards.values():
                if sh.proc is not None and (ex := sh.proc.poll()) is not None:
                    self._exited(sh, ex.code)
            if self._clock.monotonic() >= deadline:
                for sh in self._shards.values():
                    if sh.proc is not None and not sh.kill_sent:
                        sh.proc.signal_group(KILL)
                        sh.kill_sent = True
            await asyncio.sleep(poll_s)
        self._save()

    async def close(self) -> None:
        """End the calls in flight and release the clients' connections (engines keep
        running)."""
        await self._calls.close()
        await self._adapter_client.close()
        await self._sleep_client.close()

    # -- what leaves ------------------------------------------------------------

    def statuses(self) -> tuple[ShardStatus, ...]:
        """Every shard this agent knows, sorted by (replica_id, rank)."""
        return tuple(
            ShardStatus(
                replica_id=sh.spec.replica_id,
                rank=sh.spec.rank,
                state=sh.state,
                port=sh.port,
                pid=sh.proc.pid if sh.proc is not None else None,
                exit_code=sh.exit_code,
                log_tail=sh.log_tail,
                started_at=sh.started_at,
                api_key=sh.api_key,
                kv_events_port=sh.kv_ports.publish if sh.kv_ports is not None else None,
                kv_events_replay_port=sh.kv_ports.replay if sh.kv_ports is not None else None,
                kv_events_topic=kv_events_topic(sh.spec) if sh.kv_ports is not None else "",
                adapters=(
                    tuple(sorted(sh.adapters.served))
                    if sh.state == "ready" and sh.adapters is not None
                    else ()
                ),
                priority_scheduling=sh.priority_scheduling,
                note=sh.note,
            )
            for _, sh in sorted(self._shards.items())
        )

    def engine_states(self) -> list[tuple[str, str]]:
        """(engine kind, state) of every shard, for /metrics."""
        return [(sh.spec.engine, sh.state) for sh in self._shards.values()]

    def busy_gpus(self) -> frozenset[int]:
        """GPU indices an engine process of this node is running on."""
        return frozenset(
            i for sh in self._shards.values() if sh.proc is not None for i in sh.spec.gpu_indices
        )

    def log_paths(self) -> dict[tuple[str, int], Path]:
        return {k: sh.log_path for k, sh in sorted(self._shards.items())}

    def log_source(self, replica_id: str, rank: int) -> tuple[Path, tuple[str, ...]] | None:
        """A shard's log and the values to mask in it; an ended one's while kept; or None."""
        if (sh := self._shards.get((replica_id, rank))) is not None:
            return sh.log_path, self._secrets(sh)
        path = self._log_dir / logfiles.log_name(replica_id, rank)
        return self._logs.kept(path, also=self._private_values)

    # -- internals --------------------------------------------------------------

    def _start(self, spec: ShardSpec) -> None:
        path = self._log_dir / logfiles.log_name(spec.replica_id, spec.rank)
        sh = Shard(spec=spec, port=None, log_path=path, health_path=None, state="starting")
        self._shards[sh.key] = sh
        self.events.started(spec.engine)
        try:
            check(self.policy, spec)
            self._check_rendezvous(spec)
            sh.port = self._ports.allocate(self._ports_taken())
            if spec.kv_events and spec.rank == 0:
                publish = self._ports.allocate(self._ports_taken())
                replay = self._ports.allocate({*self._ports_taken(), publish})
                sh.kv_ports = KVEventPorts(publish=publish, replay=replay)
            # Read now, on this node; held in memory only (the state file keeps the spec).
            resolved = resolve(
                spec.env_from,
                private_paths=self._private_paths,
                # The engines' keys too: one spec must not be handed another's engine.
                private_values=(
                    *self._private_values,
                    *(o.api_key for o in self._shards.values() if o.api_key),
                ),
            )
            sh.secret_values = tuple(resolved.values())
            sh.api_key = secrets.token_urlsafe(32)
            plan = render(
                spec,
                port=sh.port,
                host=self._host,
                api_key=sh.api_key,
                env={**spec.env, **resolved},
                commands=self._commands,
                kv_events=sh.kv_ports,
            )
            sh.health_path = plan.health_path
            sh.priority_scheduling = plan.priority_scheduling
            sh.started_adapters = serves_at_start(spec)
            sh.proc = self._spawner.spawn(plan.argv, plan.env, sh.log_path)
        except (
            NoFreePort,
            RendezvousPortTaken,
            SpawnError,
            SpecRefused,
            SecretUnavailable,
            ValueError,
        ) as exc:
            sh.state = "failed"
            sh.log_tail = (f"llmgw agent: {exc}",)
            self.events.exited(spec.engine, "failed")
            log.error(kv("engine not started", replica=spec.replica_id, rank=spec.rank, error=exc))
            return
        sh.started_at = self._clock.wall()
        log.info(
            kv(
                "engine started",
                replica=spec.replica_id,
                rank=spec.rank,
                engine=spec.engine,
                pid=sh.proc.pid,
                port=sh.port,
                gpus=",".join(map(str, spec.gpu_indices)),
            )
        )
        # Persist before anything else can happen: an agent killed now must find it.
        unsaved = self._save()
        if unsaved is not None:
            # Missing from the state file, the engine would outlive an agent that dies
            # now with nothing to adopt or stop it by; and an agent that crashed here
            # would start one more at each of its restarts. Ended, the shard fails
            # (the controller restarts it after its backoff).
            sh.failure = f"llmgw agent: {unsaved}; the engine was stopped"
            sh.proc.signal_group(KILL)
            sh.stop_sent_at = self._clock.monotonic()
            sh.kill_sent = True

    def _stop(self, sh: Shard) -> None:
        assert sh.proc is not None
        log.info(kv("engine stopping", replica=sh.spec.replica_id, rank=sh.spec.rank))
        sh.proc.signal_group(TERM)
        sh.stop_sent_at = self._clock.monotonic()

    def _exited(self, sh: Shard, code: int | None) -> None:
        assert sh.proc is not None
        # Workers the engine left in its group would hold GPU memory: end them too.
        sh.proc.signal_group(KILL)
        sh.proc = None
        sh.exit_code = code
        sh.state = "stopped" if sh.stop_sent_at is not None and not sh.failure else "failed"
        self.events.exited(sh.spec.engine, sh.state)
        if sh.state == "failed":
            sh.log_tail = logfiles.tail(sh.log_path, secrets=self._secrets(sh))
            if sh.failure:
                sh.log_tail = (*sh.log_tail, sh.failure)
            log.warning(
                kv("engine exited", replica=sh.spec.replica_id, rank=sh.spec.rank, code=code)
            )
        else:
            log.info(kv("engine stopped", replica=sh.spec.replica_id, rank=sh.spec.rank))

    def _adopted_secrets(self, rec: ShardRecord, proc: ProcessHandle | None) -> tuple[str, ...]:
        """An adopted engine's env_from values: those in its own environment (what it was
        given, which a rotated or removed secret file no longer yields), and those the
        references yield now; both are masked in its log tail."""
        values = set(resolve_quietly(rec.spec.env_from, private_paths=self._private_paths))
        env = self._engine_environ(proc.pid) if proc is not None else None
        if env is not None:
            values.update(env[name] for name in rec.spec.env_from if env.get(name))
        return tuple(sorted(values))

    def _secrets(self, sh: Shard) -> tuple[str, ...]:
        """What no log leaving this node may carry: the key, env_from values, agent token."""
        return ((sh.api_key,) if sh.api_key else ()) + sh.secret_values + self._private_values

    def _ports_taken(self) -> set[int]:
        """Engine ports our shards hold (HTTP and KV events), and every rendezvous port a
        shard here uses (rank 0 listens there; torch's TCPStore, vLLM's and SGLang's
        dist-init)."""
        taken = set(self._rendezvous)
        for sh in self._shards.values():
            if sh.port is not None:
                taken.add(sh.port)
            if sh.kv_ports is not None:
                taken.update((sh.kv_ports.publish, sh.kv_ports.replay))
            if sh.spec.master_port is not None:
                taken.add(sh.spec.master_port)
        return taken

    def _check_rendezvous(self, spec: ShardSpec) -> None:
        """Rank 0 of a multi-node shard listens on its rendezvous port: refuse one that an
        engine here, or another process, already holds (the controller picks again)."""
        port = spec.master_port
        if spec.rank != 0 or port is None:
            return
        for sh in self._shards.values():
            if sh.key == (spec.replica_id, spec.rank):
                continue
            if sh.port == port:
                holder = f"engine port of {sh.spec.replica_id} rank {sh.spec.rank} on this node"
                raise RendezvousPortTaken(port, holder)
            if sh.kv_ports is not None and port in (sh.kv_ports.publish, sh.kv_ports.replay):
                holder = f"KV-event port of {sh.spec.replica_id} rank {sh.spec.rank} on this node"
                raise RendezvousPortTaken(port, holder)
        if not self._ports.is_free(port):
            raise RendezvousPortTaken(port, "another process on this node listens there")

    def _save(self) -> str | None:
        """Write the state file; None once written, else why not (StateStore.try_save)."""
        return self._store.try_save(
            tuple(
                ShardRecord(
                    replica_id=sh.spec.replica_id,
                    rank=sh.spec.rank,
                    pid=sh.proc.pid,
                    start_ticks=sh.proc.start_ticks,
                    port=sh.port,
                    spec=sh.spec,
                    log_path=str(sh.log_path),
                    started_at=sh.started_at or 0.0,
                    health_path=sh.health_path,
                    api_key=sh.api_key,
                    kv_events_port=sh.kv_ports.publish if sh.kv_ports is not None else None,
                    kv_events_replay_port=(sh.kv_ports.replay if sh.kv_ports is not None else None),
                    priority_scheduling=sh.priority_scheduling,
                )
                for sh in self._shards.values()
                if sh.proc is not None and sh.port is not None
            )
        )
