"""Answers that are not the controller's JSON, as one line for a person.

Between ctl and the controller there may be a reverse proxy, a load balancer or a
login gateway; what they answer is HTML, plain text or compressed bytes. Quoted raw,
a 502 page filled the error line with markup, and a login page that came as 200 was
"JSON is malformed (byte 0)", which says nothing about where it came from. So:

- `content(body, encoding, limit=…)`: the body with a `Content-Encoding` undone
  (gzip, deflate): ctl asks for none, but a proxy may compress anyway;
- `is_json(content_type)`: whether a Content-Type says JSON (None: it said nothing);
- `page_text(body, content_type)`: what such a page says, in at most `PAGE_CHARS`
  characters: its title, else its text without tags.
"""

from __future__ import annotations

import html
import re
import zlib

# The most characters of a page quoted in a message.
PAGE_CHARS = 120

_TITLE = re.compile(rb"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_TAG = re.compile(r"<[^>]*>")
_HIDDEN_BLOCK = re.compile(r"<(script|style)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)


class UnreadableEncoding(Exception):
    """The body's Content-Encoding is one ctl cannot undo, or the bytes are not in it."""


class DecodedTooLarge(Exception):
    """The body, decompressed, is larger than the bound."""


def content(body: bytes, encoding: str | None, *, limit: int) -> bytes:
    """`body` with its Content-Encoding undone, at most `limit` bytes of it."""
    name = (encoding or "").strip().lower()
    if name in ("", "identity"):
        return body
    if name not in ("gzip", "x-gzip", "deflate"):
        raise UnreadableEncoding(f"Content-Encoding {encoding!r:.40}, which ctl cannot read")
    # 32 + 15: a zlib or gzip header, told apart by the decompressor.
    inflate = zlib.decompressobj(32 + 15)
    try:
        out = inflate.decompress(body, limit + 1)
    except zlib.error as exc:
        raise UnreadableEncoding(f"Content-Encoding {name}, but the bytes are not ({exc})") from exc
    if len(out) > limit or inflate.unconsumed_tail:
        # A few kilobytes may inflate to gigabytes: the bound holds for what comes out.
        raise DecodedTooLarge
    return out


def is_json(content_type: str | None) -> bool | None:
    """True for application/json and `+json` types; None when no type was given."""
    if not content_type:
        return None
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def page_text(body: bytes, content_type: str | None) -> str:
    """What a page says: the title of an HTML page, else its text without tags, one line."""
    looks_html = "html" in (content_type or "").lower() or body.lstrip()[:1] == b"<"
    title = _TITLE.search(body[:65536]) if looks_html else None
    raw = (title.group(1) if title else body[:4096]).decode("utf-8", "replace")
    if looks_html:
        raw = html.unescape(_TAG.sub(" ", _HIDDEN_BLOCK.sub(" ", raw)))
    words = " ".join(raw.split())
    return words if len(words) <= PAGE_CHARS else words[: PAGE_CHARS - 1] + "…"
