"""`llmgw router --workers 2`: one port, two real worker processes, one supervisor.

Requests go over fresh connections (no keep-alive), so the kernel hands them to
either worker; `x-llmgw-debug: 1` makes the answer name the worker that routed
it. Every wait polls a condition with a generous deadline.
"""

from __future__ import annotations

import asyncio
import http.server
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from llmgw.testing import start_program
from llmgw.testing.wait import until, wait_until

from .router_fixtures import (
    admin_endpoints,
    base_config,
    chat_body,
    config_path,
    endpoint_entries,
    get_json,
    post,
    router,
    sim_engines,
    wait_until_scraped,
    write_config,
)

pytestmark = pytest.mark.slow

DEBUG = {"x-llmgw-debug": "1"}


def fresh_session() -> aiohttp.ClientSession:
    """A new TCP connection per request: each is accepted by whichever worker is first."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))


def workers_of(pid: int) -> dict[int, int]:
    """The supervisor's live workers: worker index → pid (from their command lines)."""
    out: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        fields = stat.rpartition(")")[2].split()
        if int(fields[1]) != pid or fields[0] == "Z" or b"--worker" not in argv:
            continue
        spec = argv[argv.index(b"--worker") + 1].decode()
        out[int(spec.split(",")[0])] = int(entry.name)
    return out


def _both(pids: dict[int, int]) -> dict[int, int] | None:
    return pids if set(pids) == {0, 1} else None


def dead(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")


def metric(text: str, prefix: str) -> float:
    """The sum of the samples whose line starts with `prefix`."""
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix)
    )


