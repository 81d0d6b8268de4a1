"""The few fields the router reads of a multipart/form-data upload (the audio routes).

An upload is read whole, like a JSON body, under the same `max_body_bytes`
bound and in-flight budget (intake.py): the engine needs it whole anyway,
and a retry on another replica needs it again. Only the named text fields
(`model`, `stream`) are looked for, by searching the body for the boundary,
without copying the file parts; the body goes to the engine as it came, with
its own Content-Type (and so its boundary).
"""

from __future__ import annotations

from collections.abc import Collection


class FormError(ValueError):
    """The body is not the multipart form its Content-Type says; the message says why."""


def boundary(content_type: str) -> bytes:
    """The boundary of a `multipart/form-data` Content-Type; FormError when there is none."""
    kind, _, params = content_type.partition(";")
    if kind.strip().lower() != "multipart/form-data":
        raise FormError("the body must be multipart/form-data")
    for param in params.split(";"):
        name, _, value = param.strip().partition("=")
        if name.lower() == "boundary" and value:
            value = value.strip('"')
            if 0 < len(value) <= 200:
                return value.encode("latin-1", "replace")
    raise FormError("the multipart Content-Type has no boundary")


def _field_name(head: bytes) -> str | None:
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() != b"content-disposition":
            continue
        for param in value.split(b";"):
            key, _, v = param.strip().partition(b"=")
            if key.lower() == b"name":
                return v.strip(b'"').decode("utf-8", "replace")
    return None


def text_fields(body: bytes, content_type: str, names: Collection[str]) -> dict[str, str]:
    """The values of the fields in `names` found in the form (the first of each)."""
    delim = b"--" + boundary(content_type)
    at = body.find(delim)
    if at < 0:
        raise FormError("the body holds no part of the multipart form")
    out: dict[str, str] = {}
    while True:
        start = at + len(delim)
        if body[start : start + 2] == b"--":
            return out  # the closing delimiter
        head_end = body.find(b"\r\n\r\n", start)
        if head_end < 0:
            raise FormError("a part of the multipart form has no end of headers")
        nxt = body.find(b"\r\n" + delim, head_end)
        if nxt < 0:
            raise FormError("the multipart form has no closing boundary")
        name = _field_name(body[start:head_end])
        if name is not None and name in names and name not in out:
            out[name] = body[head_end + 4 : nxt].decode("utf-8", "replace")
        at = nxt + 2
