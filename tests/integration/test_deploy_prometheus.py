"""deploy/: the alert rules check and pass their unit tests, the scrape example is valid
Prometheus configuration, and the dashboard queries only documented metrics."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.promtool import promtool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
NAME = re.compile(r"\b(llmgw_[a-z0-9_]+)")


def dashboard_metric_names() -> set[str]:
    """Every llmgw metric the dashboard's panels query (histogram series as their family)."""
    doc = json.loads((DEPLOY / "grafana" / "llmgw.json").read_text())
    names = set()
    for panel in doc["panels"]:
        for target in panel.get("targets", []):
            names.update(NAME.findall(target["expr"]))
    return names


class TestDeployPrometheus:
    """deploy/'s alert rules, scrape example and dashboard check out."""

    def test_alert_rules_check(self) -> None:
        """promtool accepts every alert rule."""
        out = promtool("check", "rules", "alerts.yml", cwd=DEPLOY / "prometheus")
        assert "SUCCESS: 8 rules found" in out

    def test_alert_rules_unit_tests(self) -> None:
        """Each alert fires when it should and not before (alerts_test.yml)."""
        out = promtool("test", "rules", "alerts_test.yml", cwd=DEPLOY / "prometheus")
        assert "SUCCESS" in out

    def test_scrape_config_example_is_valid(self) -> None:
        """promtool accepts the scrape config example."""
        promtool("check", "config", "prometheus.yml", cwd=DEPLOY / "prometheus")

    def test_dashboard_queries_documented_metrics(self) -> None:
        """Every metric the dashboard queries is in docs/metrics.md."""
        documented = set(re.findall(r"`(llmgw_[a-z0-9_]+)`", METRICS_DOC.read_text()))
        for name in dashboard_metric_names():
            family = re.sub(r"_(bucket|sum|count)$", "", name)
            assert family in documented or name in documented, name

    def test_dashboard_panels_each_query_something(self) -> None:
        """Every dashboard panel has a non-empty query."""
        doc = json.loads((DEPLOY / "grafana" / "llmgw.json").read_text())
        panels = [p for p in doc["panels"] if p["type"] != "row"]
        assert len(panels) >= 20
        for p in panels:
            assert p["targets"], p["title"]
            assert all(t["expr"].strip() for t in p["targets"]), p["title"]
