"""The fleet across real hosts: network namespaces on one bridge (tests/integration/netns.py).

Every program runs in its own namespace and advertises its own address; the
test process reaches them through its own port on the bridge. Links are cut
by taking a host's bridge port down, which is what a pulled cable looks like:
no reset, no refusal, just silence.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

import openai
import pytest
import yaml

from llmgw.testing import Program

from . import netns
from .controller_harness import wait_for as harness_wait_for
from .controller_harness import wait_ticks
from .netns import Host, Net

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

T = TypeVar("T")
TOKEN = "multihost-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

# Short timeouts, the flags an operator would use: each test takes seconds.
CONTROLLER_FAST = (
    "--tick-s", "0.2",
    "--heartbeat-interval-s", "0.3",
    "--heartbeat-timeout-s", "1.5",
    "--unreachable-grace-s", "2",
    "--standby-reload-s", "0.3",
    "--restart-backoff-s", "0.5",
    "--shutdown-grace-s", "1",
)  # fmt: skip


@pytest.fixture(autouse=True)
def _need_netns() -> None:
    why = netns.unavailable()
    if why is not None:
        pytest.skip(why)


def wait_for(check: Callable[[], T], *, timeout_s: float = 60.0, what: str = "") -> T:
    """The harness's poll, with a longer default: real fleets on a loaded 2-core machine."""
    return harness_wait_for(check, timeout_s=timeout_s, what=what)


def call(method: str, url: str, body: Any = None, *, timeout_s: float = 5.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        url, method=method, data=data, headers={**AUTH, "Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            text = resp.read()
    except urllib.error.HTTPError as exc:
        # Its socket closed now: a refusal a poll goes on past would otherwise be a
        # ResourceWarning in whichever later test the collector finds it.
        exc.close()
        raise
    return json.loads(text) if text else None


def start_controller(host: Host, database: str, *extra: str) -> Program:
    return host.start(
        [
            "controller",
            "--host",
            host.addr,
            "--port",
            "0",
            "--database",
            database,
            "--token",
            TOKEN,
            *CONTROLLER_FAST,
            *extra,
        ]
    )


def start_agent(
    host: Host,
    controllers: list[str],
    tmp: Path,
    *,
    gpus: str = "1xH100-80G",
    extra: Sequence[str] = (),
) -> Program:
    args = ["agent", "--node", host.name, "--gpus", gpus, "--fabric", "ib0"]
    for url in controllers:
        args += ["--controller", url]
    args += [
        "--token",
        TOKEN,
        "--address",
        host.addr,
        "--state-dir",
        str(tmp / f"state-{host.name}"),
        "--interval-s",
        "0.3",
        "--stop-grace-s",
        "2",
        "--port-range",
        "31000-31099",
        *extra,
    ]
    return host.start(args)


def start_router(host: Host, controller_url: str, tmp: Path) -> Program:
    cfg = tmp / "router.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "controller": {"url": controller_url, "token": TOKEN, "poll_timeout_s": 2.0},
                "hold_timeout_s": 20.0,
            }
        )
    )
    argv = ["router", "--config", str(cfg), "--host", host.addr, "--port", "0", "--workers", "1"]
    return host.start(argv)


def sim_model(name: str, **kw: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "name": name,
        "engine": "sim",
        "gpu_classes": ["H100-80G"],
        "gpus_per_node": 1,
        "min_replicas": 1,
        "max_replicas": 1,
        "args": ["--speed", "20"],
    }
    out.update(kw)
    return out


def live(ctl_url: str, model: str) -> list[dict[str, Any]]:
    """Replicas of the model that are not stopped."""
    reps: list[dict[str, Any]] = call("GET", f"{ctl_url}/admin/replicas?model={model}")
    return [r for r in reps if r["state"] != "stopped"]


def ready_on(ctl_url: str, model: str) -> dict[str, Any] | None:
    reps = [r for r in live(ctl_url, model) if r["state"] == "ready"]
    return reps[0] if len(reps) == 1 else None


def node_of(replica: dict[str, Any]) -> str:
    return str(replica["shards"][0]["node"])


