"""The pieces a router's workers share (`--workers N`), in one process.

The in-flight table (two workers' views of one memory file), the supervisor's
slot map, the registry's shared counts, the /metrics merge and the usage
merge; the processes themselves are tests/integration/test_router_workers.py.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from llmgw.router.config import parse as parse_config
from llmgw.router.errors import RouterConfigError
from llmgw.router.metrics import RouterMetrics
from llmgw.router.replicas.breaker import Outcome
from llmgw.router.replicas.registry import Registry, Stats
from llmgw.router.workers.ipc import Message, Observed, Setup
from llmgw.router.workers.metricsmerge import Merger, parse
from llmgw.router.workers.reportmerge import merge_reports
from llmgw.router.workers.shared import SharedInflight, SlotTable
from llmgw.router.workers.worker import WorkerSpec
from llmgw.wire.endpoints import EndpointInfo
from llmgw.wire.usage import FlowQueued, ModelLoad, UsageReport


def _views(workers: int = 2, capacity: int = 8) -> list[SharedInflight]:
    """Every worker's view of one table, as each process maps it."""
    first = SharedInflight.create(workers, capacity)
    return [first] + [
        SharedInflight(first.fd, workers=workers, index=i, capacity=capacity)
        for i in range(1, workers)
    ]


def _infos(*ids: str) -> list[EndpointInfo]:
    return [EndpointInfo(id=i, url=f"http://127.0.0.1:1/{i}", models=["m"]) for i in ids]


class TestSharedInflight:
    """Every worker writes its row of the in-flight table and reads the column."""

    def test_each_worker_writes_its_row_and_reads_the_column(self) -> None:
        """Each worker writes its row and reads the column."""
        a, b = _views()
        a.row[3] = 2
        b.row[3] = 5
        b.row[4] = 1
        assert a.total(3) == b.total(3) == 7
        assert a.total(4) == 1
        # The pending half of the row is separate: no cell of one is a cell of the other.
        a.row[a.capacity + 3] = 1
        b.row[b.capacity + 3] = 1
        assert a.pending_total(3) == 2
        assert a.total(3) == 7
        a.clear_row(1)  # the supervisor, after worker 1 died
        assert b.total(3) == 2
        assert b.total(4) == 0
        assert b.pending_total(3) == 1

    def test_index_outside_the_table_is_refused(self) -> None:
        """Index outside the table is refused."""
        a = SharedInflight.create(2, 4)
        with pytest.raises(ValueError, match="outside"):
            SharedInflight(a.fd, workers=2, index=2, capacity=4)


class TestSlotTable:
    """Slots kept by survivors and handed out again last."""

    def test_survivors_keep_their_slot_and_freed_slots_come_back_last(self) -> None:
        """Survivors keep their slot and freed slots come back last."""
        t = SlotTable(capacity=3)
        assert t.assign(["a", "b"]) == {"a": 0, "b": 1}
        # b leaves, c arrives: c gets the never-used slot, not b's.
        assert t.assign(["a", "c"]) == {"a": 0, "c": 2}
        # Full: d gets b's, the oldest freed.
        assert t.assign(["a", "c", "d"]) == {"a": 0, "c": 2, "d": 1}
        # No slot left: e is counted per worker only.
        assert "e" not in t.assign(["a", "c", "d", "e"])
        assert t.unslotted(["a", "e"]) == ["e"]


