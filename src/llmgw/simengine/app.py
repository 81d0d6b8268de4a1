"""The sim-engine's HTTP application (built apart from its runner: runtime.serve runs it).

Routes: the OpenAI surface (`/v1/chat/completions`, `/v1/completions`,
`/v1/embeddings`, `/v1/models`), `/health`, `/version`, `/metrics`, the other
APIs vLLM serves (`routes.py`: Responses, Anthropic Messages, tokenize, rerank,
score, audio), and the loopback-only debug routes of `debug.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from typing import NoReturn, TypeVar

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from llmgw.runtime.logs import kv
from llmgw.simengine import (
    api,
    auth,
    batch,
    debug,
    encoder,
    metrics,
    modelcards,
    routes,
    sleepapi,
    tokenizer,
)
from llmgw.simengine.batcher import Scheduler, SimRequest, mix_seed
from llmgw.simengine.config import SimConfig
from llmgw.simengine.conn import DEAD, DISCONNECT_POLL_S, JSON, SSE_HEADERS, gone
from llmgw.simengine.engine import Engine, Stream
from llmgw.simengine.faults import CRASH_EXIT_CODE, Faults, Verdict
from llmgw.simengine.kvcache import KVCache
from llmgw.simengine.kvevents import KVEventPublisher
from llmgw.simengine.lora import LoraRegistry
from llmgw.simengine.lora import handlers as lora_handlers
from llmgw.simengine.metricsnames import histogram_buckets
from llmgw.simengine.requestlog import RequestLog
from llmgw.simengine.sleep import Sleeper
from llmgw.simengine.stats import EngineStats
from llmgw.simengine.stops import StopScan

log = logging.getLogger(__name__)

# Not a vLLM header: lets a benchmark on the same host replay exactly what the engine saw.
ARRIVAL_HEADER = "x-llmgw-sim-arrival"
# A dead engine exits non-zero (as vLLM does after EngineDeadError) so a supervisor
# restarts it; this long after the loop died, so that requests get their 500s
# written and a health probe can see the 503 first.
ENGINE_DEAD_EXIT_CODE = 1
DEAD_EXIT_DELAY_S = 2.0


def _crash() -> NoReturn:
    log.warning("crash fault: exiting code=%d", CRASH_EXIT_CODE)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(CRASH_EXIT_CODE)


def _die() -> NoReturn:
    log.error("engine dead: exiting code=%d", ENGINE_DEAD_EXIT_CODE)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(ENGINE_DEAD_EXIT_CODE)


def _cut(stall_after: int | None, error_after: int | None) -> tuple[int | None, bool]:
    """Where a fault cuts a request (None: nowhere), and whether that cut is the error one."""
    if error_after is not None and (stall_after is None or error_after <= stall_after):
        return error_after, True
    return stall_after, False


def _arrival(req: SimRequest) -> dict[str, str]:
    """When the engine took the request in, on this host's CLOCK_MONOTONIC (for benchmarks)."""
    return {ARRIVAL_HEADER: f"{req.arrival_s:.6f}"}


def json_response(body: bytes, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type=JSON)


def error_response(exc: api.SimApiError) -> web.Response:
    return json_response(exc.body(), exc.status)


J = TypeVar("J")
# Long prompts are legitimate; vLLM has no body limit either.
MAX_BODY_BYTES = 256 * 1024 * 1024


async def read_request(
    request: web.Request, parse: Callable[[bytes, SimConfig], J], cfg: SimConfig
) -> J | web.Response:
    """The one way a request body comes in: read, parsed, or refused in vLLM's shape.

    Whatever the body is (too large, broken framing, not JSON, nested deeper than
    the decoder goes, wrong types), the answer is a 4xx error body and one log line.
    """
    try:
        return parse(await request.read(), cfg)
    except web.HTTPRequestEntityTooLarge:
        exc = api.SimApiError(413, f"Request body is larger than {MAX_BODY_BYTES} bytes.")
    except web.RequestPayloadError as err:
        exc = api.SimApiError(400, f"Malformed request body: {err}")
    except RecursionError:
        exc = api.SimApiError(400, "Malformed JSON body: nested too deeply")
    except api.SimApiError as err:
        # A copy, not `err`: kept in this frame, the raised one's traceback would hold the
        # frame, a cycle only a full collection frees, and with it the decoded body (a
        # refused 7.9 MB body stayed in memory until then).
        exc = api.SimApiError(err.status, err.message, param=err.param)
    log.warning(kv("refused request", status=exc.status, path=request.path, why=exc.message[:120]))
    return error_response(exc)


