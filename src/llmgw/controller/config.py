"""The controller's options: one frozen value built from the command line.

Every flag may also come from `LLMGW_CONTROLLER_<FLAG>` or from the YAML file
`--config` names (runtime.configfile: command line, then environment, then file).
Secrets come from files or the environment only: the tokens' `*-file` flags and
variables, the database password's `--database-password-file` or
`LLMGW_CONTROLLER_DATABASE_PASSWORD`.

Every duration is in seconds and says what it bounds. Defaults are for a real
fleet; tests pass short ones through the same flags.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw.runtime import configfile, logs, secretfile, textfile
from llmgw.runtime.cli import DefaultsFormatter
from llmgw.runtime.finite import finite_float
from llmgw.runtime.tracing import TracingSettings
from llmgw.runtime.version import add_version_argument
from llmgw.runtime.webpages import ANY_HOST, OwnNames, host_problem
from llmgw.wire.names import label_problem

DEFAULT_DATABASE = "sqlite:///./.llmgw/controller.db"
# Token usage is kept at least a month and a day: a monthly budget's spend is read
# from it (api/usage.py); at most a hundred years (events too), so the cutoff stays a date.
MIN_USAGE_RETENTION_DAYS = 32
MAX_USAGE_RETENTION_DAYS = 36_500
# The spans' service.name when --tracing-service-name is not given.
TRACING_SERVICE = "llmgw-controller"


@dataclass(frozen=True, slots=True, kw_only=True)
class ControllerConfig:
    host: str = "127.0.0.1"
    port: int = 0
    database: str = DEFAULT_DATABASE
    # PostgreSQL schema holding the tables (tests use a fresh one each); None = default.
    schema: str | None = None
    # Bearer token every route but /healthz and /openapi.json requires; None = open.
    token: str | None = None
    # A second bearer token that may only read: GET on /metrics, /admin/summary, the
    # node/model/replica/event lists and the status page's data (docs/status-page.md).
    read_token: str | None = None
    # A bearer token for GET /metrics alone (what Prometheus is given); set, /metrics
    # needs it (or the admin or read token) even when `token` is not set.
    metrics_token: str | None = None
    # Scoped tokens (docs/security.md): the agent token may only heartbeat (any
    # node); a node token only that node's heartbeat; the router token only the
    # endpoint list and usage reports. The admin `token` may do all of these too.
    agent_token: str | None = None
    node_tokens: dict[str, str] = field(default_factory=dict)
    router_token: str | None = None
    # Host names a controller without a token answers besides IP literals, localhost
    # and `host` (runtime/webpages.py: DNS rebinding); "*": any. Unused with a token.
    allowed_hosts: tuple[str, ...] = ()
    # How often the reconcile loop runs (and leadership is checked).
    tick_s: float = 1.0
    # A node with no heartbeat for this long is shown unreachable.
    heartbeat_timeout_s: float = 10.0
    # What agents are told to use between heartbeats.
    heartbeat_interval_s: float = 2.0
    # An unreachable node's replicas are failed and re-placed only after this much
    # more: a network blip must not reshuffle a fleet that is still serving.
    unreachable_grace_s: float = 30.0
    # A replica pending or starting longer than this is failed, not left starting.
    starting_deadline_s: float = 300.0
    # A draining replica is stopped when its in-flight requests finish, or after this.
    drain_grace_s: float = 30.0
    # Failed replicas restart after base × 2^restarts seconds, at most the cap.
    restart_backoff_s: float = 5.0
    restart_backoff_max_s: float = 300.0
    # Autoscaling: requests in flight (plus held) one replica is sized for.
    target_inflight_per_replica: float = 16.0
    # Autoscaling never scales a model down sooner than this after its last change,
    # so a load that oscillates around a boundary does not flap replicas.
    scale_down_cooldown_s: float = 300.0
    # Heartbeat timestamps live in memory and reach the store at most this often
    # per node (a heartbeat that changes nothing else writes nothing). None: half
    # the heartbeat timeout, so a standby reading the store sees nodes as ready.
    heartbeat_flush_s: float | None = None
    # A standby controller reloads the store this often to serve fresh reads.
    standby_reload_s: float = 2.0
    # Stopped replicas are forgotten this long after they stopped (events remain).
    stopped_retention_s: float = 3600.0
    # Token usage rows (per hour, key, team, model and router) older than this many
    # days are deleted by the leader, a bounded batch at a time (tick/retention.py).
    # 0: kept forever. Else at least MIN_USAGE_RETENTION_DAYS: a monthly budget counts
    # its period's spend from these rows.
    usage_retention_days: float = 90.0
    # Events (GET /admin/events, `ctl events`) older than this many days, and those
    # beyond the newest `event_retention_rows`, are deleted by the leader a bounded
    # batch at a time (tick/retention.py). 0: no age limit; rows 0: no cap.
    event_retention_days: float = 30.0
    event_retention_rows: int = 1_000_000
    # Long-polls of /v1/endpoints held at once; more are refused with 503.
    max_long_polls: int = 4096
    # Seconds in-flight HTTP requests get to finish on SIGTERM.
    shutdown_grace_s: float = 5.0
    # The part of the client connections one client address may hold (runtime/peers.py);
    # past it that address gets 503 while agents and routers elsewhere are served. At
    # 1.0 one client's idle connections refused every heartbeat. 1.0 behind a proxy.
    client_share: float = 0.5
    # The URL other controllers reach this one at, recorded in the store while it
    # leads: a standby forwards the usage reports it receives there (leaderlink.py).
    # None: derived from host and the bound port (derive_advertise_url); still None when
    # host is every interface (0.0.0.0, ::), and standbys then answer reports alone.
    advertise_url: str | None = None
    # OpenTelemetry spans of the controller's actions (fleet/spans.py, docs/tracing.md);
    # None (the default): off, and the SDK is never imported.
    tracing: TracingSettings | None = None

    @property
    def own_names(self) -> OwnNames:
        """The Host names answered without a token (api/auth.py): any, once served
        beyond loopback (--insecure): every peer on the network reaches it already, by
        whatever name it has there, and a rebound web page gains nothing more."""
        if not is_loopback(self.host):
            return OwnNames(allowed=(ANY_HOST,))
        return OwnNames(bind=self.host, allowed=self.allowed_hosts)

    @property
    def flush_s(self) -> float:
        if self.heartbeat_flush_s is not None:
            return self.heartbeat_flush_s
        return self.heartbeat_timeout_s / 2


FLOAT_HELP = {
    "tick-s": "seconds between reconcile ticks",
    "heartbeat-timeout-s": "a node with no heartbeat for this long is unreachable",
    "heartbeat-interval-s": "how often agents are asked to heartbeat",
    "unreachable-grace-s": "an unreachable node's replicas are replaced after this long",
    "starting-deadline-s": "a replica not ready this long after placement has failed",
    "drain-grace-s": "in-flight grace for a draining replica, unless a drain gives one",
    "restart-backoff-s": "first wait before a failed replica is restarted (doubles each time)",
    "restart-backoff-max-s": "the longest wait between restarts",
    "target-inflight-per-replica": "autoscaling: in-flight requests one replica should carry",
    "scale-down-cooldown-s": "autoscaling: no scale-down sooner than this after a change",
    "standby-reload-s": "a standby controller reloads the store this often",
    "stopped-retention-s": "stopped replicas stay listed this long",
    "usage-retention-days": "token usage older than this many days is deleted (0: kept forever)",
    "event-retention-days": "events older than this many days are deleted (0: no age limit)",
    "shutdown-grace-s": "on SIGTERM, in-flight API requests get this long",
    "client-share": "the part of the client connections one client address may hold "
    "(0 to 1; 1.0 behind a proxy, where every client has its address)",
}


# The controller's token from the environment (no flag in `ps`).
TOKEN_ENV = "LLMGW_CONTROLLER_TOKEN"
AGENT_TOKEN_ENV = "LLMGW_CONTROLLER_AGENT_TOKEN"
ROUTER_TOKEN_ENV = "LLMGW_CONTROLLER_ROUTER_TOKEN"
READ_TOKEN_ENV = "LLMGW_CONTROLLER_READ_TOKEN"
METRICS_TOKEN_ENV = "LLMGW_CONTROLLER_METRICS_TOKEN"
DATABASE_PASSWORD_ENV = "LLMGW_CONTROLLER_DATABASE_PASSWORD"
# Flags whose values are secrets: their variables (same names as the scheme's) are read
# by secretfile.resolve, which warns when the value was typed on the command line.
SECRET_FLAGS = frozenset({"token", "read_token", "metrics_token"})
# The controller's variables that are no flag's (envflags warns about any other).
OTHER_ENV = (AGENT_TOKEN_ENV, ROUTER_TOKEN_ENV, DATABASE_PASSWORD_ENV)


def read_node_tokens(path: str) -> dict[str, str]:
    """NODE=TOKEN per line ('#' comments and blank lines skipped); SecretError if bad."""
    try:
        # The config bound, not a secret's: one line per node.
        text = textfile.read(path)
    except textfile.TextFileError as exc:
        raise secretfile.SecretError(f"{path}: {exc}") from None
    out: dict[str, str] = {}
    for n, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        node, sep, token = line.partition("=")
        if not sep or not node.strip() or not token.strip():
            raise secretfile.SecretError(f"{path}:{n}: expected NODE=TOKEN")
        problem = label_problem(node.strip())
        if problem is not None:
            # No agent could heartbeat as it (wire.names): a typo, said at start.
            raise secretfile.SecretError(f"{path}:{n}: node {problem}")
        if node.strip() in out:
            raise secretfile.SecretError(f"{path}:{n}: node {node.strip()!r} given twice")
        out[node.strip()] = token.strip()
    return out


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or "localhost"; "" and 0.0.0.0 (every interface) are not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def derive_advertise_url(given: str | None, host: str, port: int) -> str | None:
    """The URL this controller tells standbys to reach it at: `given` (--advertise-url),
    else http://host:port when `host` is one address or name; None for every interface,
    since no address of this host is known to be the one the others can reach."""
    if given is not None:
        return given
    bare = host.strip("[]")
    if bare in ("", "0.0.0.0", "::"):
        return None
    return f"http://[{bare}]:{port}" if ":" in bare else f"http://{bare}:{port}"


def url_problem(url: str) -> str | None:
    """Why `url` cannot be --advertise-url, or None: an http(s) URL with a host, no query,
    no user name or password (one would be logged and stored as the leader's URL, and a
    standby's relay cannot send it beside the router's Authorization: a 500 per report)."""
    try:
        parts = urllib.parse.urlsplit(url)
        if "@" in parts.netloc:
            # Said without the URL: the part before "@" may be a password.
            return "a URL with a user name or password (give the host and port only)"
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as exc:
        return f"{url!r}: {exc}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"{url!r}: expected http://HOST:PORT or https://HOST:PORT"
    if parts.query or parts.fragment:
        return f"{url!r}: no query or fragment, only a base URL"
    return None


def with_password(database: str, password: str) -> str:
    """`database` (a PostgreSQL URL without one) with `password` in it; ValueError if not."""
    if not database.startswith(("postgresql:", "postgresql+", "postgres:")):
        raise ValueError("a database password is for postgresql://… URLs only")
    import sqlalchemy as sa  # only here: ~100 ms to import

    url = sa.make_url(database.replace("postgres://", "postgresql://", 1))
    if url.password is not None:
        raise ValueError("--database already holds a password; give it in one place")
    return url.set(password=password).render_as_string(hide_password=False)


def build_parser() -> argparse.ArgumentParser:
    """Every flag of `llmgw controller` (also read from the environment and --config)."""
    d = ControllerConfig()
    p = argparse.ArgumentParser(
        prog="llmgw controller",
        description="fleet state, placement and reconcile",
        formatter_class=DefaultsFormatter,
    )
    p.add_argument(
        "--config",
        default=None,
        help="YAML file of these settings (keys: the flags' names); flags and "
        "LLMGW_CONTROLLER_* variables win over it",
    )
    p.add_argument("--host", default=d.host, help="listen address")
    logs.add_format_argument(p)
    add_version_argument(p, "controller")
    p.add_argument("--port", type=int, default=8081, help="listen port; 0 picks one")
    p.add_argument(
        "--advertise-url",
        default=None,
        help="URL the other controllers reach this one at (http://ctl-a:8081): while it "
        "leads, standbys forward routers' usage reports there (default: from --host and "
        "--port; none for 0.0.0.0 or ::, and standbys then answer reports alone)",
    )
    p.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        default=None,
        help="without a token, a Host name answered besides IP addresses, localhost and "
        "--host (repeat; * for any): any other is 403, since a web page can point a name "
        "of its own at this address (DNS rebinding); beyond loopback (--insecure): any",
    )
    p.add_argument(
        "--database", default=d.database, help="sqlite:///… | postgresql://… | memory://"
    )
    p.add_argument(
        "--database-password-file",
        default=None,
        help="read the PostgreSQL password from this file (or set "
        f"{DATABASE_PASSWORD_ENV}; libpq's PGPASSFILE works too)",
    )
    p.add_argument("--schema", default=None, help="PostgreSQL schema for the tables")
    p.add_argument(
        "--token",
        default=None,
        help="bearer token for every API route (visible in ps: prefer --token-file or "
        f"{TOKEN_ENV})",
    )
    p.add_argument("--token-file", default=None, help="read the token from this file")
    p.add_argument(
        "--insecure",
        action="store_true",
        help="serve beyond loopback without a token (every admin route open)",
    )
    p.add_argument(
        "--read-token",
        default=None,
        help="bearer token that may only read (metrics, status page, GET /admin/…); "
        f"visible in ps: prefer --read-token-file or {READ_TOKEN_ENV}",
    )
    p.add_argument("--read-token-file", default=None, help="read the read token from this file")
    p.add_argument(
        "--metrics-token",
        default=None,
        help="bearer token for GET /metrics only; set, /metrics needs it (or another token); "
        f"visible in ps: prefer --metrics-token-file or {METRICS_TOKEN_ENV}",
    )
    p.add_argument(
        "--metrics-token-file", default=None, help="read the metrics token from this file"
    )
    p.add_argument(
        "--agent-token-file",
        default=None,
        help=f"token that may only heartbeat, for any node (env {AGENT_TOKEN_ENV})",
    )
    p.add_argument(
        "--node-tokens-file",
        default=None,
        help="file of NODE=TOKEN lines: each token may only heartbeat as that node",
    )
    p.add_argument(
        "--router-token-file",
        default=None,
        help=f"token that may only read the endpoint list and report usage "
        f"(env {ROUTER_TOKEN_ENV})",
    )
    for flag, default in _floats(d).items():
        p.add_argument(f"--{flag}", type=finite_float, default=default, help=FLOAT_HELP[flag])
    p.add_argument(
        "--heartbeat-flush-s",
        type=finite_float,
        default=None,
        help="write heartbeat-only changes to the store at most this often "
        "(default: half of --heartbeat-timeout-s)",
    )
    _tracing_flags(p)
    p.add_argument(
        "--event-retention-rows",
        type=int,
        default=d.event_retention_rows,
        help="only the newest this many events are kept (0: no cap)",
    )
    p.add_argument(
        "--max-long-polls",
        type=int,
        default=d.max_long_polls,
        help="endpoint-list long polls held open at once (more wait their turn)",
    )
    return p


def _tracing_flags(p: argparse.ArgumentParser) -> None:
    # In --config also as a mapping, `tracing: {endpoint: …}` (runtime.configfile).
    p.add_argument(
        "--tracing-endpoint",
        default=None,
        help="OTLP/HTTP traces URL (http://collector:4318/v1/traces): export a span per "
        "action (placement, eviction, stop, sleep, wake); unset: no tracing",
    )
    p.add_argument(
        "--tracing-service-name", default=TRACING_SERVICE, help="the spans' service.name"
    )
    p.add_argument(
        "--tracing-sample-ratio",
        type=finite_float,
        default=1.0,
        help="fraction of the actions' traces kept (0 to 1)",
    )
    p.add_argument(
        "--tracing-export-interval-s",
        type=finite_float,
        default=5.0,
        help="spans are batched and sent this often, off the event loop",
    )
    p.add_argument(
        "--tracing-export-timeout-s",
        type=finite_float,
        default=10.0,
        help="one export's time limit (a slow collector loses that batch)",
    )
    p.add_argument(
        "--tracing-max-queued-spans",
        type=int,
        default=2048,
        help="spans waiting to be sent, at most; one more is dropped (and counted in "
        "llmgw_controller_spans_dropped_total)",
    )


def _tracing(p: argparse.ArgumentParser, a: argparse.Namespace) -> TracingSettings | None:
    """The tracing settings, None when no endpoint is given; exits 2 when one is bad."""
    if a.tracing_endpoint is None:
        return None
    if not a.tracing_endpoint.startswith(("http://", "https://")):
        p.error(f"--tracing-endpoint {a.tracing_endpoint!r}: expected an http(s):// URL")
    if not 0 <= a.tracing_sample_ratio <= 1:
        p.error(f"--tracing-sample-ratio {a.tracing_sample_ratio:g}: expected 0 to 1")
    if a.tracing_export_interval_s <= 0 or a.tracing_export_timeout_s <= 0:
        p.error("--tracing-export-interval-s and --tracing-export-timeout-s must be positive")
    if not a.tracing_service_name:
        p.error("--tracing-service-name: empty")
    if not 1 <= a.tracing_max_queued_spans <= 1_000_000:
        p.error(f"--tracing-max-queued-spans {a.tracing_max_queued_spans}: expected 1 to 1000000")
    return TracingSettings(
        endpoint=a.tracing_endpoint,
        service_name=a.tracing_service_name,
        sample_ratio=a.tracing_sample_ratio,
        export_interval_s=a.tracing_export_interval_s,
        export_timeout_s=a.tracing_export_timeout_s,
        max_queued_spans=a.tracing_max_queued_spans,
    )


def _floats(d: ControllerConfig) -> dict[str, float]:
    return {
        "tick-s": d.tick_s,
        "heartbeat-timeout-s": d.heartbeat_timeout_s,
        "heartbeat-interval-s": d.heartbeat_interval_s,
        "unreachable-grace-s": d.unreachable_grace_s,
        "starting-deadline-s": d.starting_deadline_s,
        "drain-grace-s": d.drain_grace_s,
        "restart-backoff-s": d.restart_backoff_s,
        "restart-backoff-max-s": d.restart_backoff_max_s,
        "target-inflight-per-replica": d.target_inflight_per_replica,
        "scale-down-cooldown-s": d.scale_down_cooldown_s,
        "standby-reload-s": d.standby_reload_s,
        "stopped-retention-s": d.stopped_retention_s,
        "usage-retention-days": d.usage_retention_days,
        "event-retention-days": d.event_retention_days,
        "shutdown-grace-s": d.shutdown_grace_s,
        "client-share": d.client_share,
    }


def parse_args(argv: list[str], environ: Mapping[str, str] | None = None) -> ControllerConfig:
    """`llmgw controller …` flags, variables and file → ControllerConfig (exit 2 if bad)."""
    env = os.environ if environ is None else environ
    p = build_parser()
    floats = _floats(ControllerConfig())
    a = configfile.parse(p, argv, "controller", environ=env, secrets=SECRET_FLAGS, known=OTHER_ENV)
    if a.tick_s <= 0 or a.heartbeat_timeout_s <= 0:
        p.error("--tick-s and --heartbeat-timeout-s must be positive")
    if not 0 < a.client_share <= 1:
        p.error(f"--client-share {a.client_share:g}: expected above 0, at most 1")
    days = a.usage_retention_days
    if not (days == 0 or MIN_USAGE_RETENTION_DAYS <= days <= MAX_USAGE_RETENTION_DAYS):
        p.error(
            f"--usage-retention-days {days:g}: 0 (keep forever) or {MIN_USAGE_RETENTION_DAYS} "
            f"to {MAX_USAGE_RETENTION_DAYS} days (a monthly budget counts from the last 31)"
        )
    if not 0 <= a.event_retention_days <= MAX_USAGE_RETENTION_DAYS:
        p.error(
            f"--event-retention-days {a.event_retention_days:g}: 0 (no age limit) to "
            f"{MAX_USAGE_RETENTION_DAYS}"
        )
    if a.event_retention_rows < 0:
        p.error(f"--event-retention-rows {a.event_retention_rows}: 0 (no cap) or more")
    try:
        token = secretfile.resolve(
            program="controller",
            flag="--token",
            value=a.token,
            file=a.token_file,
            env_var=TOKEN_ENV,
            env=env,
        )
    except secretfile.SecretError as exc:
        p.error(f"--token-file: {exc}")
    try:
        agent_token = secretfile.resolve(
            program="controller",
            flag="--agent-token-file",
            value=None,
            file=a.agent_token_file,
            env_var=AGENT_TOKEN_ENV,
            env=env,
        )
        router_token = secretfile.resolve(
            program="controller",
            flag="--router-token-file",
            value=None,
            file=a.router_token_file,
            env_var=ROUTER_TOKEN_ENV,
            env=env,
        )
        read_token = secretfile.resolve(
            program="controller",
            flag="--read-token",
            value=a.read_token,
            file=a.read_token_file,
            env_var=READ_TOKEN_ENV,
            env=env,
        )
        metrics_token = secretfile.resolve(
            program="controller",
            flag="--metrics-token",
            value=a.metrics_token,
            file=a.metrics_token_file,
            env_var=METRICS_TOKEN_ENV,
            env=env,
        )
        node_tokens = read_node_tokens(a.node_tokens_file) if a.node_tokens_file else {}
        password = secretfile.resolve(
            program="controller",
            flag="--database-password-file",
            value=None,
            file=a.database_password_file,
            env_var=DATABASE_PASSWORD_ENV,
            env=env,
        )
    except secretfile.SecretError as exc:
        p.error(str(exc))
    database = a.database
    if password is not None:
        try:
            database = with_password(database, password)
        except ValueError as exc:
            p.error(f"--database-password-file / {DATABASE_PASSWORD_ENV}: {exc}")
    scoped = [t for t in (agent_token, router_token, *node_tokens.values()) if t]
    if scoped and token is None:
        p.error(
            "scoped tokens need the admin token too (--token-file): without it every "
            "route would be open"
        )
    every = [t for t in (token, read_token, metrics_token, *scoped) if t]
    if len(set(every)) != len(every):
        p.error("every token must differ (a shared one would carry the wider scope)")
    if token is None and not a.insecure and not is_loopback(a.host):
        p.error(
            f"--host {a.host} listens beyond loopback and no token is set, so every admin "
            f"route would be open to anyone who reaches it: give --token-file (or "
            f"{TOKEN_ENV}), or --insecure to serve it open anyway"
        )
    advertise = None if a.advertise_url is None else a.advertise_url.rstrip("/")
    if advertise is not None:
        problem = url_problem(advertise)
        if problem is not None:
            p.error(f"--advertise-url {problem}")
    allowed_hosts = tuple(a.allowed_hosts or ())
    for name in allowed_hosts:
        problem = host_problem(name)
        if problem is not None:
            p.error(f"--allowed-host {problem}")
    return ControllerConfig(
        host=a.host,
        allowed_hosts=allowed_hosts,
        port=a.port,
        advertise_url=advertise,
        database=database,
        schema=a.schema,
        token=token,
        read_token=read_token,
        metrics_token=metrics_token,
        agent_token=agent_token,
        node_tokens=node_tokens,
        router_token=router_token,
        heartbeat_flush_s=a.heartbeat_flush_s,
        max_long_polls=a.max_long_polls,
        event_retention_rows=a.event_retention_rows,
        tracing=_tracing(p, a),
        **{flag.replace("-", "_"): getattr(a, flag.replace("-", "_")) for flag in floats},
    )
