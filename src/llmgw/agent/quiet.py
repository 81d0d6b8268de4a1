"""A sleep waits for its engine to fall quiet: nothing running, nothing waiting.

The controller takes a replica out of the endpoint list in the tick that tells its
agent to sleep it, and a router that has not yet applied the new list may still send
it a request just as the agent calls `/sleep`. In "wait" mode vLLM (and the
sim-engine) finishes what runs, but a request that arrives once the sleep has begun
waits in the paused queue for a wake that may come minutes later, or never (a
sleeper is stopped when its memory is needed): it ends only at the router's request
deadline, a 504 after `request_timeout_s`.

So right before `/sleep` the agent reads the engine's `/metrics`
(`vllm:num_requests_running`, `vllm:num_requests_waiting`, the sim-engine's too).
While a request is there, a router is still sending or has just sent: the sleep is
postponed (the shard stays `ready`; the controller, which already counts the replica
as falling asleep, keeps it out of the endpoint list and keeps listing the sleep, and
the next tick looks again), for up to `wait_s`, the controller's default drain grace,
as a stop's drain waits for the requests in flight. Past that, a router still sending
is broken rather than late: the engine sleeps all the same ("wait" mode still
finishes what runs) rather than hold a swap's cards for it. An engine whose
`/metrics` does not say is put to sleep as before.

A request can still arrive between the read and the `/sleep`, or while the sleep
runs (in "wait" mode it queues behind the running ones; a level-1 sleep copies the
weights out for seconds). The engine holds it asleep, and nothing would wake the
engine for it: its router has it in flight at this replica, not queued in the
router, so it is no demand the controller sees. So once the sleep has answered the
agent reads `/metrics` again (`undo_sleep`): a request there has been caught, and
the engine is woken at once (with its warm-up) and reported `ready` again, the
sleep undone, rather than `sleeping`. The controller still lists the sleep, and
the next tick tries it again under the quiet wait above: postponed while the
caught requests run, done once they are answered. A sleep forced past the wait is
not undone (that would loop: force, undo, wait again), nor is one whose engine
does not say.

What this cannot close: a request sent after that second read, by a router whose
endpoint list is older than the whole sleep. It waits for the engine's next wake,
or for its router's deadline.
"""

from __future__ import annotations

from dataclasses import dataclass, field

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
# The controller's default --drain-grace-s.
QUIET_WAIT_S = 30.0
# A shard not postponed for this long starts a new wait: the controller listed it
# awake in between (a wait is only ever looked at once a tick, a second or less).
_FORGET_AFTER_S = 10.0

Key = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Load:
    """Requests an engine has now, from its /metrics."""

    running: int
    waiting: int

    @property
    def idle(self) -> bool:
        return self.running == 0 and self.waiting == 0

    def __str__(self) -> str:
        return f"{self.running} requests running, {self.waiting} waiting"


def undo_sleep(before: Load | None, after: Load | None) -> bool:
    """Whether a sleep that has just answered is undone (the engine woken again): it
    went ahead on a quiet engine (`before` idle, or not said), and `after` it the
    engine holds requests that arrived meanwhile. A sleep forced past the quiet wait
    (`before` not idle) stays done, or every forced sleep would be undone again."""
    quiet_before = before is None or before.idle
    return quiet_before and after is not None and not after.idle


def parse_load(text: str) -> Load | None:
    """The two gauges from a Prometheus text body, summed over their label sets (one
    per vLLM engine); None when either is missing or unreadable (the engine does not
    say). `vllm:num_requests_waiting_by_reason` and other longer names never match."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        for name in (RUNNING, WAITING):
            if not line.startswith(name):
                continue
            rest = line[len(name) :]
            if rest.startswith("{"):
                end = rest.rfind("}")
                if end < 0:
                    return None
                rest = rest[end + 1 :]
            elif not rest.startswith((" ", "\t")):
                continue  # a longer name
            try:
                value = float(rest.split()[0])
            except (IndexError, ValueError):
                return None
            sums[name] = sums.get(name, 0.0) + value
    if RUNNING not in sums or WAITING not in sums:
        return None
    return Load(running=round(sums[RUNNING]), waiting=round(sums[WAITING]))


@dataclass(slots=True)
class _Wait:
    since: float
    last: float


@dataclass(slots=True)
class QuietWait:
    """Which sleeps are postponed, since when (monotonic seconds)."""

    wait_s: float = QUIET_WAIT_S
    _waits: dict[Key, _Wait] = field(default_factory=dict)

    def postpone(self, key: Key, load: Load | None, now: float) -> bool:
        """Whether the sleep of `key` waits now, for an engine with `load`."""
        if load is None or load.idle:
            self._waits.pop(key, None)
            return False
        w = self._waits.get(key)
        if w is None or now - w.last > _FORGET_AFTER_S:
            w = self._waits[key] = _Wait(since=now, last=now)
        w.last = now
        if now - w.since >= self.wait_s:
            self._waits.pop(key, None)
            return False
        return True

    def waited_s(self, key: Key, now: float) -> float:
        """Seconds the sleep of `key` has been postponed so far; 0 when it is not."""
        w = self._waits.get(key)
        return 0.0 if w is None else now - w.since
