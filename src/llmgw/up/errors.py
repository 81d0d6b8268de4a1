"""`llmgw up`'s one exception root; `main` turns each into one line on stderr.

    UpError
    ├── FleetError     fleet.py: the fleet file is unreadable or invalid (exit 2)
    ├── Refused        checks.py: up cannot start here (folder in use, port taken; exit 1)
    ├── StartFailed    children.py: a program exited or was not ready in time (exit 1)
    └── Interrupted    children.py: Ctrl-C, SIGTERM or SIGHUP while starting (a clean stop)

Failures of the controller's admin API arrive as `llmgw.adminclient.errors.AdminError`
and become a StartFailed where up calls it.
"""

from __future__ import annotations


class UpError(Exception):
    """Something `llmgw up` reports in one line (or, for Interrupted, stops on)."""
