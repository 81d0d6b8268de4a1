"""Sleep mode, as vLLM's dev-mode routes answer it (vllm/entrypoints/serve/dev/sleep/).

Routes (only with `VLLM_SERVER_DEV_MODE=1` in the environment, as vLLM registers them):
    POST /sleep?level=0|1|2[&mode=abort|wait|keep]  {"status": "sleeping", "level": N}
    POST /wake_up[?tags=weights&tags=kv_cache]       {"status": "awake"|"sleeping", "tags": …}
    GET  /is_sleeping                                {"is_sleeping": bool}
A sleep needs `--enable-sleep-mode` (vLLM's cumem allocator); without it the
sim-engine answers 400 rather than vLLM's internal error. Level 0 only pauses
scheduling; level 1 drops the KV cache and moves the weights to host memory;
level 2 drops both. Waking with some tags leaves the rest asleep, and the engine
stays asleep until every tag is back (vLLM's executor keeps `sleeping_tags`).

Unlike vLLM, whose API-key middleware guards only `/v1`, `/v2`, `/inference`
and `/cohere`, the sim-engine requires its `--api-key` on these routes too: it
behaves as vLLM does with the agent's guard middleware in place (docs/security.md).

What a sleep costs, with defaults from vLLM's published sleep-mode figures:
    wake, level 1: WAKE_L1_BASE_S + WAKE_L1_S_PER_GB × weight GB per GPU
        (the weights copied back from host memory: 0.1-0.8 s for small models,
        2.85-2.89 s for a 30B on one card, 5.27-5.66 s for a 235B on four);
    wake, level 2: WAKE_L2_BASE_S + WAKE_L2_S_PER_GB × weight GB per GPU
        (0.85-2.58 s for small models, and the weights read again);
    GPU memory: AWAKE_GIB per GPU awake, ASLEEP_GIB asleep (an H100's engine
        goes from 73.9 to 1.4 GiB); level 0 keeps it all;
    the first request after a wake runs COLD_FACTOR times slower (5.8-7.1×)
        unless a request (the agent's one-token warm-up) went first;
    a sleep at level 1 or 2 answers after `--sleep-s` (default 0: at once).
`--speed` divides the wake and sleep times as it divides step times. Flags override each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

DEFAULT_WEIGHTS_GB = 16.06  # Llama-3-8B in bf16, as timing.py
WAKE_L1_BASE_S = 0.05
WAKE_L1_S_PER_GB = 0.046
WAKE_L2_BASE_S = 0.85
WAKE_L2_S_PER_GB = 0.10
COLD_FACTOR = 6.5
AWAKE_GIB = 73.9
ASLEEP_GIB = 1.4
GIB = 1024**3

TAGS = ("weights", "kv_cache")
PAUSE_MODES = ("abort", "wait", "keep")
SleepState = Literal["awake", "weights_offloaded", "discard_all", "paused"]


class SleepRefused(Exception):
    """A sleep or wake the engine does not do; `status` and `message` for the answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass(frozen=True, kw_only=True)
class SleepSettings:
    """`--enable-sleep-mode`, VLLM_SERVER_DEV_MODE and the cost model's knobs."""

    enabled: bool = False
    # The routes exist (vLLM: VLLM_SERVER_DEV_MODE=1).
    dev_mode: bool = False
    # The whole model's weights; each of `tp` GPUs holds 1/tp of them.
    weights_gb: float = DEFAULT_WEIGHTS_GB
    # Fixed wake times per level; None: from the weights (module docstring).
    wake_l1_s: float | None = None
    wake_l2_s: float | None = None
    # Seconds a sleep at level 1 or 2 takes before it answers (vLLM copies the weights
    # to host memory: 0.4 s for 8 GB to 6 s for a 235B on four cards); 0: at once.
    sleep_s: float = 0.0
    cold_factor: float = COLD_FACTOR
    awake_gib: float = AWAKE_GIB
    asleep_gib: float = ASLEEP_GIB

    def __post_init__(self) -> None:
        if self.weights_gb <= 0:
            raise ValueError("--weights-gb must be > 0")
        if min(self.wake_l1_s or 0.0, self.wake_l2_s or 0.0) < 0:
            raise ValueError("wake times cannot be negative")
        if self.sleep_s < 0:
            raise ValueError("--sleep-s cannot be negative")
        if self.cold_factor < 1:
            raise ValueError("--cold-factor must be >= 1")
        if not 0 <= self.asleep_gib <= self.awake_gib:
            raise ValueError("need 0 <= asleep GiB <= awake GiB")

    def wake_s(self, *, level: int, tp: int, speed: float) -> float:
        """Seconds a wake from `level` takes for this model on `tp` GPUs."""
        per_gpu_gb = self.weights_gb / tp
        if level == 0:
            raw = 0.0
        elif level == 1:
            raw = (
                self.wake_l1_s
                if self.wake_l1_s is not None
                else WAKE_L1_BASE_S + WAKE_L1_S_PER_GB * per_gpu_gb
            )
        else:
            raw = (
                self.wake_l2_s
                if self.wake_l2_s is not None
                else WAKE_L2_BASE_S + WAKE_L2_S_PER_GB * per_gpu_gb
            )
        return raw / speed


@dataclass
class Sleeper:
    """The engine's sleep state: which tags are asleep, and at which level."""

    settings: SleepSettings
    tp: int = 1
    speed: float = 1.0
    # 0 while awake or only paused (level 0); else the level of the last sleep.
    level: int = 0
    paused: bool = False
    asleep: set[str] = field(default_factory=set)
    sleeps: int = 0
    # Wakes that woke something, and every /wake_up answered (one on an awake engine
    # included: what a caller repeating its wake would show).
    wakes: int = 0
    wake_calls: int = 0

    @property
    def sleeping(self) -> bool:
        return self.paused or bool(self.asleep)

    @property
    def state(self) -> SleepState:
        if self.asleep:
            return "discard_all" if self.level == 2 else "weights_offloaded"
        return "paused" if self.paused else "awake"

    def sleep(self, level: int) -> None:
        """Fall asleep at `level`; SleepRefused when sleep mode is off or the level is wrong."""
        if level not in (0, 1, 2):
            raise SleepRefused(400, f"level must be 0, 1 or 2, not {level}")
        if not self.settings.enabled:
            raise SleepRefused(
                400, "Sleep mode is not enabled: start the engine with --enable-sleep-mode"
            )
        self.paused = True
        if level >= 1 and not self.asleep:
            self.asleep = set(TAGS)
            self.level = level
        self.sleeps += 1

    def wake(self, tags: list[str] | None) -> tuple[bool, float]:
        """Wake `tags` (None: all): (fully awake now, seconds the wake takes)."""
        for tag in tags or ():
            if tag not in (*TAGS, "scheduling"):
                raise SleepRefused(400, f"unknown tag {tag!r}: expected weights, kv_cache")
        self.wake_calls += 1
        waking = set(TAGS) if tags is None else set(tags) & set(TAGS)
        was = self.asleep & waking
        cost = 0.0
        if "weights" in was:
            cost = self.settings.wake_s(level=self.level, tp=self.tp, speed=self.speed)
        self.asleep -= waking
        if not self.asleep:
            if was:
                self.wakes += 1
            self.level = 0
            self.paused = False
        return not self.sleeping, cost

    def gpu_bytes(self) -> int:
        """GPU memory the engine holds per GPU now."""
        gib = self.settings.asleep_gib if self.asleep else self.settings.awake_gib
        return int(gib * GIB)
