"""sim-engine --scheduling-policy: vLLM's priority scheduling and the request `priority` field."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any
from unittest import mock

import msgspec
import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from llmgw.simengine import api, messages, responses
from llmgw.simengine.app import SIM_KEY, build_app
from llmgw.simengine.batcher import Scheduler, SimRequest
from llmgw.simengine.config import SimConfig
from llmgw.simengine.engine import Stream
from llmgw.simengine.kvcache import KVCache
from llmgw.simengine.main import config_from_args, parser
from llmgw.simengine.stats import EngineStats
from llmgw.simengine.timing import TimingModel
from tests.unit.test_sim_batcher import preemptions, run

FAST = TimingModel(speed=100.0)
FCFS_CFG = SimConfig(
    model="m", served_model_names=("m",), num_gpu_blocks=100, max_model_len=64, timing=FAST
)
PRIO_CFG = SimConfig(
    model="m",
    served_model_names=("m",),
    num_gpu_blocks=100,
    max_model_len=64,
    timing=FAST,
    scheduling_policy="priority",
)
REFUSED = "Got priority 3 but Priority scheduling is not enabled."
# One small request per generate route (and embeddings, which vLLM checks alike).
BODIES: dict[str, dict[str, Any]] = {
    "/v1/chat/completions": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/completions": {"prompt": "hi", "max_tokens": 2},
    "/v1/responses": {"input": "hi", "max_output_tokens": 2},
    "/v1/messages": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
    "/v1/embeddings": {"input": "hi"},
}
GENERATE = [p for p in BODIES if p != "/v1/embeddings"]


def make(*, policy: str = "priority", max_seqs: int = 8) -> Scheduler:
    """A scheduler with 4 usable blocks of 4 tokens: 16 tokens of KV cache."""
    return Scheduler(
        kv=KVCache(num_gpu_blocks=5, block_size=4),
        stats=EngineStats({}),
        max_num_seqs=max_seqs,
        max_num_batched_tokens=64,
        max_model_len=16,
        policy=policy,
    )


def req(rid: str, prompt: int = 2, *, priority: int = 0, t: float = 0.0) -> SimRequest:
    base = 1000 * (1 + ord(rid[0]))  # ids of different first letters share no prefix
    return SimRequest(
        rid,
        list(range(base, base + prompt)),
        arrival_s=t,
        max_tokens=8,
        seed=1,
        ignore_eos=True,
        priority=priority,
    )


def served_order(s: Scheduler, reqs: list[SimRequest], *, t0: float) -> list[str]:
    """Run `s` until idle; `reqs`' ids in the order they were first scheduled."""
    run(s, t0=t0)
    return [r.req_id for r in sorted(reqs, key=lambda r: r.first_scheduled_s or 0.0)]


