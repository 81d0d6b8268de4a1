"""ctl's one exception tree (STYLE habit 8); `main` turns any of them into one line and exit 1.

    CtlError                      anything ctl reports to the operator and exits 1 on
    ├── ControllerError           the controller could not or would not answer
    │   ├── Unreachable           no HTTP answer at all (refused, DNS, timeout)
    │   ├── Unauthorized          401: the token is missing or wrong
    │   ├── NotFound              404: unknown node, model or replica
    │   ├── Rejected              400/409/422: the controller refused the input
    │   ├── NotLeader             503 not_leader: a standby controller, writes go to the leader
    │   └── ServerFailed          any other status, or an answer ctl cannot decode
    ├── SpecError                 `apply -f`: a spec file is invalid (names file, model, field)
    ├── DrainTimeout              `drain --timeout`: the node still holds replicas
    └── BenchFailed               `bench`: the replica did not answer the load

Foreign errors (urllib, aiohttp, yaml, msgspec) are translated once, where they
are raised (client.py, specs.py, bench.py), with `raise … from exc`; nothing
above those seams sees them, so no traceback ever reaches the operator.
"""

from __future__ import annotations


class CtlError(Exception):
    """Something ctl reports as one line on stderr before exiting 1."""


class ControllerError(CtlError):
    """The controller could not or would not do what was asked."""


class Unreachable(ControllerError):
    """No HTTP answer: connection refused, unknown host, timeout. Retrying later may help."""


class Unauthorized(ControllerError):
    """401: pass the right token (--token, LLMGW_TOKEN or the config file)."""


class NotFound(ControllerError):
    """404: the named node, model or replica does not exist."""


class Rejected(ControllerError):
    """400/409/422: the input was refused; nothing was changed."""


class NotLeader(ControllerError):
    """503 from a standby controller: writes must go to the leader."""


class ServerFailed(ControllerError):
    """Any other failure status, or an answer that does not decode as the API promises."""


class SpecError(CtlError):
    """A model spec file is unreadable or invalid; nothing was applied."""


class DrainTimeout(CtlError):
    """The node still held replicas when `drain --timeout` ran out."""


class BenchFailed(CtlError):
    """The benchmarked replica failed requests or could not be reached."""
