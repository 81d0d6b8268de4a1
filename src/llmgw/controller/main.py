"""`llmgw controller`: fleet state, placement and reconcile."""

from __future__ import annotations

import dataclasses
import logging
import sys

from llmgw.controller.config import ControllerConfig, derive_advertise_url, parse_args
from llmgw.runtime import logs, serve
from llmgw.runtime.httpserver import ServerLimits

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    try:
        fmt, argv = logs.take_format(argv)
    except logs.LogFormatError as exc:
        sys.stderr.write(f"llmgw controller: {exc}\n")
        return 2
    config = parse_args(argv)
    logs.setup(fmt=fmt)
    return serve.run(lambda: _serve(config))


async def _serve(config: ControllerConfig) -> int:
    from llmgw.controller.app import build_app, open_backends
    from llmgw.controller.fleet.spans import ActionSpans
    from llmgw.controller.store import StoreError
    from llmgw.runtime.tracing import TracingUnavailable

    spans = None
    if config.tracing is not None:
        try:
            spans = ActionSpans(config.tracing)
        except TracingUnavailable as exc:
            sys.stderr.write(f"llmgw controller: {exc}\n")
            return 2
    try:
        store, leadership = await open_backends(config)
    except StoreError as exc:
        sys.stderr.write(f"llmgw controller: {exc}\n")
        return 1
    # Bound here rather than by serve_app: with --port 0 the URL standbys are told
    # (--advertise-url's default) needs the port, and the app records it on leading.
    sock = serve.listen(config.host, config.port, "controller")
    port = int(sock.getsockname()[1])
    url = derive_advertise_url(config.advertise_url, config.host, port)
    config = dataclasses.replace(config, advertise_url=url)
    app = build_app(config, store, leadership, spans=spans)
    return await serve.serve_app(
        app,
        host=config.host,
        port=port,
        name="controller",
        grace_s=config.shutdown_grace_s,
        sock=sock,
        limits=ServerLimits(client_share=config.client_share),
    )
