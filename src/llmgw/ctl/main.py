"""`llmgw ctl [--controller URL] [--token T] COMMAND …`: the operator's CLI (docs/ctl.md).

Start-up cost is part of the interface: this module imports argparse and
nothing heavy (no rich, aiohttp, msgspec, yaml); each command's module is
imported only once it is chosen, so `llmgw ctl --help` answers at once.
A test keeps it so (tests/integration/test_ctl_startup.py).

Exit codes: 0 done; 1 the controller was unreachable, rejected the token
(401), does not know the subject (404), refused the input, a drain timed
out, or stdout could not be written — always with one line on stderr, never a
traceback; 2 bad command line; 141 the reader of stdout went away (`| head`), silently.
The `--json` shapes are documented in docs/ctl.md.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import os
import sys
from collections.abc import Mapping
from pathlib import Path

from llmgw.adminclient.errors import AdminError, AdminUnauthorized
from llmgw.ctl import config
from llmgw.ctl.context import Ctx
from llmgw.ctl.durations import duration_arg, since_arg
from llmgw.ctl.errors import CtlError, OutputFailed, ReaderGone, SpecError
from llmgw.runtime.cli import DefaultsFormatter
from llmgw.runtime.finite import finite_float
from llmgw.runtime.version import add_version_argument

# command → "module:function"; each function is (args, ctx) -> exit code.
HANDLERS = {
    "status": "llmgw.ctl.commands.read:status",
    "nodes": "llmgw.ctl.commands.read:nodes",
    "models": "llmgw.ctl.commands.read:models",
    "replicas": "llmgw.ctl.commands.read:replicas",
    "events": "llmgw.ctl.commands.read:events",
    "logs": "llmgw.ctl.commands.logs:logs",
    "cordon": "llmgw.ctl.commands.nodes:cordon",
    "uncordon": "llmgw.ctl.commands.nodes:uncordon",
    "drain": "llmgw.ctl.commands.nodes:drain",
    "apply": "llmgw.ctl.commands.models:apply",
    "delete": "llmgw.ctl.commands.models:delete",
    "scale": "llmgw.ctl.commands.models:scale",
    "bench": "llmgw.ctl.commands.bench:bench",
    "keys": "llmgw.ctl.commands.keys:keys",
    "usage": "llmgw.ctl.commands.usage:usage",
    "completion": "llmgw.ctl.completion:completion",
}

# The reader of ctl's output went away (`| head -1`): 128 + SIGPIPE, as a shell reports a
# program the signal ended; nothing is said (errors.ReaderGone).
EXIT_READER_GONE = 141

# -o values (output.FORMATS; repeated here so --help imports nothing).
OUTPUT_FORMATS = ("table", "wide", "tsv", "json")


def _connection_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    # Accepted before or after the command; after-the-command values win only if given.
    default = None if top else argparse.SUPPRESS
    parser.add_argument(
        "--controller",
        metavar="URL",
        default=default,
        help=f"controller URL (env {config.ENV_CONTROLLER}; default {config.DEFAULT_CONTROLLER})",
    )
    parser.add_argument(
        "--token", metavar="T", default=default, help=f"admin token (env {config.ENV_TOKEN})"
    )
    parser.add_argument(
        "--token-file",
        metavar="FILE",
        default=default,
        help=f"read the admin token from this file (env {config.ENV_TOKEN_FILE})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=False if top else argparse.SUPPRESS,
        help="print JSON, the shapes in docs/ctl.md (same as -o json)",
    )
    parser.add_argument(
        "-o",
        "--output",
        choices=OUTPUT_FORMATS,
        default=default,
        help="table (default in a terminal), wide (default when piped: nothing cut), tsv, or json",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        formatter_class=DefaultsFormatter,
        prog="llmgw ctl",
        description="The operator's CLI: the fleet at a glance, and the operator's commands.",
        epilog="Settings come from flags, then LLMGW_CONTROLLER / LLMGW_TOKEN, then "
        "$XDG_CONFIG_HOME/llmgw/ctl.yaml (~/.config/llmgw/ctl.yaml).",
    )
    add_version_argument(parser, "ctl")
    _connection_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=DefaultsFormatter)
        _connection_options(p, top=False)
        return p

    p = command("status", "the fleet on one screen: capacity, what is broken, what is idle")
    p.add_argument("--watch", action="store_true", help="refresh in place until Ctrl-C")
    p.add_argument(
        "--interval", type=finite_float, default=2.0, metavar="S", help="seconds (default 2)"
    )
    command("nodes", "list nodes")
    command("models", "list models")
    p = command("replicas", "list replicas (IDLE is '-' when no router has reported it)")
    p.add_argument("--model", metavar="M", help="only this model's replicas")
    p.add_argument("--state", metavar="S", help="only replicas in this state")
    p = command("events", "the event log, oldest first")
    p.add_argument("--model", metavar="M", help="only events of this model")
    p.add_argument("--replica", metavar="R", help="only events about this replica")
    p.add_argument("--node", metavar="N", help="only events about this node")
    p.add_argument("--limit", type=int, default=200, metavar="N", help="last N (default 200)")
    p.add_argument(
        "--detail",
        type=int,
        metavar="ID",
        help="one event whole: its full message (command line, log tail)",
    )
    p = command("logs", "the last lines of a replica's engine log, from its node's agent")
    p.add_argument("replica", help="the replica's id (ctl replicas)")
    p.add_argument(
        "--tail", type=_tail_lines, default=100, metavar="N", help="last N lines (1 to 10000)"
    )
    p.add_argument(
        "--rank", type=int, default=0, metavar="R", help="which node of a multi-node replica"
    )
    p.add_argument(
        "--follow", "-f", action="store_true", help="print new lines as they come, until Ctrl-C"
    )
    p.add_argument(
        "--interval", type=finite_float, default=2.0, metavar="S", help="--follow polls this often"
    )

    command("cordon", "stop placing new replicas on a node").add_argument(
        "node", help="the node's name"
    )
    command("uncordon", "allow placement on a node again").add_argument(
        "node", help="the node's name"
    )
    p = command("drain", "move a node's replicas elsewhere and wait until it is empty")
    p.add_argument("node", help="the node's name")
    p.add_argument(
        "--timeout",
        type=finite_float,
        default=600.0,
        metavar="S",
        help="give up after S s (default 600)",
    )
    p.add_argument("--grace-s", type=finite_float, metavar="S", help="in-flight grace per replica")
    p.add_argument("--no-wait", action="store_true", help="start the drain and return")
    p.add_argument(
        "--force",
        action="store_true",
        help="replicas with no room for a replacement drain anyway (capacity drops); "
        "by default they keep serving and the drain waits",
    )
    p.add_argument(
        "--evict-idle",
        action="store_true",
        help="make room for replacements that do not fit by evicting replicas of other "
        "models known idle past their idle_timeout_s (never below min_replicas, never "
        "unknown idleness, never a higher priority); tried before --force",
    )

    p = command("apply", "create or update model specs from a YAML file (all or nothing)")
    p.add_argument("-f", "--file", required=True, metavar="FILE", help="YAML; '-' for stdin")
    p.add_argument("--dry-run", action="store_true", help="validate only")
    command("delete", "delete a model (its replicas drain)").add_argument(
        "model", help="the model's name"
    )
    p = command("scale", "change a model's replica bounds")
    p.add_argument("model", help="the model's name")
    p.add_argument(
        "--min", type=int, dest="min_replicas", metavar="N", help="new min_replicas (kept if unset)"
    )
    p.add_argument(
        "--max", type=int, dest="max_replicas", metavar="M", help="new max_replicas (kept if unset)"
    )

    p = command("bench", "measure a replica's capacity and record its routing weight")
    p.add_argument("replica", help="the replica's id (ctl replicas)")
    p.add_argument("--max-concurrency", type=int, default=64, metavar="N", help="default 64")
    p.add_argument(
        "--duration-s",
        type=finite_float,
        default=5.0,
        metavar="S",
        help="seconds per concurrency level",
    )
    p.add_argument("--max-tokens", type=int, default=64, metavar="N", help="tokens per request")
    p.add_argument("--no-record", action="store_true", help="measure only; keep the weight")
    _keys_parser(command("keys", "client API keys: create, list, revoke (docs/tenants.md)"))
    p = command("usage", "token usage by hour, per key, team or model (docs/tenants.md)")
    p.add_argument("--by", choices=("key", "team", "model"), default="key", help="rows per")
    p.add_argument(
        "--since",
        type=since_arg,
        default=duration_arg("24h"),
        metavar="DURATION",
        help="from the hour this long ago, e.g. 24h, 7d, 90m (default 24h)",
    )
    p.add_argument(
        "--limit",
        type=_usage_limit,
        default=None,
        metavar="N",
        help="at most N rows, the newest whole hours (default: the controller's, 10000)",
    )
    p = command(
        "completion", 'print a shell completion script: eval "$(llmgw ctl completion bash)"'
    )
    p.add_argument("shell", choices=("bash", "zsh"), help="which shell")
    return parser


def _tail_lines(text: str) -> int:
    """`ctl logs --tail`: 1 to the controller's largest (wire.logs.MAX_TAIL_LINES)."""
    from llmgw.wire.logs import MAX_TAIL_LINES

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_TAIL_LINES:
        raise argparse.ArgumentTypeError(f"must be 1 to {MAX_TAIL_LINES}, got {value}")
    return value