def metrics_text(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        return str(resp.read().decode())


class TestOnePortTwoWorkers:
    """Two workers on one port agree and count once."""

    async def test_workers_agree_on_prefix_homes_and_count_once(self, tmp_path: Path) -> None:
        """Both workers serve the port; a prefix goes to the same engine whichever worker
        routes it (rendezvous homes); /metrics counts every request exactly once."""
        with sim_engines(tmp_path, [50.0, 50.0, 50.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg, workers=2) as r:
                await wait_until_scraped(r.url, ["e0", "e1", "e2"])
                seen: dict[int, set[tuple[int, str]]] = {}  # prefix → {(worker, endpoint)}
                sent = 0
                async with fresh_session() as s:

                    async def three_prefixes_routed_by_both() -> bool:
                        # One request at a time: no load anywhere, so only the prefix decides.
                        nonlocal sent
                        for p in range(6):
                            system = f"You are assistant number {p}. " * 40
                            body = chat_body(
                                [
                                    {"role": "system", "content": system},
                                    {"role": "user", "content": f"question {sent}"},
                                ],
                                max_tokens=2,
                            )
                            reply = await post(s, r.url, body, headers=DEBUG)
                            assert reply.status == 200, reply.body
                            sent += 1
                            worker = int(reply.headers["x-llmgw-worker"])
                            seen.setdefault(p, set()).add((worker, reply.endpoint or ""))
                        both = [p for p, ws in seen.items() if {w for w, _ in ws} == {0, 1}]
                        return len(both) >= 3

                    await until(
                        three_prefixes_routed_by_both,
                        timeout_s=40,
                        every_s=0,
                        what=lambda: f"three prefixes routed by both workers; seen {seen}",
                    )
                for p, ws in seen.items():
                    assert len({e for _, e in ws}) == 1, f"prefix {p} split: {ws}"
                text = await asyncio.to_thread(metrics_text, r.url)
                assert metric(text, "llmgw_router_requests_total{") == sent

    async def test_each_worker_learns_what_the_others_sent(self, tmp_path: Path) -> None:
        """What one worker records in its prefix index reaches the other's (Learned,
        through the supervisor): both indexes end up holding the same entries, and
        a prompt one worker sent somewhere is routed there by the other as a prefix
        hit (reason `prefix`), not by its rendezvous home."""
        with sim_engines(tmp_path, [50.0, 50.0, 50.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg, workers=2) as r:
                await wait_until_scraped(r.url, ["e0", "e1", "e2"])
                async with fresh_session() as s:
                    for i in range(12):
                        body = chat_body(f"conversation {i}: " + "tell me more. " * 60)
                        assert (await post(s, r.url, body)).status == 200

                views: dict[int, dict[str, int]] = {}

                def both_views_agree() -> bool:
                    doc = admin_endpoints(r.url)
                    views[int(doc["worker"])] = dict(doc["prefix_entries"])
                    return len(views) == 2 and views[0] == views[1] and bool(views[0])

                await until(
                    both_views_agree,
                    what="both workers' indexes hold the same entries",
                    blocking=True,
                    timeout_s=40,
                )
                # A learned prefix is a hit in whichever worker routes it next.
                reasons: set[tuple[int, str]] = set()
                async with fresh_session() as s:

                    async def routed_by_both() -> bool:
                        body = chat_body("conversation 3: " + "tell me more. " * 60)
                        reply = await post(s, r.url, body, headers=DEBUG)
                        assert reply.status == 200
                        # `e1 prefix; e0 0.00 h1, e1* 0.00 p9 h0, …`: endpoint, then why.
                        why = reply.headers["x-llmgw-scores"].split(";")[0].split()[1]
                        reasons.add((int(reply.headers["x-llmgw-worker"]), why))
                        return {w for w, _ in reasons} == {0, 1}

                    await until(
                        routed_by_both,
                        timeout_s=30,
                        every_s=0,
                        what=lambda: f"both workers route the prefix; seen {reasons}",
                    )
                assert {why for _, why in reasons} == {"prefix"}, reasons

    async def test_inflight_is_host_wide_and_not_double_counted(self, tmp_path: Path) -> None:
        """Streams dispatched by both workers show in every worker's in-flight count,
        once in /metrics, and once in the usage report; so do those of them the engine
        queues (it runs 2 at once), still awaiting their first token (`pending`)."""
        n = 6
        with sim_engines(tmp_path, [2.0], extra=("--max-num-seqs", "2")) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg, workers=2) as r:
                await wait_until_scraped(r.url, ["e0"])

                async def stream(s: aiohttp.ClientSession, i: int) -> None:
                    body = chat_body(f"long story {i}", max_tokens=4000, stream=True)
                    await post(s, r.url, body)

                async with fresh_session() as s:
                    tasks = [asyncio.create_task(stream(s, i)) for i in range(n)]
                    try:

                        def all_in() -> bool:
                            e0 = admin_endpoints(r.url)["endpoints"][0]
                            return bool((e0["inflight"], e0["pending"]) == (n, n - 2))

                        await until(
                            all_in,
                            what=f"{n} streams in flight, {n - 2} queued",
                            blocking=True,
                            timeout_s=40,
                        )
                        # Every worker sees them all; ask enough times to meet both.
                        views: dict[int, tuple[int, int]] = {}

                        def both_views() -> bool:
                            doc = admin_endpoints(r.url)
                            e0 = doc["endpoints"][0]
                            views[doc["worker"]] = (e0["inflight"], e0["pending"])
                            return set(views) == {0, 1}

                        await until(
                            both_views,
                            what="an answer from each worker",
                            blocking=True,
                            timeout_s=40,
                        )
                        assert set(views.values()) == {(n, n - 2)}, views
                        text = await asyncio.to_thread(metrics_text, r.url)
                        assert metric(text, 'llmgw_router_inflight{endpoint="e0"}') == n
                        assert metric(text, 'llmgw_router_pending{endpoint="e0"}') == n - 2
                        usage = await asyncio.to_thread(get_json, r.url + "/admin/usage")
                        assert usage["inflight"] == {"e0": n}
                        assert usage["load"]["m"]["inflight"] == n
                    finally:
                        for t in tasks:
                            t.cancel()
                        await asyncio.gather(*tasks, return_exceptions=True)


class _MetricsOnly(http.server.BaseHTTPRequestHandler):
    """An engine's /metrics and nothing else, counting its scrapes."""

    hits = 0
    lock = threading.Lock()
    BODY = b"vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"

    def do_GET(self) -> None:
        if self.path == "/metrics":
            with self.lock:
                type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.BODY)))
        self.end_headers()
        self.wfile.write(self.BODY)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def metrics_engine() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _MetricsOnly)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class TestHostChores:
    """Scrapes and reloads done once for all workers."""

    async def test_each_engine_is_scraped_once_per_tick_for_all_workers(
        self, tmp_path: Path, metrics_engine: str
    ) -> None:
        """Each engine is scraped once per tick for all workers."""
        interval = 0.25
        cfg = base_config(
            endpoints=[{"id": "e0", "url": metrics_engine, "models": ["m"]}],
            scrape_interval_s=interval,
        )
        with router(tmp_path, cfg, workers=2) as r:
            await wait_until_scraped(r.url, ["e0"])
            start_hits, t0 = _MetricsOnly.hits, time.monotonic()
            await until(
                lambda: _MetricsOnly.hits - start_hits >= 8,
                what="eight scrapes",
                blocking=True,
                timeout_s=40,
            )
            hits, elapsed = _MetricsOnly.hits - start_hits, time.monotonic() - t0
        # One scraper never scrapes faster than its interval; two would double it.
        assert hits <= elapsed / interval + 2, (hits, elapsed)

    async def test_sighup_reload_reaches_every_worker_and_stop_ends_all(
        self, tmp_path: Path
    ) -> None:
        """SIGHUP to the whole process group: the supervisor reloads (the file is not
        polled here, so only the signal can do it) and sends the new list to both
        workers, which ignore the signal themselves; SIGTERM then ends every process."""
        with sim_engines(tmp_path, [50.0, 50.0]) as engines:
            entries = endpoint_entries(engines)
            cfg = base_config(endpoints=entries[:1], reload_poll_s=3600)
            with router(tmp_path, cfg, workers=2) as r:
                await wait_until_scraped(r.url, ["e0"])
                pids = await until(
                    lambda: _both(workers_of(r.pid)),
                    what="two workers",
                    blocking=True,
                    timeout_s=40,
                )
                write_config(
                    config_path(tmp_path), base_config(endpoints=entries, reload_poll_s=3600)
                )
                os.killpg(r.pid, signal.SIGHUP)
                updated: set[int] = set()

                def both_reloaded() -> bool:
                    doc = admin_endpoints(r.url)
                    if len(doc["endpoints"]) == 2:
                        updated.add(doc["worker"])
                    return updated == {0, 1}

                await until(
                    both_reloaded,
                    what="both workers have the reloaded list",
                    blocking=True,
                    timeout_s=40,
                )
                assert workers_of(r.pid) == pids
                r.proc.send_signal(signal.SIGTERM)
                assert await asyncio.to_thread(r.proc.wait, 30) == 0
                assert all(dead(p) for p in pids.values())


