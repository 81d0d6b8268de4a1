"""`llmgw router --config FILE [--port P] [--host H]`: the data plane."""

from __future__ import annotations

import argparse
import gc
import os
import sys

from llmgw.router.config import load, upstream_client
from llmgw.router.errors import RouterConfigError
from llmgw.runtime import logs, serve
from llmgw.runtime.cli import DefaultsFormatter
from llmgw.runtime.httpserver import ServerLimits, raise_nofile_limit

DEFAULT_PORT = 8080


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw router", description=__doc__, formatter_class=DefaultsFormatter
    )
    p.add_argument("--config", required=True, help="YAML configuration file (reloaded on change)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="listen port; 0 picks one")
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument("--log-level", default=None, help="DEBUG shows every routing decision")
    logs.add_format_argument(p)
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        given = [] if args.log_format is None else [logs.FLAG, args.log_format]
        fmt, _ = logs.take_format(given)
    except logs.LogFormatError as exc:
        sys.stderr.write(f"llmgw router: {exc}\n")
        return 2
    logs.setup(args.log_level, fmt)
    try:
        cfg = load(args.config)
        upstream_client(cfg, os.environ)  # a bad $LLMGW_ROUTER_UPSTREAM stops us here
    except RouterConfigError as exc:
        sys.stderr.write(f"llmgw router: {exc}\n")
        return 2

    async def run() -> int:
        # Imported here so `--help` and config errors stay fast.
        from llmgw.router.app import build_app

        # Idle client connections must never starve engine connections of descriptors:
        # the soft limit goes to the hard one, and serve_app caps client connections
        # at half of it (runtime.httpserver.connection_cap).
        raise_nofile_limit()
        app = build_app(cfg, config_path=args.config)
        # Everything alive now (modules, the app) lives as long as the process: out of
        # the collector's sight, full collections stay short on the request path.
        gc.collect()
        gc.freeze()
        limits = ServerLimits(
            idle_timeout_s=cfg.idle_timeout_s,
            header_timeout_s=cfg.header_timeout_s,
            max_connections=cfg.max_client_connections,
            # OpenAI's API takes plain JSON; a small gzip body can inflate to gigabytes.
            decompress=False,
        )
        return await serve.serve_app(
            app, host=args.host, port=args.port, name="router", limits=limits
        )

    return serve.run(run)
