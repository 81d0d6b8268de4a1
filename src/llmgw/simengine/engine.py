"""The engine loop: one asyncio task that runs scheduler steps in simulated time.

Each step: pick the batch (`Scheduler.schedule`), sleep until the step's end
(`TimingModel.step_s` after its start), apply it (`Scheduler.finish_step`) and
wake the streams that got a token. No busy loop: an idle engine waits on an
event, a busy one sleeps.

Simulated time stays faithful when the process lags: a step starts where the
previous one ended, not when the event loop got round to it, so the CPU work
of delivering tokens (which runs while the engine sleeps) does not stretch the
model's timing, and a burst of arrivals (thousands of requests parsed at once
hold the event loop for a second or two) delays tokens without shifting every
later one. Only when the process falls more than `max_lag_s` (default 5 s)
behind, i.e. the CPU cannot keep up at all, does the timeline slip to the
present, counted in `lag_resets`; bench/sim_engine.py measures where that
starts.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from llmgw.simengine.batcher import Scheduler, SimRequest, StepPlan
from llmgw.simengine.timing import TimingModel

log = logging.getLogger(__name__)


class Stream:
    """The consumer side of one request: which tokens were sent, and a waiter for more.

    A streaming handler wants every token (`per_token`); a non-streaming one
    only the end, or the count `wake_at` where a fault cuts the request, so
    a thousand non-streaming requests do not wake a thousand tasks per step.
    """

    __slots__ = ("_held", "_waiter", "failed", "per_token", "req", "sent", "sent_chars", "wake_at")

    def __init__(self, req: SimRequest) -> None:
        self.req = req
        self.sent = 0  # output tokens already handed to the client
        self.per_token = True
        self.wake_at: int | None = None  # without per_token: wake at this many tokens
        self.failed = False  # the engine died under it: no more tokens will come
        self.sent_chars = 0  # characters of the reply's text handed to the client
        self._held = ""  # text of sent tokens held back: it may begin a stop string
        self._waiter: asyncio.Future[None] | None = None

    def ready(self) -> bool:
        req = self.req
        if req.finish_reason is not None or self.failed:
            return True
        if self.per_token:
            return req.num_output > self.sent
        return self.wake_at is not None and req.num_output >= self.wake_at

    def notify(self) -> None:
        w = self._waiter
        if w is not None and not w.done() and self.ready():
            w.set_result(None)

    async def wait_output(self) -> None:
        """Return once `ready()`: unsent tokens (or the wake count), or the end."""
        while not self.ready():
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def take(self, limit: int | None = None) -> list[int]:
        """Up to `limit` output ids not sent yet (all when None); marks them sent."""
        ids = self.req.output_ids(self.sent)
        if limit is not None and len(ids) > limit:
            ids = ids[: max(limit, 0)]
        self.sent += len(ids)
        return ids

    def take_text(self, limit: int | None = None) -> tuple[int, str]:
        """Up to `limit` output tokens not sent yet, marked sent: how many, and the text to
        write for them. Text that may begin a stop string is held back until the next
        tokens or the end (stops.py), and the end's text is cut where a stop string ended
        the reply."""
        ids = self.take(limit)
        req = self.req
        text = self._held + req.text_of(self.sent - len(ids), self.sent)
        done = req.finish_reason is not None and self.sent == req.num_output
        held = ""
        if done and req.text_end is not None:
            text = text[: max(req.text_end - self.sent_chars, 0)]
        elif not done and req.stop_scan is not None and req.stop_scan.holdback:
            cut = max(len(text) - req.stop_scan.holdback, 0)
            text, held = text[:cut], text[cut:]
        self._held = held
        self.sent_chars += len(text)
        return len(ids), text


class Engine:
    """Owns the scheduler's clock: submit/abort from handlers, `run()` as the one engine task."""

    def __init__(
        self,
        scheduler: Scheduler,
        timing: TimingModel,
        *,
        max_lag_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # time.monotonic, not loop.time(): uvloop's reading is in whole milliseconds and
        # frozen for a loop iteration, which would skew arrival and step times.
        self.now = clock
        self.scheduler = scheduler
        self.timing = timing
        self.max_lag_s = max_lag_s
        self._streams: dict[str, Stream] = {}
        self._wake = asyncio.Event()
        self._deadline: float | None = None  # end of the last step; None: idle since
        self.lag_resets = 0  # times the timeline slipped because the CPU fell behind
        # Asleep (sleep.py): requests wait, no step runs until `resume()`.
        self.paused = False
        # Step times are multiplied by this until a request finishes: an engine just
        # woken runs its first request slowly unless a warm-up went first (sleep.py).
        self.cold_factor = 1.0
        # Called before each step; what it raises ends `run()` (the fault hook, faults.py).
        self.before_step: Callable[[], None] | None = None
        # Called after each step is planned, when the KV cache has taken (and
        # evicted) its blocks: the KV-event publisher's flush (kvevents.py).
        self.after_schedule: Callable[[], None] | None = None

    def submit(self, req: SimRequest) -> Stream:
        stream = Stream(req)
        self._streams[req.req_id] = stream
        self.scheduler.add(req)
        self._wake.set()
        return stream

    def abort(self, stream: Stream, *, reason: str = "abort") -> None:
        """Take the request out of the engine (client gone, injected error); idempotent."""
        self.scheduler.abort(stream.req, reason=reason, now=self.now())
        self._streams.pop(stream.req.req_id, None)
        stream.notify()

    def fail_all(self) -> list[Stream]:
        """The engine died: mark every open stream failed and wake it; returns them."""
        streams = list(self._streams.values())
        self._streams.clear()
        for s in streams:
            s.failed = True
            s.notify()
        return streams

    def pause(self) -> None:
        """Stop stepping (sleep); what is queued waits for `resume()`."""
        self.paused = True

    def resume(self, *, cold_factor: float = 1.0) -> None:
        """Step again; the next request to finish runs `cold_factor` times slower."""
        self.paused = False
        self.cold_factor = cold_factor
        self._wake.set()

    def abort_all(self) -> int:
        """Abort every open request (vLLM's sleep in its default "abort" mode); the count."""
        streams = list(self._streams.values())
        for s in streams:
            self.abort(s)
        return len(streams)

    def release(self, stream: Stream) -> None:
        """Forget a finished request's stream."""
        self._streams.pop(stream.req.req_id, None)

    def begin_step(self, now: float) -> tuple[StepPlan, float, float] | None:
        """Plan the next step: (plan, start, end), or None when nothing can run."""
        d = self._deadline
        if d is not None and now - d > self.max_lag_s:
            self.lag_resets += 1
            d = None
        start = now if d is None else d
        plan = self.scheduler.schedule(start)
        if not plan.scheduled and start < now:
            # Work that arrived after the catch-up start belongs to a step that starts now.
            start = now
            plan = self.scheduler.schedule(start)
        if not plan.scheduled:
            return None
        end = start + self.cold_factor * self.timing.step_s(
            prefill_tokens=plan.prefill_tokens, decode_seqs=plan.decode_seqs
        )
        return plan, start, end

    def end_step(self, plan: StepPlan, end: float) -> None:
        """Apply a step that ended at `end` and wake the streams with news."""
        self._deadline = end
        streams = self._streams
        for req in self.scheduler.finish_step(plan, end):
            if req.finish_reason is not None:
                self.cold_factor = 1.0
            s = streams.get(req.req_id)
            if s is not None:
                s.notify()

    async def run(self) -> None:
        """The engine task: steps while there is work, waits (no spinning) when idle."""
        now = self.now
        while True:
            if self.paused or not self.scheduler.has_work():
                self._deadline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            if self.before_step is not None:
                self.before_step()
            step = self.begin_step(now())
            if self.after_schedule is not None:
                self.after_schedule()
            if step is None:
                # Nothing fits and nothing runs (cannot last: requests are validated
                # to fit the cache); wait for an arrival or an abort to change that.
                self._deadline = None
                self._wake.clear()
                await self._wake.wait()
                continue
            plan, _, end = step
            await asyncio.sleep(0)  # let handlers write what the last step produced
            if (delay := end - now()) > 0:
                await asyncio.sleep(delay)
            # uvloop's timers fire on whole milliseconds, sometimes early: top up once.
            if (delay := end - now()) > 0:
                await asyncio.sleep(delay)
            self.end_step(plan, end)
