"""The controller's admin API: one method per route, wire types out.

Two layers, so tests need no socket:
- a `Transport` sends one request and returns (status, body); `UrllibTransport`
  is the real one (the stdlib keeps `llmgw ctl` quick to start), tests pass a
  fake that answers from memory;
- `AdminClient` builds paths, encodes bodies, decodes answers into `llmgw.wire`
  types and turns every failure into an `AdminError` (errors.py), here and only here.
"""

from __future__ import annotations

import http.client
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import NamedTuple, Protocol, TypeVar

import msgspec

from llmgw.adminclient import bounded, foreign
from llmgw.adminclient.errors import (
    AdminError,
    AdminNotAController,
    AdminNotFound,
    AdminNotLeader,
    AdminRejected,
    AdminServerFailed,
    AdminUnauthorized,
    AdminUnreachable,
)
from llmgw.adminclient.pages import MAX_PAGES, next_after
from llmgw.runtime.netaddr import is_loopback
from llmgw.wire.adapters import AdapterSpec
from llmgw.wire.admin import (
    DrainRequest,
    EngineKey,
    EventView,
    ModelView,
    ModelViewRead,
    NodeView,
    ReplicaView,
    Summary,
    WeightRequest,
)
from llmgw.wire.errors import ErrorBody
from llmgw.wire.keys import KeyCreate, KeyCreated, KeyRevoked, KeyView
from llmgw.wire.logs import ReplicaLogs
from llmgw.wire.models import ModelSpec, ScaleRequest
from llmgw.wire.usage import UsageAnswer, UsageBy

T = TypeVar("T")
R = TypeVar("R")


class Response(NamedTuple):
    status: int
    body: bytes
    # A redirect's Location (never followed: see UrllibTransport); None otherwise.
    location: str | None = None
    # The Link header of a paged list's answer (pages.py); None: no header.
    link: str | None = None
    # The Content-Type header; None: none given (a fake transport's answer).
    content_type: str | None = None


class Transport(Protocol):
    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Response:
        """Send one request; any HTTP status is an answer, no answer raises `AdminUnreachable`."""
        ...


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx is the answer: urllib would follow it with every header, the bearer token
    included, to whatever host its Location names. A controller never redirects."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


def _opener(url: str, *, deadline: float) -> urllib.request.OpenerDirector:
    """No redirects; no proxy for a loopback controller; the answer whole by `deadline`.

    urllib sends every request through `http_proxy` unless `no_proxy` names the host,
    127.0.0.1 and localhost included: the token would leave this host for a proxy that
    cannot even reach the controller. Built per request, so the proxy settings are the
    environment's at that moment.
    """
    host = urllib.parse.urlsplit(url).hostname or ""
    if host == "localhost" or is_loopback(host):
        return bounded.opener(urllib.request.ProxyHandler({}), _NoRedirects(), deadline=deadline)
    return bounded.opener(_NoRedirects(), deadline=deadline)


