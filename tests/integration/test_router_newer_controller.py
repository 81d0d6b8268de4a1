"""A real router of this version following a newer controller (the supported mix of a
rolling upgrade, docs/operations.md#which-versions-run-together): what the controller's
answers gain must not cost the router its leases or its endpoint list.

The newer controller is a stand-in (newer_controller.py) serving answers this version
encodes plus the fields and values a later one may add; the router and the engine are
real processes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

from .newer_controller import NewerController
from .router_fixtures import base_config, router, sim_args
from .test_router_usage_report import metrics, series

pytestmark = pytest.mark.slow

KEY = "sk-llmgw-newer-controller-k"
SHA = hashlib.sha256(KEY.encode()).hexdigest()


def key_entry(**over: Any) -> dict[str, Any]:
    """Key `k` of team `t` as the endpoint list carries it, with `over` set or added."""
    return {"name": "k", "sha256": SHA, "team": "t", "rpm": 600, **over}


def endpoint_list(engine: Program, version: int = 1, **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "version": version,
        "endpoints": [{"id": "e0", "url": engine.url, "models": ["m"]}],
        "models": ["m"],
        "keys": [key_entry()],
        "keys_required": True,
    }
    doc.update(over)
    return doc


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Program]:
    prog = start_program(sim_args(speed=2000.0), log_dir=tmp_path_factory.mktemp("engine"))
    try:
        yield prog
    finally:
        prog.stop(grace_s=3)


def follower(tmp: Path, c: NewerController) -> Any:
    cfg = base_config(controller={"url": c.url, "poll_timeout_s": 1.0}, router_id="r-old")
    return router(tmp, cfg)


def rpm_share(r: Program) -> float:
    return series(metrics(r.url), "llmgw_router_team_rpm_share", team="t")


class TestLeasesOfANewerController:
    """A lease answer whose entries gained a field."""

    def test_a_lease_with_an_added_field_is_enforced(self, tmp_path: Path, engine: Program) -> None:
        """The router takes its share from a lease carrying a field it does not know,
        rather than refusing every answer and falling back to its backup limits."""
        lease = {
            "leases": [{"sha256": SHA, "rpm": 7.0, "rpm_limit": 600, "max_parallel": 4}],
            "lease_s": 60.0,
            "routers": 3,
            "lease_epoch": 12,
        }
        with NewerController(endpoint_list(engine), lease) as c, follower(tmp_path, c) as r:
            wait_until(lambda: c.reports >= 3, timeout_s=15, what="three usage reports")
            assert rpm_share(r) == 7.0
            assert "bad lease answer" not in r.log_text()
