"""Logging: short lowercase events with key=value fields, one logger per module.

Two formats, chosen per process with `--log-format text|json` (every program
takes it; `LLMGW_LOG_FORMAT` is the default when the flag is absent):

- text: `2026-12-01 21:58:08,123 INFO llmgw.router.request.proxy route rid=… model=…`
- json: one object per line, `{"ts": …, "level": …, "logger": …, "event": …, …fields}`.

Either way a record is one line (a traceback aside): a value a client sent (a path, a
request id) may hold a line feed, which in the text format forged a log line of the
client's own, or a terminal's escape sequence. The text format writes such characters
as Python writes them in a string (`\n`, `\x1b`); JSON escapes them itself. A value
holding white space or `"` is quoted in the text format (logfmt: `why="no room"`), so
a client's value cannot pass for fields of its own.

`kv(event, **fields)` returns a `str` (so `%`-free call sites and tests keep
working) that also carries the event and its fields, and the JSON formatter
writes those as keys instead of parsing the text back.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from typing import Any, Literal

LogFormat = Literal["text", "json"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
FLAG = "--log-format"


class LogFormatError(ValueError):
    """A bad `--log-format` value; the message is one line."""


class Event(str):
    """`event k=v …` as text, with the event and fields kept for the JSON format."""

    __slots__ = ("event", "fields")
    event: str
    fields: dict[str, object]

    def __new__(cls, event: str, fields: dict[str, object]) -> Event:
        text = event
        if fields:
            text += " " + " ".join(f"{k}={_value(v)}" for k, v in fields.items())
        self = super().__new__(cls, text)
        self.event = event
        self.fields = fields
        return self


def kv(event: str, **fields: object) -> str:
    """Render `event k=v k=v` for a log line (its fields become keys in JSON logs)."""
    return Event(event, fields)


def _value(value: object) -> str:
    """A field's value as the text format writes it: bare, or quoted (logfmt) when it
    holds white space or `"`. Bare, a client's request id of `x status=200` read as a
    field of its own, forged beside the real one. An `=` alone forges nothing (a value
    runs to the next space: `reason=LLMGW_ROUTER_COMPILED=0`), nor does an empty value
    (`team=`)."""
    text = str(value)
    if not any(c.isspace() or c == '"' for c in text):
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# LogRecord attributes that are not user fields (passed with `extra=`).
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
}


def _plain(value: object) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)


def _escape(c: str) -> str:
    return c if c.isprintable() else repr(c)[1:-1]


def one_line(text: str) -> str:
    """`text` with every character that is not printable (line ends, tabs, escape
    sequences' ESC, Unicode line separators) as its Python escape."""
    return text if text.isprintable() else "".join(map(_escape, text))


class TextFormatter(logging.Formatter):
    """`time level logger message`, the message on one line (`one_line`); a traceback
    follows it on lines of its own, as logging writes it."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return one_line(super().formatMessage(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts (Unix seconds), level, logger, event, fields."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": round(record.created, 6),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        msg = record.msg
        if isinstance(msg, Event) and not record.args:
            doc["event"] = msg.event
            for k, v in msg.fields.items():
                doc.setdefault(k, _plain(v))
        else:
            doc["event"] = record.getMessage()
        for k, v in record.__dict__.items():
            if k not in _RESERVED and not k.startswith("_"):
                doc.setdefault(k, _plain(v))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"))


def add_format_argument(parser: argparse.ArgumentParser) -> None:
    """List `--log-format` in a program's `--help`, worded the same everywhere.

    Programs that call `take_format` first never see the flag reach their parser;
    it is declared there so `--help` tells of it."""
    parser.add_argument(
        FLAG,
        choices=FORMATS,
        default=None,
        help="text (default, or $LLMGW_LOG_FORMAT) or json: one object per line",
    )


def take_format(argv: Sequence[str]) -> tuple[LogFormat, list[str]]:
    """Remove `--log-format X` / `--log-format=X` from argv; the format and the rest.

    Every program calls this before its own flag parser, so one flag means the
    same everywhere. Without the flag: $LLMGW_LOG_FORMAT, else text.
    """
    rest: list[str] = []
    chosen: str | None = None
    it = iter(argv)
    for arg in it:
        if arg == FLAG:
            chosen = next(it, None)
            if chosen is None:
                raise LogFormatError(f"{FLAG} needs a value: text or json")
        elif arg.startswith(FLAG + "="):
            chosen = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if chosen is None:
        chosen = os.environ.get("LLMGW_LOG_FORMAT") or "text"
    if chosen not in FORMATS:
        raise LogFormatError(f"{FLAG} must be text or json, not {chosen!r}")
    fmt: LogFormat = "json" if chosen == "json" else "text"
    return fmt, rest


def setup(level: str | None = None, fmt: LogFormat = "text") -> None:
    """Configure the root logger once per process (LLMGW_LOG_LEVEL overrides)."""
    lvl = (level or os.environ.get("LLMGW_LOG_LEVEL") or "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    logging.basicConfig(level=lvl, handlers=[handler])
    # aiohttp's access log is one line per request; the router's hot path cannot afford it.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
