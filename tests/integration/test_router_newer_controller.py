"""A real router of this version following a newer controller (the supported mix of a
rolling upgrade, docs/operations.md#which-versions-run-together): what the controller's
answers gain must not cost the router its leases or its endpoint list.

The newer controller is a stand-in (newer_controller.py) serving answers this version
encodes plus the fields and values a later one may add; the router and the engine are
real processes.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import Program, start_program
from llmgw.testing.wait import wait_until

from .newer_controller import NewerController
from .router_fixtures import base_config, chat_body, router, sim_args
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


OTHER = "sk-llmgw-newer-controller-k2"


def ask(r: Program, key: str, model: str = "m") -> int:
    """The status of one chat request through `r` with `key`."""
    body = json.dumps(chat_body("hi", max_tokens=1, model=model)).encode()
    req = urllib.request.Request(
        r.url + "/v1/chat/completions",
        data=body,
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            status: int = resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    return status


def other_key() -> dict[str, Any]:
    return key_entry(name="k2", team="t2", sha256=hashlib.sha256(OTHER.encode()).hexdigest())


class TestEndpointListOfANewerController:
    """An endpoint list whose endpoints, keys or outlook gained a field or a value."""

    def test_an_endpoint_with_an_added_field_is_routed_to(
        self, tmp_path: Path, engine: Program
    ) -> None:
        """An endpoint carrying a field the router does not know is served all the same."""
        listed = endpoint_list(engine)
        listed["endpoints"][0]["max_batch"] = 8
        with NewerController(listed) as c, follower(tmp_path, c) as r:
            assert wait_until(lambda: ask(r, KEY) == 200, timeout_s=10, what="the list taken")

    def test_a_key_in_a_band_the_router_does_not_know_is_served_as_standard(
        self, tmp_path: Path, engine: Program
    ) -> None:
        """A key in a priority band added since is served, in the standard band."""
        listed = endpoint_list(engine, keys=[key_entry(priority="realtime")])
        with NewerController(listed) as c, follower(tmp_path, c) as r:
            assert wait_until(lambda: ask(r, KEY) == 200, timeout_s=10, what="the list taken")

    @pytest.mark.parametrize(
        "newer",
        [{"rpd": 5}, {"budget": {"tokens": 10, "per": "year"}}, {"rpm": "many"}],
        ids=["added-limit", "unknown-budget-period", "unreadable-limit"],
    )
    def test_a_key_the_router_cannot_read_is_refused_and_the_rest_applies(
        self, tmp_path: Path, engine: Program, newer: dict[str, Any]
    ) -> None:
        """A key with a limit the router cannot read is refused (never served with
        fewer limits), while the other keys and the endpoints of the list are taken."""
        listed = endpoint_list(engine, keys=[key_entry(**newer), other_key()])
        with NewerController(listed) as c, follower(tmp_path, c) as r:
            wait_until(lambda: ask(r, OTHER) == 200, timeout_s=10, what="the list taken")
            assert ask(r, KEY) == 401

    def test_an_outlook_in_a_state_the_router_does_not_know_is_left_out(
        self, tmp_path: Path, engine: Program
    ) -> None:
        """An outlook entry in a state added since does not cost the router the list."""
        look = {"models": ["m2"], "state": "queued_for_quota", "reason": "quota"}
        listed = endpoint_list(engine, models=["m", "m2"], outlook=[look])
        with NewerController(listed) as c, follower(tmp_path, c) as r:
            assert wait_until(lambda: ask(r, KEY) == 200, timeout_s=10, what="the list taken")

    def test_what_is_left_out_is_logged_once_for_every_list(
        self, tmp_path: Path, engine: Program
    ) -> None:
        """A key left out of one list after another is logged once, not at each list."""
        listed = endpoint_list(engine, keys=[key_entry(rpd=5), other_key()])
        with NewerController(listed) as c, follower(tmp_path, c) as r:
            wait_until(lambda: ask(r, OTHER) == 200, timeout_s=10, what="the list taken")
            for version in (2, 3, 4):
                c.publish({**listed, "version": version})
                wait_until(lambda v=version: v in c.afters, timeout_s=10, what=f"list {version}")
            assert r.log_text().count("key refused") == 1