class TestRegistryAcrossWorkers:
    """Registries in two workers share in-flight counts."""

    def _pair(self) -> tuple[Registry, Registry]:
        views = _views()
        slots = SlotTable(views[0].capacity).assign(["e0", "e1"])
        regs = []
        for v in views:
            v.slots = slots
            reg = Registry(shared=v)
            reg.replace(_infos("e0", "e1"))
            regs.append(reg)
        return regs[0], regs[1]

    def test_a_dispatch_in_one_worker_is_seen_by_the_other(self) -> None:
        """A dispatch in one worker is seen by the other."""
        a, b = self._pair()
        rel = a.acquire("e0")
        assert rel is not None
        b_rel = b.acquire("e0")
        assert b_rel is not None
        assert [s.inflight for s in b.snapshots()] == [2, 0]
        assert a.inflight("e0") == 2
        # A usage report counts each worker's own: the supervisor adds them.
        assert a.own_inflight() == {"e0": 1, "e1": 0}
        rel(Outcome.OK)
        rel(Outcome.OK)  # a second call changes nothing
        assert b.inflight("e0") == 1
        b_rel(Outcome.OK)
        assert a.inflight("e0") == 0

    def test_pending_streams_are_seen_by_every_worker(self) -> None:
        """Pending streams are seen by every worker."""
        a, b = self._pair()
        ra, rb = a.acquire("e0", pending=True), b.acquire("e0", pending=True)
        assert ra is not None
        assert rb is not None
        assert [(s.inflight, s.pending) for s in b.snapshots()] == [(2, 2), (0, 0)]
        ra.started()
        assert [(s.inflight, s.pending) for s in b.snapshots()] == [(2, 1), (0, 0)]
        rb(Outcome.OK)
        ra(Outcome.OK)
        assert [(s.inflight, s.pending) for s in a.snapshots()] == [(0, 0), (0, 0)]

    def test_scrape_mark_is_the_host_wide_count(self) -> None:
        """Scrape mark is the host-wide count."""
        a, b = self._pair()
        assert a.acquire("e1") is not None
        b.observe("e1", Stats(running=1, waiting=0, kv_usage=None))
        snap = b.snapshot("e1")
        assert snap is not None
        assert snap.inflight_at_scrape == 1

    def test_a_removed_endpoint_stops_counting_in_its_slot(self) -> None:
        """A removed endpoint stops counting in its slot."""
        a, b = self._pair()
        rel = a.acquire("e1")
        assert rel is not None
        a.replace(_infos("e0"))
        assert b.inflight("e1") == 0  # the slot may be given to another endpoint
        rel(Outcome.OK)  # the request ends after its endpoint left: no write
        assert b.inflight("e1") == 0
        assert a.departed_inflight() == {"e1": 0}


def _page(requests: int, inflight: int, *, held: int = 0) -> bytes:
    m = RouterMetrics(snapshots=lambda: [], held=lambda: {"m": held} if held else {})
    for _ in range(requests):
        m.request_done("m", "e0", 200, 0.01)
    text = m.render().decode()
    # The live gauge as a worker renders it: the host-wide count.
    text += (
        "# HELP llmgw_router_inflight Requests in flight per endpoint.\n"
        "# TYPE llmgw_router_inflight gauge\n"
        f'llmgw_router_inflight{{endpoint="e0"}} {float(inflight)}\n'
    )
    return text.encode()


REQ = 'llmgw_router_requests_total{code="200",endpoint="e0",model="m",outcome="ok"}'


class TestMetricsMerge:
    """The supervisor's merge of the workers' metrics pages."""

    def _sample(self, text: bytes, family: str, key: str) -> float:
        return parse(text.decode())[family].samples[key]

    def test_counters_add_up_host_gauges_do_not(self) -> None:
        """Counters add up, host gauges do not."""
        m = Merger()
        m.update(0, _page(3, 4, held=1))
        m.update(1, _page(2, 4, held=2))
        out = m.render()
        assert self._sample(out, "llmgw_router_requests_total", REQ) == 5.0
        bucket = 'llmgw_router_request_duration_seconds_count{endpoint="e0",model="m"}'
        assert self._sample(out, "llmgw_router_request_duration_seconds", bucket) == 5.0
        inflight = 'llmgw_router_inflight{endpoint="e0"}'
        assert self._sample(out, "llmgw_router_inflight", inflight) == 4.0
        assert self._sample(out, "llmgw_router_held", 'llmgw_router_held{model="m"}') == 3.0

    def test_a_dead_workers_counts_stay_in_the_total(self) -> None:
        """A dead worker's counts stay in the total."""
        m = Merger()
        m.update(0, _page(3, 1))
        m.update(1, _page(2, 1))
        m.retire(1)
        m.update(1, _page(1, 0))  # its replacement starts from zero
        out = m.render()
        assert self._sample(out, "llmgw_router_requests_total", REQ) == 6.0
        # Gauges of the dead worker are gone, not kept.
        assert (
            self._sample(out, "llmgw_router_inflight", 'llmgw_router_inflight{endpoint="e0"}')
            == 1.0
        )
        # An endpoint that leaves takes its series out of the dead workers' figures too.
        m.forget_endpoints(["e0"])
        m.pages.clear()
        assert REQ not in m.render().decode()

    def test_the_merged_page_parses_as_prometheus_text(self) -> None:
        """The merged page parses as Prometheus text."""
        from prometheus_client.parser import text_string_to_metric_families

        m = Merger()
        m.update(0, _page(1, 0))
        m.update(1, _page(1, 0))
        names = {f.name for f in text_string_to_metric_families(m.render().decode())}
        assert {"llmgw_router_requests", "llmgw_router_inflight"} <= names

    def test_a_label_value_with_a_unicode_line_break_stays_one_sample(self) -> None:
        """A label value holding a Unicode line break stays one sample."""
        team = "a\x85b\u2028c\x1cd"
        line = f'llmgw_router_flow_queued{{band="standard",team="{team}"}} 2.0'
        page = f"# HELP llmgw_router_flow_queued q\n# TYPE llmgw_router_flow_queued gauge\n{line}\n"
        m = Merger()
        m.update(0, page.encode())
        m.update(1, page.encode())
        key = line.rpartition(" ")[0]
        assert self._sample(m.render(), "llmgw_router_flow_queued", key) == 4.0


