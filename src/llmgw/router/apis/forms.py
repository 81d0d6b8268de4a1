"""The few fields the router reads of a multipart/form-data upload (the audio routes).

An upload is read whole, like a JSON body, under the same `max_body_bytes`
bound and in-flight budget (intake.py): the engine needs it whole anyway,
and a retry on another replica needs it again. Only the named text fields
(`model`, `stream`) are looked for, by searching the body for the boundary,
without copying the file parts; the body goes to the engine as it came, with
its own Content-Type (and so its boundary).

The router routes, admits (a key's models) and counts the request by the
`model` it reads here, and the engine answers for the `model` it reads itself:
the two must be the same field, or a key allowed one model gets another served
by the same engine (an adapter, a second served name). So the form is read as
the engines' parsers read it (python-multipart behind vLLM's FastAPI, aiohttp
behind the sim-engine) and where they could differ it is refused (FormError,
400), never guessed:

- the Content-Type names one boundary (parameters split outside quotes);
- a delimiter is `--boundary` at the body's start or after CRLF, followed by CRLF
  (a part) or `--` (the end); `--boundaryX` inside a file is the file's bytes;
- a part's Content-Disposition parameters are split outside quoted strings, so a
  quoted `"; name=model"` is text;
- a field read here given twice (the engines keep the last, where reading the
  first would route by one and serve the other), a part with two
  Content-Dispositions or two names, an extended `name*`, a name with a
  backslash (unescaped differently by each parser), and a read field's value
  that is not UTF-8, is transfer-encoded or is sent as a file (a `filename`,
  even an empty one, which the parsers do not all read alike), are refused.
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

# One `; key=value` parameter: a token, or a quoted string with backslash escapes.
_PARAM: Final = re.compile(rb'\s*;\s*([^\s;="]*)\s*(?:=\s*("(?:[^"\\]|\\.)*"|[^\s;"]*))?\s*')
# Transfer encodings that leave a value's bytes as they are.
_IDENTITY: Final = frozenset({b"7bit", b"8bit", b"binary"})


class FormError(ValueError):
    """The body is not the multipart form its Content-Type says; the message says why."""


def boundary(content_type: str) -> bytes:
    """The boundary of a `multipart/form-data` Content-Type; FormError when there is none,
    or more than one (the engines' parsers keep the last, and one body can hold a form
    under each)."""
    raw = content_type.encode("latin-1", "replace")
    if raw.partition(b";")[0].strip().lower() != b"multipart/form-data":
        raise FormError("the body must be multipart/form-data")
    found = [v for k, v in _params(raw, "the multipart Content-Type") if k == b"boundary"]
    if len(found) > 1:
        raise FormError("the multipart Content-Type has more than one boundary")
    if not found or not 0 < len(found[0]) <= 200:
        raise FormError("the multipart Content-Type has no boundary")
    return found[0]


def _params(value: bytes, what: str) -> list[tuple[bytes, bytes]]:
    """A header's parameters (after its value's type), names lowercased, quoted
    values without their quotes (not unescaped: a name with a backslash is refused, and
    no other value is read); FormError where they do not parse."""
    at = value.find(b";")
    out: list[tuple[bytes, bytes]] = []
    end = len(value.rstrip())
    while 0 <= at < end:
        m = _PARAM.match(value, at)
        if m is None or m.end() == at:
            raise FormError(f"{what} does not parse")
        v = m.group(2) or b""
        if v.startswith(b'"'):
            v = v[1:-1]
        if m.group(1):
            out.append((m.group(1).lower(), v))
        at = m.end()
    return out


class _Part:
    """What the router reads of one part's headers: its name, and whether its value is
    sent transfer-encoded or as a file."""

    __slots__ = ("encoded", "file", "name")

    def __init__(self, head: bytes) -> None:
        self.name: str | None = None
        self.encoded = False
        # A filename (even an empty one): python-multipart and Starlette read the part
        # as a file, aiohttp as a file only when the name is not empty.
        self.file = False
        dispositions = 0
        for line in head.split(b"\r\n"):
            key, _, value = line.partition(b":")
            key = key.strip().lower()
            if key == b"content-transfer-encoding":
                self.encoded = value.strip().lower() not in _IDENTITY
            elif key == b"content-disposition":
                dispositions += 1
                if dispositions > 1:
                    raise FormError("a part of the multipart form has two Content-Dispositions")
                params = _params(value, "a part's Content-Disposition")
                self.name = _name(params)
                self.file = any(k in (b"filename", b"filename*") for k, _ in params)


def _name(params: list[tuple[bytes, bytes]]) -> str | None:
    names = [v for k, v in params if k == b"name"]
    if any(k == b"name*" for k, _ in params):
        raise FormError("a part of the multipart form is named by name*, which is not supported")
    if len(names) > 1:
        raise FormError("a part of the multipart form has more than one name")
    if not names:
        return None
    if b"\\" in names[0]:
        raise FormError("a part of the multipart form has a name with a backslash")
    return names[0].decode("utf-8", "replace")


def _delimiter(body: bytes, delim: bytes, at: int) -> int:
    """Where the next delimiter from `at` begins (its CRLF), or -1: `delim` after CRLF and
    followed by CRLF or `--`."""
    while True:
        at = body.find(b"\r\n" + delim, at)
        if at < 0:
            return -1
        after = at + 2 + len(delim)
        if body[after : after + 2] in (b"\r\n", b"--"):
            return at
        at = after


def text_fields(body: bytes, content_type: str, names: Collection[str]) -> dict[str, str]:
    """The values of the fields in `names` found in the form; FormError if one is there
    twice, or the form is one the engine could read otherwise (the module docstring)."""
    delim = b"--" + boundary(content_type)
    if body.startswith(delim) and body[len(delim) : len(delim) + 2] in (b"\r\n", b"--"):
        at = 0
    else:
        at = _delimiter(body, delim, 0)
        if at < 0:
            raise FormError("the body holds no part of the multipart form")
        at += 2
    out: dict[str, str] = {}
    while True:
        start = at + len(delim)
        if body[start : start + 2] == b"--":
            return out  # the closing delimiter
        head_end = body.find(b"\r\n\r\n", start)
        if head_end < 0:
            raise FormError("a part of the multipart form has no end of headers")
        nxt = _delimiter(body, delim, head_end)
        if nxt < 0:
            raise FormError("the multipart form has no closing boundary")
        part = _Part(body[start + 2 : head_end])
        name = part.name
        if name is not None and name in names:
            if name in out:
                raise FormError(f"the multipart form has more than one `{name}` field")
            if part.file:
                # The engine reads a file, not this text: routed by one model and
                # served another (its default), or refused there after admission.
                raise FormError(f"the `{name}` field of the multipart form is a file")
            if part.encoded:
                raise FormError(f"the `{name}` field of the multipart form is encoded")
            try:
                out[name] = body[head_end + 4 : nxt].decode("utf-8")
            except UnicodeDecodeError:
                raise FormError(f"the `{name}` field of the multipart form is not UTF-8") from None
        at = nxt + 2
