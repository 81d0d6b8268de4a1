"""`llmgw controller`: fleet state, placement and reconcile."""

from __future__ import annotations

import logging
import sys

from llmgw.controller.config import ControllerConfig, parse_args
from llmgw.runtime import logs, serve

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
    app = build_app(config, store, leadership, spans=spans)
    return await serve.serve_app(
        app, host=config.host, port=config.port, name="controller", grace_s=config.shutdown_grace_s
    )
