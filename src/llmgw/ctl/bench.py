"""The load driver behind `ctl bench` (docs/ctl.md): closed-loop load straight at one replica.

Each level runs `concurrency` workers for `duration_s`; a worker sends one
non-streaming chat completion, waits for it, sends the next. Closed loop on
purpose: it measures what the replica sustains, where an open loop at a fixed
rate would measure how fast a queue grows. Requests go to the replica's own
URL, not through a router, so the figure is the replica's and nothing else's.
Engines answer only with their key (the agent starts each with one); the caller
passes it in, and it travels in the Authorization header and nowhere else (an
error message quotes the engine's answer, never the request).
Prompts differ per request, so the prefix cache does not flatter prefill.

Only this module imports aiohttp; the decisions (stop rule, peak, weight) are
pure functions in `capacity`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from llmgw.ctl.capacity import Level, concurrency_levels, percentile, stop_reason
from llmgw.ctl.errors import BenchFailed

# ~100 prompt tokens at the sim-engine's (and roughly real tokenizers') 4 characters a token.
_FILLER = " ".join(["the quick brown fox jumps over the lazy dog"] * 9)


@dataclass(kw_only=True)
class LevelProgress:
    """A running level, for the progress display: read, never written, by the caller."""

    concurrency: int
    duration_s: float
    elapsed_s: float = 0.0
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    last_error: str | None = None


class _Driver:
    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        model: str,
        *,
        max_tokens: int,
        api_key: str | None = None,
    ) -> None:
        self._session = session
        self._url = url.rstrip("/") + "/v1/chat/completions"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._model = model
        self._max_tokens = max_tokens
        self._seq = 0

    async def one(self) -> tuple[int | None, str | None]:
        """Generated tokens of one request, or (None, why) when it failed."""
        self._seq += 1
        body = {
            "model": self._model,
            "messages": [{"role": "user", "content": f"bench {self._seq}: {_FILLER}"}],
            "max_tokens": self._max_tokens,
            "stream": False,
        }
        try:
            async with self._session.post(self._url, json=body, headers=self._headers) as resp:
                if resp.status != 200:
                    text = (await resp.text())[:200]
                    return None, f"HTTP {resp.status}: {text}"
                data = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            return None, f"{type(exc).__name__}: {exc}"
        usage = data.get("usage") if isinstance(data, dict) else None
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        # An engine that reports no usage is assumed to have generated max_tokens.
        return (tokens if isinstance(tokens, int) else self._max_tokens), None

    async def level(
        self, progress: LevelProgress, *, now: Callable[[], float] = time.monotonic
    ) -> Level:
        start = now()
        deadline = start + progress.duration_s
        latencies: list[float] = []
        last_done = start

        async def worker() -> None:
            nonlocal last_done
            while now() < deadline:
                sent = now()
                tokens, error = await self.one()
                last_done = now()
                progress.elapsed_s = last_done - start
                if tokens is None:
                    progress.failed += 1
                    progress.last_error = error
                    continue
                latencies.append(last_done - sent)
                progress.completed += 1
                progress.tokens += tokens

        async with asyncio.TaskGroup() as tg:
            for _ in range(progress.concurrency):
                tg.create_task(worker())
        return Level(
            concurrency=progress.concurrency,
            completed=progress.completed,
            failed=progress.failed,
            tokens=progress.tokens,
            elapsed_s=max(last_done - start, 1e-9),
            latency_p50_s=percentile(latencies, 0.5),
            latency_p95_s=percentile(latencies, 0.95),
        )


async def ramp(
    url: str,
    model: str,
    *,
    max_concurrency: int,
    duration_s: float,
    max_tokens: int,
    api_key: str | None = None,
    on_start: Callable[[LevelProgress], None] = lambda _p: None,
    on_level: Callable[[Level], None] = lambda _lv: None,
) -> tuple[list[Level], str]:
    """Run levels 1, 2, 4, … until the stop rule says so; the levels and why it stopped.

    `api_key`: the engine's key (sent as a bearer token); None for an engine without one.
    """
    levels: list[Level] = []
    timeout = aiohttp.ClientTimeout(total=max(60.0, 4 * duration_s), sock_connect=5.0)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        driver = _Driver(session, url, model, max_tokens=max_tokens, api_key=api_key)
        for concurrency in concurrency_levels(max_concurrency):
            progress = LevelProgress(concurrency=concurrency, duration_s=duration_s)
            on_start(progress)
            level = await driver.level(progress)
            levels.append(level)
            on_level(level)
            if not level.completed and len(levels) == 1:
                raise BenchFailed(
                    f"no request to {url} succeeded at concurrency {concurrency}: "
                    f"{progress.last_error}"
                )
            reason = stop_reason(levels)
            if reason:
                return levels, reason
    return levels, f"reached --max-concurrency {max_concurrency}"