class TestUsageMerge:
    """Workers' usage reports add up to one router's."""

    def test_worker_reports_add_up_to_one_router(self) -> None:
        """Worker reports add up to one router."""
        a = UsageReport(
            router_id="w",
            sent_at=1.0,
            last_used={"e0": 10.0},
            inflight={"e0": 1},
            demand={"m": 1},
            load={"m": ModelLoad(inflight=1, held=1, requests=5, interval_s=2.0)},
            flow_queued=[FlowQueued(band="batch", team="t", requests=2)],
        )
        b = UsageReport(
            router_id="w",
            sent_at=1.0,
            last_used={"e0": 12.0, "e1": 3.0},
            inflight={"e0": 2, "e1": 0},
            load={"m": ModelLoad(inflight=2, held=0, requests=7, interval_s=2.1)},
            flow_queued=[
                FlowQueued(band="batch", team="t", requests=3),
                FlowQueued(band="critical", team="", requests=1),
            ],
        )
        r = merge_reports("router-x", 5.0, [a, b])
        assert r.router_id == "router-x"
        assert r.last_used == {"e0": 12.0, "e1": 3.0}
        assert r.inflight == {"e0": 3, "e1": 0}
        assert r.demand == {"m": 1}
        assert r.load == {"m": ModelLoad(inflight=3, held=1, requests=12, interval_s=2.1)}
        assert r.flow_queued == [
            FlowQueued(band="batch", team="t", requests=5),
            FlowQueued(band="critical", team="", requests=1),
        ]


class TestMessages:
    """Supervisor-worker messages round-trip intact."""

    def test_setup_carries_config_list_and_stats_intact(self) -> None:
        """Setup carries config list and stats intact."""
        cfg = parse_config("endpoints: [{id: e0, url: 'http://127.0.0.1:9', models: [m]}]\n")
        setup = Setup(
            index=1,
            workers=2,
            capacity=8,
            router_id="router-x",
            cfg=cfg,
            listed=None,
            slots={"e0": 0},
            stats={"e0": Stats(running=1, waiting=2, kv_usage=0.5)},
        )
        for msg in (setup, Observed(id="e0", stats=Stats(running=0, waiting=0, kv_usage=None))):
            wire = msgspec.msgpack.encode(msg)
            assert msgspec.msgpack.decode(wire, type=Message) == msg

    def test_worker_spec_round_trips_and_refuses_garbage(self) -> None:
        """Worker spec round trips and refuses garbage."""
        spec = WorkerSpec(1, 3, 4, 5)
        assert WorkerSpec.parse(spec.arg()) == spec
        with pytest.raises(RouterConfigError):
            WorkerSpec.parse("1,2")


class TestChannel:
    """The supervisor-worker channel's asks and closing."""

    async def test_ask_is_answered_and_a_closed_end_fails_the_waiting_ask(self) -> None:
        """Ask is answered and a closed end fails the waiting ask."""
        import asyncio
        import socket

        from llmgw.router.workers.ipc import Ask, AskReply, Channel, ChannelClosed

        a_sock, b_sock = socket.socketpair()
        a, b = await Channel.open(a_sock), await Channel.open(b_sock)

        def answer(msg: Message) -> None:
            assert isinstance(msg, Ask)
            b.send(AskReply(seq=msg.seq, body=msg.what.encode()))

        serve_a = asyncio.create_task(a.serve(lambda msg: None))
        serve_b = asyncio.create_task(b.serve(answer))
        assert await a.ask("metrics", timeout_s=5) == b"metrics"
        serve_b.cancel()
        b.close()
        with pytest.raises(ChannelClosed):
            await a.ask("usage", timeout_s=5)
        with pytest.raises(ChannelClosed):
            await serve_a
        assert a.closed


