"""Injected faults, for the router's reliability tests.

- `fail_rate` p: each inference request is answered `fail_status` (500 by
  default; 429 or another 5xx) with vLLM's error body, with probability p,
  before any byte of a response; `retry_after_s` n adds `Retry-After: n` to
  that answer, as an overloaded server behind a gateway would.
- `stall_after_tokens` n: a request stops producing output after n tokens and
  the connection stays open, silent, until the client gives up (streaming and
  not). The request leaves the engine's batch, as if it hung in the frontend.
- `error_after_tokens` n: after n tokens a stream gets vLLM's mid-stream error
  frame and `data: [DONE]`; a non-streaming request gets a 500. Counted as
  finished_reason "error".
- `crash_after_requests` n: inference requests are counted as they arrive; the
  one that would be number n+1 makes the process exit at once (`os._exit(70)`),
  cutting every open connection. Setting it through `POST /sim/faults` restarts
  the count, so it means "after n more requests".
- `linger_after_done_s` s: a stream stays open s seconds after its `data: [DONE]`
  before the body ends (a slow frontend), so a client that closes at `[DONE]`
  lands in that moment: the race the router must count as complete.
- `loop_error_after_steps` n: the engine's scheduling loop raises after n more
  steps (a test hook for the loop guard in app.py: the engine then dies as
  vLLM's does on EngineDeadError). Setting it restarts the count.

`POST /sim/faults` (loopback only) takes a JSON object with any of these keys;
`null` clears a count (and 0.0 a rate); keys not given keep their value.
"""

from __future__ import annotations

import random
from enum import Enum

import msgspec

CRASH_EXIT_CODE = 70  # EX_SOFTWARE


class FaultConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    fail_rate: float = 0.0  # 0..1
    stall_after_tokens: int | None = None  # None: never
    crash_after_requests: int | None = None  # None: never
    error_after_tokens: int | None = None  # None: never
    fail_status: int = 500  # what fail_rate answers: 429 or 5xx
    retry_after_s: int | None = None  # None: no Retry-After on a fail_rate answer
    loop_error_after_steps: int | None = None  # None: never
    linger_after_done_s: float = 0.0  # 0: the body ends with [DONE]

    def validate(self) -> FaultConfig:
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError("fail_rate must be within [0, 1]")
        if not (self.fail_status == 429 or 500 <= self.fail_status <= 599):
            raise ValueError("fail_status must be 429 or 5xx")
        if not 0.0 <= self.linger_after_done_s <= 60.0:
            raise ValueError("linger_after_done_s must be within [0, 60]")
        names = (
            "stall_after_tokens",
            "crash_after_requests",
            "error_after_tokens",
            "retry_after_s",
            "loop_error_after_steps",
        )
        for name in names:
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name} must be >= 0")
        return self


class FaultPatch(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A change to the faults: UNSET keeps the current value, None clears it."""

    fail_rate: float | msgspec.UnsetType = msgspec.UNSET
    stall_after_tokens: int | msgspec.UnsetType | None = msgspec.UNSET
    crash_after_requests: int | msgspec.UnsetType | None = msgspec.UNSET
    error_after_tokens: int | msgspec.UnsetType | None = msgspec.UNSET
    fail_status: int | msgspec.UnsetType = msgspec.UNSET
    retry_after_s: int | msgspec.UnsetType | None = msgspec.UNSET
    loop_error_after_steps: int | msgspec.UnsetType | None = msgspec.UNSET
    linger_after_done_s: float | msgspec.UnsetType = msgspec.UNSET


class Verdict(Enum):
    SERVE = "serve"
    FAIL = "fail"  # answer fail_status before any byte
    CRASH = "crash"  # exit the process now


class Faults:
    """The current fault settings and the per-request decisions they imply."""

    def __init__(self, config: FaultConfig, *, seed: int = 0) -> None:
        self._config = config.validate()
        self._rng = random.Random(seed)
        self._counted = 0  # inference requests seen since crash_after_requests was set
        self._steps = 0  # engine steps since loop_error_after_steps was set

    @property
    def config(self) -> FaultConfig:
        return self._config

    def update(self, patch: FaultPatch) -> FaultConfig:
        """Apply a patch atomically (validated first: nothing half-applied)."""
        changes = {
            f: getattr(patch, f)
            for f in patch.__struct_fields__
            if getattr(patch, f) is not msgspec.UNSET
        }
        new = msgspec.structs.replace(self._config, **changes).validate()
        if "crash_after_requests" in changes:
            self._counted = 0
        if "loop_error_after_steps" in changes:
            self._steps = 0
        self._config = new
        return new

    def admit(self) -> Verdict:
        """Decide the fate of one arriving inference request."""
        c = self._config
        self._counted += 1
        if c.crash_after_requests is not None and self._counted > c.crash_after_requests:
            return Verdict.CRASH
        if c.fail_rate > 0.0 and self._rng.random() < c.fail_rate:
            return Verdict.FAIL
        return Verdict.SERVE

    def cut_after(self) -> tuple[int | None, int | None]:
        """(stall_after_tokens, error_after_tokens) for a request admitted now."""
        return self._config.stall_after_tokens, self._config.error_after_tokens

    def fail_answer(self) -> tuple[int, dict[str, str]]:
        """(status, extra headers) of a request that fail_rate fails."""
        c = self._config
        headers = {} if c.retry_after_s is None else {"Retry-After": str(c.retry_after_s)}
        return c.fail_status, headers

    def step(self) -> None:
        """Count one engine step; raises once loop_error_after_steps is reached."""
        limit = self._config.loop_error_after_steps
        if limit is None:
            return
        self._steps += 1
        if self._steps > limit:
            raise RuntimeError("simulated engine loop failure (loop_error_after_steps)")