class SimEngine:
    """The engine, its faults and counters, and the request handlers."""

    def __init__(
        self,
        cfg: SimConfig,
        *,
        crash: Callable[[], NoReturn] = _crash,
        die: Callable[[], NoReturn] = _die,
    ) -> None:
        self.cfg = cfg
        self.kv = KVCache(num_gpu_blocks=cfg.num_gpu_blocks, block_size=cfg.block_size)
        self.stats = EngineStats(histogram_buckets(cfg.metrics_dialect, cfg.max_model_len))
        self.scheduler = Scheduler(
            kv=self.kv,
            stats=self.stats,
            max_num_seqs=cfg.max_num_seqs,
            max_num_batched_tokens=cfg.max_num_batched_tokens,
            max_model_len=cfg.max_model_len,
            policy=cfg.scheduling_policy,
            max_loras=cfg.lora.max_loras if cfg.lora.enabled else None,
        )
        self.engine = Engine(self.scheduler, cfg.timing)
        self.sleeper = Sleeper(cfg.sleep, tp=cfg.timing.tp, speed=cfg.timing.speed)
        self.faults = Faults(cfg.faults, seed=cfg.seed)
        self.engine.before_step = self.faults.step
        # vLLM's KV events (kvevents.py), published after each step; ValueError
        # (no pyzmq, address taken) stops the engine before it serves.
        self.kv_events = KVEventPublisher(cfg.kv_events, self.kv) if cfg.kv_events.enabled else None
        if self.kv_events is not None:
            self.engine.after_schedule = self.kv_events.flush
        # OSError (a path that cannot be written) stops the engine before it serves.
        self.request_log = RequestLog(cfg.request_log) if cfg.request_log else None
        self._crash = crash
        self._die = die
        self.dead = False  # the engine loop raised: every request fails, then the process exits
        self.created_wall = time.time()
        self._ids = itertools.count(1)
        self._id_prefix = os.urandom(4).hex()  # ids stay unique across restarts
        self._stopping = asyncio.Event()
        self.lora = LoraRegistry(cfg.lora, speed=cfg.timing.speed)
        self.lora.on_change = self._adapters_changed
        self._models_body = modelcards.models_body(cfg, int(self.created_wall), self.lora.names)
        self._cache_info = _cache_info(cfg)
        # Open streams and their requests, for `_sweep_gone`.
        self._streams: dict[Stream, web.Request] = {}
        # The last request's W3C trace context, for /sim/state (debug.trace_recorder).
        self.last_trace: dict[str, str] = {}

    # -- lifecycle ---------------------------------------------------------------

    async def lifespan(self, _app: web.Application) -> AsyncIterator[None]:
        tasks = [
            asyncio.create_task(self.run_engine(), name="sim-engine-loop"),
            asyncio.create_task(self._sweep_gone(), name="sim-engine-sweep"),
        ]
        if self.kv_events is not None:
            tasks.append(asyncio.create_task(self.kv_events.serve_replay(), name="kv-replay"))
        try:
            yield
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            if self.kv_events is not None:
                self.kv_events.close()
            if self.request_log is not None:
                self.request_log.close()

    async def run_engine(self) -> None:
        """The engine loop, guarded: if it raises, the engine is dead, not silently stuck.

        Without the guard the task would end with its exception unseen while
        /health kept answering 200 and every request waited forever. As vLLM
        does on EngineDeadError: log it, fail what is open (500), answer /health
        503, and exit non-zero.
        """
        try:
            await self.engine.run()
        except Exception:
            log.exception("engine loop failed; the engine is dead")
            self.dead = True
            failed = self.engine.fail_all()
            log.error("failing %d open requests, exiting in %gs", len(failed), DEAD_EXIT_DELAY_S)
            await asyncio.sleep(DEAD_EXIT_DELAY_S)
            self._die()

    async def _sweep_gone(self) -> None:
        """Abort streams whose client left while they had nothing to write.

        A stream notices a lost client only when it writes, and a request in the
        waiting queue writes nothing: without this it would keep its place, be
        counted as waiting and later run for nobody. vLLM aborts it at once (its
        server listens for the disconnect), so a router cancelling a queued
        request sees the queue shrink here too. One pass per poll interval, for
        every stream at once, rather than a timer per token wait.
        """
        while True:
            await asyncio.sleep(DISCONNECT_POLL_S)
            for stream in [s for s, r in self._streams.items() if gone(r) and not s.failed]:
                self.engine.abort(stream)

    async def on_shutdown(self, _app: web.Application) -> None:
        # Stalled requests would hold the graceful stop for the whole grace period.
        self._stopping.set()

    # -- OpenAI surface ------------------------------------------------------------

    def _adapters_changed(self) -> None:
        self._models_body = modelcards.models_body(
            self.cfg, int(self.created_wall), self.lora.names
        )

    def _parse_chat(self, raw: bytes, cfg: SimConfig) -> api.Job:
        return api.parse_chat(raw, cfg, self.lora.names)

    def _parse_completions(self, raw: bytes, cfg: SimConfig) -> list[api.Job]:
        return api.parse_completions(raw, cfg, self.lora.names)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        job = await read_request(request, self._parse_chat, self.cfg)
        if isinstance(job, web.Response):
            return job
        if job.n > 1:
            return await batch.generate(self, request, [job], "chatcmpl")
        return await self._generate(request, job, "chatcmpl")

    async def completions(self, request: web.Request) -> web.StreamResponse:
        jobs = await read_request(request, self._parse_completions, self.cfg)
        if isinstance(jobs, web.Response):
            return jobs
        if len(jobs) > 1 or jobs[0].n > 1:
            return await batch.generate(self, request, jobs, "cmpl")
        return await self._generate(request, jobs[0], "cmpl")

    async def embeddings(self, request: web.Request) -> web.StreamResponse:
        job = await read_request(request, api.parse_embeddings, self.cfg)
        if isinstance(job, web.Response):
            return job
        if self.dead:
            return error_response(api.SimApiError(500, DEAD))
        verdict = self.faults.admit()
        if verdict is Verdict.CRASH:
            self._crash()
        if verdict is Verdict.FAIL:
            return self._fail_answer()
        # Embeddings bypass the batch: one prefill-only step's time, no queueing.
        n = sum(len(ids) for ids in job.inputs)
        await asyncio.sleep(self.cfg.timing.step_s(prefill_tokens=n, decode_seqs=0))
        data = []
        for i, ids in enumerate(job.inputs):
            vec = api.embedding(ids, job.dims)
            data.append(
                {
                    "index": i,
                    "object": "embedding",
                    "embedding": api.embedding_b64(vec) if job.base64 else vec,
                }
            )
        body = {
            "id": f"embd-{self._id_prefix}{next(self._ids):08x}",
            "object": "list",
            "created": int(time.time()),
            "model": job.model,
            "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0},
        }
        return json_response(msgspec.json.encode(body))

    async def models(self, _request: web.Request) -> web.StreamResponse:
        return json_response(self._models_body)

    async def health(self, _request: web.Request | None) -> web.StreamResponse:
        return web.Response(status=503 if self.dead else 200)

    async def version(self, _request: web.Request) -> web.StreamResponse:
        from llmgw import __version__

        return json_response(msgspec.json.encode({"version": f"llmgw-sim-{__version__}"}))

    async def metrics(self, _request: web.Request) -> web.StreamResponse:
        kv = self.kv
        view = metrics.EngineView(
            running=self.scheduler.num_running,
            waiting=self.scheduler.num_waiting,
            kv_usage=kv.usage,
            used_blocks=kv.capacity_blocks - kv.num_free_blocks,
            capacity_blocks=kv.capacity_blocks,
            block_size=kv.block_size,
            sleep_state=self.sleeper.state,
            gpu_bytes=self.sleeper.gpu_bytes(),
        )
        if self.cfg.metrics_dialect == "sglang":
            text = metrics.render_sglang(self.stats, view, model_name=self.cfg.model_name)
        else:
            text = metrics.render_vllm(
                self.stats,
                view,
                model_name=self.cfg.model_name,
                cache_info=self._cache_info,
                created_wall=self.created_wall,
            )
        return web.Response(
            body=text, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"}
        )

    # -- generation ------------------------------------------------------------------

    async def _generate(
        self,
        request: web.Request,
        job: api.Job,
        kind: str,
        make: Callable[[api.Job, str, int], encoder.AnyEncoder] = encoder.Encoder,
    ) -> web.StreamResponse:
        refused = await self.admit(job)
        if refused is not None:
            return refused
        rid = self.new_id(kind)
        req = self.sim_request(rid, job)
        stall_after, error_after = self.faults.cut_after()
        stream = self.engine.submit(req)
        enc = make(job, rid, int(time.time()))
        try:
            if job.stream:
                return await self._stream(request, job, enc, stream, stall_after, error_after)
            return await self._complete(request, enc, stream, stall_after, error_after)
        finally:
            self.done(request, stream)

    async def admit(self, job: api.Job) -> web.Response | None:
        """The answer to a request the engine does not run (dead, a fault); None: run it."""
        if self.dead:
            return error_response(api.SimApiError(500, DEAD))
        verdict = self.faults.admit()
        if verdict is Verdict.CRASH:
            self._crash()
        if verdict is Verdict.FAIL:
            return self._fail_answer()
        if job.model in self.lora.names:
            # Read in on first use (lora.py); its wait is part of time to first token.
            await self.lora.use(job.model)
        return None

    def new_id(self, kind: str) -> str:
        return f"{kind}-{self._id_prefix}{next(self._ids):024x}"

    def sim_request(self, rid: str, job: api.Job, choice: int = 0) -> SimRequest:
        """The engine request of `job`'s choice `choice` (0 .. n-1), seeded `seed + choice`
        as vLLM seeds a request's n children."""
        seed = job.seed if job.seed is not None else tokenizer.prompt_seed(job.prompt_ids)
        return SimRequest(
            rid,
            job.prompt_ids,
            arrival_s=self.engine.now(),
            max_tokens=job.max_tokens,
            seed=mix_seed(seed + choice, self.cfg.seed),
            ignore_eos=job.ignore_eos,
            min_tokens=job.min_tokens,
            params_max_tokens=job.params_max_tokens,
            priority=job.priority,
            adapter=job.model if job.model in self.lora.names else None,
            params_n=job.n if choice == 0 else None,
            stop=StopScan(job.stops, include=job.include_stop) if job.stops else None,
            script=job.script,
        )

    def done(self, request: web.Request, stream: Stream) -> None:
        """A request's handler is over: out of the engine, and into the request log."""
        req = stream.req
        if stream.failed:
            pass  # the dead engine's scheduler is not to be touched again
        elif req.finish_reason is None:
            self.engine.abort(stream)  # client gone, or a fault cut it short
        else:
            self.engine.release(stream)
        if self.request_log is not None:
            self.request_log.write(req, request.headers.get("x-request-id"))

    def register_stream(self, stream: Stream, request: web.Request) -> None:
        """An open stream, for `_sweep_gone`, until `unregister_stream`."""
        self._streams[stream] = request

    def unregister_stream(self, stream: Stream) -> None:
        del self._streams[stream]

    def _fail_answer(self) -> web.Response:
        status, headers = self.faults.fail_answer()
        resp = error_response(api.SimApiError(status, "simulated failure (fail_rate)"))
        resp.headers.update(headers)
        return resp

    def _usage(self, req: SimRequest) -> dict[str, object]:
        return api.usage(req.num_prompt, req.num_output, req.num_cached_tokens or 0)

    async def _stream(
        self,
        request: web.Request,
        job: api.Job,
        enc: encoder.AnyEncoder,
        stream: Stream,
        stall_after: int | None,
        error_after: int | None,
    ) -> web.StreamResponse:
        req = stream.req
        cut, error_first = _cut(stall_after, error_after)
        resp = web.StreamResponse(headers={**SSE_HEADERS, **_arrival(req)})
        self._streams[stream] = request
        try:
            await resp.prepare(request)
            pending = enc.first()
            while True:
                await stream.wait_output()
                if stream.failed:
                    await resp.write(enc.error(DEAD))
                    return resp
                if req.finish_reason == "abort" and gone(request):
                    return resp  # aborted by _sweep_gone: nobody to write to
                taken, text = stream.take_text(None if cut is None else cut - stream.sent)
                done = req.finish_reason is not None and stream.sent == req.num_output
                if taken or done:
                    usage = self._usage(req) if job.continuous_usage else None
                    finish = req.finish_reason if done else None
                    pending += enc.delta(text, finish, usage, req.stop_reason)
                if pending:
                    await resp.write(pending)
                    pending = b""
                if done:
                    break
                if cut is not None and stream.sent >= cut:
                    if error_first:
                        self.engine.abort(stream, reason="error")
                        await resp.write(enc.error("simulated error (error_after_tokens)"))
                        return resp
                    self.engine.abort(stream)
                    await self._hold(request)
                    return resp
            await resp.write(enc.tail(self._usage(req)))
            await self._linger()
            await resp.write_eof()
        except ConnectionResetError:
            log.debug("client gone rid=%s", req.req_id)
        finally:
            del self._streams[stream]
        return resp

    async def _complete(
        self,
        request: web.Request,
        enc: encoder.AnyEncoder,
        stream: Stream,
        stall_after: int | None,
        error_after: int | None,
    ) -> web.StreamResponse:
        req = stream.req
        cut, error_first = _cut(stall_after, error_after)
        # Wake only at the end (or at the cut), not for every token.
        stream.per_token = False
        stream.wake_at = cut
        while req.finish_reason is None:
            if cut is not None and req.num_output >= cut:
                if error_first:
                    self.engine.abort(stream, reason="error")
                    return error_response(
                        api.SimApiError(500, "simulated error (error_after_tokens)")
                    )
                self.engine.abort(stream)
                await self._hold(request)
                return web.Response(status=500)
            try:
                await asyncio.wait_for(stream.wait_output(), DISCONNECT_POLL_S)
            except TimeoutError:
                if gone(request):
                    return web.Response(status=499)
            if stream.failed:
                return error_response(api.SimApiError(500, DEAD))
        body = enc.full(req.output_text(), req.finish_reason, self._usage(req), req.stop_reason)
        resp = json_response(body)
        resp.headers.update(_arrival(req))
        return resp

    async def _linger(self) -> None:
        """The linger_after_done_s fault: the body's end comes this much after [DONE]."""
        linger = self.faults.config.linger_after_done_s
        if linger > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), linger)

    async def _hold(self, request: web.Request) -> None:
        """Stay silent until the client leaves or the server stops (the stall fault)."""
        while not self._stopping.is_set() and not gone(request):
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), DISCONNECT_POLL_S)


