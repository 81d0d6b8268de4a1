"""Writes llmgw.json, the Grafana dashboard (docs/dashboard.md): `python deploy/grafana/make_dashboard.py`.

The JSON is committed; this script is how it is kept tidy. Every query names only
metrics the programs export (tests/e2e/test_observability.py checks that
against a live `llmgw up`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

DS = {"type": "prometheus", "uid": "${datasource}"}


def panel(
    pid: int,
    title: str,
    exprs: list[tuple[str, str]],
    x: int,
    y: int,
    *,
    w: int = 12,
    h: int = 8,
    kind: str = "timeseries",
    unit: str = "short",
) -> dict[str, Any]:
    return {
        "id": pid,
        "type": kind,
        "title": title,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
        "options": {},
        "targets": [
            {"refId": chr(ord("A") + i), "datasource": DS, "expr": e, "legendFormat": legend}
            for i, (e, legend) in enumerate(exprs)
        ],
    }


def row(pid: int, title: str, y: int) -> dict[str, Any]:
    return {
        "id": pid,
        "type": "row",
        "title": title,
        "collapsed": False,
        "gridPos": {"x": 0, "y": y, "w": 24, "h": 1},
        "panels": [],
    }


FAILED = 'outcome=~"engine_error|unavailable|stream_broken|timeout"'

panels = [
    row(1, "Fleet", 0),
    panel(
        2,
        "GPUs used per class",
        [
            ("sum by (gpu_class) (llmgw_controller_gpus_used)", "{{gpu_class}} used"),
            ("sum by (gpu_class) (llmgw_controller_gpus_free)", "{{gpu_class}} free"),
            ("sum by (gpu_class) (llmgw_controller_gpus_unhealthy)", "{{gpu_class}} unhealthy"),
        ],
        0,
        1,
        w=8,
        kind="bargauge",
    ),
    panel(
        3,
        "Free whole nodes per fabric",
        [
            ("max by (fabric) (llmgw_controller_fabric_free_nodes)", "{{fabric}}"),
        ],
        8,
        1,
        w=8,
        kind="bargauge",
    ),
    panel(
        4,
        "Nodes by state",
        [
            ("max by (state) (llmgw_controller_nodes)", "{{state}}"),
        ],
        16,
        1,
        w=8,
        kind="stat",
    ),
    panel(
        5,
        "Replicas by state",
        [
            ("sum by (state) (llmgw_controller_replicas)", "{{state}}"),
        ],
        0,
        9,
        w=8,
    ),
    panel(
        6,
        "Models short, unplaceable, waiting",
        [
            ('max(llmgw_controller_models{status="short"})', "short"),
            ('max(llmgw_controller_models{status="unplaceable"})', "unplaceable"),
            ('max(llmgw_controller_models{status="waiting"})', "waiting"),
        ],
        8,
        9,
        w=8,
    ),
    panel(
        7,
        "Unplaceable and waiting models",
        [
            ("max by (model) (llmgw_controller_model_unplaceable)", "{{model}} unplaceable"),
            ("max by (model) (llmgw_controller_model_waiting_requests)", "{{model}} waiting"),
        ],
        16,
        9,
        w=8,
        kind="table",
    ),
    row(8, "Requests", 17),
    panel(
        9,
        "Request rate by outcome",
        [
            ("sum by (outcome) (rate(llmgw_router_requests_total[5m]))", "{{outcome}}"),
        ],
        0,
        18,
        unit="reqps",
    ),
    panel(
        10,
        "Failed share",
        [
            (
                f"sum(rate(llmgw_router_requests_total{{{FAILED}}}[5m])) / "
                "sum(rate(llmgw_router_requests_total[5m]))",
                "failed",
            ),
        ],
        12,
        18,
        unit="percentunit",
    ),
    panel(
        11,
        "Request duration p50 / p99",
        [
            (
                "histogram_quantile(0.5, sum by (le) (rate(llmgw_router_request_duration_seconds_bucket[5m])))",
                "p50",
            ),
            (
                "histogram_quantile(0.99, sum by (le) (rate(llmgw_router_request_duration_seconds_bucket[5m])))",
                "p99",
            ),
        ],
        0,
        26,
        unit="s",
    ),
    panel(
        12,
        "Time to first token p99 per model",
        [
            (
                "histogram_quantile(0.99, sum by (model, le) "
                "(rate(llmgw_router_time_to_first_token_seconds_bucket[5m])))",
                "{{model}}",
            ),
        ],
        12,
        26,
        unit="s",
    ),
    panel(
        13,
        "Inter-token latency p50 per model",
        [
            (
                "histogram_quantile(0.5, sum by (model, le) "
                "(rate(llmgw_router_inter_token_latency_seconds_bucket[5m])))",
                "{{model}}",
            ),
        ],
        0,
        34,
        unit="s",
    ),
    panel(
        14,
        "Tokens per second per model",
        [
            ("sum by (model) (rate(llmgw_router_prompt_tokens_total[5m]))", "{{model}} prompt"),
            (
                "sum by (model) (rate(llmgw_router_completion_tokens_total[5m]))",
                "{{model}} completion",
            ),
        ],
        12,
        34,
    ),
    panel(
        15,
        "Prefix-cache hit rate per model",
        [
            (
                "sum by (model) (rate(llmgw_router_cached_tokens_total[5m])) / "
                "sum by (model) (rate(llmgw_router_prompt_tokens_total[5m]))",
                "{{model}}",
            ),
        ],
        0,
        42,
        unit="percentunit",
    ),
    panel(
        16,
        "Breakers not closed",
        [
            ("max by (endpoint) (llmgw_router_breaker_state) > 0", "{{endpoint}}"),
        ],
        12,
        42,
    ),
    panel(
        17,
        "Held requests (scale from zero)",
        [
            ("sum by (model) (llmgw_router_held)", "{{model}}"),
        ],
        0,
        50,
    ),
    panel(
        18,
        "Retries",
        [
            ("sum by (model) (rate(llmgw_router_retries_total[5m]))", "{{model}}"),
        ],
        12,
        50,
        unit="reqps",
    ),
    row(19, "Controller and agents", 58),
    panel(
        20,
        "Controller tick p99",
        [
            (
                "histogram_quantile(0.99, sum by (le) (rate(llmgw_controller_tick_duration_seconds_bucket[5m])))",
                "tick",
            ),
            (
                "histogram_quantile(0.99, sum by (le) "
                "(rate(llmgw_controller_store_write_duration_seconds_bucket[5m])))",
                "store write",
            ),
        ],
        0,
        59,
        w=8,
        unit="s",
    ),
    panel(
        21,
        "Decisions",
        [
            ("sum by (reason) (rate(llmgw_controller_placements_total[15m]))", "placed {{reason}}"),
            (
                "sum by (reason) (rate(llmgw_controller_replica_failures_total[15m]))",
                "failed {{reason}}",
            ),
            ("sum by (reason) (rate(llmgw_controller_evictions_total[15m]))", "evicted {{reason}}"),
        ],
        8,
        59,
        w=8,
        unit="ops",
    ),
    panel(
        22,
        "Leader and heartbeat age",
        [
            ("max(llmgw_controller_leader)", "leader"),
            ("max(llmgw_controller_node_heartbeat_age_seconds)", "oldest heartbeat s"),
        ],
        16,
        59,
        w=8,
    ),
    panel(
        23,
        "Engines by state (agents)",
        [
            ("sum by (state) (llmgw_agent_engines)", "{{state}}"),
        ],
        0,
        67,
        w=8,
    ),
    panel(
        24,
        "Engine start-up p90",
        [
            (
                "histogram_quantile(0.9, sum by (engine, le) (rate(llmgw_agent_engine_startup_seconds_bucket[1h])))",
                "{{engine}}",
            ),
        ],
        8,
        67,
        w=8,
        unit="s",
    ),
    panel(
        25,
        "Card temperature and utilisation",
        [
            ("max(llmgw_agent_gpu_temperature_celsius)", "hottest °C"),
            ("avg(llmgw_agent_gpu_utilization_ratio)", "mean utilisation"),
        ],
        16,
        67,
        w=8,
    ),
]

dashboard = {
    "title": "llmgw",
    "uid": "llmgw-fleet",
    "tags": ["llmgw"],
    "timezone": "browser",
    "schemaVersion": 39,
    "version": 1,
    "refresh": "30s",
    "time": {"from": "now-6h", "to": "now"},
    "templating": {
        "list": [
            {
                "name": "datasource",
                "type": "datasource",
                "query": "prometheus",
                "label": "Prometheus",
                "current": {},
                "hide": 0,
            }
        ]
    },
    "annotations": {"list": []},
    "panels": panels,
}

if __name__ == "__main__":
    out = Path(__file__).with_name("llmgw.json")
    out.write_text(json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}")
