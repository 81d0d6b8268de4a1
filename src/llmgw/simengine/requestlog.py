"""`--request-log PATH`: one JSON line per generation request, written when it ends.

For benchmarks that split a request's time to first token into the router's part
and the engine's: the engine's own times (CLOCK_MONOTONIC, comparable with a client
process's `time.monotonic()` on the same Linux host) joined on the client's
`x-request-id`, which the router forwards. The /metrics histograms cannot do it: they
pool every request, and their buckets are coarser than the router's share.

Cost: one encode and one `write` system call per request (the file is unbuffered,
so a line is on disk when the request's handler returns, and a killed engine loses
none); the file is opened once, appended to across restarts, and closed on shutdown.
"""

from __future__ import annotations

import msgspec

from llmgw.simengine.batcher import SimRequest
from llmgw.simengine.conn import header_text


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One line of the log; fields in the order written. Times are monotonic seconds,
    None where the request never got that far (aborted while waiting, say)."""

    request_id: str | None  # the client's x-request-id (bytes not UTF-8 escaped); None: none
    id: str  # the engine's own id, as in the response body
    priority: int
    prompt_tokens: int
    cached_tokens: int | None  # prefix-cache hits at first scheduling; None: never scheduled
    arrival_s: float
    scheduled_s: float | None  # first scheduled (a preempted request keeps the first)
    first_token_s: float | None
    finished_s: float | None  # finished or aborted
    preemptions: int
    finish_reason: str | None  # stop, length, abort, error; None: the engine died under it


def record(req: SimRequest, request_id: str | None) -> RequestRecord:
    return RequestRecord(
        request_id=None if request_id is None else header_text(request_id),
        id=req.req_id,
        priority=req.priority,
        prompt_tokens=req.num_prompt,
        cached_tokens=req.num_cached_tokens,
        arrival_s=req.arrival_s,
        scheduled_s=req.first_scheduled_s,
        first_token_s=req.first_token_s,
        finished_s=req.finished_s,
        preemptions=req.num_preemptions,
        finish_reason=req.finish_reason,
    )


class RequestLog:
    """The open log file. OSError from the constructor: the path cannot be written."""

    def __init__(self, path: str) -> None:
        self._file = open(path, "ab", buffering=0)  # noqa: SIM115  # held open until close()
        self._encoder = msgspec.json.Encoder()

    def write(self, req: SimRequest, request_id: str | None) -> None:
        """Append the ended request's line (none once closed: a handler cancelled at the
        end of a graceful stop may end after the app's clean-up)."""
        if not self._file.closed:
            self._file.write(self._encoder.encode(record(req, request_id)) + b"\n")

    def close(self) -> None:
        self._file.close()