class TestWorkersFlag:
    """The --workers flag's bounds."""

    def test_workers_below_one_is_a_usage_error(self, capsys: pytest.CaptureFixture[str]) -> None:
        """Workers below one is a usage error."""
        from llmgw.router.main import main

        assert main(["--config", "unused.yaml", "--workers", "0"]) == 2
        assert "--workers 0" in capsys.readouterr().err

    @pytest.mark.parametrize("workers", ["9", str(10**20)])
    def test_workers_far_past_the_cores_is_a_usage_error(
        self,
        workers: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """More than four workers per core is refused before any process or table is
        made (a typo's million workers forked until the host ran out)."""
        from llmgw.router import main as router_main

        monkeypatch.setattr(router_main.os, "sched_getaffinity", lambda _pid: {0, 1})
        path = tmp_path / "router.yaml"
        path.write_text("endpoints: []\n")
        assert router_main.main(["--config", str(path), "--workers", workers]) == 2
        assert f"--workers {workers}: at most 8 (4 per core, 2 cores)" in capsys.readouterr().err


class TestWorkerLink:
    """A message that fails to apply leaves the worker link listening."""

    async def test_a_message_that_fails_to_apply_leaves_the_link_listening(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A reload the worker cannot apply is logged and skipped: later messages still
        apply, and the supervisor going away still stops the worker (before, the link's
        loop died with the error and the worker served on, orphaned)."""
        import asyncio
        import socket

        from llmgw.router.wiring import Router
        from llmgw.router.workers.ipc import Channel, Reload
        from llmgw.router.workers.worker import WorkerLink
        from llmgw.testing.wait import until

        cfg = parse_config("endpoints: [{id: e0, url: 'http://127.0.0.1:9', models: [m]}]\n")
        shared = SharedInflight.create(1, 8)
        setup = Setup(
            index=0,
            workers=1,
            capacity=8,
            router_id="router-x",
            cfg=cfg,
            listed=None,
            slots={"e0": 0},
            stats={},
        )
        sup_sock, worker_sock = socket.socketpair()
        sup, chan = await Channel.open(sup_sock), await Channel.open(worker_sock)
        link = WorkerLink(chan, setup, shared)
        state = Router(cfg, shared=shared, router_id="router-x")
        link.attach(state)

        def broken(_cfg: object) -> None:
            raise RuntimeError("cannot apply")

        monkeypatch.setattr(state, "apply_config", broken)
        run = asyncio.create_task(link.run())
        try:
            sup.send(Reload(cfg=cfg, slots={"e0": 0}))
            sup.send(Observed(id="e0", stats=Stats(running=3, waiting=0, kv_usage=None)))
            await until(
                lambda: (s := state.registry.snapshot("e0")) is not None and s.stats is not None,
                timeout_s=10,
                every_s=0.01,
                what="e0's figures applied",
            )
            assert not run.done()
            sup.close()
            async with asyncio.timeout(10):
                await link.lost.wait()
        finally:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            chan.close()


class TestSupervisorAsks:
    """Answers from a replaced worker are dropped."""

    async def test_an_answer_from_a_worker_replaced_meanwhile_is_dropped(
        self, tmp_path: object
    ) -> None:
        """Worker 0 answers, dies and is started again while the supervisor still waits
        on worker 1: the dead worker's page must not become the new worker 0's, or its
        counts, already kept by `Merger.retire`, are added twice, and then go backwards
        when the new worker's own page replaces it."""
        import asyncio
        import socket
        import subprocess
        from pathlib import Path
        from typing import cast

        from llmgw.router.workers.ipc import Ask, AskReply, Channel
        from llmgw.router.workers.pool import Supervisor, _Worker

        assert isinstance(tmp_path, Path)
        path = tmp_path / "router.yaml"
        path.write_text("endpoints: []\n")
        listen = socket.socket()
        sup = Supervisor(parse_config(path.read_text()), config_path=path, workers=2, sock=listen)
        page = b"# HELP c_total c\n# TYPE c_total counter\nc_total 5.0\n"
        chans: list[Channel] = []
        tasks: list[asyncio.Task[None]] = []
        answered_0 = asyncio.Event()
        release_1 = asyncio.Event()

        async def worker(index: int, answer: bytes, gate: asyncio.Event | None) -> _Worker:
            a, b = socket.socketpair()
            sup_end, w_end = await Channel.open(a), await Channel.open(b)
            chans.extend((sup_end, w_end))

            def handle(msg: Message) -> None:
                assert isinstance(msg, Ask)

                async def reply() -> None:
                    if gate is not None:
                        await gate.wait()
                    w_end.send(AskReply(seq=msg.seq, body=answer))
                    if index == 0:
                        answered_0.set()

                tasks.append(asyncio.create_task(reply()))

            tasks.append(asyncio.create_task(w_end.serve(handle)))
            tasks.append(
                asyncio.create_task(
                    sup._serve(w := _Worker(index, cast(subprocess.Popen[bytes], None), sup_end))
                )
            )
            w.ready.set()
            sup.workers[index] = w
            return w

        try:
            await worker(0, page, None)
            await worker(1, page, release_1)
            # An earlier gather's pages.
            sup.merger.update(0, page)
            sup.merger.update(1, page)
            asking = asyncio.create_task(sup.metrics_page())
            async with asyncio.timeout(10):
                await answered_0.wait()
            # Worker 0 dies after answering; the watch loop retires and replaces it.
            sup.merger.retire(0)
            del sup.workers[0]
            fresh = _Worker(0, cast(subprocess.Popen[bytes], None), chans[0])
            sup.workers[0] = fresh
            release_1.set()
            async with asyncio.timeout(10):
                await asking
            assert 0 not in sup.merger.pages
            # The dead worker's 5 (retired) and worker 1's 5; the new worker has said nothing.
            assert parse(sup.merger.render().decode())["c_total"].samples["c_total"] == 10.0
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for c in chans:
                c.close()
            listen.close()


class TestChannelFrames:
    """An oversized frame closes the channel."""

    async def test_an_oversized_frame_closes_the_channel(self) -> None:
        """A length past MAX_FRAME ends the channel as any broken frame does: the end is
        marked closed (the supervisor stops asking it) and waiting asks fail at once."""
        import asyncio
        import socket

        from llmgw.router.workers.ipc import MAX_FRAME, Channel, ChannelClosed

        a_sock, b_sock = socket.socketpair()
        a = await Channel.open(a_sock)
        try:
            pending = asyncio.create_task(a.ask("metrics", timeout_s=30))
            await asyncio.sleep(0)
            b_sock.sendall((MAX_FRAME + 1).to_bytes(4, "big"))
            with pytest.raises(ChannelClosed):
                await a.receive()
            assert a.closed
            with pytest.raises(ChannelClosed):
                async with asyncio.timeout(10):
                    await pending
        finally:
            a.close()
            b_sock.close()


class TestSupervisorReload:
    """A reload reaches the workers with the restart-only settings still in force."""

    def test_a_worker_started_after_a_reload_gets_the_settings_in_force(
        self, tmp_path: object
    ) -> None:
        """The config a worker restarted after a reload is set up with keeps the running
        max_body_bytes: it took the file's, and answered 413 where the others did not."""
        import socket
        from pathlib import Path

        from llmgw.router.workers.pool import Supervisor

        assert isinstance(tmp_path, Path)
        path = tmp_path / "router.yaml"
        path.write_text("max_body_bytes: 262144\n")
        with socket.socket() as listen:
            sup = Supervisor(
                parse_config(path.read_text()), config_path=path, workers=2, sock=listen
            )
            sup._reloaded(parse_config("max_body_bytes: 65536\nhold_timeout_s: 7\n"))
        assert (sup.cfg.max_body_bytes, sup.cfg.hold_timeout_s) == (262144, 7.0)


class TestHeldAnswersShare:
    """Each worker holds its share of max_held_answer_bytes, not the whole of it."""

    def test_four_workers_hold_a_quarter_each(self) -> None:
        """With 4 workers and 1,000 bytes for the router, each worker's bound is 250."""
        from llmgw.router.wiring import Router

        cfg = parse_config("max_held_answer_bytes: 1000\n")
        bounds = [Router(cfg, shared=v).answers.limit_bytes for v in _views(workers=4)]
        assert bounds == [250] * 4
        assert Router(cfg).answers.limit_bytes == 1000
