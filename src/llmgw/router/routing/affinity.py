"""Session hints: a second signal beside the content, never in place of it.

A client may say which conversation a request belongs to: the `X-Session-ID`
header, else the OpenAI `user` field (which applications set on nearly every
request, as OpenAI asks them to). The prefix chain never includes it
(blockhash.py): content decides where a request goes. The hint only breaks a tie
the content leaves — among the endpoints holding the longest prefix of the
request, the one that served this session last — which is where a
conversation's newest turns are, when the blocks are too coarse to show them.

`SessionAffinity` remembers, per (model, session), the endpoint that served it
last and the first block of that request, in a bounded LRU. A remembered
endpoint counts only for a request with the same first block: a `user` who
opens a conversation over another system prompt gets no pull towards where
their last one ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from llmgw.router.routing.blockhash import request_block_hashes

# Hints longer than this are cut: the key is hashed, so the length only costs time.
MAX_HINT_CHARS: Final = 256


class RouteKey:
    """What routing knows of a request's content and session.

    A plain class, not a frozen dataclass: one is made per request, and the
    dataclass's generated `__init__` (object.__setattr__ per field) cost half as
    much as hashing the chain of a 300-byte chat request.
    Read-only by convention (`Final`); equal when chain and session are.
    """

    __slots__ = ("body", "hashes", "session")

    def __init__(
        self,
        hashes: tuple[int, ...] = (),
        session: int | None = None,
        body: Mapping[str, Any] | None = None,
    ) -> None:
        self.hashes: Final = hashes
        # hash((model, hint)), None without a hint. Per-process, like the chain.
        self.session: Final = session
        # The request body, for precise mode's tokenizer (kvevents.py); not compared.
        self.body: Final = body

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RouteKey):
            return NotImplemented
        return self.hashes == other.hashes and self.session == other.session

    def __hash__(self) -> int:
        return hash((self.hashes, self.session))

    def __repr__(self) -> str:
        return f"RouteKey(hashes={self.hashes!r}, session={self.session!r})"


NO_KEY: Final = RouteKey()


def session_hint(body: dict[str, Any], header: str | None) -> str | None:
    """The request's session hint: the header, else a non-empty string `user`, else None."""
    if header:
        return header[:MAX_HINT_CHARS]
    user = body.get("user")
    if isinstance(user, str) and user:
        return user[:MAX_HINT_CHARS]
    return None


def route_key(body: dict[str, Any], session_header: str | None) -> RouteKey:
    """The request's content chain and session key."""
    hint = session_hint(body, session_header)
    session = None if hint is None else hash((str(body.get("model", "")), hint))
    return RouteKey(request_block_hashes(body), session, body)


class SessionAffinity:
    """Session key → (endpoint that served it last, that request's first block), LRU-bounded."""

    def __init__(self, *, max_sessions: int = 200_000) -> None:
        self._max = max(1, max_sessions)
        # A plain dict kept in use order (a served session is taken out and put back
        # last; the first is the least recently served): compiled, its operations are
        # direct calls, where an OrderedDict's (move_to_end, popitem) were generic ones.
        self._last: dict[int, tuple[str, int]] = {}

    def __len__(self) -> int:
        return len(self._last)

    def last(self, key: RouteKey) -> str | None:
        """Where this session was served last, if its request started the same way."""
        if key.session is None or not key.hashes:
            return None
        got = self._last.get(key.session)
        if got is None or got[1] != key.hashes[0]:
            return None
        return got[0]

    def served(self, key: RouteKey, endpoint_id: str) -> None:
        if key.session is None or not key.hashes:
            return
        last = self._last
        session = key.session
        if session in last:
            del last[session]
        last[session] = (endpoint_id, key.hashes[0])
        if len(last) > self._max:
            del last[next(iter(last))]

    def retain(self, endpoint_ids: Iterable[str]) -> None:
        """Forget sessions last served by an endpoint not listed (it left)."""
        keep = set(endpoint_ids)
        for s in [s for s, (ep, _) in self._last.items() if ep not in keep]:
            del self._last[s]