class UrllibTransport:
    """The real transport: one short-lived connection per request, which is what a CLI makes.

    `timeout_s` bounds each wait for a byte; the answer as a whole must also be in
    within `answer_within_s` and `max_answer_bytes` (bounded.py says why).
    """

    def __init__(
        self, *, answer_within_s: float = 60.0, max_answer_bytes: int = 64 * 1024 * 1024
    ) -> None:
        self._answer_within_s = answer_within_s
        self._max_answer_bytes = max_answer_bytes

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Response:
        req = urllib.request.Request(url, data=body, method=method, headers=dict(headers))
        deadline = time.monotonic() + self._answer_within_s
        try:
            return _exchange(req, url, timeout_s, deadline, self._max_answer_bytes)
        except bounded.AnswerDeadline as exc:
            raise AdminUnreachable(
                f"the controller at {url} did not finish its answer within "
                f"{self._answer_within_s:g}s (bytes kept coming, too slowly or without end)"
            ) from exc
        except (bounded.AnswerTooLarge, foreign.DecodedTooLarge) as exc:
            raise AdminServerFailed(
                f"the answer from {url} is larger than "
                f"{self._max_answer_bytes / 1048576:g} MiB; not read further"
            ) from exc
        except foreign.UnreadableEncoding as exc:
            raise AdminServerFailed(
                f"the answer from {url} has {exc} (a proxy in front of the controller?)"
            ) from exc
        except urllib.error.URLError as exc:
            raise AdminUnreachable(f"cannot reach the controller at {url}: {exc.reason}") from exc
        except TimeoutError as exc:
            raise AdminUnreachable(
                f"the controller at {url} did not answer within {timeout_s:g}s"
            ) from exc
        except (ConnectionError, OSError) as exc:
            raise AdminUnreachable(f"cannot reach the controller at {url}: {exc}") from exc
        except UnicodeError as exc:
            # The resolver's encoding of a host name it cannot look up (`a..b`).
            raise AdminUnreachable(
                f"cannot reach the controller at {url}: its host name is not valid ({exc})"
            ) from exc
        except http.client.HTTPException as exc:
            # Not OSErrors: something else listens there, or the answer was cut short.
            raise AdminServerFailed(
                f"no valid HTTP answer from {url} (is the controller there?): "
                f"{type(exc).__name__}: {exc!r:.80}"
            ) from exc


def _exchange(
    req: urllib.request.Request, url: str, timeout_s: float, deadline: float, limit: int
) -> Response:
    """One request and its whole answer; the caller translates what this raises.

    An error status's body is read here, not in the caller's `except HTTPError`: a
    proxy's 502 page cut short or stalled raised from inside that handler, past the
    translations beside it, and ended ctl in a traceback.
    """
    try:
        with _opener(url, deadline=deadline).open(req, timeout=timeout_s) as resp:
            body = bounded.read_body(resp, limit=limit)
            return Response(
                resp.status,
                foreign.content(body, resp.headers.get("Content-Encoding"), limit=limit),
                link=resp.headers.get("Link"),
                content_type=resp.headers.get("Content-Type"),
            )
    except urllib.error.HTTPError as exc:
        # A status is an answer, whatever it says; the client decides what it means.
        with exc:
            body = bounded.read_body(exc, limit=limit)
            return Response(
                exc.code,
                foreign.content(body, exc.headers.get("Content-Encoding"), limit=limit),
                exc.headers.get("Location"),
                content_type=exc.headers.get("Content-Type"),
            )


def _decode(body: bytes, kind: type[T]) -> T:
    """An answer as `kind`; its only failure is `msgspec.DecodeError`.

    msgspec raises RecursionError, not DecodeError, for an answer nested past its
    depth (a few kilobytes of `[`): uncaught, it ended ctl in a traceback.
    """
    try:
        return msgspec.json.decode(body, type=kind)
    except RecursionError as exc:
        raise msgspec.DecodeError("the answer is nested too deep") from exc


def _quote(segment: str) -> str:
    # Model names may contain "/" (org/model); it must not split the path.
    return urllib.parse.quote(segment, safe="")


