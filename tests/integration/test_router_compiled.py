"""The router's mypyc build (scripts/build-mypyc, llmgw.router.compiled) in real processes.

A process loads the build for its sources, falls back to the Python modules on a
corrupt one, and fails clearly when `LLMGW_ROUTER_COMPILED=1` finds none; the compiled
modules answer exactly as the Python ones (chain hashes, rendezvous orders, prefix
index sequences, scheduler and policy decisions: hypothesis inputs sent to two peer
processes, compiled and not, with one hash seed); and a router says which it runs.
The tests that need a build skip without one: scripts/test builds it first.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw.router import compiled
from llmgw.router.replicas.breaker import BreakerState
from llmgw.router.replicas.registry import Snapshot, Stats
from llmgw.router.routing.blockhash import MAX_ROUTED_BYTES
from llmgw.router.routing.scheduler import load_of
from llmgw.testing import start_program
from llmgw.wire.endpoints import EndpointInfo

from .router_fixtures import (
    base_config,
    chat_body,
    config_path,
    endpoint_entries,
    post,
    sim_engines,
    wait_until_scraped,
    write_config,
)

PEER = Path(__file__).with_name("compiled_peer.py")
MODULES = list(compiled.MODULES)


def build_or_skip() -> Path:
    found = compiled.find(os.environ)
    if isinstance(found, str):
        pytest.skip(f"no mypyc build of the router ({found}); scripts/test makes one")
    return found


def python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`code` in a fresh interpreter with `env` added to this one's environment."""
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


STATUS = (
    "import json, llmgw.router.compiled as c; c.load();"
    "import llmgw.router.routing.policies as p;"
    "print(json.dumps([c.STATUS.modules, c.STATUS.detail, p.__file__]))"
)


class TestLoading:
    """Which modules a real router process runs, compiled or Python."""

    def test_a_process_runs_the_build_for_its_sources(self) -> None:
        """Found by key, every compiled module in sys.modules under its own name."""
        folder = build_or_skip()
        done = python(STATUS)
        assert done.returncode == 0, done.stderr
        modules, detail, policies = json.loads(done.stdout)
        assert (modules, detail) == (MODULES, str(folder))
        assert Path(policies).parent == folder / "llmgw" / "router" / "routing"

    def test_the_program_imports_no_hot_module_before_loading(self) -> None:
        """`llmgw router`'s entry module imports none of the compiled modules: one imported
        before `main` loads the build would leave the whole router on the Python ones."""
        code = (
            "import json, sys, llmgw.cli, llmgw.router.main;"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('llmgw.'))))"
        )
        done = python(code)
        assert done.returncode == 0, done.stderr
        assert set(json.loads(done.stdout)).isdisjoint(MODULES)

    def test_zero_runs_the_python_modules(self) -> None:
        """LLMGW_ROUTER_COMPILED=0 runs the Python modules."""
        build_or_skip()
        done = python(STATUS, LLMGW_ROUTER_COMPILED="0")
        modules, detail, policies = json.loads(done.stdout)
        assert (modules, detail) == ([], "LLMGW_ROUTER_COMPILED=0")
        assert policies.endswith("policies.py")

    def test_a_module_imported_before_the_router_leaves_the_python_modules(self) -> None:
        """A process that imported the router's server (a compiled module) before the
        build was loaded would mix the two classes of one name, so the build is not
        loaded there (and the Python modules run, consistently)."""
        build_or_skip()
        done = python("import llmgw.router.http.server\n" + STATUS)
        assert done.returncode == 0, done.stderr
        modules, detail, policies = json.loads(done.stdout)
        assert modules == []
        # It imports runtime.peers, compiled too and earlier in MODULES: that one is named.
        assert "llmgw.runtime.peers was imported before its build" in detail
        assert policies.endswith("policies.py")

    def corrupt(self, cache: Path) -> Path:
        """A complete-looking build for these sources whose libraries are not ELF files."""
        mypy = compiled.mypy_version()
        assert mypy is not None
        folder = cache / "llmgw" / "mypyc" / compiled.key(mypy)
        for module in compiled.MODULES:
            for suffix in ("", "__mypyc"):
                path = compiled.extension(folder, module, suffix)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"not a shared object")
        manifest = {"modules": MODULES, "depends": {}}
        (folder / compiled.MANIFEST).write_text(json.dumps(manifest))
        return folder

    def test_a_build_that_does_not_load_leaves_the_python_modules(self, tmp_path: Path) -> None:
        """A build that does not load leaves the Python modules."""
        folder = self.corrupt(tmp_path)
        done = python(STATUS, XDG_CACHE_HOME=str(tmp_path))
        assert done.returncode == 0, done.stderr
        modules, detail, policies = json.loads(done.stdout)
        assert modules == []
        assert detail.startswith(f"the build at {folder} did not load")
        assert policies.endswith("policies.py")

    def test_one_fails_clearly_on_a_build_that_does_not_load(self, tmp_path: Path) -> None:
        """Setting 1 fails clearly on a build that does not load."""
        folder = self.corrupt(tmp_path)
        done = python(STATUS, XDG_CACHE_HOME=str(tmp_path), LLMGW_ROUTER_COMPILED="1")
        assert done.returncode != 0
        assert f"LLMGW_ROUTER_COMPILED=1 but the build at {folder} did not load" in done.stderr

    def test_one_fails_clearly_without_a_build(self, tmp_path: Path) -> None:
        """Setting 1 fails clearly without a build."""
        done = python(STATUS, XDG_CACHE_HOME=str(tmp_path), LLMGW_ROUTER_COMPILED="1")
        assert done.returncode != 0
        assert "LLMGW_ROUTER_COMPILED=1 but no build for these sources" in done.stderr
        assert "scripts/build-mypyc" in done.stderr


