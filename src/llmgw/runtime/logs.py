"""Logging: short lowercase events with key=value fields, one logger per module."""

from __future__ import annotations

import logging
import os
import sys


def setup(level: str | None = None) -> None:
    """Configure the root logger once per process (LLMGW_LOG_LEVEL overrides)."""
    lvl = (level or os.environ.get("LLMGW_LOG_LEVEL") or "INFO").upper()
    logging.basicConfig(
        level=lvl,
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # aiohttp's access log is one line per request; the router's hot path cannot afford it.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def kv(event: str, **fields: object) -> str:
    """Render `event k=v k=v` for a log line."""
    if not fields:
        return event
    return event + " " + " ".join(f"{k}={v}" for k, v in fields.items())
