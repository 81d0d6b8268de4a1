"""The standard `process_*` metrics, also where /proc shows only processes.

prometheus_client's ProcessCollector reads the boot time from /proc/stat and, when
it cannot, exports no `process_*` series at all. The controller's and the router's
systemd units set `ProcSubset=pid` (deploy/systemd/), which hides /proc/stat: under
them the whole family vanished without a word. The boot time is the same quantity
as the wall clock minus CLOCK_BOOTTIME (the clock /proc/PID/stat's start times
count in), which needs no file; everything else the collector reads is under
/proc/self, which that view keeps.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, ProcessCollector


class _ProcessCollector(ProcessCollector):
    def _boot_time(self) -> float:
        boottime = getattr(time, "CLOCK_BOOTTIME", None)
        if boottime is None:
            # Not Linux: the stock reading, whose OSError where there is no /proc the
            # collector takes as "no process_* series"; an AttributeError stopped the start.
            # prometheus_client leaves this method unannotated.
            return super()._boot_time()  # type: ignore[no-untyped-call,no-any-return]
        return time.time() - time.clock_gettime(boottime)


def register_process_metrics(registry: CollectorRegistry) -> None:
    """Add this process's `process_*` family (CPU, memory, fds, start time) to `registry`."""
    _ProcessCollector(registry=registry)
