"""The scrape loop, with a fake fetcher: concurrency, timeouts, restarts."""

from __future__ import annotations

import asyncio
import time

import pytest

from llmgw.router.errors import UpstreamConnectError
from llmgw.router.replicas.registry import Registry
from llmgw.router.replicas.scrape import Scraper
from llmgw.testing import ManualClock, until
from llmgw.wire.endpoints import EndpointInfo


def vllm_text(*, running: int, success: float) -> bytes:
    return (
        f'vllm:num_requests_running{{engine="0",model_name="m"}} {running}.0\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25\n'
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} '
        f"{success}\n"
    ).encode()


class FakeFetcher:
    """Answers per endpoint id: bytes, an exception, or a delay then bytes."""

    def __init__(self) -> None:
        self.answers: dict[str, bytes | Exception] = {}
        self.delay_s: dict[str, float] = {}

    async def fetch_metrics(self, info: EndpointInfo, *, timeout_s: float) -> bytes:
        await asyncio.sleep(self.delay_s.get(info.id, 0.0))
        got = self.answers[info.id]
        if isinstance(got, Exception):
            raise got
        return got


def registry(*ids: str) -> Registry:
    reg = Registry(clock=ManualClock())
    reg.replace([EndpointInfo(id=i, url=f"http://{i}", models=("m",)) for i in ids])
    return reg


class TestScraper:
    """The scrape loop's concurrency, failures and restart detection."""

    async def test_observes_every_endpoint(self) -> None:
        """One tick feeds every endpoint's figures to the registry."""
        reg = registry("a", "b")
        f = FakeFetcher()
        f.answers = {"a": vllm_text(running=2, success=1), "b": vllm_text(running=5, success=1)}
        await Scraper(registry=reg, fetcher=f).tick()
        assert {s.id: s.stats.running for s in reg.snapshots() if s.stats} == {"a": 2, "b": 5}

    async def test_slow_endpoint_does_not_delay_others(self) -> None:
        """A hanging endpoint costs its own timeout; the others are observed at once."""
        reg = registry("fast", "slow")
        f = FakeFetcher()
        text = vllm_text(running=1, success=1)
        f.answers = {"fast": text, "slow": text}
        f.delay_s = {"slow": 30.0}
        failed: list[str] = []
        s = Scraper(registry=reg, fetcher=f, timeout_s=0.5, on_failure=failed.append)
        task = asyncio.create_task(s.tick())
        await until(
            lambda: (fast := reg.snapshot("fast")) is not None and fast.stats is not None,
            timeout_s=5,
            every_s=0.01,
            what="fast observed",
        )
        assert not task.done()  # observed while the slow one still hangs
        started = time.monotonic()
        await task
        assert time.monotonic() - started < 5.0
        assert failed == ["slow"]
        assert reg.snapshot("slow").stats is None  # type: ignore[union-attr]

    async def test_failure_does_not_touch_breaker(self) -> None:
        """A failed scrape is reported, the endpoint stays closed and unscraped."""
        reg = registry("a")
        f = FakeFetcher()
        f.answers = {"a": UpstreamConnectError("a", "refused")}
        for _ in range(10):
            await Scraper(registry=reg, fetcher=f).tick()
        snap = reg.snapshot("a")
        assert snap is not None
        assert (snap.breaker.value, snap.stats, snap.stale) == ("closed", None, True)

    async def test_unparsable_metrics_is_a_failure(self) -> None:
        """Metrics without the mandatory figures count as a failed scrape."""
        reg = registry("a")
        f = FakeFetcher()
        f.answers = {"a": b"# nothing useful\n"}
        failed: list[str] = []
        await Scraper(registry=reg, fetcher=f, on_failure=failed.append).tick()
        assert failed == ["a"]

    async def test_counter_reset_calls_on_restart(self) -> None:
        """A counter going backwards reports an engine restart for that endpoint."""
        reg = registry("a")
        f = FakeFetcher()
        restarted: list[str] = []
        s = Scraper(registry=reg, fetcher=f, on_restart=restarted.append)
        f.answers = {"a": vllm_text(running=1, success=100)}
        await s.tick()
        f.answers = {"a": vllm_text(running=1, success=3)}
        await s.tick()
        assert restarted == ["a"]


class Raising:
    """A fetcher whose answer makes the scrape raise what no reader expects."""

    def __init__(self) -> None:
        self.calls = 0

    async def fetch_metrics(self, info: EndpointInfo, *, timeout_s: float) -> bytes:
        self.calls += 1
        if info.id == "bad":
            raise RuntimeError("a bug reading this engine")
        return vllm_text(running=1, success=1)


class TestUnexpectedErrors:
    """One engine's unexpected failure costs its own scrape, never the loop."""

    async def test_the_loop_scrapes_on(self, caplog: pytest.LogCaptureFixture) -> None:
        """An exception of no expected kind is a failed scrape of that endpoint, logged
        with its traceback; the other endpoint is observed and the next tick runs."""
        reg = registry("bad", "good")
        f = Raising()
        failed: list[str] = []
        s = Scraper(registry=reg, fetcher=f, on_failure=failed.append)
        await s.tick()
        await s.tick()
        assert failed == ["bad", "bad"]
        good = reg.snapshot("good")
        assert good is not None
        assert good.stats is not None
        assert "scrape failed unexpectedly" in caplog.text
