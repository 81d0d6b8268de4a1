"""An engine's own error event inside a 200 stream, found without parsing the stream.

vLLM, SGLang and TGI report a failure that happens after the response started
as an SSE event, `data: {"error": {..., "code": 500}}`, followed by `[DONE]`.
The HTTP status was 200 long before, so unless someone looks,
the breaker records a success for an engine that is failing every stream.

Looking must cost next to nothing per relayed chunk. The one fact that makes
it cheap: inside JSON a quote is always escaped, so the bytes `{"error"` can
only appear unescaped where a JSON object opens with the key `error` — and
such an object starts an event only when a `data:` field name sits right
before it at the start of a line. One `bytes.find` per chunk finds candidates;
only a confirmed frame's line is decoded. Chunk boundaries fall anywhere (in
the marker, in `data:`, in the JSON), so the last few bytes of each chunk are
kept for the next, and a frame's line is gathered until its newline arrives.
"""

from __future__ import annotations

import re
from typing import Final

import msgspec

MARK: Final = b'{"error"'
# Anthropic's error event (`event: error`, `data: {"type": "error", "error": {...}}`),
# looked for instead in a Messages stream (apis.py); the same reasoning holds.
ANTHROPIC_MARK: Final = b'{"type":"error"'
# The Responses API's error event (`event: error`, `data: {"type": "error", "code",
# "message", ...}`) opens as Anthropic's does, or, written in the field order of the
# openai package's event type (code, message, param, sequence_number, type), with its
# code: no other Responses event opens with `code`. Its engine may also write OpenAI's
# frame (MARK) there, so a Responses stream is watched for all three (`also`).
RESPONSES_MARK: Final = b'{"type":"error"'
RESPONSES_CODE_MARK: Final = b'{"code"'
# Anthropic's error types that say the engine failed, as the status they stand for.
_FAILURE_TYPES: Final = {"api_error": 500, "internal_error": 500, "overloaded_error": 529}
# The same for the Responses API's error codes (a string, at the event's top level).
_FAILURE_CODES: Final = {"server_error": 500}
# Events that open a stream and carry no output, by their type: a Messages stream's
# and a Responses stream's (catalog.py). An error right after them comes before
# anything a client would miss, as after a chat stream's role opener.
MESSAGES_OPENERS: Final = (b"message_start", b"content_block_start", b"ping")
RESPONSES_OPENERS: Final = (
    b"response.created",
    b"response.in_progress",
    b"response.output_item.added",
    b"response.content_part.added",
)
# Enough of the previous chunk to hold a marker cut short plus `\ndata: ` before it.
TAIL_BYTES: Final = 32
# An error frame longer than this is not one an engine writes; stop gathering.
MAX_FRAME_BYTES: Final = 64 * 1024
# A code written as a string longer than this is no HTTP status, nor any code an
# engine writes.
MAX_CODE_DIGITS: Final = 9

_decode: Final = msgspec.json.Decoder().decode
# An SSE event's blocks (a blank line ends each), and the `event:` line naming its type.
_BLOCKS: Final = re.compile(rb"\r?\n\r?\n")
_EVENT_LINE: Final = re.compile(rb"^event: ?([^\r\n]*)\r?$", re.M)


class ErrorFrameWatch:
    """Feed it every relayed chunk in order; `code` is the first error frame's code."""

    __slots__ = ("_also", "_mark", "_pending", "_tail", "code", "message")

    def __init__(self, mark: bytes = MARK, *, also: tuple[bytes, ...] = ()) -> None:
        # What opens an error frame's JSON: MARK, or ANTHROPIC_MARK in a Messages stream;
        # `also`, other openings looked for too (a Responses stream's).
        self._mark = mark
        self._also = also
        # The stream starts as if after a newline: a first line `data: {"error"` counts.
        self._tail = b"\n"
        self._pending: bytearray | None = None  # a frame's line, until its newline
        # The first error frame's code as the engine wrote it (vLLM: the HTTP
        # status; TGI sends none); None: no frame seen, or one without a code.
        self.code: int | None = None
        self.message: str | None = None

    @property
    def endpoint_failure(self) -> bool:
        """An error frame with a 5xx code: the engine failed, not the request."""
        return self.code is not None and self.code >= 500

    @property
    def seen(self) -> bool:
        return self.message is not None

    def feed(self, chunk: bytes) -> None:
        if self.message is not None:
            return  # one verdict per stream: the first frame decides
        if self._pending is not None:
            self._gather(chunk)
            return
        data = self._tail + chunk
        kept = len(self._tail)
        self._tail = data[-TAIL_BYTES:]
        at = _frame_at(data, self._mark, kept)
        for also in self._also:
            other = _frame_at(data, also, kept)
            if other >= 0 and (at < 0 or other < at):
                at = other
        if at >= 0:
            self._pending = bytearray()
            self._gather(data[at:])

    def _gather(self, data: bytes) -> None:
        assert self._pending is not None
        end = data.find(b"\n")
        if end < 0:
            self._pending += data
            if len(self._pending) > MAX_FRAME_BYTES:
                self._pending = None
                self._tail = b""
            return
        line = bytes(self._pending) + data[:end]
        self._pending = None
        # Later frames still start at a line, after this one's newline.
        self._tail = data[end:][-TAIL_BYTES:]
        self._judge(line)

    def _judge(self, line: bytes) -> None:
        try:
            doc = _decode(line)
        except msgspec.DecodeError:
            return
        if type(doc) is not dict:
            return
        err = doc.get("error")
        if isinstance(err, dict):
            self.message = str(err.get("message") or "")
            code = err.get("code")
            # TGI's chat error frame names the status `http_status_code`.
            self.code = _code(err.get("http_status_code") if code is None else code)
            kind = err.get("type")
            if self.code is None and isinstance(kind, str):
                # Anthropic's frame has no code, only its type.
                self.code = _FAILURE_TYPES.get(kind)
        elif isinstance(err, str):
            self.message = err  # TGI: a string and no code
        elif err is None and doc.get("type") == "error":
            # The Responses API's error event: its code (a string) and message on top.
            message = doc.get("message")
            self.message = message if isinstance(message, str) else ""
            code = doc.get("code")
            self.code = _code(code)
            if self.code is None and isinstance(code, str):
                self.code = _FAILURE_CODES.get(code)
        else:
            self.message = ""


