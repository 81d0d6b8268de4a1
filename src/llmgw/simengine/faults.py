"""Injected faults, for the router's reliability tests.

- `fail_rate` p: each inference request is answered 500 (vLLM's error body)
  with probability p, before any byte of a response.
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

    def validate(self) -> FaultConfig:
        if not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError("fail_rate must be within [0, 1]")
        for name in ("stall_after_tokens", "crash_after_requests", "error_after_tokens"):
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


class Verdict(Enum):
    SERVE = "serve"
    FAIL = "fail"  # answer 500 before any byte
    CRASH = "crash"  # exit the process now


class Faults:
    """The current fault settings and the per-request decisions they imply."""

    def __init__(self, config: FaultConfig, *, seed: int = 0) -> None:
        self._config = config.validate()
        self._rng = random.Random(seed)
        self._counted = 0  # inference requests seen since crash_after_requests was set

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
