"""The workers' usage reports as one router's (`--workers N`): the supervisor asks
every worker for its report and sends the controller their sum (pool.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from llmgw.router.control.leases import add_demand
from llmgw.router.control.usagereports import build_report
from llmgw.wire.leases import KeyDemand
from llmgw.wire.usage import ModelLoad, UsageReport


def merge_reports(router_id: str, sent_at: float, reports: Sequence[UsageReport]) -> UsageReport:
    """The workers' reports as one router's: counts added, last use the latest."""
    last_used: dict[str, float] = {}
    inflight: dict[str, int] = {}
    demand: dict[str, int] = {}
    load: dict[str, ModelLoad] = {}
    keys: dict[str, KeyDemand] = {}
    queued: dict[tuple[str, str], int] = {}
    for r in reports:
        for d in r.key_demand:
            keys[d.sha256] = d if d.sha256 not in keys else add_demand(keys[d.sha256], d)
        for q in r.flow_queued:
            queued[q.band, q.team] = queued.get((q.band, q.team), 0) + q.requests
        for k, t in r.last_used.items():
            last_used[k] = max(t, last_used.get(k, t))
        for k, n in r.inflight.items():
            inflight[k] = inflight.get(k, 0) + n
        for k, n in r.demand.items():
            demand[k] = demand.get(k, 0) + n
        for k, m in r.load.items():
            have = load.get(k)
            load[k] = (
                m
                if have is None
                else ModelLoad(
                    inflight=have.inflight + m.inflight,
                    held=have.held + m.held,
                    requests=have.requests + m.requests,
                    interval_s=max(have.interval_s, m.interval_s),
                )
            )
    return build_report(
        router_id=router_id,
        sent_at=sent_at,
        last_used=last_used,
        inflight=inflight,
        demand=demand,
        load=load,
        key_demand=[keys[k] for k in sorted(keys)],
        flow_queued=queued,
    )
