"""What became of the configuration file's reloads, for whoever runs the router.

A reload that fails (bad YAML, an invalid value, an empty file) keeps the running
configuration and is logged (sources.py); a reload that changes a restart-only
setting applies the rest and logs the field (config.in_force). Without these figures
an operator who edited the file and reloaded could learn only from the log that it
did not apply, and an alert had nothing to watch: Prometheus and Alertmanager
export the same two gauges for their own files.

`ReloadStatus` is the snapshot the watcher replaces after each load; /admin/config
shows it and `ReloadMetrics` puts it on /metrics. With `--workers N` the supervisor
watches the file, so both come from there (workers/pool.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import msgspec
from prometheus_client.core import GaugeMetricFamily, Metric


class ReloadStatus(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of the file's last load (the start's until a reload)."""

    # Whether the last load put the file in force; False: the running config was kept.
    last_successful: bool
    # Unix seconds of the last load that put the file in force (the start's at first).
    last_success_at: float
    # Unix seconds of the last load tried, successful or not.
    last_attempt_at: float
    # Why the last load was refused, one line naming the field; None when it applied.
    last_error: str | None = None
    # Restart-only fields the file in force sets otherwise than the running router,
    # sorted: they wait for a restart (empty: the file is all in force).
    restart_pending: tuple[str, ...] = ()

    def applied(self, at: float, pending: tuple[str, ...]) -> ReloadStatus:
        """This status after a load that put the file in force at `at`."""
        return ReloadStatus(
            last_successful=True,
            last_success_at=at,
            last_attempt_at=at,
            restart_pending=tuple(sorted(pending)),
        )

    def refused(self, at: float, error: str) -> ReloadStatus:
        """This status after a load refused at `at`: what is in force is unchanged."""
        return msgspec.structs.replace(
            self, last_successful=False, last_attempt_at=at, last_error=error
        )


def started(at: float) -> ReloadStatus:
    """The status of a router that loaded its file at `at` and has not reloaded it."""
    return ReloadStatus(last_successful=True, last_success_at=at, last_attempt_at=at)


class ReloadMetrics:
    """The last reload on /metrics. Registered only where the file is watched (a
    one-process router, the supervisor of workers): a worker's page carrying it too
    would be summed with the supervisor's (workers/metricsmerge.py)."""

    def __init__(self, status: Callable[[], ReloadStatus]) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        st = self._status()
        yield GaugeMetricFamily(
            "llmgw_router_config_last_reload_successful",
            "Whether the last load of the configuration file put it in force (1) or was "
            "refused, the running configuration kept (0).",
            value=1.0 if st.last_successful else 0.0,
        )
        yield GaugeMetricFamily(
            "llmgw_router_config_last_reload_success_timestamp_seconds",
            "Unix time of the last load that put the configuration file in force.",
            value=st.last_success_at,
        )
        yield GaugeMetricFamily(
            "llmgw_router_config_restart_pending",
            "Restart-only settings the file in force sets otherwise than the running "
            "router: they wait for a restart.",
            value=float(len(st.restart_pending)),
        )