# -- the same answers, compiled or not ---------------------------------------------------


class Peer:
    def __init__(self, setting: str) -> None:
        env = {**os.environ, "PYTHONHASHSEED": "0", "LLMGW_ROUTER_COMPILED": setting}
        self.proc = subprocess.Popen(
            [sys.executable, str(PEER)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.modules = json.loads(self.stdout.readline() or "null")

    def ask(self, op: str, args: dict[str, Any]) -> Any:
        self.stdin.write(json.dumps([op, args]) + "\n")
        self.stdin.flush()
        return json.loads(self.stdout.readline())

    def stop(self) -> None:
        self.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stdout.close()


@pytest.fixture(scope="module")
def peers() -> Iterator[tuple[Peer, Peer]]:
    build_or_skip()
    pure, built = Peer("0"), Peer("1")
    try:
        assert (pure.modules, built.modules) == ([], MODULES)
        yield pure, built
    finally:
        pure.stop()
        built.stop()


def same(peers: tuple[Peer, Peer], op: str, **args: Any) -> Any:
    pure, built = (p.ask(op, args) for p in peers)
    assert built == pure
    assert pure[0] == "ok", pure
    return pure[1]


IDS = ("a", "b", "c", "d", "e")
# Repeated text: prompts long enough for remembered first parts (1 KiB) and the C chain.
text = st.builds(lambda s, n: s * n, st.text(min_size=1, max_size=24), st.integers(1, 300))
content = st.one_of(
    st.none(),
    text,
    st.lists(
        st.one_of(
            st.fixed_dictionaries({"type": st.just("text"), "text": text}),
            st.fixed_dictionaries({"type": st.just("image_url"), "image_url": st.text()}),
        ),
        max_size=3,
    ),
)
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "user", "assistant", "tool"]), "content": content},
    optional={
        "name": st.text(max_size=6),
        "tool_calls": st.lists(st.fixed_dictionaries({"id": st.text(max_size=4)}), max_size=2),
        "tool_call_id": st.text(max_size=4),
    },
)
bodies = st.fixed_dictionaries(
    {"model": st.sampled_from(["m", "n"])},
    optional={
        "messages": st.lists(message, max_size=5),
        "prompt": st.one_of(text, st.lists(text, min_size=1, max_size=2)),
        "tools": st.lists(st.fixed_dictionaries({"name": st.text(max_size=6)}), max_size=2),
        "user": st.text(max_size=4),
    },
)
# Loads that tie, and weights and drain rates that break ties or not.
stats = st.builds(
    Stats,
    running=st.integers(0, 12),
    waiting=st.integers(0, 6),
    kv_usage=st.sampled_from([None, 0.0, 0.5]),
    kv_capacity_tokens=st.sampled_from([None, 64, 4096]),
)