def _usage_limit(text: str) -> int:
    """`ctl usage --limit`: 1 to the controller's largest (wire.usage.MAX_USAGE_LIMIT)."""
    from llmgw.wire.usage import MAX_USAGE_LIMIT

    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_USAGE_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r}: a number of rows, 1 to {MAX_USAGE_LIMIT}")
    return value


def _keys_parser(parent: argparse.ArgumentParser) -> None:
    sub = parent.add_subparsers(dest="keys_command", metavar="SUBCOMMAND")

    def command(name: str, help_: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_, description=help_, formatter_class=DefaultsFormatter)
        _connection_options(p, top=False)
        return p

    p = command("create", "create a key; it is printed once, alone on the last line")
    p.add_argument("name", help="the key's name (who or what uses it)")
    p.add_argument("--team", required=True, metavar="T", help="the team its usage counts to")
    p.add_argument("--models", metavar="M1,M2", help="only these models (default: every model)")
    p.add_argument("--rpm", type=int, metavar="N", help="requests per minute (default: no limit)")
    p.add_argument("--tpm", type=int, metavar="N", help="tokens per minute (default: no limit)")
    p.add_argument("--budget-tokens", type=int, metavar="N", help="tokens per --per period")
    p.add_argument("--per", choices=("day", "week", "month"), help="the budget's period (UTC)")
    p.add_argument("--priority", choices=("critical", "standard", "batch"), help="default standard")
    p.add_argument("--expires-in", metavar="DURATION", help="e.g. 30d, 12h (default: never)")
    command("list", "list keys and their limits (never a key)")
    command("revoke", "revoke a key: every router refuses it within seconds").add_argument(
        "name", help="the key's name"
    )