class TestWorkerRestart:
    """Killed workers are replaced, and a killed supervisor takes its workers along."""

    async def test_a_killed_worker_is_replaced_and_the_others_keep_serving(
        self, tmp_path: Path
    ) -> None:
        """SIGKILL one worker under a stream of requests on fresh connections: a stream on
        the other worker completes, every request begun after the death succeeds, a new
        worker takes the index, and the request count never goes down."""
        with (
            sim_engines(tmp_path, [50.0, 50.0]) as engines,
            sim_engines(tmp_path, [1.0], model="w") as slow,
        ):
            entries = [
                *endpoint_entries(engines),
                {"id": "w0", "url": slow[0].url, "models": ["w"]},
            ]
            cfg = base_config(endpoints=entries)
            with router(tmp_path, cfg, workers=2) as r:
                await wait_until_scraped(r.url, ["e0", "e1", "w0"])
                pids = await until(
                    lambda: _both(workers_of(r.pid)),
                    what="two workers",
                    blocking=True,
                    timeout_s=40,
                )
                results: list[tuple[float, int]] = []  # (start, status or 0 for an error)
                stop = asyncio.Event()

                async def client(s: aiohttp.ClientSession) -> None:
                    while not stop.is_set():
                        t = time.monotonic()
                        try:
                            reply = await post(s, r.url, chat_body("hi", max_tokens=2))
                            results.append((t, reply.status))
                        except aiohttp.ClientError:
                            results.append((t, 0))

                async with fresh_session() as s, aiohttp.ClientSession() as keep:
                    # A witness stream (about 10 s: the slow engine), on the worker
                    # that will not be killed.
                    witness = await keep.post(
                        r.url + "/v1/chat/completions",
                        json=chat_body("witness", max_tokens=1500, stream=True, model="w"),
                        headers=DEBUG,
                    )
                    survivor = int(witness.headers["x-llmgw-worker"])
                    first = await witness.content.readany()
                    victim = pids[1 - survivor]
                    clients = [asyncio.create_task(client(s)) for _ in range(4)]
                    try:
                        await until(
                            lambda: len(results) >= 20,
                            what="20 requests before the kill",
                            blocking=True,
                            timeout_s=40,
                        )
                        before = metric(
                            await asyncio.to_thread(metrics_text, r.url),
                            "llmgw_router_requests_total{",
                        )
                        os.kill(victim, signal.SIGKILL)
                        await until(
                            lambda: dead(victim),
                            what="the victim is dead",
                            blocking=True,
                            timeout_s=40,
                        )
                        died = time.monotonic()
                        # About 10 s long: still streaming when the other worker died.
                        assert not witness.content.at_eof()
                        await until(
                            lambda: workers_of(r.pid).get(1 - survivor) not in (None, victim),
                            what="a new worker",
                            blocking=True,
                            timeout_s=40,
                        )
                        after_n = len(results)
                        await until(
                            lambda: len(results) >= after_n + 20,
                            what="20 more requests",
                            blocking=True,
                            timeout_s=40,
                        )
                    finally:
                        stop.set()
                        await asyncio.gather(*clients, return_exceptions=True)
                    body = first + await witness.read()
                    assert witness.status == 200
                    assert body.rstrip().endswith(b"data: [DONE]")
                    assert not [e for e in body.split(b"\n\n") if b'"error"' in e]
                late = [status for t, status in results if t > died]
                assert late, "no request after the death"
                assert all(status == 200 for status in late), late
                text = await asyncio.to_thread(metrics_text, r.url)
                after = metric(text, "llmgw_router_requests_total{")
                assert after >= before
                # The supervisor counts the restart and serves with two workers again.
                assert metric(text, "llmgw_router_worker_restarts_total ") == 1
                await until(
                    lambda: metric(metrics_text(r.url), "llmgw_router_workers ") == 2,
                    what="two workers serving again",
                    blocking=True,
                    timeout_s=40,
                )
                assert r.alive()

    async def test_a_killed_supervisor_takes_its_workers_with_it(self, tmp_path: Path) -> None:
        """SIGKILL to the supervisor (no chance to stop anything): each worker sees its
        channel close and stops by itself, so none serves on unsupervised and the port
        is free for the next router."""
        import socket

        with sim_engines(tmp_path, [50.0]) as engines:
            cfg = base_config(endpoints=endpoint_entries(engines))
            with router(tmp_path, cfg, workers=2) as r:
                await wait_until_scraped(r.url, ["e0"])
                pids = await until(
                    lambda: _both(workers_of(r.pid)),
                    what="two workers",
                    blocking=True,
                    timeout_s=40,
                )
                port = int(r.url.rsplit(":", 1)[1])
                os.kill(r.pid, signal.SIGKILL)
                await until(
                    lambda: all(dead(p) for p in pids.values()),
                    what="both workers gone",
                    blocking=True,
                    timeout_s=40,
                )

                def port_free() -> bool:
                    with socket.socket() as s:
                        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                        try:
                            s.bind(("127.0.0.1", port))
                        except OSError:
                            return False
                        return True

                await until(port_free, what="the port is free", blocking=True, timeout_s=40)


