"""deploy/: the alert rules check and pass their unit tests, the scrape example is valid
Prometheus configuration, and the rules and the dashboard query only documented metrics.

"Documented" is a row of a marked table on docs/metrics.md, which
tests/unit/test_docs_metrics.py holds to what each program registers; the labels a
query selects or groups by must be in that row's labels column.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml

from tests.promtool import promtool

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRICS_DOC = Path(__file__).resolve().parents[2] / "docs" / "metrics.md"
NAME = re.compile(r"\b(llmgw_[a-z0-9_]+)")
# `| \`llmgw_x\` | type | \`label\`, … | meaning |` under a `<!-- metrics: … -->` mark.
ROW = re.compile(r"^\|\s*`(llmgw_[a-z0-9_]+)`\s*\|\s*\w+\s*\|([^|]*)\|")
SELECTOR = re.compile(r"(llmgw_[a-z0-9_]+)\{([^}]*)\}")
GROUPED = re.compile(r"by \(([^)]*)\) \(\s*(?:rate\(|increase\()?(llmgw_[a-z0-9_]+)")


def documented_labels() -> dict[str, set[str]]:
    """Each metric of docs/metrics.md's marked tables, with its documented labels."""
    out: dict[str, set[str]] = {}
    marked = False
    for line in METRICS_DOC.read_text().splitlines():
        if line.startswith("<!-- metrics:"):
            marked = True
        elif marked and (row := ROW.match(line)) is not None:
            out[row.group(1)] = set(re.findall(r"`([a-z_]+)`", row.group(2)))
        elif marked and line.strip() and not line.startswith("|"):
            marked = False
    return out


def _family(name: str) -> str:
    return re.sub(r"_(bucket|sum|count)$", "", name)


def unknown_references(expr: str, docs: dict[str, set[str]]) -> list[str]:
    """The metrics and labels `expr` names that docs/metrics.md does not list."""
    out = [n for n in NAME.findall(expr) if n not in docs and _family(n) not in docs]
    for name, matchers in SELECTOR.findall(expr):
        for label in re.findall(r"(\w+)\s*!?=~?", matchers):
            if label not in docs.get(_family(name), set()):
                out.append(f"{name}{{{label}}}")
    for labels, name in GROUPED.findall(expr):
        for label in (x.strip() for x in labels.split(",")):
            if label != "le" and label not in docs.get(_family(name), set()):
                out.append(f"{name} by {label}")
    return out


def rule_metric_names() -> set[str]:
    """Every llmgw metric the alert rules query."""
    return {n for e in rule_exprs().values() for n in NAME.findall(e)}


def rule_exprs() -> dict[str, str]:
    """Alert name → its expression, from alerts.yml."""
    doc = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    return {r["alert"]: r["expr"] for g in doc["groups"] for r in g["rules"]}


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
        """Every metric the dashboard queries, and each label it uses, is in docs/metrics.md."""
        docs = documented_labels()
        doc = json.loads((DEPLOY / "grafana" / "llmgw.json").read_text())
        exprs = [t["expr"] for p in doc["panels"] for t in p.get("targets", [])]
        assert dashboard_metric_names()
        assert {e: unknown_references(e, docs) for e in exprs if unknown_references(e, docs)} == {}

    def test_alert_rules_query_documented_metrics(self) -> None:
        """Every metric an alert rule names, and each label it uses, is in docs/metrics.md."""
        docs = documented_labels()
        found = {a: unknown_references(e, docs) for a, e in rule_exprs().items()}
        assert len(found) == 8
        assert {a: bad for a, bad in found.items() if bad} == {}

    def test_a_misspelt_metric_or_label_is_reported(self) -> None:
        """The check above can fail: an unknown name, selector label or grouping label."""
        docs = documented_labels()
        assert "state" in docs["llmgw_controller_nodes"]
        expr = 'max by (nodee) (llmgw_controller_nodes{stat="x"}) + llmgw_controller_node'
        assert unknown_references(expr, docs) == [
            "llmgw_controller_node",
            "llmgw_controller_nodes{stat}",
            "llmgw_controller_nodes by nodee",
        ]

    def test_dashboard_panels_each_query_something(self) -> None:
        """Every dashboard panel has a non-empty query."""
        doc = json.loads((DEPLOY / "grafana" / "llmgw.json").read_text())
        panels = [p for p in doc["panels"] if p["type"] != "row"]
        assert len(panels) >= 20
        for p in panels:
            assert p["targets"], p["title"]
            assert all(t["expr"].strip() for t in p["targets"]), p["title"]