def main(
    argv: list[str],
    *,
    env: Mapping[str, str] | None = None,
    home: Path | None = None,
    base: Ctx | None = None,
) -> int:
    """Run one ctl command. Tests pass `env`, `home` and a `base` Ctx (fake transport, clock)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if base is None:
        if sys.stdout is None:
            # Started with `>&-`: refused before anything is done, rather than a command
            # that acts and then cannot say so.
            _say(_standard_streams(), "standard output is closed; nothing was done")
            return 1
        base = _standard_streams()
    try:
        if not args.command:
            parser.print_help(base.out)
            base.out.flush()
            return 2
        target = config.resolve(
            flag_url=args.controller,
            flag_token=args.token,
            flag_token_file=args.token_file,
            env=os.environ if env is None else env,
            home=Path.home() if home is None else home,
            # Tests that pass `home` pass no folder to find `llmgw up`'s token in.
            cwd=Path.cwd() if home is None else None,
        )
        ctx = dataclasses.replace(
            base, url=target.url, token=target.token, output=args.output or base.output
        )
        module_name, func = HANDLERS[args.command].split(":")
        handler = getattr(importlib.import_module(module_name), func)
        code: int = handler(args, ctx)
        # Flushed here, not as the interpreter exits: a full disk or a reader gone is
        # reported below rather than as Python's "Exception ignored".
        base.out.flush()
        return code
    except ReaderGone:
        return EXIT_READER_GONE
    except CtlError as exc:
        _say(base, str(exc), several_lines=isinstance(exc, SpecError))
        return 1
    except AdminError as exc:
        hint = (
            "; set --token-file, LLMGW_TOKEN_FILE or LLMGW_TOKEN"
            if isinstance(exc, AdminUnauthorized)
            else ""
        )
        _say(base, f"{exc}{hint}")
        return 1
    except KeyboardInterrupt:
        _say(base, "interrupted")
        return 130


def _standard_streams() -> Ctx:
    """The process's stdout and stderr, their write failures ctl's errors (ctl.streams)."""
    from llmgw.ctl.streams import Output

    return Ctx(out=Output(sys.stdout, name="stdout"), err=Output(sys.stderr, name="stderr"))


def _say(ctx: Ctx, message: str, *, several_lines: bool = False) -> None:
    """One refusal on stderr. Messages quote names and reasons from the fleet, the
    operator's own arguments and the controller's wording: made visible (ctl.shown),
    never written raw to a terminal. One line, so a line break in a quoted name (a
    controller echoes `DELETE /admin/models/x\\ny`) is shown as `\\n`; only a spec
    file's problems are several lines, each of them made visible."""
    from llmgw.ctl.shown import lines, visible

    shown = lines(message) if several_lines else visible(message)
    # stderr itself may be full or gone: the exit code is all that is left to say it.
    with contextlib.suppress(OutputFailed):
        ctx.err.write(f"llmgw ctl: {shown}\n")
        ctx.err.flush()