async def post(app: web.Application, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    """The app's handler for `path` answering `body` (no socket: a mocked request)."""
    payload = StreamReader(mock.Mock(_reading_paused=False), 2**16)
    payload.feed_data(msgspec.json.encode({"model": "m", **body}))
    payload.feed_eof()
    request = make_mocked_request("POST", path, app=app, payload=payload)
    match = await app.router.resolve(request)
    resp = await match.handler(request)
    assert isinstance(resp, web.Response)
    assert isinstance(resp.body, bytes)
    return resp.status, msgspec.json.decode(resp.body)


@contextlib.asynccontextmanager
async def serving(cfg: SimConfig) -> AsyncIterator[web.Application]:
    """The app with its engine loop running."""
    app = build_app(cfg)
    task = asyncio.create_task(app[SIM_KEY].engine.run())
    try:
        yield app
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class TestWaitingOrder:
    """Under priority the waiting queue is served by (priority, arrival)."""

    def test_priority_then_arrival(self) -> None:
        """Lower priority first; equal priorities by arrival, whatever the order of adding."""
        s = make(max_seqs=1)
        reqs = [
            req("a", priority=2, t=0.0),
            req("b", priority=0, t=0.3),
            req("c", priority=0, t=0.1),
            req("d", priority=-1, t=0.2),
        ]
        for r in reqs:
            s.add(r)
        s.finish_step(s.schedule(0.0), 0.01)  # admits "a" alone: the rest had not arrived
        assert s.waiting_snapshot() == ["d", "c", "b"]
        assert served_order(s, reqs, t0=1.0) == ["a", "d", "c", "b"]

    def test_fcfs_ignores_priority(self) -> None:
        """Under fcfs the queue keeps its order, as it always did."""
        s = make(policy="fcfs", max_seqs=1)
        reqs = [req("a", priority=2), req("b", priority=0), req("c", priority=-1)]
        for r in reqs:
            s.add(r)
        assert served_order(s, reqs, t0=0.0) == ["a", "b", "c"]

    def test_head_that_does_not_fit_blocks_the_rest(self) -> None:
        """A head without blocks stops the step's admissions, as in vLLM: no skipping ahead."""
        s = make()
        s.add(req("a", 7))
        s.finish_step(s.schedule(0.0), 0.01)  # "a" holds 2 of the 4 blocks
        s.add(req("big", 12, priority=0, t=0.5))  # needs 3 blocks
        s.add(req("small", 3, priority=1, t=0.5))  # would fit in 1
        plan = s.schedule(1.0)
        assert (
            [r.req_id for r, _ in plan.scheduled],
            s.waiting_snapshot(),
        ) == (["a"], ["big", "small"])

    def test_later_arrival_does_not_block_earlier_ones(self) -> None:
        """A request that arrived after the step began waits, even ranked first."""
        s = make()
        s.add(req("a", priority=5, t=0.0))
        s.add(req("b", priority=0, t=0.5))
        plan = s.schedule(0.2)
        assert (
            [r.req_id for r, _ in plan.scheduled],
            s.waiting_snapshot(),
            s.num_waiting,
        ) == (["a"], ["b"], 1)
        plan = s.schedule(0.5)
        assert [r.req_id for r, _ in plan.scheduled] == ["a", "b"]

    def test_abort_takes_a_request_out_of_either_heap(self) -> None:
        """Aborting an admitted or a not-yet-admitted waiting request removes just it."""
        s = make(max_seqs=1)
        a, b, c, d = req("a"), req("b"), req("c", priority=1), req("d", t=9.0)
        for r in (a, b, c, d):
            s.add(r)
        s.schedule(0.0)  # a runs; b, c admitted; d arrives later
        s.abort(b, reason="abort", now=0.0)
        s.abort(d, reason="abort", now=0.0)
        assert (s.waiting_snapshot(), d.finish_reason) == (["c"], "abort")


class TestPreemption:
    """Under priority the victim is the running request with the largest (priority, arrival)."""

    def run_until_preemption(self, policy: str) -> tuple[Scheduler, list[str], list[str], int]:
        # "x" (priority 9) runs first; "y" (priority 0) joins a step later and, needing a
        # third block first, runs out; "z" waits (max_num_seqs 2).
        s = make(policy=policy, max_seqs=2)
        s.add(req("x", 5, priority=9, t=0.0))
        s.add(req("y", 7, priority=0, t=0.005))
        s.add(req("z", 2, priority=0, t=0.006))
        now = 0.0
        while True:
            plan = s.schedule(now)
            if plan.preempted:
                ids = [r.req_id for r, _ in plan.scheduled]
                return s, ids, [r.req_id for r in plan.preempted], plan.decode_seqs
            now += 0.01
            s.finish_step(plan, now)

    def test_lowest_priority_is_preempted_and_gives_back_its_tokens(self) -> None:
        """ "x" ranks last: preempted though it was planned first, and only "y" decodes."""
        s, scheduled, preempted, decodes = self.run_until_preemption("priority")
        assert (scheduled, preempted, decodes) == (["y"], ["x"], 1)
        assert s.waiting_snapshot() == ["z", "x"]

    def test_fcfs_preempts_the_newest(self) -> None:
        """Under fcfs the newest running request goes, to the front of the queue."""
        s, scheduled, preempted, decodes = self.run_until_preemption("fcfs")
        assert (scheduled, preempted, decodes) == (["x"], ["y"], 1)
        assert s.waiting_snapshot() == ["y", "z"]

    def test_later_arrival_of_equal_priority_goes_first(self) -> None:
        """Between equal priorities the later arrival is the victim, even when it runs first."""
        s = make()
        a, b = req("a", 7, t=0.1), req("b", 7, t=0.0)
        s.add(a)
        s.finish_step(s.schedule(0.1), 0.11)
        s.add(b)
        victims = preemptions(s, t0=0.2)
        assert (victims[:1], a.num_output, b.num_output) == (["a"], 8, 8)


class TestPolicySetting:
    """The flag, the config and the scheduler agree on the policy names."""

    def test_flag_default_and_value(self) -> None:
        """--scheduling-policy defaults to fcfs, as vLLM, and takes priority."""

        def policy(*argv: str) -> str:
            args, _ = parser().parse_known_args(["--model", "m", *argv])
            return config_from_args(args).scheduling_policy

        assert (policy(), policy("--scheduling-policy", "priority")) == ("fcfs", "priority")

    def test_unknown_policy_refused(self) -> None:
        """A policy vLLM does not have is refused by the parser, the config and the scheduler."""
        with pytest.raises(SystemExit):
            parser().parse_args(["--model", "m", "--scheduling-policy", "lifo"])
        with pytest.raises(ValueError, match="scheduling policy"):
            SimConfig(model="m", served_model_names=("m",), num_gpu_blocks=9, scheduling_policy="x")
        with pytest.raises(ValueError, match="scheduling policy"):
            make(policy="lifo")


class TestPriorityField:
    """The request's `priority` through the HTTP app."""

    @pytest.mark.parametrize("path", list(BODIES))
    async def test_fcfs_refuses_nonzero(self, path: str) -> None:
        """Under fcfs a priority other than 0 is vLLM's 400 (Anthropic's shape on /v1/messages)."""
        status, body = await post(build_app(FCFS_CFG), path, {**BODIES[path], "priority": 3})
        assert (status, body["error"]["message"]) == (400, REFUSED)
        if path != "/v1/messages":
            assert (body["error"]["type"], body["error"]["code"]) == ("BadRequestError", 400)

    @pytest.mark.parametrize("value", ["1", 1.5, True, None, [1], 2**31, -(2**31), 10**30])
    @pytest.mark.parametrize("cfg", [FCFS_CFG, PRIO_CFG], ids=["fcfs", "priority"])
    async def test_bad_values_are_400(self, value: object, cfg: SimConfig) -> None:
        """A priority that is no 32-bit integer is a 400 naming the field, never a 500."""
        path = "/v1/chat/completions"
        status, body = await post(build_app(cfg), path, {**BODIES[path], "priority": value})
        assert (status, "priority" in body["error"]["message"]) == (400, True)

    @pytest.mark.parametrize("path", GENERATE)
    @pytest.mark.parametrize(
        ("cfg", "priority"),
        [(FCFS_CFG, None), (FCFS_CFG, 0), (PRIO_CFG, None), (PRIO_CFG, 0), (PRIO_CFG, -7)],
        ids=["fcfs-absent", "fcfs-0", "priority-absent", "priority-0", "priority-neg"],
    )
    async def test_accepted_and_served(
        self, path: str, cfg: SimConfig, priority: int | None, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Priority 0 (or none) is served under both policies, any under priority, and
        the engine's request carries it."""
        extra = {} if priority is None else {"priority": priority}
        async with serving(cfg) as app:
            engine = app[SIM_KEY].engine
            real_submit = engine.submit
            submitted: list[int] = []

            def submit(r: SimRequest) -> Stream:
                submitted.append(r.priority)
                return real_submit(r)

            monkeypatch.setattr(engine, "submit", submit)
            status, _ = await post(app, path, {**BODIES[path], **extra})
        assert (status, submitted) == (200, [priority or 0])

    @pytest.mark.parametrize(
        ("path", "parse"),
        [
            ("/v1/chat/completions", api.parse_chat),
            ("/v1/completions", api.parse_completion),
            ("/v1/responses", responses.parse_responses),
            ("/v1/messages", messages.parse_messages),
        ],
    )
    def test_job_carries_the_priority(
        self, path: str, parse: Callable[[bytes, SimConfig], api.Job]
    ) -> None:
        """Every generate route's job carries the request's priority to the scheduler."""
        raw = msgspec.json.encode({"model": "m", "priority": -4, **BODIES[path]})
        assert parse(raw, PRIO_CFG).priority == -4