def _cache_info(cfg: SimConfig) -> dict[str, str]:
    """vllm:cache_config_info labels: CacheConfig fields as strings, as vLLM writes them."""
    return {
        "block_size": str(cfg.block_size),
        "cache_dtype": "auto",
        "enable_prefix_caching": "True",
        "gpu_memory_utilization": "0.9",
        "is_attention_free": "False",
        "kv_cache_max_concurrency": str(cfg.kv_capacity_tokens / cfg.max_model_len),
        "kv_cache_size_tokens": str(cfg.kv_capacity_tokens),
        "num_cpu_blocks": "None",
        "num_gpu_blocks": str(cfg.num_gpu_blocks),
        "num_gpu_blocks_override": "None",
        "prefix_caching_hash_algo": "sim_blake2b",
        "sliding_window": "None",
    }


SIM_KEY = web.AppKey("sim", SimEngine)


def build_app(
    cfg: SimConfig,
    *,
    crash: Callable[[], NoReturn] = _crash,
    die: Callable[[], NoReturn] = _die,
) -> web.Application:
    sim = SimEngine(cfg, crash=crash, die=die)
    middlewares: list[Middleware] = [debug.loopback_only, debug.trace_recorder(sim)]
    if cfg.api_keys:
        middlewares.append(auth.middleware(cfg.api_keys))
    app = web.Application(client_max_size=MAX_BODY_BYTES, middlewares=middlewares)
    app[SIM_KEY] = sim
    app.cleanup_ctx.append(sim.lifespan)
    app.on_shutdown.append(sim.on_shutdown)
    r = app.router
    r.add_post("/v1/chat/completions", sim.chat)
    r.add_post("/v1/completions", sim.completions)
    r.add_post("/v1/embeddings", sim.embeddings)
    r.add_get("/v1/models", sim.models)
    r.add_get("/health", sim.health)
    r.add_get("/version", sim.version)
    r.add_get("/metrics", sim.metrics)
    load, unload = lora_handlers(sim.lora, cfg.served_model_names)
    r.add_post("/v1/load_lora_adapter", load)
    r.add_post("/v1/unload_lora_adapter", unload)
    routes.add_routes(app, sim)
    debug.add_routes(app, sim)
    if cfg.sleep.dev_mode:
        sleepapi.add_routes(app, sim)
    return app
