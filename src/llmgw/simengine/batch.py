"""A request of several choices: a completions `prompt` that is a batch, `n` > 1 (chat or
completions), or both. One engine request per choice, one answer, as vLLM serves it:
prompt `p`'s choice `k` has index `p * n + k`.

Usage counts each prompt once (its first choice's, cached tokens too) and sums every
choice's generated tokens. A stream opens with each chat choice's role chunk, writes each
choice's tokens as they come, under its index, every choice's last chunk with its finish
reason, then one usage chunk (when asked for) and `[DONE]`. The injected cut faults
(stall, error after N tokens) apply to single-choice requests only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmgw.simengine import api, encoder
from llmgw.simengine.conn import DEAD, DISCONNECT_POLL_S, JSON, SSE_HEADERS, gone
from llmgw.simengine.engine import Stream

if TYPE_CHECKING:
    from llmgw.simengine.app import SimEngine

log = logging.getLogger(__name__)


def _usage(streams: list[Stream], n: int) -> dict[str, Any]:
    """The request's usage: each prompt (every `n`-th stream's) once, every choice's output."""
    firsts = [s.req for s in streams[::n]]
    return api.usage(
        sum(r.num_prompt for r in firsts),
        sum(s.req.num_output for s in streams),
        sum(r.num_cached_tokens or 0 for r in firsts),
    )


async def _wait_any(streams: list[Stream], timeout_s: float | None = None) -> None:
    """Until one of `streams` is ready (or `timeout_s` passed)."""
    if any(s.ready() for s in streams):
        return
    tasks = [asyncio.ensure_future(s.wait_output()) for s in streams]
    try:
        await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        # Each waiter is awaited to its end: no task outlives this call.
        await asyncio.gather(*tasks, return_exceptions=True)


async def generate(
    sim: SimEngine, request: web.Request, jobs: list[api.Job], kind: str
) -> web.StreamResponse:
    """Run every choice of `jobs` (one job per prompt, `n` choices each); answer them as one."""
    refused = await sim.admit(jobs[0])
    if refused is not None:
        return refused
    rid = sim.new_id(kind)
    created = int(time.time())
    n = jobs[0].n
    streams: list[Stream] = []
    encs: list[encoder.Encoder] = []
    for p, job in enumerate(jobs):
        for k in range(n):
            i = p * n + k
            # The engine's id of a choice: the response's id, then "-" and the index.
            streams.append(sim.engine.submit(sim.sim_request(f"{rid}-{i}", job, k)))
            encs.append(encoder.Encoder(job, rid, created, i))
    try:
        if jobs[0].stream:
            return await _stream(sim, request, encs, streams, n)
        return await _complete(request, encs, streams, n)
    finally:
        for s in streams:
            sim.done(request, s)


async def _complete(
    request: web.Request, encs: list[encoder.Encoder], streams: list[Stream], n: int
) -> web.StreamResponse:
    for s in streams:
        s.per_token = False  # wake at the end only
    while open_ := [s for s in streams if s.req.finish_reason is None and not s.failed]:
        await _wait_any(open_, DISCONNECT_POLL_S)
        if not any(s.ready() for s in open_) and gone(request):
            return web.Response(status=499)
    if any(s.failed for s in streams):
        return _error(500, DEAD)
    choices = [
        enc.full_choice(s.req.output_text(), s.req.finish_reason or "", s.req.stop_reason)
        for enc, s in zip(encs, streams, strict=True)
    ]
    return web.Response(body=encs[0].body(choices, _usage(streams, n)), content_type=JSON)


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        body=api.SimApiError(status, message).body(), status=status, content_type=JSON
    )


async def _stream(
    sim: SimEngine,
    request: web.Request,
    encs: list[encoder.Encoder],
    streams: list[Stream],
    n: int,
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    for s in streams:
        sim.register_stream(s, request)
    try:
        await resp.prepare(request)
        await resp.write(b"".join(enc.first() for enc in encs))
        open_ = list(range(len(streams)))
        while open_:
            await _wait_any([streams[i] for i in open_])
            out = b""
            for i in list(open_):
                s, enc = streams[i], encs[i]
                req = s.req
                if s.failed:
                    await resp.write(out + enc.error(DEAD))
                    return resp
                if req.finish_reason == "abort" and gone(request):
                    return resp  # aborted by the sweep: nobody to write to
                taken, text = s.take_text()
                done = req.finish_reason is not None and s.sent == req.num_output
                if taken or done:
                    usage = api.usage(req.num_prompt, req.num_output, req.num_cached_tokens or 0)
                    cont = usage if enc.job.continuous_usage else None
                    finish = req.finish_reason if done else None
                    out += enc.delta(text, finish, cont, req.stop_reason)
                if done:
                    open_.remove(i)
            if out:
                await resp.write(out)
        await resp.write(encs[0].tail(_usage(streams, n)))
        await resp.write_eof()
    except ConnectionResetError:
        log.debug("client gone rid=%s", encs[0].rid)
    finally:
        for s in streams:
            sim.unregister_stream(s)
    return resp
