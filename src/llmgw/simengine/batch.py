"""A completions request whose `prompt` is a batch: one engine request per prompt, one
answer with a choice per prompt (`index` in the batch's order), as vLLM serves it.

Usage is summed over the prompts. A stream writes each choice's tokens as they come,
under its index, every choice's last chunk with its finish reason, then one usage chunk
(when asked for) and `[DONE]`. The injected cut faults (stall, error after N tokens)
apply to single prompts only.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from llmgw.simengine import api, tokenizer
from llmgw.simengine.conn import DEAD, DISCONNECT_POLL_S, JSON, SSE_HEADERS, gone
from llmgw.simengine.engine import Stream

if TYPE_CHECKING:
    from llmgw.simengine.app import SimEngine

log = logging.getLogger(__name__)


def _usage(streams: list[Stream]) -> dict[str, Any]:
    reqs = [s.req for s in streams]
    return api.usage(
        sum(r.num_prompt for r in reqs),
        sum(r.num_output for r in reqs),
        sum(r.num_cached_tokens or 0 for r in reqs),
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


async def generate(sim: SimEngine, request: web.Request, jobs: list[api.Job]) -> web.StreamResponse:
    """Run every prompt of the batch `jobs` and answer them as one."""
    refused = await sim.admit(jobs[0])
    if refused is not None:
        return refused
    rid = sim.new_id("cmpl")
    created = int(time.time())
    # vLLM's own ids of a batch's requests: the response's id, then "-" and the index.
    streams = [sim.engine.submit(sim.sim_request(f"{rid}-{i}", j)) for i, j in enumerate(jobs)]
    encs = [api.Encoder(j, rid, created, i) for i, j in enumerate(jobs)]
    try:
        if jobs[0].stream:
            return await _stream(sim, request, encs, streams)
        return await _complete(request, encs, streams)
    finally:
        for s in streams:
            sim.done(request, s)


async def _complete(
    request: web.Request, encs: list[api.Encoder], streams: list[Stream]
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
        enc.full_choice(tokenizer.output_text(s.req.output_ids()), s.req.finish_reason or "")
        for enc, s in zip(encs, streams, strict=True)
    ]
    return web.Response(body=encs[0].body(choices, _usage(streams)), content_type=JSON)


def _error(status: int, message: str) -> web.Response:
    return web.Response(
        body=api.SimApiError(status, message).body(), status=status, content_type=JSON
    )


async def _stream(
    sim: SimEngine, request: web.Request, encs: list[api.Encoder], streams: list[Stream]
) -> web.StreamResponse:
    resp = web.StreamResponse(headers=SSE_HEADERS)
    for s in streams:
        sim.register_stream(s, request)
    try:
        await resp.prepare(request)
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
                ids = s.take()
                done = req.finish_reason is not None and s.sent == req.num_output
                if ids or done:
                    usage = api.usage(req.num_prompt, req.num_output, req.num_cached_tokens or 0)
                    cont = usage if enc.job.continuous_usage else None
                    finish = req.finish_reason if done else None
                    out += enc.delta(tokenizer.output_text(ids), finish, cont)
                if done:
                    open_.remove(i)
            if out:
                await resp.write(out)
        await resp.write(encs[0].tail(_usage(streams)))
        await resp.write_eof()
    except ConnectionResetError:
        log.debug("client gone rid=%s", encs[0].rid)
    finally:
        for s in streams:
            sim.unregister_stream(s)
    return resp