class TestSupervisorStart:
    """The supervisor's start-up failures end cleanly."""

    async def test_sigterm_while_a_worker_never_gets_ready_stops_at_once(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """SIGTERM while the workers start stops the router then, not after the start
        timeout (a minute) has run out; the half-started workers are stopped too."""
        import socket
        import subprocess
        import sys

        from llmgw.router.config import parse as parse_config
        from llmgw.router.workers import pool
        from llmgw.router.workers.ipc import Channel
        from llmgw.router.workers.pool import Supervisor, _Worker

        monkeypatch.setattr(pool, "START_TIMEOUT_S", 600.0)
        path = tmp_path / "router.yaml"
        path.write_text("endpoints: []\n")
        listen = socket.socket()
        sup = Supervisor(parse_config(path.read_text()), config_path=path, workers=2, sock=listen)
        procs: list[subprocess.Popen[bytes]] = []
        ends: list[socket.socket] = []

        async def spawn(index: int) -> _Worker:
            # A worker that never says Ready (stuck loading, say).
            proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
            procs.append(proc)
            a, b = socket.socketpair()
            ends.append(b)
            w = _Worker(index, proc, await Channel.open(a))
            w.task = asyncio.create_task(sup._serve(w))
            sup.workers[index] = w
            return w

        monkeypatch.setattr(sup, "_spawn", spawn)
        loop = asyncio.get_running_loop()
        run = asyncio.create_task(sup.run(host="127.0.0.1", grace_s=1.0))
        try:
            await until(lambda: len(sup.workers) >= 2, every_s=0.01, what="two workers started")
            os.kill(os.getpid(), signal.SIGTERM)
            async with asyncio.timeout(30):
                assert await run == 0
            assert all(p.poll() is not None for p in procs)
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                loop.remove_signal_handler(sig)
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for e in ends:
                e.close()
            listen.close()

    async def test_a_worker_that_stops_reading_is_killed_not_buffered_for(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A worker that never reads its channel (stopped, or stuck): the supervisor
        does not keep every broadcast for it without end, it kills the worker (which the
        watch loop then starts again)."""
        import socket
        import subprocess
        import sys

        from llmgw.router.config import parse as parse_config
        from llmgw.router.replicas.registry import Stats
        from llmgw.router.workers import pool
        from llmgw.router.workers.ipc import Channel, Observed
        from llmgw.router.workers.pool import Supervisor, _Worker

        monkeypatch.setattr(pool, "MAX_BACKLOG_BYTES", 1 << 20, raising=False)
        path = tmp_path / "router.yaml"
        path.write_text("endpoints: []\n")
        listen = socket.socket()
        sup = Supervisor(parse_config(path.read_text()), config_path=path, workers=1, sock=listen)
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
        a, b = socket.socketpair()  # b: the worker's end, never read
        channel = await Channel.open(a)
        try:
            sup.workers[0] = _Worker(0, proc, channel)
            msg = Observed(id="e" * 4096, stats=Stats(running=1, waiting=0, kv_usage=None))
            for _ in range(2000):  # about 8 MB
                sup._broadcast(msg)
                if proc.poll() is not None:
                    break
            assert await asyncio.to_thread(proc.wait, 30) != 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            channel.close()
            b.close()
            listen.close()

    async def test_a_restart_that_cannot_spawn_is_tried_again(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A worker exits and starting its replacement fails once (no processes or
        descriptors left, say): the supervisor tries again rather than leave the
        index empty for good (the watch loop only watches workers that exist)."""
        import socket
        import subprocess
        import sys

        from llmgw.router.config import parse as parse_config
        from llmgw.router.workers import pool
        from llmgw.router.workers.ipc import Channel
        from llmgw.router.workers.pool import Supervisor, _Worker

        monkeypatch.setattr(pool, "MAX_RESTART_DELAY_S", 0.05)
        monkeypatch.setattr(pool, "EARLY_EXIT_S", 0.0)
        path = tmp_path / "router.yaml"
        path.write_text("endpoints: []\n")
        listen = socket.socket()
        sup = Supervisor(parse_config(path.read_text()), config_path=path, workers=1, sock=listen)
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        await asyncio.to_thread(proc.wait, 30)
        a, b = socket.socketpair()
        sup.workers[0] = dead_worker = _Worker(0, proc, await Channel.open(a))
        calls: list[int] = []

        async def spawn(index: int) -> _Worker:
            calls.append(index)
            if len(calls) == 1:
                raise OSError(24, "Too many open files")
            sup.workers[index] = dead_worker  # a stand-in: only the call matters here
            return dead_worker

        monkeypatch.setattr(sup, "_spawn", spawn)
        try:
            async with asyncio.timeout(30):
                await sup._restart(dead_worker, 0)
            assert calls == [0, 0]
            assert 0 in sup.workers
            assert sup.restarts == 1
        finally:
            b.close()
            listen.close()


class TestCtrlCWhileStarting:
    """Ctrl-C while workers start ends all without a traceback."""

    def test_a_group_sigint_while_workers_start_ends_all_without_a_traceback(
        self, tmp_path: Path
    ) -> None:
        """Ctrl-C in a terminal reaches the whole process group, workers included, often
        while they still import and wait for their Setup: everything stops, quietly."""
        with sim_engines(tmp_path, [50.0]) as engines:
            path = write_config(
                config_path(tmp_path), base_config(endpoints=endpoint_entries(engines))
            )
            prog = start_program(
                ["router", "--config", str(path), "--port", "0", "--workers", "2"],
                log_dir=tmp_path,
                wait=False,
            )
            with prog:
                started = wait_until(
                    lambda: w if len(w := workers_of(prog.pid)) >= 2 else None,
                    every_s=0.01,
                    what="two workers",
                )
                assert len(started) == 2, started
                os.killpg(prog.pid, signal.SIGINT)
                prog.proc.wait(timeout=30)
                for pid in started.values():
                    assert dead(pid), pid
                assert "Traceback" not in prog.log_text(), prog.log_text()[-3000:]