def engine_answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as resp:
            return resp.status == 200
    except (OSError, urllib.error.URLError):
        return False


def chat(router_url: str, model: str, *, stream: bool) -> str:
    msgs: list[Any] = [{"role": "user", "content": "hello across hosts"}]
    # Closed on the way out (see test_netfaults.timed_chat).
    with openai.OpenAI(base_url=f"{router_url}/v1", api_key="unused", timeout=20.0) as client:
        if stream:
            parts = [
                c.choices[0].delta.content or ""
                for c in client.chat.completions.create(
                    model=model, messages=msgs, max_tokens=8, stream=True
                )
                if c.choices
            ]
            return "".join(parts)
        out = client.chat.completions.create(model=model, messages=msgs, max_tokens=8)
        return out.choices[0].message.content or ""


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Net]:
    """controller · router · two GPU hosts (one H100 each), SQLite on the controller host."""
    with netns.hosts(["ctl", "router", "gpu-a", "gpu-b"], log_dir=tmp_path / "logs") as net:
        yield net


class PrivatePostgres:
    """A throwaway PostgreSQL cluster of the test's own, inside one host's namespace.

    The machine's own server is left alone. Server-side TCP keepalives are
    short so that a session whose host vanished (a cut link sends nothing) is
    ended, and its advisory locks released, within seconds; `stock_keepalives`
    leaves them at PostgreSQL's defaults (the operating system's: two hours).
    """

    def __init__(self, host: Host, tmp: Path, *, stock_keepalives: bool = False) -> None:
        import shutil
        import subprocess
        import tempfile

        self.host = host
        bins = sorted(Path("/usr/lib/postgresql").glob("*/bin/postgres"))
        if not bins:
            pytest.skip("PostgreSQL server binaries not installed (/usr/lib/postgresql)")
        self.bin = bins[-1].parent
        # Outside pytest's tmp folder, which only root may enter.
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-test-pg-"))
        shutil.chown(self.dir, "postgres", "postgres")
        self.data = self.dir / "data"
        init = subprocess.run(
            [
                "runuser", "-u", "postgres", "--",
                str(self.bin / "initdb"), "-D", str(self.data), "--auth=trust",
                "-U", "postgres", "--no-sync",
            ],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert init.returncode == 0, init.stderr
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {host.net.subnet}.0/24 trust\n")
        self.log = self.dir / "pg.log"
        log = open(self.log, "wb")  # noqa: SIM115 - the child keeps its own copy
        self.proc = host.popen(
            [
                "runuser", "-u", "postgres", "--",
                str(self.bin / "postgres"), "-D", str(self.data),
                "-h", host.addr, "-p", "5432", "-k", str(self.dir),
                "-c", "fsync=off", "-c", "synchronous_commit=off",
                *([] if stock_keepalives else [
                    "-c", "tcp_keepalives_idle=1", "-c", "tcp_keepalives_interval=1",
                    "-c", "tcp_keepalives_count=2", "-c", "tcp_user_timeout=3000",
                ]),
                "-c", f"listen_addresses={host.addr}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        log.close()
        self.url = f"postgresql://postgres@{host.addr}:5432/postgres"

        def up() -> bool:
            import psycopg

            try:
                with psycopg.connect(self.url, connect_timeout=2) as conn:
                    conn.execute("SELECT 1")
            except psycopg.OperationalError:
                return False  # not listening yet
            return True

        try:
            wait_for(lambda: self._alive_or_fail() and up(), what="private PostgreSQL up")
        except BaseException:
            self.stop()
            raise

    def _alive_or_fail(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"postgres exited: {self.log.read_text(errors='replace')}")
        return True

    def stop(self) -> None:
        import shutil
        import signal
        import subprocess

        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        shutil.rmtree(self.dir, ignore_errors=True)


class TestMultiHost:
    """The fleet across network namespaces survives hosts cut off."""

    def test_model_on_one_host_is_served_through_router_on_another(
        self, fleet: Net, tmp_path: Path
    ) -> None:
        """A model on one host is served through a router on another."""
        ctl = start_controller(fleet["ctl"], f"sqlite:///{tmp_path / 'c.db'}")
        for name in ("gpu-a", "gpu-b"):
            start_agent(fleet[name], [ctl.url], tmp_path)
        router = start_router(fleet["router"], ctl.url, tmp_path)
        assert ctl.url.startswith(f"http://{fleet['ctl'].addr}:")
        assert router.url.startswith(f"http://{fleet['router'].addr}:")

        call("POST", f"{ctl.url}/admin/models", sim_model("m"))
        rep = wait_for(lambda: ready_on(ctl.url, "m"), what="one ready replica of m")
        node = node_of(rep)
        assert node in ("gpu-a", "gpu-b")
        # The engine is reached on its host's own address, not on loopback.
        assert rep["endpoint_url"].startswith(f"http://{fleet[node].addr}:"), rep

        wait_for(lambda: chat(router.url, "m", stream=False), what="router serves m")
        assert chat(router.url, "m", stream=True)
        # And the router says which replica answered: the one on the other host.
        req = urllib.request.Request(
            f"{router.url}/v1/chat/completions",
            data=json.dumps(
                {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            ).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
            assert resp.headers["x-llmgw-endpoint"] == rep["id"]

    def test_cut_off_agent_host_is_replaced_and_never_runs_twice(
        self, fleet: Net, tmp_path: Path
    ) -> None:
        """A cut-off agent host is replaced and its replica never runs twice."""
        ctl = start_controller(fleet["ctl"], f"sqlite:///{tmp_path / 'c.db'}")
        for name in ("gpu-a", "gpu-b"):
            start_agent(fleet[name], [ctl.url], tmp_path)
        router = start_router(fleet["router"], ctl.url, tmp_path)
        call("POST", f"{ctl.url}/admin/models", sim_model("m"))
        first = wait_for(lambda: ready_on(ctl.url, "m"), what="m ready")
        wait_for(lambda: chat(router.url, "m", stream=False), what="router serves m")
        old_node = node_of(first)
        new_node = "gpu-b" if old_node == "gpu-a" else "gpu-a"
        old_engine = first["endpoint_url"]

        fleet.cut(old_node)

        def unreachable() -> bool:
            nodes = call("GET", f"{ctl.url}/admin/nodes")
            return any(n["name"] == old_node and n["state"] == "unreachable" for n in nodes)

        wait_for(unreachable, what=f"{old_node} unreachable")
        moved = wait_for(
            lambda: (r := ready_on(ctl.url, "m")) is not None and node_of(r) == new_node and r,
            what=f"m re-placed on {new_node}",
        )
        assert moved["id"] != first["id"]
        # The cut-off host's engine is still running there (nobody could tell it
        # otherwise), but it is no longer in anyone's endpoint list.
        endpoints = call("GET", f"{ctl.url}/v1/endpoints")["endpoints"]
        assert [e["id"] for e in endpoints] == [moved["id"]]
        wait_for(lambda: chat(router.url, "m", stream=True), what="router serves m on the new host")

        fleet.restore(old_node)

        def back_and_single() -> bool:
            nodes = {n["name"]: n["state"] for n in call("GET", f"{ctl.url}/admin/nodes")}
            return (
                nodes.get(old_node) == "ready"
                and [r["id"] for r in live(ctl.url, "m")] == [moved["id"]]
                and not engine_answers(old_engine)
            )

        wait_for(back_and_single, what="old host back, its stale engine stopped, one replica")
        # Still exactly one, ticks later: the returning agent's report did not
        # bring the old replica back.
        wait_ticks(ctl.url, TOKEN, 5)
        assert [r["id"] for r in live(ctl.url, "m")] == [moved["id"]]
        endpoints = call("GET", f"{ctl.url}/v1/endpoints")["endpoints"]
        assert [e["id"] for e in endpoints] == [moved["id"]]

    def test_router_cut_off_from_controller_keeps_serving(self, fleet: Net, tmp_path: Path) -> None:
        """A router cut off from the controller keeps serving."""
        ctl = start_controller(fleet["ctl"], f"sqlite:///{tmp_path / 'c.db'}")
        start_agent(fleet["gpu-a"], [ctl.url], tmp_path)
        router = start_router(fleet["router"], ctl.url, tmp_path)
        call("POST", f"{ctl.url}/admin/models", sim_model("m"))
        wait_for(lambda: ready_on(ctl.url, "m"), what="m ready")
        wait_for(lambda: chat(router.url, "m", stream=False), what="router serves m")

        fleet.cut("ctl")
        # Longer than several long-polls and the controller's heartbeat timeout:
        # the router keeps its last list, the engine keeps serving.
        deadline = time.monotonic() + 8.0
        served = 0
        while time.monotonic() < deadline:
            assert chat(router.url, "m", stream=served % 2 == 0)
            served += 1
            time.sleep(0.2)
        assert served >= 10
        fleet.restore("ctl")
        wait_for(lambda: ready_on(ctl.url, "m"), what="controller sees m ready again")
        assert chat(router.url, "m", stream=False)

    def test_postgres_ha_leader_host_cut_off(self, tmp_path: Path) -> None:
        """PostgreSQL on its own host, controllers on two more: cut the leader's host."""
        names = ["pg", "ctl-1", "ctl-2", "gpu-a", "gpu-b"]
        with netns.hosts(names, log_dir=tmp_path / "logs") as net:
            pg = PrivatePostgres(net["pg"], tmp_path)
            try:
                # An agent gives up on a silent controller after its 5 s request
                # timeout and turns to the next one; the heartbeat timeout must be
                # longer than that (the default is 10 s), or the new leader would
                # see healthy nodes as unreachable.
                slow_hb = ("--heartbeat-timeout-s", "8")
                c1 = start_controller(net["ctl-1"], pg.url, *slow_hb)
                wait_for(lambda: call("GET", f"{c1.url}/healthz")["leader"], what="ctl-1 leads")
                c2 = start_controller(net["ctl-2"], pg.url, *slow_hb)
                wait_for(lambda: call("GET", f"{c2.url}/healthz")["leader"] is False, what="ctl-2")
                for name in ("gpu-a", "gpu-b"):
                    start_agent(net[name], [c1.url, c2.url], tmp_path)
                call("POST", f"{c1.url}/admin/models", sim_model("m"))
                call("POST", f"{c1.url}/admin/models", sim_model("n"))
                before = {
                    m: wait_for(lambda m=m: ready_on(c1.url, m), what=f"{m} ready")["id"]
                    for m in ("m", "n")
                }

                net.cut("ctl-1")
                wait_for(
                    lambda: call("GET", f"{c2.url}/healthz")["leader"],
                    timeout_s=90,
                    what="ctl-2 takes over",
                )
                # Nothing lost: both specs; nothing double-placed: the same single
                # replica of each, still ready, agents now reporting to ctl-2.
                specs = sorted(m["name"] for m in call("GET", f"{c2.url}/admin/models"))
                assert specs == ["m", "n"]

                def agents_on_c2() -> bool:
                    nodes = call("GET", f"{c2.url}/admin/nodes")
                    return {n["name"]: n["state"] for n in nodes} == {
                        "gpu-a": "ready",
                        "gpu-b": "ready",
                    } and all(time.time() - (n["last_heartbeat"] or 0) < 1.0 for n in nodes)

                wait_for(agents_on_c2, what="agents heartbeat the new leader")
                wait_ticks(c2.url, TOKEN, 5)  # heartbeats arrive meanwhile
                for m, rid in before.items():
                    reps = live(c2.url, m)
                    assert [r["id"] for r in reps] == [rid], reps
                    assert reps[0]["state"] == "ready"

                # The deposed leader comes back: it must not lead, nor write.
                net.restore("ctl-1")
                # It finds its session gone at its next store call, and stands by.
                wait_for(
                    lambda: call("GET", f"{c1.url}/healthz")["leader"] is False,
                    what="ctl-1, back, is a standby",
                )
                assert call("GET", f"{c2.url}/healthz")["leader"] is True
                for m, rid in before.items():
                    assert [r["id"] for r in live(c2.url, m)] == [rid]
            finally:
                for host in net.hosts.values():
                    for prog in host.programs:
                        prog.stop(grace_s=3)
                pg.stop()