@st.composite
def snapshots(draw: st.DrawFn) -> list[Snapshot]:
    ids = draw(st.lists(st.sampled_from(IDS), unique=True, max_size=5))
    return [
        Snapshot.of(
            info=EndpointInfo(
                id=i,
                url=f"http://{i}",
                models=("m",),
                weight=draw(st.sampled_from([0.0, 0.5, 1.0, 2.5])),
                priority=draw(st.integers(0, 2)),
            ),
            stats=draw(st.none() | stats),
            drain_rate=draw(st.sampled_from([0.0, 0.0, 1.5, 3.0])),
            inflight=draw(st.integers(0, 10)),
            running_capacity=draw(st.integers(0, 16)),
            stale=draw(st.booleans()),
            age_s=None,
            breaker=draw(st.sampled_from(BreakerState)),
            restarts=0,
            inflight_at_scrape=draw(st.integers(0, 10)),
            pending=draw(st.integers(0, 3)),
        )
        for i in ids
    ]


def encoded(snaps: list[Snapshot]) -> str:
    """As the peers rebuild them (compiled_peer.snapshot_of)."""
    return json.dumps([s.as_builtins() for s in snaps])


# A registry's life: endpoints listed (the first n of five), scraped, dispatched to.
registry_ops = st.lists(
    st.one_of(
        st.tuples(st.just("replace"), st.integers(0, 5)),
        st.tuples(
            st.just("observe"),
            st.sampled_from(IDS),
            st.fixed_dictionaries(
                {
                    "running": st.integers(0, 12),
                    "waiting": st.integers(0, 6),
                    "kv_usage": st.none(),
                },
                optional={"success_total": st.integers(0, 100).map(float)},
            ),
        ),
        st.tuples(st.just("acquire"), st.sampled_from(IDS), st.booleans()),
        st.tuples(st.just("release")),
        st.tuples(st.just("advance"), st.sampled_from([0.5, 4.0, 20.0])),
    ).map(list),
    max_size=20,
)
registry_infos = st.lists(
    st.fixed_dictionaries(
        {"url": st.just("http://x"), "models": st.just(["m"])},
        optional={
            "weight": st.sampled_from([0.0, 0.5, 2.5]),
            "priority": st.integers(-1, 2),
            "api_key": st.just("k"),
        },
    ),
    min_size=5,
    max_size=5,
).map(lambda infos: [{"id": i, **info} for i, info in zip(IDS, infos, strict=True)])


some_ids = st.lists(st.sampled_from([*IDS, "z"]), unique=True, max_size=6)
configs = st.fixed_dictionaries(
    {
        "default_capacity": st.integers(1, 8),
        "saturated_load": st.sampled_from([0.5, 1.0]),
        "stale_penalty": st.sampled_from([0.0, 1.0]),
        "affinity_load_bound": st.sampled_from([0.0, 0.5, 1.0]),
        "full_gain_at": st.sampled_from([0.0, 0.25]),
        "home_load_bound": st.sampled_from([0.0, 0.25]),
        "min_prefix_blocks": st.integers(0, 3),
    }
)
chains = st.lists(st.integers(-3, 40), min_size=1, max_size=14)
caps = st.none() | st.integers(1, 80)
index_ops = st.lists(
    st.one_of(
        st.tuples(st.just("record"), st.sampled_from(IDS), chains, caps),
        st.tuples(st.just("completed"), st.sampled_from(IDS), chains, caps),
        st.tuples(st.just("match"), chains),
        st.tuples(st.just("trim"), st.sampled_from(IDS), st.integers(0, 40)),
        st.tuples(st.just("scale"), st.sampled_from(IDS), st.sampled_from([0.01, 0.3, 1.0])),
        st.tuples(st.just("purge"), st.sampled_from(IDS)),
        st.tuples(st.just("retain"), some_ids),
    ),
    max_size=40,
)
# Conversations over a few shared system prompts (one over 1 KiB, one past 8 blocks).
SYSTEMS = ("You are terse.", "You review code. " * 80, "Answer in French, please. " * 12)
requests = st.lists(
    st.tuples(
        st.builds(
            lambda system, turns: {
                "model": "m",
                "messages": [
                    {"role": "system", "content": system},
                    *({"role": "user", "content": t} for t in turns),
                ],
            },
            st.sampled_from(SYSTEMS),
            st.lists(st.sampled_from(["hi", "more", "why? " * 30]), min_size=1, max_size=3),
        ),
        st.sampled_from([None, "s1", "s2"]),
        some_ids,
        st.none() | st.integers(0, 3000),
    ),
    min_size=1,
    max_size=12,
)
# Engine answers and streams: usage objects (whole, partial, wrong types), error
# frames (vLLM's, TGI's), cut anywhere into chunks.
usages = st.one_of(
    st.none(),
    st.integers(),
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": st.none() | st.integers(-5, 10**6) | st.text(max_size=3),
            "completion_tokens": st.none() | st.integers(-5, 10**6),
            "prompt_tokens_details": st.none()
            | st.fixed_dictionaries(
                {}, optional={"cached_tokens": st.none() | st.integers(-2, 99)}
            ),
        },
    ),
)
answers = st.one_of(
    st.builds(lambda u: json.dumps({"id": "x", "choices": [], "usage": u}), usages),
    st.sampled_from(['{"usage": 5}', "not json", '{"usage":{"prompt_tokens":3}', ""]),
)
events = st.one_of(
    st.builds(
        lambda u: json.dumps({"choices": [{"delta": {"content": "hi"}}], "usage": u}), usages
    ),
    st.builds(
        lambda code, msg: json.dumps({"error": {"message": msg, "code": code}}),
        st.none() | st.integers(400, 599) | st.sampled_from(["503", "x"]),
        st.text(max_size=8),
    ),
    st.just(json.dumps({"error": "overloaded"})),
    st.just("[DONE]"),
)


