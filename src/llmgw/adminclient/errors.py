"""The admin client's one exception tree; every failure of a call is one of these.

    AdminError                the controller could not or would not answer
    ├── AdminUnreachable      no HTTP answer at all (refused, DNS, timeout)
    ├── AdminUnauthorized     401: the token is missing or wrong
    ├── AdminNotFound         404: unknown node, model or replica
    │   └── AdminNotAController   404 from something that is not a controller (say, the router)
    ├── AdminRejected         400/409/422: the controller refused the input
    ├── AdminNotLeader        503 not_leader: a standby controller, writes go to the leader
    └── AdminServerFailed     any other status, or an answer that does not decode

Foreign errors (urllib, http.client, msgspec) are translated once, in client.py,
with `raise … from exc`; callers (ctl, up) catch `AdminError` and show its message.
"""

from __future__ import annotations


class AdminError(Exception):
    """A call to the controller's admin API failed; the message is one line for a person.

    `status` is the HTTP status when the controller answered (None when it did not);
    `detail` is the controller's own message, or the message itself when it said none.
    """

    def __init__(self, message: str, *, status: int | None = None, detail: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail or message


class AdminUnreachable(AdminError):
    """No HTTP answer: connection refused, unknown host, timeout. Retrying later may help."""


class AdminUnauthorized(AdminError):
    """401: pass the right token."""


class AdminNotFound(AdminError):
    """404: the named node, model or replica does not exist."""


class AdminNotAController(AdminNotFound):
    """404 from a server that is not an llmgw controller; the message says what it is."""


class AdminRejected(AdminError):
    """400/409/422: the input was refused; nothing was changed."""


class AdminNotLeader(AdminError):
    """503 from a standby controller: writes must go to the leader."""


class AdminServerFailed(AdminError):
    """Any other failure status, or an answer that does not decode as the API promises."""