class AdminClient:
    """`GET /admin/...` and friends (docs/controller.md), as methods returning wire types."""

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout_s: float = 10.0,
        transport: Transport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._token = token
        self._timeout_s = timeout_s
        self._transport = transport or UrllibTransport()
        # The last answer as the controller sent it, parsed but not through the typed
        # view (which leaves out what a newer controller added): `ctl -o json` prints it.
        self.answer: object = None

    # -- reads ---------------------------------------------------------------

    def summary(self) -> Summary:
        return self._call("GET", "/admin/summary", Summary)

    def nodes(self) -> list[NodeView]:
        return self._call("GET", "/admin/nodes", list[NodeView])

    def node(self, name: str) -> NodeView:
        return self._call("GET", f"/admin/nodes/{_quote(name)}", NodeView)

    def models(self, *, page_size: int | None = None) -> list[ModelView]:
        """Every model by name, page after page (`page_size` a page; None: the
        controller's default)."""
        read = self._pages("/admin/models", list[ModelViewRead], page_size=page_size)
        views: list[ModelView] = list(read)
        return views

    def model(self, name: str) -> ModelView:
        return self._call("GET", f"/admin/models/{_quote(name)}", ModelViewRead)

    def replicas(self, *, model: str | None = None, state: str | None = None) -> list[ReplicaView]:
        query = {"model": model, "state": state}
        return self._call("GET", "/admin/replicas", list[ReplicaView], query=query)

    def replica(self, replica_id: str) -> ReplicaView:
        return self._call("GET", f"/admin/replicas/{_quote(replica_id)}", ReplicaView)

    def replica_logs(self, replica_id: str, *, tail: int, rank: int = 0) -> ReplicaLogs:
        """The last `tail` lines of a replica shard's engine log, asked of its node's agent
        (admin token only). AdminNotFound also when the node keeps no log of it."""
        path = f"/admin/replicas/{_quote(replica_id)}/logs"
        query = {"tail": str(tail), "rank": str(rank)}
        return self._call("GET", path, ReplicaLogs, query=query)

    def events(
        self,
        *,
        model: str | None = None,
        replica: str | None = None,
        node: str | None = None,
        limit: int | None = None,
    ) -> list[EventView]:
        query = {
            "model": model,
            "replica": replica,
            "node": node,
            "limit": None if limit is None else str(limit),
        }
        return self._call("GET", "/admin/events", list[EventView], query=query)

    def event(self, event_id: int) -> EventView:
        """One event by id; AdminNotFound when there is none (it may have aged out)."""
        found = self._call("GET", "/admin/events", list[EventView], query={"id": str(event_id)})
        if not found:
            raise AdminNotFound(f"no event {event_id} (ids are in `ctl events`)", status=404)
        return found[0]

    # -- writes --------------------------------------------------------------

    def cordon(self, name: str) -> NodeView:
        return self._call("POST", f"/admin/nodes/{_quote(name)}/cordon", NodeView)

    def uncordon(self, name: str) -> NodeView:
        return self._call("POST", f"/admin/nodes/{_quote(name)}/uncordon", NodeView)

    def drain(
        self,
        name: str,
        *,
        grace_s: float | None = None,
        force: bool = False,
        evict_idle: bool = False,
    ) -> NodeView:
        body: DrainRequest | None = None
        if grace_s is not None:
            body = DrainRequest(grace_s=grace_s, force=force, evict_idle=evict_idle)
        elif force or evict_idle:
            body = DrainRequest(force=force, evict_idle=evict_idle)
        return self._call("POST", f"/admin/nodes/{_quote(name)}/drain", NodeView, body=body)

    def apply(self, specs: Sequence[ModelSpec | AdapterSpec]) -> list[ModelView]:
        """All specs in one call: the controller applies all or none. An adapter's entry
        answers with its base's view."""
        views: list[ModelView] = list(
            self._call("POST", "/admin/models", list[ModelViewRead], body=list(specs))
        )
        return views

    def delete(self, name: str) -> str:
        return self.delete_entry(name).get("deleted", name)

    def delete_entry(self, name: str) -> dict[str, str]:
        """The controller's answer: `deleted`, and `adapter_of` when it was an adapter.

        Its string fields only: read as `dict[str, str]`, a field of another type that a
        newer controller added (a count of draining replicas) failed `ctl delete` after
        the model was deleted.
        """
        answer = self._call("DELETE", f"/admin/models/{_quote(name)}", dict[str, object])
        return {k: v for k, v in answer.items() if isinstance(v, str)}

    def scale(self, name: str, request: ScaleRequest) -> ModelView:
        path = f"/admin/models/{_quote(name)}/scale"
        return self._call("POST", path, ModelViewRead, body=request)

    def set_weight(self, replica_id: str, request: WeightRequest) -> ReplicaView:
        path = f"/admin/replicas/{_quote(replica_id)}/weight"
        return self._call("POST", path, ReplicaView, body=request)

    def engine_key(self, replica_id: str) -> EngineKey:
        """The key the replica's engine requires (admin token only; a secret: never print
        it). AdminRejected (409) while the controller knows none for the replica."""
        path = f"/admin/replicas/{_quote(replica_id)}/engine-key"
        return self._call("POST", path, EngineKey)

    def keys(self, *, page_size: int | None = None) -> list[KeyView]:
        """Every client key by name, with its limits (never a key or its hash), page after
        page (`page_size` a page; None: the controller's default)."""
        return self._pages("/admin/keys", list[KeyView], page_size=page_size)

    def create_key(self, request: KeyCreate) -> KeyCreated:
        """A new client key; the answer is the only time the key itself is shown."""
        return self._call("POST", "/admin/keys", KeyCreated, body=request)

    def revoke_key(self, name: str) -> KeyRevoked:
        return self._call("DELETE", f"/admin/keys/{_quote(name)}", KeyRevoked)

    def usage(
        self, *, by: UsageBy = "key", since_s: float | None = None, limit: int | None = None
    ) -> UsageAnswer:
        """Token usage by hour and `by`, from the hour `since_s` ago (the controller's
        default, a day, when None), at most `limit` rows (None: the controller's default)."""
        query = {
            "by": by,
            "since_s": None if since_s is None else repr(float(since_s)),
            "limit": None if limit is None else str(limit),
        }
        return self._call("GET", "/admin/usage", UsageAnswer, query=query)

    # -- the seam ------------------------------------------------------------

    def _pages(self, path: str, kind: type[list[R]], *, page_size: int | None) -> list[R]:
        """Every row of a paged list: each page's cursor followed until a page has none.

        Nothing is sent that a controller from before pages would refuse: the first
        request has no `after` (nor `limit` unless asked), and such a controller's
        answer, the whole list, has no Link. `answer` is every page's rows as one list.
        """
        rows: list[R] = []
        raw: list[object] = []
        query = {"limit": None if page_size is None else str(page_size), "after": None}
        for _ in range(MAX_PAGES):
            page, link = self._call_link("GET", path, kind, query=query)
            rows.extend(page)
            if isinstance(self.answer, list):
                raw.extend(self.answer)
            after = next_after(link)
            if after is None:
                break
            # Each cursor past the one before: a controller that repeats or rewinds it
            # (a broken proxy's cache, a squatter) would be followed forever.
            before = query["after"]
            if not after or (before is not None and after <= before):
                raise AdminServerFailed(
                    f"GET {path}: the next page's cursor {after[:64]!r} does not follow "
                    f"{before!r}; the list is not read further"
                )
            query["after"] = after
        else:
            # Cursors that advance forever ("a", "aa", …): a controller's pages hold a
            # thousand rows by default, so this many pages is no real list.
            raise AdminServerFailed(
                f"GET {path}: still more pages after {MAX_PAGES:,}; the list is not read further"
            )
        self.answer = raw
        return rows

    def _call(
        self,
        method: str,
        path: str,
        kind: type[T],
        *,
        body: object = None,
        query: Mapping[str, str | None] | None = None,
    ) -> T:
        return self._call_link(method, path, kind, body=body, query=query)[0]

    def _call_link(
        self,
        method: str,
        path: str,
        kind: type[T],
        *,
        body: object = None,
        query: Mapping[str, str | None] | None = None,
    ) -> tuple[T, str | None]:
        """The answer decoded as `kind`, and its Link header."""
        url = self.base_url + path
        params = {k: v for k, v in (query or {}).items() if v is not None}
        if params:
            url += "?" + urllib.parse.urlencode(params)
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = msgspec.json.encode(body)
            headers["Content-Type"] = "application/json"
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        resp = self._transport.request(
            method, url, body=data, headers=headers, timeout_s=self._timeout_s
        )
        if resp.status >= 400:
            raise self._failure(method, path, resp)
        if 300 <= resp.status < 400:
            raise AdminServerFailed(
                f"{method} {path}: {self.base_url} answered a redirect ({resp.status}) to "
                f"{resp.location or 'nowhere'}, not followed (the token would go along); "
                "a controller never redirects: point --controller at the controller itself",
                status=resp.status,
            )
        try:
            decoded = _decode(resp.body, kind)
            # Not nested deeper for ignoring the fields the view skipped: raised here too.
            self.answer = _decode(resp.body, object)
        except msgspec.DecodeError as exc:
            if foreign.is_json(resp.content_type) is False:
                raise AdminServerFailed(
                    f"{method} {path}: {self.base_url} answered {resp.status} with "
                    f"{resp.content_type!r:.60}, not the controller's JSON: "
                    f"{foreign.page_text(resp.body, resp.content_type)!r} "
                    "(a proxy or login page in front of the controller?)"
                ) from exc
            raise AdminServerFailed(
                f"{method} {path}: the controller's answer does not decode ({exc})"
            ) from exc
        return decoded, resp.link

    def _not_a_controller(self) -> str | None:
        """After a 404: None if a controller answers here, else a one-line hint.

        A controller's `/healthz` says `leader`; the router's says
        `program: router` and where its controller is.
        """
        try:
            resp = self._transport.request(
                "GET", self.base_url + "/healthz", body=None, headers={}, timeout_s=3.0
            )
            health = _decode(resp.body, object) if resp.status == 200 else None
        except (AdminError, msgspec.DecodeError):
            health = None
        if isinstance(health, dict) and "leader" in health:
            return None
        if isinstance(health, dict) and health.get("program") == "router":
            where = health.get("controller")
            tail = (
                f"; its controller is at {where}"
                if isinstance(where, str) and where
                else "; this router has no controller (static endpoints)"
            )
            return f"{self.base_url} looks like the llmgw router, not the controller{tail}"
        return (
            f"{self.base_url} is not an llmgw controller (no /admin routes, and its /healthz "
            "does not say `leader`); the controller listens on port 8081 by default"
        )

    def _failure(self, method: str, path: str, resp: Response) -> AdminError:
        """The exception for an error status, carrying the controller's own message."""
        kind, message = "", ""
        try:
            detail = _decode(resp.body, ErrorBody).error
            kind, message = detail.type, detail.message
        except msgspec.DecodeError:
            message = foreign.page_text(resp.body, resp.content_type)
        message = message or f"{method} {path} answered {resp.status}"
        status = resp.status
        if not kind and foreign.is_json(resp.content_type) is False:
            # Not the controller's error, which is always JSON: a proxy's page.
            message = (
                f"{message} (a {resp.content_type.split(';')[0]:.40} answer, not the "
                "controller's: a proxy in front of it?)"
                if resp.content_type
                else message
            )
        if status == 401:
            return AdminUnauthorized(
                f"the controller at {self.base_url} rejected the token (401): {message}",
                status=status,
                detail=message,
            )
        if status == 404:
            # A controller's 404 is typed not_found_error; anything else (the router's
            # OpenAI-shaped unknown_url, a web server's page) may be the wrong server.
            not_controller = None if kind == "not_found_error" else self._not_a_controller()
            if not_controller is not None:
                return AdminNotAController(not_controller, status=status, detail=message)
            return AdminNotFound(message, status=status)
        if status in (400, 409, 422):
            return AdminRejected(message, status=status)
        if status == 503 and kind == "not_leader":
            return AdminNotLeader(
                f"{message} (this controller is a standby; use the leader)",
                status=status,
                detail=message,
            )
        return AdminServerFailed(
            f"{method} {path} failed with {status}: {message}", status=status, detail=message
        )