def _frame_at(data: bytes, mark: bytes, kept: int) -> int:
    """Where the first error frame opened by `mark` begins in `data`, or -1. The first
    `kept` bytes are the last chunk's tail: a mark wholly inside them was looked at then."""
    i = data.find(mark, max(0, kept - len(mark) + 1))
    while i >= 0:
        if _opens_event(data, i):
            return i
        i = data.find(mark, i + 1)
    return -1


def _opens_event(data: bytes, i: int) -> bool:
    """`data:` (one optional space) at the start of a line right before position `i`."""
    j = i - 1 if data[i - 1 : i] == b" " else i
    return data[j - 5 : j] == b"data:" and data[j - 6 : j - 5] in (b"\n", b"\r")


def _code(value: object) -> int | None:
    """A frame's code as a number: an int, or a string of at most MAX_CODE_DIGITS ASCII
    digits; None otherwise. `str.isdigit` alone let through digits `int()` refuses (`²`)
    and strings past its 4,300-digit bound: the ValueError ended the answer as a 500."""
    if type(value) is int:
        return value
    if (
        isinstance(value, str)
        and len(value) <= MAX_CODE_DIGITS
        and value.isascii()
        and value.isdigit()
    ):
        return int(value)
    return None


def nothing_before_error(
    head: bytes, marks: tuple[bytes, ...] = (MARK,), openers: tuple[bytes, ...] = ()
) -> bool:
    """Whether the first error frame in `head` (a stream's opening bytes) follows no output.

    Only events that carry none may come before it (`openers_only`): a replica that
    fails right after them produced nothing the client would miss. `marks`: what
    opens the API's error frame (ErrorFrameWatch's). Called only once an error frame
    was seen in the bytes held back before the response's head.
    """
    data = b"\n" + head  # as the watch reads a stream: from the start of a line
    at = -1
    for mark in marks:
        i = _frame_at(data, mark, 0)
        if i >= 0 and (at < 0 or i < at):
            at = i
    if at < 0:
        return False
    return openers_only(data[1 : data.rfind(b"data:", 0, at)], openers)


def openers_only(head: bytes, openers: tuple[bytes, ...] = ()) -> bool:
    """Whether `head` holds no event but ones that carry no output.

    `openers` empty: a chat stream, whose one such event is the role opener. Else
    the event types that open the API's streams (MESSAGES_OPENERS, RESPONSES_OPENERS):
    every event of `head` must name one as its `type` or its `event:` line; a block
    without data (the `event:` line of the frame that follows, a comment) carries
    none either. An event cut short that does not name one yet counts as output:
    the head is then sent, as it would have been.
    """
    if not openers:
        return role_opener_only(head)
    for block in _BLOCKS.split(head):
        if b"data:" in block and not _names_one(block, openers):
            return False
    return True


def _names_one(block: bytes, openers: tuple[bytes, ...]) -> bool:
    """Whether the SSE event `block` is of one of the `openers` types."""
    line = _EVENT_LINE.search(block)
    if line is not None:
        return line.group(1) in openers
    return any(b'"type":"' + name + b'"' in block for name in openers)


def role_opener_only(head: bytes) -> bool:
    """Whether `head` holds no event but, at most, a chat stream's role opener."""
    events = head.count(b"data:")
    return events == 0 or (events == 1 and b'"role"' in head and b'"content":""' in head)
