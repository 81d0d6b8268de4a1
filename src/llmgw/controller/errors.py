"""The controller's exceptions: one root, no HTTP in them.

Decision code (commands, the agent protocol, the endpoint list, the store
wrapper) raises these to say why it will not do what was asked; it never
picks a status code. The HTTP edge maps each class to a status and an error
type in one table (api/http.py) and answers in the OpenAI error shape.

    ControllerRefusal          the controller will not do what was asked, and says why
    ├── InvalidRequest         malformed body or query; the message names the field
    │   └── InvalidSpec        well-formed, but breaks a rule of the type
    ├── TokenRejected          missing or wrong bearer token
    ├── Forbidden              a valid token that may not do this (read-only on a write)
    ├── DoesNotExist           unknown node, model or replica
    ├── Conflict               valid alone, contradicts what exists (a name taken)
    ├── NotLeading             a write reached a standby; the caller retries elsewhere/later
    ├── Busy                   too many long-polls held; retry shortly
    ├── AgentSilent            a node's agent did not answer what was asked of it
    └── StoreUnavailable       the database refused the write, or did not confirm it

Anything else escaping a handler is a bug (the edge answers 500 and logs it).
The names differ from other programs' (the admin client's AdminNotFound,
AdminUnauthorized, AdminNotLeader; ctl's CtlError) so a reader never mistakes one for
another. The store has its own small root (store/base.py StoreError: SchemaTooNew,
NotLeader), raised below this layer; the store wrapper turns what reaches a request
into StoreUnavailable or NotLeading, and SchemaTooNew ends the controller at start.
"""

from __future__ import annotations


class ControllerRefusal(Exception):
    """`param`: the field or path the message is about, when there is one."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidRequest(ControllerRefusal):
    pass


class InvalidSpec(InvalidRequest):
    pass


class TokenRejected(ControllerRefusal):
    pass


class DoesNotExist(ControllerRefusal):
    pass


class Forbidden(ControllerRefusal):
    """A valid token that may not do this (the read-only token on a write)."""


class Conflict(ControllerRefusal):
    pass


class NotLeading(ControllerRefusal):
    """Writes and heartbeats go to the leader; a standby says so instead of acting."""


class Busy(ControllerRefusal):
    pass


class AgentSilent(ControllerRefusal):
    """An ask left for a node's agent (a log tail, controller/logasks.py) got no
    answer in time, or one saying it could not be done."""


class StoreUnavailable(ControllerRefusal):
    """The store refused the transaction, or its answer was lost (the connection dropped
    after the COMMIT went out, so it may be kept). Memory holds none of it; the leader
    reads the store again before its next decision (Fleet.resync)."""
