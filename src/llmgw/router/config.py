"""The router's configuration: one YAML file, validated at the edge.

Everything inside the router trusts a `RouterConfig`; nothing else reads the
file. A bad file is a `RouterConfigError` whose one-line message names the field, so
`llmgw router` can exit 2 with it at start and a reload can log it and keep
the old configuration.

Shape (every key but `endpoints`/`controller` optional):

    endpoints: [{id, url, models: [...], engine?, pool?, weight?, priority?,
                 kv_events?, tokenizer?, ...}]
    models: [...]            # known models with no replica yet: held, not 404
    controller: {url, token?}
    policy: ours | round_robin | least_inflight
    scrape_interval_s: 2 ...  # timings, flat
    breaker: {failure_threshold, cooldown_s, max_cooldown_s}
    api_keys: [{name, sha256}]
    tracing: {endpoint, service_name?, sample_ratio?}   # off when absent
    admin_token: ...
    allowed_hosts: [...]     # names the admin routes answer without admin_token
    router_id: ...

Secrets need not be in the file: `admin_token`, `metrics_token` and the
controller's `token` each also come from a file the YAML names (`admin_token_file:`,
`metrics_token_file:`, `controller: {token_file: ...}`, read at each load) or,
when the file sets neither, from `LLMGW_ROUTER_ADMIN_TOKEN`,
`LLMGW_ROUTER_METRICS_TOKEN` and `LLMGW_ROUTER_CONTROLLER_TOKEN`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from llmgw.router.errors import RouterConfigError
from llmgw.router.replicas.enginemetrics import ENGINES
from llmgw.runtime import finite, safeyaml, secretfile, textfile
from llmgw.runtime.logs import kv
from llmgw.runtime.webpages import host_problem
from llmgw.wire.endpoints import EndpointInfo
from llmgw.wire.keys import ClientKey
from llmgw.wire.usage import RouterId

Policy = Literal["ours", "round_robin", "least_inflight"]
Seconds = Annotated[float, msgspec.Meta(gt=0)]
NonNegSeconds = Annotated[float, msgspec.Meta(ge=0)]
log = logging.getLogger(__name__)
# connect_timeout_s's range. Below it, a router loop busy for one slice of work fails
# connections that were fine. Above it, the kernel has long given up a connect by
# itself (six SYN retries: about two minutes), and as the TCP user timeout the value
# would leave a silent engine host holding requests for many minutes.
CONNECT_TIMEOUT_BOUNDS_S = (0.1, 300.0)
# ZeroMQ transports a KV-event publisher may be reached by (precise mode).
KV_EVENT_SCHEMES = ("tcp://", "ipc://", "inproc://")
# max_upload_bytes unset: room for the 25 MB audio file OpenAI and vLLM (its
# VLLM_MAX_AUDIO_CLIP_FILESIZE_MB) accept, and the form around it.
DEFAULT_UPLOAD_BYTES = 26 * 1024 * 1024


class ControllerConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Controller root, e.g. http://127.0.0.1:9000 (no trailing slash needed).
    url: str
    # Sent as `Authorization: Bearer <token>`; None sends none.
    token: str | None = None
    # How long one long-poll of GET /v1/endpoints may wait for a change.
    poll_timeout_s: Seconds = 30.0


class ApiKey(ClientKey, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A client key in the file: `name` and `sha256`, and optionally what a key from
    the controller carries (team, models, rpm, tpm, budget, priority, expires_at;
    docs/tenants.md)."""


class BreakerSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Per-endpoint circuit breaker."""

    failure_threshold: Annotated[int, msgspec.Meta(ge=1)] = 5
    cooldown_s: Seconds = 10.0
    max_cooldown_s: Seconds = 120.0


class TracingConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """OpenTelemetry spans of the routing decisions (router/request/tracing.py, docs/tracing.md)."""

    # The OTLP/HTTP traces URL, e.g. http://otel-collector:4318/v1/traces.
    endpoint: str
    # The spans' service.name resource attribute.
    service_name: str = "llmgw-router"
    # Fraction of the traces the router starts that are kept; a client's sampled flag
    # is followed whatever this is.
    sample_ratio: Annotated[float, msgspec.Meta(ge=0, le=1)] = 1.0
    # Spans are batched and sent this often, off the event loop.
    export_interval_s: Seconds = 5.0
    export_timeout_s: Seconds = 10.0
    # Spans waiting to be sent, at most (a collector away fills it); one more is dropped
    # and counted in llmgw_router_spans_dropped_total.
    max_queued_spans: Annotated[int, msgspec.Meta(ge=1, le=1_000_000)] = 2048


class FlowBand(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One priority band's bounds in flow control (docs/tenants.md#flow-control)."""

    # Requests of one model this band may hold while the fleet is saturated; past it
    # an arrival is answered 429 (unless it pushes out a noisier tenant's). 0: none.
    max_queued: Annotated[int, msgspec.Meta(ge=0)] = 1000
    # Seconds a request may wait in the band; then it is answered 503. Never past the
    # request's own deadline (request_timeout_s).
    max_wait_s: NonNegSeconds = 30.0
    # An arrival that would wait longer than this many turnovers (the time the
    # requests running at the model's replicas take to finish, from the rate they
    # do) is answered 429 at once, sooner than max_wait_s: a queue past one turnover
    # only adds wait. 0: only max_wait_s bounds the wait.
    max_wait_turnovers: Annotated[float, msgspec.Meta(ge=0)] = 0.0


class FlowConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Flow control: requests queued by priority band and tenant while every replica
    of their model is at its learned capacity (docs/tenants.md#flow-control)."""

    # Off: every request goes to a replica at once, however loaded (the engines queue).
    enabled: bool = True
    critical: FlowBand = FlowBand(max_queued=1000, max_wait_s=60.0, max_wait_turnovers=2.0)
    standard: FlowBand = FlowBand(max_queued=1000, max_wait_s=30.0, max_wait_turnovers=1.0)
    # Batch work is there to wait: only max_wait_s bounds it.
    batch: FlowBand = FlowBand(max_queued=1000, max_wait_s=120.0)
    # The least room, in requests, each model keeps for the critical band while critical
    # requests meet its replicas that full (kept 10 s past the last); more while the
    # band is a larger share of the model's releases (request/reserve.py). Standard and
    # batch are held at it. 0: none; a critical request then waits for a release.
    critical_reserve: Annotated[int, msgspec.Meta(ge=0)] = 1

    def bands(self) -> dict[str, FlowBand]:
        """Band name → its bounds, first served first."""
        return {"critical": self.critical, "standard": self.standard, "batch": self.batch}


class RouterConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Static endpoints (phase 1). Exclusive with `controller`, which supplies them.
    endpoints: tuple[EndpointInfo, ...] = ()
    # Model names known to have no replica yet: requests for them are held
    # instead of answered 404.
    models: tuple[str, ...] = ()
    controller: ControllerConfig | None = None
    # Stable id in usage reports; None: a fresh one per process (a restarted router
    # is a new reporter, whose empty last_used the controller must not merge). Bounded
    # as the controller bounds it (wire.usage.RouterId): 1 to 256 characters, no
    # control character; past that every report was refused.
    router_id: RouterId | None = None
    # Routing policy; the two baselines exist to be measured against (bench/routing.py).
    policy: Policy = "ours"
    # One log line per request (logger llmgw.router.access, INFO): request id, model,
    # endpoint, status, outcome, TTFT, duration, tokens. Off: the hot path logs nothing.
    access_log: bool = False
    # OpenTelemetry spans of routing decisions; None (the default): off, and the
    # router only passes a client's traceparent and tracestate on. Read once at start.
    tracing: TracingConfig | None = None

    scrape_interval_s: Seconds = 2.0
    # Below the interval, so one tick's scrapes end before the next begins.
    scrape_timeout_s: Seconds = 1.5
    # At most this many scrapes in flight at once.
    scrape_concurrency: Annotated[int, msgspec.Meta(ge=1)] = 64
    stale_after_s: Seconds = 10.0
    # How long a request may wait for a replica of its model to appear.
    hold_timeout_s: NonNegSeconds = 120.0
    # Held requests beyond this are answered 503 at once.
    max_held: Annotated[int, msgspec.Meta(ge=0)] = 1000
    # Queues per priority band and tenant while the fleet is saturated. Read at start.
    flow: FlowConfig = FlowConfig()
    # The whole request's deadline: retries, holding and the upstream response.
    request_timeout_s: Seconds = 600.0
    # Time to open a TCP connection to an engine; past it the attempt is retried.
    # Also how long an engine's host may leave sent bytes or keepalive probes
    # unacknowledged before its connection is dropped (a silent host: upstream/fast.py),
    # never less than upstream.fast.SILENT_FLOOR_S. Within CONNECT_TIMEOUT_BOUNDS_S.
    connect_timeout_s: Seconds = 3.0
    # A stream whose engine sends nothing for this long is ended with an error
    # event and counted against the endpoint's breaker; without it a stalled
    # engine holds the client until request_timeout_s.
    stream_idle_timeout_s: Seconds = 120.0
    max_body_bytes: Annotated[int, msgspec.Meta(ge=1)] = 8 * 1024 * 1024
    # The largest body of a multipart upload (the audio routes), whose files are larger
    # than any JSON body; at least max_body_bytes. Unset: 26 MiB (OpenAI's and vLLM's
    # 25 MB audio file and its form), or max_body_bytes if larger, at most one client
    # address's share of max_inflight_body_bytes (`upload_limit`).
    max_upload_bytes: Annotated[int, msgspec.Meta(ge=1)] | msgspec.UnsetType = msgspec.UNSET
    # The most the router holds of one engine's whole (non-stream) answer, to read its
    # usage and send it with a Content-Length. A larger one is relayed as it arrives,
    # its usage read from its tail; an error answer (a retryable status) larger than
    # this is a 502 (request/unbuffered.py). The default passes a full embeddings batch
    # (docs/router.md gives its size).
    max_answer_bytes: Annotated[int, msgspec.Meta(ge=1)] = 256 * 1024 * 1024
    # The most the router holds of all engines' whole answers at once, each worker its
    # share (this over --workers); an answer whose bytes would pass it is relayed as it
    # arrives, as one over max_answer_bytes is (a retryable error answer, counted while
    # kept for a retry elsewhere: a 502), never refused. Fixed, not a fraction of the
    # host's memory: in a container that is the host's, not the container's limit.
    # Four answers at the default max_answer_bytes (http/answers.py HeldAnswers).
    max_held_answer_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1024 * 1024 * 1024

    # Client-side limits (docs/hardening.md). A keep-alive connection idle this
    # long is closed; a request head must arrive within header_timeout_s of its
    # first byte, its body within body_timeout_s (slow clients get a 408).
    idle_timeout_s: Seconds = 75.0
    header_timeout_s: Seconds = 10.0
    body_timeout_s: Seconds = 60.0
    # Open client connections; also at most half the open-file limit less 64
    # (the rest is headroom for engine connections). Past it new connections
    # get a 503 at once; established ones are served on.
    max_client_connections: Annotated[int, msgspec.Meta(ge=1)] = 10_000
    # Request-body bytes in (counted as they arrive, not as declared) and held for
    # their request, all clients together; past it a request is answered 503 with
    # Retry-After.
    max_inflight_body_bytes: Annotated[int, msgspec.Meta(ge=1)] = 256 * 1024 * 1024
    # The part of each shared budget (client connections, body bytes in flight,
    # held requests) one client address may hold (runtime/peers.py): past it that
    # address is refused while others are served. 1.0 behind a proxy, where every
    # client has the proxy's address.
    client_share: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    # Once a body has been arriving for header_timeout_s, it must have come at this
    # many bytes a second on average, or 408 (a body trickled a byte at a time held
    # its connection for body_timeout_s). 0: no minimum.
    min_body_bytes_per_s: Annotated[int, msgspec.Meta(ge=0)] = 1024
    # Extra attempts on other replicas before any byte reached the client.
    max_retries: Annotated[int, msgspec.Meta(ge=0)] = 2
    report_interval_s: Seconds = 2.0
    # How often the file's mtime is checked for a reload.
    reload_poll_s: Seconds = 1.0

    breaker: BreakerSettings = msgspec.field(default_factory=BreakerSettings)
    # Empty: /v1/* is open. Otherwise `Authorization: Bearer <key>` is required.
    api_keys: tuple[ApiKey, ...] = ()
    # None: admin endpoints answer only on loopback, and only to a Host that is an IP
    # literal, localhost, --host or one of `allowed_hosts` (runtime/webpages.py).
    admin_token: str | None = None
    # Host names the admin routes answer without admin_token, beside those ("*": any).
    allowed_hosts: tuple[str, ...] = ()
    # None: /metrics is open. Set: it needs `Authorization: Bearer <token>`
    # (Prometheus: `authorization: {credentials: ...}` in the scrape config).
    metrics_token: str | None = None

    def __post_init__(self) -> None:
        if self.scrape_timeout_s >= self.scrape_interval_s:
            raise ValueError(
                f"scrape_timeout_s ({self.scrape_timeout_s}) must be below "
                f"scrape_interval_s ({self.scrape_interval_s})"
            )
        low, high = CONNECT_TIMEOUT_BOUNDS_S
        if not low <= self.connect_timeout_s <= high:
            raise ValueError(
                f"connect_timeout_s ({self.connect_timeout_s:g}) must be between {low:g} and "
                f"{high:g} seconds: it bounds each connection attempt to an engine and how "
                "long an engine's host may stay silent"
            )
        if self.breaker.max_cooldown_s < self.breaker.cooldown_s:
            raise ValueError("breaker.max_cooldown_s must be at least breaker.cooldown_s")
        for name in self.allowed_hosts:
            problem = host_problem(name)
            if problem is not None:
                raise ValueError(f"allowed_hosts {problem}")
        if self.controller is not None and self.endpoints:
            raise ValueError("endpoints must be empty when controller is set (it supplies them)")
        ctl = self.controller
        if ctl is not None and ctl.token and "@" in ctl.url.partition("//")[2].split("/")[0]:
            # Said without the URL: the part before "@" may be a password. aiohttp sends
            # URL credentials as an Authorization of their own and refuses them beside
            # the token's (ValueError): the loop following the controller died of it.
            raise ValueError(
                "controller.url holds a user name or password beside controller.token: "
                "only one Authorization can be sent; remove one"
            )
        seen: set[str] = set()
        for i, ep in enumerate(self.endpoints):
            if ep.id in seen:
                raise ValueError(f"endpoints[{i}].id {ep.id!r} is repeated")
            seen.add(ep.id)
            if not ep.url.startswith(("http://", "https://")):
                raise ValueError(f"endpoints[{i}].url {ep.url!r} must start with http://")
            if not ep.models:
                raise ValueError(f"endpoints[{i}].models must name at least one model")
            if ep.engine not in ENGINES:
                raise ValueError(
                    f"endpoints[{i}].engine {ep.engine!r} must be one of {sorted(ENGINES)}"
                )
            if ep.weight <= 0:
                raise ValueError(f"endpoints[{i}].weight must be above 0")
            for name in ("kv_events", "kv_events_replay"):
                addr = getattr(ep, name)
                if addr and not addr.startswith(KV_EVENT_SCHEMES):
                    raise ValueError(
                        f"endpoints[{i}].{name} {addr!r} must start with tcp://, ipc:// or inproc://"
                    )
            if ep.kv_events and not ep.tokenizer:
                raise ValueError(
                    f"endpoints[{i}].tokenizer is needed with kv_events "
                    "('sim', or 'hf:<path to tokenizer.json>')"
                )
            if ep.tokenizer and ep.tokenizer != "sim" and not ep.tokenizer.startswith("hf:"):
                raise ValueError(
                    f"endpoints[{i}].tokenizer {ep.tokenizer!r}: expected 'sim' or "
                    "'hf:<path to tokenizer.json>'"
                )
        if self.max_inflight_body_bytes < self.max_body_bytes:
            raise ValueError(
                f"max_inflight_body_bytes ({self.max_inflight_body_bytes}) must be at least "
                f"max_body_bytes ({self.max_body_bytes})"
            )
        self._check_upload_limit()
        names = [k.name for k in self.api_keys]
        if len(set(names)) != len(names):
            raise ValueError("api_keys names must be unique")

    def _check_upload_limit(self) -> None:
        given = self.max_upload_bytes
        if isinstance(given, msgspec.UnsetType):
            return
        if given < self.max_body_bytes:
            raise ValueError(
                f"max_upload_bytes ({given}) must be at least max_body_bytes "
                f"({self.max_body_bytes})"
            )
        if given > self.max_inflight_body_bytes:
            raise ValueError(
                f"max_inflight_body_bytes ({self.max_inflight_body_bytes}) must be at least "
                f"max_upload_bytes ({given})"
            )

    def upload_limit(self) -> int:
        """The largest multipart upload taken: `max_upload_bytes`, or unset its default
        (DEFAULT_UPLOAD_BYTES, or max_body_bytes if larger, at most one address's share
        of the in-flight budget: a file that sets a small budget keeps its share, and
        needs no new setting)."""
        if not isinstance(self.max_upload_bytes, msgspec.UnsetType):
            return self.max_upload_bytes
        # Imported here: runtime.peers is a compiled hot module, loaded only after the
        # program has chosen between the compiled and the Python build (compiled.py).
        from llmgw.runtime.peers import share_of

        wanted = max(DEFAULT_UPLOAD_BYTES, self.max_body_bytes)
        each = share_of(
            self.max_inflight_body_bytes, self.client_share, at_least=self.max_body_bytes
        )
        return min(wanted, each)

    def known_models(self) -> frozenset[str]:
        """Models this file names: configured ones and every endpoint's."""
        out = set(self.models)
        for ep in self.endpoints:
            out.update(ep.models)
        return frozenset(out)

    def endpoint_infos(self) -> tuple[EndpointInfo, ...]:
        """The static endpoints with URLs normalised (no trailing slash)."""
        return tuple(
            msgspec.structs.replace(ep, url=ep.url.rstrip("/")) if ep.url.endswith("/") else ep
            for ep in self.endpoints
        )


# Retired: the router serves with its own server only (router/http/), and talks to
# engines with its own client only (router/upstream/fast.py). `fast`, what it does
# anyway, is accepted with a warning; anything else stops the router.
SERVER_ENV = "LLMGW_ROUTER_SERVER"
UPSTREAM_ENV = "LLMGW_ROUTER_UPSTREAM"
# Secrets the file may leave out: key → the variable that gives it (docstring above).
SECRET_ENV = {
    "admin_token": "LLMGW_ROUTER_ADMIN_TOKEN",
    "metrics_token": "LLMGW_ROUTER_METRICS_TOKEN",
}
CONTROLLER_TOKEN_ENV = "LLMGW_ROUTER_CONTROLLER_TOKEN"
# The router's variables that are no flag's (envflags warns about any other).
OTHER_ENV = (UPSTREAM_ENV, SERVER_ENV, *SECRET_ENV.values(), CONTROLLER_TOKEN_ENV)

# A reload refuses a file with nothing in it: that is what a file looks like between
# its writer's truncation and its first write (an editor saving in place, `>`), and
# applied it dropped every endpoint and every key, opening /v1 to anyone.
EMPTY_ON_RELOAD = (
    "the file is empty (still being written?); the running config is kept. "
    "A router with no settings is `{}`"
)

# Settings read once at start; a reload that changes them logs that a restart is needed.
RESTART_ONLY = (
    "controller",
    "router_id",
    "stale_after_s",
    "flow",
    "breaker",
    "max_body_bytes",
    "max_upload_bytes",
    "idle_timeout_s",
    "header_timeout_s",
    "max_client_connections",
    "max_inflight_body_bytes",
    "max_held_answer_bytes",
    "client_share",
    "tracing",
)


def _secret(
    doc: MutableMapping[str, object], key: str, var: str, env: Mapping[str, str], where: str
) -> None:
    """Fill `doc[key]` from `doc[key_file]` (removed) or, when the file has neither, `env[var]`."""
    named = doc.pop(f"{key}_file", None)
    if named is not None:
        if doc.get(key) is not None:
            raise RouterConfigError(f"{where}{key} and {key}_file: give one")
        try:
            doc[key] = secretfile.read_secret_file(str(named))
        except secretfile.SecretError as exc:
            raise RouterConfigError(f"{where}{key}_file: {exc}") from None
    elif doc.get(key) is None and env.get(var):
        doc[key] = env[var]


def parse(
    text: str,
    *,
    source: str = "config",
    env: Mapping[str, str] | None = None,
    empty_ok: bool = True,
) -> RouterConfig:
    """Validate YAML text into a RouterConfig, or raise RouterConfigError naming the field.

    `env` (default os.environ) gives the secrets the file leaves out (SECRET_ENV).
    `empty_ok` False refuses a text with no YAML in it (a reload: `EMPTY_ON_RELOAD`)."""
    try:
        doc = safeyaml.load(text)
    except safeyaml.YamlError as exc:
        raise RouterConfigError(f"{source}: {exc}") from None
    if doc is None:
        if not empty_ok:
            raise RouterConfigError(f"{source}: {EMPTY_ON_RELOAD}")
        doc = {}
    if not isinstance(doc, dict):
        raise RouterConfigError(f"{source}: expected a mapping at the top level")
    environ = os.environ if env is None else env
    for key, var in SECRET_ENV.items():
        _secret(doc, key, var, environ, f"{source}: ")
    if isinstance(doc.get("controller"), dict):
        _secret(doc["controller"], "token", CONTROLLER_TOKEN_ENV, environ, f"{source}: controller.")
    if "http_server" in doc:
        retired_server(doc.pop("http_server"), f"{source}: http_server")
    if "upstream_client" in doc:
        retired_client(doc.pop("upstream_client"), f"{source}: upstream_client")
    bad = finite.nonfinite_path(doc)
    if bad is not None:
        # Before the range checks: every comparison with NaN is False (runtime/finite.py).
        raise RouterConfigError(f"{source}: {bad}: {finite.NOT_FINITE}")
    try:
        return msgspec.convert(doc, RouterConfig)
    except msgspec.ValidationError as exc:
        raise RouterConfigError(f"{source}: {_one_line(str(exc))}") from exc
    except ValueError as exc:  # raised by __post_init__ checks
        raise RouterConfigError(f"{source}: {_one_line(str(exc))}") from exc


def retired_server(value: object, where: str) -> None:
    """`http_server` (the file) or $LLMGW_ROUTER_SERVER (`where` says which), both
    retired: the router serves with its own server only. `fast` is what it does
    anyway (a warning: drop the setting); `aiohttp` cannot be honoured, and a router
    that silently served otherwise than its file says would mislead whoever reads it."""
    if value == "fast":
        log.warning(
            kv("retired setting", setting=where, why="the router's own server is the only one")
        )
        return
    raise RouterConfigError(
        f"{where}: {value!r}: retired; the router serves with its own HTTP server only "
        "(aiohttp's is gone); remove the setting"
    )


def retired_client(value: object, where: str) -> None:
    """`upstream_client` (the file) or $LLMGW_ROUTER_UPSTREAM (`where` says which), both
    retired: the proxy talks to engines with its own client only (upstream/fast.py).
    `fast` is what it does anyway (a warning: drop the setting); `aiohttp` cannot be
    honoured, and a router that silently relayed otherwise than its file says would
    mislead whoever reads it."""
    if value == "fast":
        log.warning(
            kv("retired setting", setting=where, why="the router's own client is the only one")
        )
        return
    raise RouterConfigError(
        f"{where}: {value!r}: retired; the router talks to engines with its own HTTP "
        "client only (aiohttp's is gone); remove the setting"
    )


def check_retired_env(env: Mapping[str, str]) -> None:
    """$LLMGW_ROUTER_SERVER and $LLMGW_ROUTER_UPSTREAM, when set: as `retired_server`
    and `retired_client`."""
    value = env.get(SERVER_ENV, "").strip()
    if value:
        retired_server(value, SERVER_ENV)
    value = env.get(UPSTREAM_ENV, "").strip()
    if value:
        retired_client(value, UPSTREAM_ENV)


def load(path: str | Path, *, empty_ok: bool = True) -> RouterConfig:
    """Read and validate the file at `path` (`empty_ok`: as `parse`'s)."""
    try:
        text = textfile.read(path)
    except textfile.TextFileError as exc:
        raise RouterConfigError(f"{path}: {exc}") from None
    return parse(text, source=str(path), empty_ok=empty_ok)


def restart_only_changes(old: RouterConfig, new: RouterConfig) -> list[str]:
    """Fields that differ but only take effect after a restart."""
    return [f for f in RESTART_ONLY if getattr(old, f) != getattr(new, f)]


def in_force(running: RouterConfig, loaded: RouterConfig) -> RouterConfig:
    """What a reload of `loaded` puts in force over `running`: `loaded`, but with the
    restart-only settings `running` has, each one that differs logged as waiting for a
    restart.

    Handing on `loaded` whole half-applied them: whatever read them after start took
    the file's (a hold's probe wait, /healthz's controller, a worker started again after
    the reload), while the rest of the router kept the values it was built with."""
    waiting = restart_only_changes(running, loaded)
    if not waiting:
        return loaded
    for field in waiting:
        log.warning(kv("config change needs a restart", field=field))
    kept: dict[str, object] = {f: getattr(running, f) for f in waiting}
    if "controller" in waiting:
        # Which source gives the endpoints is fixed at start as well: the file's
        # endpoints cannot stand beside a controller, and a file naming one has none.
        kept["endpoints"] = running.endpoints
    return msgspec.structs.replace(loaded, **kept)


def _one_line(text: str) -> str:
    return " ".join(text.split())
