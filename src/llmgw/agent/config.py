"""Agent configuration: command-line flags, optionally over a YAML file with the same keys.

    llmgw agent --controller URL [--controller URL2] [--token T] --node NAME
                (--gpus 8xH100-80G | --gpus nvml | --gpus-file F)
                [--fabric ib0]... [--label k=v]... [--port-range 21000-21099]
                --state-dir DIR [--address HOST] [--port P] [--interval-s 2]
                [--log-dir DIR] [--ended-logs-keep 20] [--stop-grace-s 10]
                [--engine-bin vllm=CMD]...
                [--stop-engines-on-exit] [--config FILE] [--print-inventory]
                [--allow-env NAME]... [--allow-flag FLAG]... [--secret-env VAR]...

In the file, keys are the flag names with `_` or `-` (`state_dir:`), lists for
repeatable flags (`controller`, `fabric` and `secret_env` also take one string) and
mappings for `label` and `engine_bin`. A flag given on the command line wins over the file.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
import socket
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

import msgspec

from llmgw.agent.engineprocs import PRIVATE_ENV
from llmgw.agent.errors import AgentError
from llmgw.agent.ports import parse_range
from llmgw.agent.secretrefs import is_private_env
from llmgw.agent.templates import parse_engine_bins
from llmgw.runtime import envflags, finite, logs, safeyaml, secretfile, textfile
from llmgw.runtime.finite import finite_float
from llmgw.runtime.version import add_version_argument
from llmgw.runtime.webpages import host_problem
from llmgw.wire.agent import ENV_NAME_PATTERN
from llmgw.wire.names import label_problem
from llmgw.wire.policy import SpecPolicy

ENV_NAME = re.compile(ENV_NAME_PATTERN)


class AgentConfigError(AgentError):
    """A configuration a person must fix; the message says what and where."""


class AgentConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Controller base URLs; with several (an HA pair), the agent moves to the
    # next when one is unreachable or answers 503 (a standby).
    controller: tuple[str, ...] = ()
    token: str | None = None
    # The token's file (first line); wins over `token` and LLMGW_AGENT_TOKEN.
    token_file: str | None = None
    # Spec env variables and engine flags this node allows although policy.py
    # refuses them by default (e.g. ["--trust-remote-code"]).
    allow_env: tuple[str, ...] = ()
    allow_flags: tuple[str, ...] = ()
    # Variables of the agent's environment a spec's `env_from: {NAME: {env: VAR}}` may
    # read; engines never inherit them, each gets only those its spec references.
    secret_env: tuple[str, ...] = ()
    node: str = ""
    # "nvml" for real GPUs, or a fake inventory such as "8xH100-80G".
    gpus: str | None = None
    gpus_file: str | None = None
    fabric: tuple[str, ...] = ()
    label: dict[str, str] = {}
    # Inclusive engine port range, "LOW-HIGH".
    port_range: str = "21000-21999"
    state_dir: str = ""
    # Where routers and peer shards reach this node's engines (sent in heartbeats).
    address: str = ""
    # The agent's own loopback HTTP port (status, fault injection); 0 picks one.
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 0
    # Host names that port answers besides IP literals and localhost ("*": any): a web
    # page can point a name of its own at 127.0.0.1 (runtime/webpages.py).
    allowed_hosts: tuple[str, ...] = ()
    interval_s: Annotated[float, msgspec.Meta(gt=0)] = 2.0
    # Engine logs; default <state_dir>/logs. This agent's alone: at start it removes
    # engine logs there that none of its engines owns, past ended_logs_keep; it holds
    # a lock there (logfiles.lock_log_dir), so a second agent naming it exits 2.
    log_dir: str | None = None
    stop_grace_s: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    # Engine name → command prefix, e.g. {"vllm": "/opt/vllm/bin/vllm serve"}.
    engine_bin: dict[str, str] = {}
    # Stop every engine when the agent exits (`llmgw up`); by default engines
    # outlive the agent and the next agent re-adopts them.
    stop_engines_on_exit: bool = False
    log_max_bytes: Annotated[int, msgspec.Meta(ge=1024)] = 10 * 1024 * 1024
    log_keep: Annotated[int, msgspec.Meta(ge=0)] = 3
    # Dropped shards whose logs are kept, newest first (agent/logfiles.py EndedLogs);
    # 0: a dropped shard's log is removed at once.
    ended_logs_keep: Annotated[int, msgspec.Meta(ge=0)] = 20
    print_inventory: bool = False
    # The node's host memory in MiB as heartbeats report it; None: /proc/meminfo's
    # MemTotal (a fake node says what it pretends to have, agent/hostmem.py).
    host_memory_mib: Annotated[int, msgspec.Meta(ge=0)] | None = None

    @property
    def ports(self) -> tuple[int, int]:
        return parse_range(self.port_range)

    @property
    def engine_log_dir(self) -> Path:
        return Path(self.log_dir) if self.log_dir else Path(self.state_dir) / "logs"


# The agent's controller token from the environment; engines never inherit it.
TOKEN_ENV = "LLMGW_AGENT_TOKEN"
# Flags whose values are secrets: TOKEN_ENV is read by secretfile.resolve, not envflags.
SECRET_FLAGS = frozenset({"token"})


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw agent",
        description="One per GPU node: discovers GPUs, runs engines, heartbeats the controller.",
        argument_default=argparse.SUPPRESS,
    )
    p.add_argument("--config", help="YAML file with the same keys as these flags")
    logs.add_format_argument(p)
    add_version_argument(p, "agent")
    p.add_argument("--controller", action="append", help="controller URL (repeat for HA)")
    p.add_argument(
        "--token", help=f"bearer token for the controller (visible in ps; prefer {TOKEN_ENV})"
    )
    p.add_argument("--token-file", help="read the controller token from this file")
    p.add_argument(
        "--allow-env", action="append", help="a spec env variable refused by default (repeat)"
    )
    p.add_argument(
        "--allow-flag",
        action="append",
        dest="allow_flags",
        help="an engine flag refused by default, e.g. --trust-remote-code (repeat)",
    )
    p.add_argument(
        "--secret-env",
        action="append",
        help="a variable of the agent's environment a spec's env_from {env: VAR} may read; "
        "withheld from every other engine (repeat)",
    )
    p.add_argument("--node", help="this node's name")
    p.add_argument("--gpus", help='"nvml" for real GPUs, or a fake inventory like 8xH100-80G')
    p.add_argument("--gpus-file", help="fake inventory from a YAML/JSON file")
    p.add_argument("--fabric", action="append", help="network fabric this node is on (repeat)")
    p.add_argument("--label", action="append", help="k=v label (repeat)")
    p.add_argument("--port-range", help="engine ports, LOW-HIGH (default 21000-21999)")
    p.add_argument("--state-dir", help="where the re-adoption state file lives")
    p.add_argument("--address", help="address engines are reached on (default: host name)")
    p.add_argument("--port", type=int, help="the agent's own loopback HTTP port (default 0)")
    p.add_argument(
        "--allowed-host",
        action="append",
        dest="allowed_hosts",
        help="a Host name that port answers besides IP addresses and localhost (repeat; "
        "* for any): any other is 403, since a web page can point a name of its own at "
        "127.0.0.1 (DNS rebinding)",
    )
    p.add_argument("--interval-s", type=finite_float, help="heartbeat/supervision tick (default 2)")
    p.add_argument("--log-dir", help="engine logs, one agent's alone (default <state-dir>/logs)")
    p.add_argument(
        "--ended-logs-keep",
        type=int,
        help="dropped shards whose logs are kept, newest first; older ones are removed, "
        "also those earlier agents left (default 20)",
    )
    p.add_argument("--stop-grace-s", type=finite_float, help="SIGTERM→SIGKILL grace (default 10)")
    p.add_argument("--engine-bin", action="append", help="ENGINE=COMMAND, e.g. vllm=/x/vllm serve")
    p.add_argument(
        "--stop-engines-on-exit",
        action="store_true",
        help="stop engines when the agent exits (default: leave them for re-adoption)",
    )
    p.add_argument(
        "--print-inventory", action="store_true", help="print the GPU inventory and exit"
    )
    p.add_argument(
        "--host-memory-mib",
        type=int,
        help="host memory to report (default: MemTotal of /proc/meminfo)",
    )
    return p


def _pairs(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise AgentConfigError(f"--{what} {item!r}: expected KEY=VALUE")
        out[k] = v
    return out


def _from_file(path: str) -> dict[str, Any]:
    try:
        doc = safeyaml.load(textfile.read(path))
    except (textfile.TextFileError, safeyaml.YamlError) as exc:
        raise AgentConfigError(f"config {path}: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise AgentConfigError(f"config {path}: expected a mapping of settings")
    out = {str(k).replace("-", "_"): v for k, v in doc.items()}
    for key in ("controller", "fabric", "secret_env", "allowed_hosts"):
        if isinstance(out.get(key), str):
            out[key] = [out[key]]
    return out


def parse_config(argv: list[str]) -> AgentConfig:
    """Flags over file over defaults; raises AgentConfigError (argparse exits on bad flags)."""
    ns = vars(envflags.parse(build_parser(), argv, "agent", secrets=SECRET_FLAGS))
    ns.pop("log_format", None)  # taken before this parser (runtime.logs.take_format)
    merged: dict[str, Any] = _from_file(ns.pop("config")) if "config" in ns else {}
    if "label" in ns:
        ns["label"] = _pairs(ns["label"], "label")
    if "engine_bin" in ns:
        ns["engine_bin"] = _pairs(ns["engine_bin"], "engine-bin")
    merged.update(ns)
    # The flags' type refuses NaN and inf already; the file's values only here.
    bad = finite.nonfinite_path(merged)
    if bad is not None:
        raise AgentConfigError(f"{bad}: {finite.NOT_FINITE}")
    try:
        cfg = msgspec.convert(merged, AgentConfig)
    except msgspec.ValidationError as exc:
        raise AgentConfigError(f"bad setting: {exc}") from exc
    if not cfg.address:
        cfg = msgspec.structs.replace(cfg, address=socket.gethostname())
    try:
        # Order: --token-file, --token (warned about), LLMGW_AGENT_TOKEN, the file's token.
        token = secretfile.resolve(
            program="agent",
            flag="--token",
            value=ns.get("token"),
            file=cfg.token_file,
            env_var=TOKEN_ENV,
        )
    except secretfile.SecretError as exc:
        raise AgentConfigError(f"token_file: {exc}") from None
    if token is not None:
        cfg = msgspec.structs.replace(cfg, token=token)
    _check(cfg)
    return cfg


def _check(cfg: AgentConfig) -> None:
    if cfg.gpus is not None and cfg.gpus_file is not None:
        raise AgentConfigError("give --gpus or --gpus-file, not both")
    try:
        cfg.ports  # noqa: B018  # parse now, so a bad range fails at start
        parse_engine_bins(cfg.engine_bin)
    except ValueError as exc:
        raise AgentConfigError(str(exc)) from exc
    _check_secret_env(cfg.secret_env)
    for name in cfg.allowed_hosts:
        problem = host_problem(name)
        if problem is not None:
            raise AgentConfigError(f"--allowed-host {problem}")
    if cfg.print_inventory:
        return
    missing = [
        flag
        for flag, value in (
            ("--controller", cfg.controller),
            ("--node", cfg.node),
            ("--state-dir", cfg.state_dir),
        )
        if not value
    ]
    if missing:
        raise AgentConfigError("missing " + ", ".join(missing))
    # Refused here: the controller refuses every heartbeat that names them (wire.names).
    for flag, value in [("--node", cfg.node), *(("--fabric", f) for f in cfg.fabric)]:
        problem = label_problem(value)
        if problem is not None:
            raise AgentConfigError(f"{flag} {problem}")
    for url in cfg.controller:
        if _has_userinfo(url):
            # Said without the URL (the part before "@" may be a password). The agent's
            # credential is its token: with one, aiohttp refuses URL credentials beside
            # it (ValueError), and the heartbeat loop died of it.
            raise AgentConfigError(
                "--controller: a URL with a user name or password; give http://HOST:PORT "
                "and the token in --token-file"
            )
        # Refused here: the heartbeat loop would only log its failure, forever.
        why = _url_problem(url)
        if why is not None:
            raise AgentConfigError(f"--controller {url!r}: {why}; expected http://HOST:PORT")


def _check_secret_env(names: tuple[str, ...]) -> None:
    """Each a variable name, none of the agent's own credentials (never an engine's), and
    none that engines need from the agent or that the agent sets (PATH, LD_LIBRARY_PATH,
    CUDA_VISIBLE_DEVICES): a listed variable is withheld from every engine."""
    for name in names:
        if not ENV_NAME.fullmatch(name):
            raise AgentConfigError(f"secret_env {name!r}: not a variable name")
        if is_private_env(name) or name in PRIVATE_ENV:
            raise AgentConfigError(
                f"secret_env {name}: the agent's own credential is never given to an engine"
            )
        if SpecPolicy().env_refused(name):
            raise AgentConfigError(
                f"secret_env {name}: not a secret but a variable that loads code or that the "
                "agent sets (wire/policy.py); listed, no engine would inherit it"
            )


def _has_userinfo(url: str) -> bool:
    try:
        return "@" in urlsplit(url).netloc
    except ValueError:  # a bad URL: _url_problem says why
        return False


def _url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port that is not 0-65535
    except ValueError as exc:
        return str(exc)
    if parts.scheme not in ("http", "https"):
        return "not an http(s) URL"
    if not parts.hostname:
        return "no host"
    return None


def check_address(address: str) -> None:
    """AgentConfigError unless `address` is one of this node's own addresses.

    Engines listen on it and the controller gives it to routers: an address no interface
    here holds (a typo, another host's, a copied config) would have engines fail to bind,
    or worse, routers sent to whoever holds it. Binding a socket to it is the test the
    engines themselves will face; a host name passes when one of its addresses does.
    The unspecified address (0.0.0.0, ::) always binds, but it is no one's address.
    """
    try:
        if ipaddress.ip_address(address).is_unspecified:
            raise AgentConfigError(
                f"--address {address!r} is not an address anyone can reach: engines would "
                "listen on every interface and routers would connect to their own host; "
                "give this node's address"
            )
    except ValueError:
        pass  # a host name
    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise AgentConfigError(
            f"--address {address!r} does not resolve on this node ({exc}); engines listen "
            "there and routers connect to it"
        ) from None
    for family, _, _, _, sockaddr in infos:
        try:
            with socket.socket(family, socket.SOCK_STREAM) as sock:
                sock.bind((sockaddr[0], 0, *sockaddr[2:]))
        except OSError:
            continue
        return
    shown = ", ".join(sorted({str(info[4][0]) for info in infos}))
    raise AgentConfigError(
        f"--address {address!r} ({shown}) is not an address of this node's interfaces: "
        "engines listen there and routers connect to it; give one this node holds"
    )
