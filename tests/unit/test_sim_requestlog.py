"""sim-engine --request-log: one JSON line per generation request, with its engine times."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from unittest import mock

import msgspec
import pytest
from aiohttp import web
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from llmgw.simengine.app import SIM_KEY, build_app
from llmgw.simengine.batcher import SimRequest
from llmgw.simengine.config import SimConfig
from llmgw.simengine.faults import FaultConfig
from llmgw.simengine.main import config_from_args, main, parser
from llmgw.simengine.timing import TimingModel

PATH = "/v1/chat/completions"
BODY = {"model": "m", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3}
FIELDS = [
    "request_id",
    "id",
    "priority",
    "prompt_tokens",
    "cached_tokens",
    "arrival_s",
    "scheduled_s",
    "first_token_s",
    "finished_s",
    "preemptions",
    "finish_reason",
]


def config(log: Path | None, **faults: int) -> SimConfig:
    return SimConfig(
        model="m",
        served_model_names=("m",),
        num_gpu_blocks=100,
        max_model_len=64,
        timing=TimingModel(speed=100.0),
        faults=FaultConfig(**faults),
        request_log=None if log is None else str(log),
    )


@contextlib.asynccontextmanager
async def started(cfg: SimConfig) -> AsyncIterator[web.Application]:
    """The app through its own start-up and clean-up (the engine loop runs in between)."""
    app = build_app(cfg)
    app.freeze()
    await app.startup()
    try:
        yield app
    finally:
        await app.shutdown()
        await app.cleanup()


async def post(app: web.Application, headers: dict[str, str], **body: object) -> int:
    """The chat handler's status for BODY and `body` (no socket: a mocked request)."""
    payload = StreamReader(mock.Mock(_reading_paused=False), 2**16)
    payload.feed_data(msgspec.json.encode({**BODY, **body}))
    payload.feed_eof()
    request = make_mocked_request("POST", PATH, headers=headers, app=app, payload=payload)
    match = await app.router.resolve(request)
    resp = await match.handler(request)
    return resp.status


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class TestRequestLog:
    """What --request-log writes, and that nothing is written without it."""

    async def test_finished_request_line(self, tmp_path: Path) -> None:
        """A served request's line has every field, in order, with ordered times."""
        log = tmp_path / "e0.requests.jsonl"
        async with started(config(log)) as app:
            assert await post(app, {"x-request-id": "quiet-7"}) == 200
        [got] = lines(log)
        assert list(got) == FIELDS
        assert (got["request_id"], got["priority"], got["preemptions"]) == ("quiet-7", 0, 0)
        assert (got["finish_reason"], got["id"][:9]) == ("length", "chatcmpl-")
        assert 0 <= got["cached_tokens"] <= got["prompt_tokens"]
        assert got["prompt_tokens"] > 0
        times = [got[k] for k in ("arrival_s", "scheduled_s", "first_token_s", "finished_s")]
        assert times == sorted(times)
        assert app[SIM_KEY].request_log is not None

    async def test_no_request_id(self, tmp_path: Path) -> None:
        """Without an x-request-id the line says null, and a second request appends."""
        log = tmp_path / "log.jsonl"
        async with started(config(log)) as app:
            await post(app, {})
            await post(app, {"x-request-id": "b"})
        assert [g["request_id"] for g in lines(log)] == [None, "b"]

    async def test_aborted_request_line(self, tmp_path: Path) -> None:
        """A request the stall fault cuts short is logged when it ends, as aborted."""
        log = tmp_path / "log.jsonl"
        async with started(config(log, stall_after_tokens=1)) as app:
            # Long enough that the cut comes before the end.
            await post(app, {"x-request-id": "cut"}, max_tokens=40, ignore_eos=True)
        [got] = lines(log)
        assert (got["request_id"], got["finish_reason"]) == ("cut", "abort")
        assert got["first_token_s"] <= got["finished_s"]

    async def test_no_line_after_close(self, tmp_path: Path) -> None:
        """A request that ends after the clean-up closed the log writes nothing, not an error."""
        log = tmp_path / "log.jsonl"
        async with started(config(log)) as app:
            pass
        sim = app[SIM_KEY]
        assert sim.request_log is not None
        req = SimRequest("late", [1, 2], arrival_s=0.0, max_tokens=1, seed=0)
        sim.request_log.write(req, "late")
        assert log.read_text() == ""

    async def test_off_by_default(self, tmp_path: Path) -> None:
        """Without the flag there is no log and nothing is written."""
        async with started(config(None)) as app:
            assert await post(app, {"x-request-id": "x"}) == 200
            assert app[SIM_KEY].request_log is None
        assert list(tmp_path.iterdir()) == []


class TestRequestLogFlag:
    """The --request-log flag."""

    def test_flag_sets_the_path(self) -> None:
        """The flag's path reaches the config; its default is off."""

        def path(*argv: str) -> str | None:
            return config_from_args(parser().parse_args(["--model", "m", *argv])).request_log

        assert (path(), path("--request-log", "/tmp/x.jsonl")) == (None, "/tmp/x.jsonl")

    def test_unwritable_path_stops_the_engine(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A path that cannot be opened is a usage error (2) before the engine serves."""
        bad = tmp_path / "no-such-dir" / "log.jsonl"
        assert main(["--model", "m", "--request-log", str(bad)]) == 2
        assert str(bad) in capsys.readouterr().err
