"""Anthropic's Models API at the router: its model object and its list's pages. Pure.

The anthropic package's `models.list()` and `models.retrieve(id)` ask the paths
OpenAI's client asks (`GET /v1/models`, `GET /v1/models/{id}`), with
`anthropic-version` set and the key in `x-api-key`. A request with that header
is answered in Anthropic's shape (request/listing.py), any other in OpenAI's as
before: each client parses only its own, and neither sends the other's header.

A page is a window on the sorted model ids. `after_id` and `before_id` are
compared with the ids, not looked up among them: a cursor naming a model that
left the list between two pages (its last replica gone, its key narrowed)
still pages on, where a lookup would fail a client's loop halfway through.
With `before_id` the page is the last `limit` ids before it (the package pages
backward from `first_id`), else the first `limit` after `after_id` (or from
the start); `has_more` says whether more ids lie beyond the page that way.

The router knows no model's release date or display name: `created_at` is the
epoch (Anthropic's own value for an unknown date) and `display_name` the id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final
from urllib.parse import parse_qs

import msgspec

LIMIT_DEFAULT: Final = 20
LIMIT_MAX: Final = 1000
EPOCH: Final = "1970-01-01T00:00:00Z"
_BAD_LIMIT: Final = f"limit: must be a whole number from 1 to {LIMIT_MAX}."


class ModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One model as the Models API writes it."""

    id: str
    display_name: str
    created_at: str
    type: str = "model"
    # Every listed model takes requests (the package's ModelInfo reads the field).
    lifecycle: str = "active"


class ModelPage(msgspec.Struct, frozen=True, kw_only=True):
    """One page of the list."""

    data: list[ModelInfo]
    has_more: bool
    # None (JSON null): the page is empty.
    first_id: str | None
    last_id: str | None


class PageAsk(msgspec.Struct, frozen=True, kw_only=True):
    """What a list request asks for; a cursor None was not given."""

    limit: int = LIMIT_DEFAULT
    after_id: str | None = None
    before_id: str | None = None


_encode: Final = msgspec.json.Encoder().encode


def asked(headers: Mapping[str, str]) -> bool:
    """Whether a models request wants Anthropic's shape: it names an `anthropic-version`."""
    return headers.get("anthropic-version") is not None


def read_ask(query: str) -> PageAsk | str:
    """The page a list request's query string asks for, or why it is refused (a 400's
    message). A parameter given twice counts its last value; a blank one, as not given."""
    params = parse_qs(query)
    limit = LIMIT_DEFAULT
    raw = _last(params, "limit")
    if raw is not None:
        # isdecimal, not int(): int() takes " 5", "+5" and "1_0" too.
        if not (raw.isascii() and raw.isdecimal()) or len(raw) > 4:
            return _BAD_LIMIT
        limit = int(raw)
        if not 1 <= limit <= LIMIT_MAX:
            return _BAD_LIMIT
    return PageAsk(
        limit=limit, after_id=_last(params, "after_id"), before_id=_last(params, "before_id")
    )


def _last(params: dict[str, list[str]], name: str) -> str | None:
    values = params.get(name)
    return values[-1] if values else None


def page(models: Iterable[str], ask: PageAsk) -> ModelPage:
    """The page of `models` that `ask` names (the module docstring says how)."""
    after, before = ask.after_id, ask.before_id
    window = sorted(
        m for m in models if (after is None or m > after) and (before is None or m < before)
    )
    chosen = window[-ask.limit :] if before is not None else window[: ask.limit]
    return ModelPage(
        data=[model_info(m) for m in chosen],
        has_more=len(window) > len(chosen),
        first_id=chosen[0] if chosen else None,
        last_id=chosen[-1] if chosen else None,
    )


def model_info(model: str) -> ModelInfo:
    return ModelInfo(id=model, display_name=model, created_at=EPOCH)


def encode(obj: ModelPage | ModelInfo) -> bytes:
    return _encode(obj)