@st.composite
def streams(draw: st.DrawFn) -> list[str]:
    text = "".join(f"data: {e}\n\n" for e in draw(st.lists(events, max_size=6)))
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=8)))
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


EQUIVALENCE = settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


class TestSameAnswers:
    """The compiled modules give the same answers as the Python ones."""

    @EQUIVALENCE
    @given(bodies, st.sampled_from([MAX_ROUTED_BYTES, 4096, 100]))
    def test_chain_hashes(self, peers: tuple[Peer, Peer], body: Any, limit: int) -> None:
        """Compiled and Python peers give the same chain hashes."""
        same(peers, "hashes", body=body, limit=limit)

    @EQUIVALENCE
    @given(answers)
    def test_usage_of_answers(self, peers: tuple[Peer, Peer], body: str) -> None:
        """Compiled and Python peers read the same usage from answers."""
        same(peers, "usage", body=body)

    @EQUIVALENCE
    @given(streams())
    def test_streams_usage_and_error_frames(
        self, peers: tuple[Peer, Peer], chunks: list[str]
    ) -> None:
        """Compiled and Python peers read the same usage and error frames from streams."""
        same(peers, "stream", chunks=chunks)

    def test_usage_is_read_compiled(self, peers: tuple[Peer, Peer]) -> None:
        """Not only equal: the counts are there (msgspec types in a compiled module
        decoded nothing, in both peers alike had they been compiled both)."""
        body = json.dumps({"usage": {"prompt_tokens": 7, "completion_tokens": 3}})
        assert same(peers, "usage", body=body) == {
            "prompt": 7,
            "completion": 3,
            "cached": 0,
            "cached_reported": None,
        }
        chunks = ["data: " + body + "\n\n", 'data: {"error": {"message": "x", "code": 500}}\n']
        assert same(peers, "stream", chunks=chunks)[1] == [True, 500, "x", True]

    @EQUIVALENCE
    @given(st.integers(-(2**63), 2**64), st.lists(st.text(max_size=8), max_size=8))
    def test_rendezvous_order(self, peers: tuple[Peer, Peer], key: int, ids: list[str]) -> None:
        """Compiled and Python peers give the same rendezvous order."""
        same(peers, "rendezvous", key=key, ids=ids)

    @EQUIVALENCE
    @given(index_ops, st.integers(1, 200), st.integers(1, 100))
    def test_prefix_index_sequences(
        self, peers: tuple[Peer, Peer], ops: list[Any], max_total: int, default: int
    ) -> None:
        """Compiled and Python peers keep the same prefix index over any operations."""
        same(peers, "index", ops=ops, ids=list(IDS), max_total=max_total, default=default)

    @EQUIVALENCE
    @given(
        snapshots(),
        st.dictionaries(st.sampled_from(IDS), st.integers(0, 6)),
        some_ids,
        some_ids,
        st.sampled_from([None, *IDS, "z"]),
        st.dictionaries(st.sampled_from(IDS), st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        configs,
    )
    def test_scheduler_decisions(
        self,
        peers: tuple[Peer, Peer],
        snaps: list[Snapshot],
        matches: dict[str, int],
        home: list[str],
        exclude: list[str],
        session: str | None,
        gains: dict[str, float],
        cfg: dict[str, Any],
    ) -> None:
        """Compiled and Python peers make the same scheduler decisions."""
        same(
            peers,
            "choose",
            snaps=encoded(snaps),
            matches=matches,
            home=home,
            exclude=exclude,
            session=session,
            gains=gains,
            cfg=cfg,
        )

    @EQUIVALENCE
    @given(snapshots())
    def test_snapshots_from_keywords(self, peers: tuple[Peer, Peer], snaps: list[Snapshot]) -> None:
        """Built by Snapshot.of (info and stats only), a snapshot derives what the
        scheduler reads, and gives back what it was built from."""
        got = same(peers, "snapshots", snaps=encoded(snaps))
        shown = json.loads(encoded(snaps))
        assert [g[-1] for g in got] == shown
        assert [g[:-1] for g in got] == [
            [
                s.info.id,
                s.info.weight,
                s.info.priority,
                None if s.stats is None else s.stats.running + s.stats.waiting,
                load_of(s),
            ]
            for s in snaps
        ]

    @EQUIVALENCE
    @given(registry_infos, registry_ops)
    def test_registry_snapshots(
        self, peers: tuple[Peer, Peer], infos: list[Any], ops: list[Any]
    ) -> None:
        """The registry's snapshots (what it keeps for them precomputed) read alike."""
        for step in same(peers, "registry", infos=infos, ops=ops):
            for eid, weight, priority, queued, _, shown in step:
                info = next(i for i in infos if i["id"] == eid)
                assert (eid, weight, priority) == (
                    shown["info"]["id"],
                    info.get("weight", 1.0),
                    info.get("priority", 0),
                )
                stats = shown["stats"]
                assert queued == (None if stats is None else stats["running"] + stats["waiting"])

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(snapshots(), requests, st.sampled_from([24, 200, 4096]))
    def test_default_policy_sequences(
        self, peers: tuple[Peer, Peer], snaps: list[Snapshot], reqs: list[Any], capacity: int
    ) -> None:
        """choose, record, served and the feedback check, request after request."""
        same(peers, "ours", snaps=encoded(snaps), requests=reqs, capacity=capacity)


# -- a router says which it runs -----------------------------------------------------------


def compiled_gauges(url: str) -> dict[str, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("llmgw_router_compiled{"):
            series, _, value = line.rpartition(" ")
            out[series.split('"')[1]] = float(value)
    return out


class TestReportedModules:
    """A router reports its compiled modules."""

    @pytest.mark.slow
    @pytest.mark.parametrize(("workers", "setting"), [(1, "auto"), (1, "0"), (2, "auto")])
    async def test_a_router_reports_its_compiled_modules(
        self, tmp_path: Path, workers: int, setting: str
    ) -> None:
        """The metric and the start-up line say what runs compiled, summed over workers
        (how many run each module compiled), and requests are routed either way."""
        folder = build_or_skip()
        with sim_engines(tmp_path, [20.0, 20.0]) as engines:
            path = write_config(
                config_path(tmp_path), base_config(endpoints=endpoint_entries(engines))
            )
            argv = ["router", "--config", str(path), "--port", "0", "--workers", str(workers)]
            argv += ["--log-level", "INFO"]
            env = {"LLMGW_ROUTER_COMPILED": setting}
            with start_program(argv, log_dir=tmp_path, env=env) as r:
                await wait_until_scraped(r.url, ["e0", "e1"])
                async with aiohttp.ClientSession() as s:
                    for turn in ("hello", "hello again", "hello"):
                        reply = await post(s, r.url, chat_body(turn, max_tokens=2))
                        assert reply.status == 200
                want = float(workers) if setting == "auto" else 0.0
                assert await asyncio.to_thread(compiled_gauges, r.url) == dict.fromkeys(
                    MODULES, want
                )
                log = r.log_path.read_text()
        if setting == "auto":
            assert (
                log.count(f"compiled modules modules={','.join(MODULES)} build={folder}") == workers
            )
        else:
            assert "python modules reason=LLMGW_ROUTER_COMPILED=0" in log
