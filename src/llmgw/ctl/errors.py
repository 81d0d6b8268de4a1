"""ctl's one exception tree; `main` turns any of them into one line and exit 1.

    CtlError                      anything ctl reports to the operator and exits 1 on
    ├── SpecError                 `apply -f`: a spec file is invalid (names file, model, field)
    ├── DrainTimeout              `drain --timeout`: the node still holds replicas
    ├── BenchFailed               `bench`: the replica did not answer the load
    └── OutputFailed              standard output or error cannot be written (full disk)
        └── ReaderGone            its reader went away (`| head -1`): exit 141, silent

Failures of the controller's admin API come from the shared client as
`llmgw.adminclient.errors.AdminError` (its own tree: unreachable, 401, 404, rejected,
not leader, server failed); `main` reports them the same way.

Foreign errors (urllib, aiohttp, yaml, msgspec, a failed write to stdout) are
translated once, where they are raised (the admin client, specs.py, bench.py,
streams.py), with `raise … from exc`; nothing above those seams sees them, so no
traceback ever reaches the operator.
"""

from __future__ import annotations


class CtlError(Exception):
    """Something ctl reports as one line on stderr before exiting 1."""


class SpecError(CtlError):
    """A model spec file is unreadable or invalid; nothing was applied."""


class DrainTimeout(CtlError):
    """The node still held replicas when `drain --timeout` ran out."""


class BenchFailed(CtlError):
    """The benchmarked replica failed requests or could not be reached."""


class OutputFailed(CtlError):
    """Standard output or error could not be written (ctl.streams)."""


class ReaderGone(OutputFailed):
    """The reader of ctl's output closed it (`| head -1`): not reported, exit 141."""
