"""The router's exception tree and its OpenAI-shaped error answers.

Everything the router raises on purpose derives from `RouterError`:

    RouterError
    ├── RouterConfigError        the configuration file is unreadable or invalid
    ├── UpstreamError            one attempt at one endpoint failed
    │   ├── UpstreamConnectError nothing reached the engine: always safe to retry
    │   ├── UpstreamTimeout      the deadline passed before the engine answered
    │   ├── UpstreamBroken       the response broke after it had started
    │   ├── AnswerTooLarge       an answer read whole (a scrape) passed its bound
    │   └── ScrapeFailed         an engine's /metrics could not be read (scrape.py)
    ├── MetricsParseError        an engine's /metrics lacks a figure the router needs
    ├── ControllerCallFailed     the controller did not answer usefully
    │   ├── ReportRefused        it refused a usage report (4xx): sending it again won't help
    │   └── LeaseRefused         it kept a report but its lease answer was unreadable
    ├── HoldQueueFull            `max_held` requests are already waiting
    ├── NoReplica                nothing could serve the request within its deadline
    ├── FlowRefused              flow control's queue was full, or the wait too long
    ├── KeyRevoked               the request's key was revoked (or expired) while it waited
    │   └── ModelNotAllowed      its key's `models` lost the request's model while it waited
    └── ModelRemoved             the request's model left the router's models while it waited

The upstream clients raise only `UpstreamError`s: a transport's exception
(asyncio's, the socket's, aiohttp's) becomes one in one function,
`upstream.base.translate`, and the proxy never catches a transport's type.
Every error a client sees is written with the one OpenAI error encoder
(`wire.errors.error_body`): as a whole answer by request/refusals.py, as a
stream's last event by `stream_error_frame` here.

Nothing here imports the router's compiled modules: the program imports this
(through config.py) before it loads their build (compiled.py).
"""

from __future__ import annotations

from llmgw.wire.errors import error_body


class RouterError(Exception):
    """Base of everything the router raises on purpose."""


class UpstreamError(RouterError):
    """One attempt at one endpoint failed; `endpoint_id` names it."""

    def __init__(self, endpoint_id: str, detail: str = "") -> None:
        super().__init__(f"{endpoint_id}: {detail}" if detail else endpoint_id)
        self.endpoint_id = endpoint_id
        self.detail = detail


class UpstreamConnectError(UpstreamError):
    """The connection could not be opened or was refused: the engine saw nothing."""


class UpstreamTimeout(UpstreamError):
    """The engine did not answer within the time the request had left."""


class UpstreamBroken(UpstreamError):
    """The engine's response stopped before it was complete."""


class AnswerTooLarge(UpstreamError):
    """An answer read whole (an engine's /metrics) passed its bound; the rest is unread."""


class RouterConfigError(RouterError):
    """The configuration file is unreadable or invalid; the message is one line."""


class MetricsParseError(RouterError, ValueError):
    """The scrape lacks a mandatory figure or has one that is not a number."""


class ControllerCallFailed(RouterError):
    """The controller did not answer usefully; the last endpoint list stays in force."""


class ReportRefused(ControllerCallFailed):
    """The controller answered a usage report 4xx other than 401/403/429: the same
    report would be refused again, so its token rows are given up (usage.py)."""

    def __init__(self, message: str, *, status: int) -> None:
        super().__init__(message)
        self.status = status


class LeaseRefused(ControllerCallFailed):
    """The controller kept a usage report (2xx) but its answer was no lease: the
    report's token rows are delivered; the last lease holds until it expires."""


class HoldQueueFull(RouterError):
    """`max_held` requests are already waiting, or (`share`) the client address's part
    of them; the caller answers 503 at once."""

    def __init__(self, model: str, *, share: bool = False) -> None:
        super().__init__(model)
        self.share = share


class NoReplica(RouterError):
    """No replica could take the request within its deadline (or the hold queue is full).

    `again`: whether a client's retry after `retry_after_s` may fare better; False
    when the router already waited for a replica on the client's behalf (to the hold's
    deadline, through a breaker's probe) or retried the request on other replicas."""

    def __init__(
        self,
        model: str,
        why: str,
        *,
        retry_after_s: int = 1,
        code: str = "no_replica",
        again: bool = True,
    ) -> None:
        super().__init__(f"{model}: {why}")
        self.model = model
        self.why = why
        self.retry_after_s = retry_after_s
        self.again = again
        # The error code clients see: no_replica, or model_unplaceable when the
        # controller says no replica can be placed (answered at once, not held).
        self.code = code


class FlowRefused(RouterError):
    """Flow control refused a request while the fleet was saturated (request/flowgate.py).

    `status` is 429 when the band's queue was full (or the request was pushed out of
    it by a quieter tenant's) and 503 when it waited as long as its band allows.
    """

    def __init__(self, model: str, why: str, *, status: int, code: str, retry_after_s: int) -> None:
        super().__init__(f"{model}: {why}")
        self.model = model
        self.why = why
        self.status = status
        self.code = code
        self.retry_after_s = retry_after_s


class KeyRevoked(RouterError):
    """The request's key left the keys in force (revoked, expired) while the request
    waited for a replica or its turn: it is refused as a new request with the key would be."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class ModelNotAllowed(KeyRevoked):
    """The request's key is still in force, but its `models` no longer hold the
    request's model (narrowed while the request waited): refused as a new request with
    the key would be (403), a `KeyRevoked` so that every wait that re-checks the key
    refuses it the same way."""

    def __init__(self, name: str, model: str) -> None:
        super().__init__(name)
        self.model = model


class ModelRemoved(RouterError):
    """The request's model left the models the router knows (a reload, the controller's
    list) while it was held for a replica: it is refused as a new request for it would
    be (404), not held for a replica that no list will bring."""

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.model = model


def stream_error_frame(message: str, *, code: int = 502) -> bytes:
    """The SSE event that ends a stream that broke mid-way, followed by [DONE].

    The same framing vLLM uses for an in-band error, so clients that handle one
    handle the other.
    """
    body = error_body(message, type="upstream_error", code=code)
    return b"data: " + body + b"\n\ndata: [DONE]\n\n"
