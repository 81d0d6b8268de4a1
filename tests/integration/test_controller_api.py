"""The admin API against a real controller process: every command with bad input, auth, OpenAPI."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.controller_harness import (
    Controller,
    Db,
    FakeAgents,
    controller,
    spec,
    wait_for,
)

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """One controller for the module (SQLite), with a token and one node with a ready replica."""
    path: Path = tmp_path_factory.mktemp("api") / "controller.db"
    with controller(Db(f"sqlite:///{path}"), token=TOKEN) as ctl:
        ctl.post("/admin/models", spec("m", gpus_per_node=2))
        with FakeAgents(ctl, {"a": 8}):
            wait_for(lambda: ctl.replicas("m", "ready"), what="a ready replica")
        yield ctl


class TestAuth:
    def test_missing_token_is_401(self, c: Controller) -> None:
        """No Authorization header: 401 authentication_error."""
        err = c.error("GET", "/admin/summary", token=None)
        assert (err.status, err.body["error"]["type"]) == (401, "authentication_error")

    def test_wrong_token_is_401(self, c: Controller) -> None:
        """A wrong bearer token: 401, also on agent and router routes."""
        assert c.error("GET", "/admin/nodes", token="nope").status == 401
        assert c.error("POST", "/v1/usage", {}, token="nope").status == 401
        assert c.error("GET", "/v1/endpoints", token="nope").status == 401

    def test_health_and_openapi_need_no_token(self, c: Controller) -> None:
        """/healthz and /openapi.json answer without a token."""
        assert c.get("/healthz", token=None)["leader"] is True
        assert c.get("/openapi.json", token=None)["openapi"].startswith("3.1")


class TestNotFound:
    @pytest.mark.parametrize(
        ("method", "path", "body"),
        [
            ("GET", "/admin/nodes/nope", None),
            ("POST", "/admin/nodes/nope/cordon", None),
            ("POST", "/admin/nodes/nope/uncordon", None),
            ("POST", "/admin/nodes/nope/drain", {"grace_s": 1}),
            ("GET", "/admin/models/nope", None),
            ("DELETE", "/admin/models/nope", None),
            ("POST", "/admin/models/nope/scale", {"min_replicas": 1}),
            ("GET", "/admin/replicas/r-nope", None),
            ("POST", "/admin/replicas/r-nope/weight", {"weight": 2.0}),
            ("GET", "/admin/nowhere", None),
        ],
    )
    def test_unknown_names_are_404(
        self, c: Controller, method: str, path: str, body: object
    ) -> None:
        """Unknown node, model, replica or route: 404 not_found_error in the one error shape."""
        err = c.error(method, path, body)
        assert err.status == 404
        assert err.body["error"]["type"] == "not_found_error"
        assert err.body["error"]["message"]


class TestInvalidInput:
    def test_invalid_spec_names_the_field(self, c: Controller) -> None:
        """A wrongly typed field is 422 with the field as param."""
        err = c.error("POST", "/admin/models", spec("x", gpus_per_node="two"))
        assert (err.status, err.body["error"]["param"]) == (422, "gpus_per_node")

    def test_unknown_field_is_refused(self, c: Controller) -> None:
        """A field the spec does not have is 422 naming it."""
        err = c.error("POST", "/admin/models", spec("x", replicas=3))
        assert (err.status, err.body["error"]["param"]) == (422, "replicas")

    def test_spec_max_below_min_is_refused(self, c: Controller) -> None:
        """min 3, max 1 in a spec is 422 naming max_replicas."""
        err = c.error("POST", "/admin/models", spec("x", min_replicas=3, max_replicas=1))
        assert (err.status, err.body["error"]["param"]) == (422, "max_replicas")

    def test_list_apply_is_all_or_nothing(self, c: Controller) -> None:
        """One bad spec in a list refuses all of them, naming index, model and field."""
        err = c.error("POST", "/admin/models", [spec("ok1"), spec("bad", engine="tgi")])
        assert err.body["error"]["param"] == "[1].engine"
        assert "models[1] ('bad')" in err.body["error"]["message"]
        assert c.error("GET", "/admin/models/ok1").status == 404

    def test_malformed_json_is_400(self, c: Controller) -> None:
        """A body that is not JSON is 400."""
        assert c.error("POST", "/admin/models", raw=b"{not json").status == 400
        assert c.error("POST", "/admin/models", raw=b"").status == 400

    def test_name_clash_is_409(self, c: Controller) -> None:
        """An alias that another model already serves is a 409 conflict."""
        err = c.error("POST", "/admin/models", spec("other", aliases=["m"]))
        assert (err.status, err.body["error"]["type"]) == (409, "conflict_error")

    def test_scale_max_below_min_is_400(self, c: Controller) -> None:
        """Scale whose merge puts max under min is 400 and changes nothing."""
        err = c.error("POST", "/admin/models/m/scale", {"min_replicas": 5})
        assert (err.status, err.body["error"]["param"]) == (400, "max_replicas")
        assert c.get("/admin/models/m")["min"] == 1

    def test_scale_bad_field_is_422(self, c: Controller) -> None:
        """A negative bound is refused naming the field."""
        err = c.error("POST", "/admin/models/m/scale", {"max_replicas": -1})
        assert (err.status, err.body["error"]["param"]) == (422, "max_replicas")

    def test_drain_bad_grace_is_refused(self, c: Controller) -> None:
        """A drain request with a non-number grace is 422; with a negative one, too."""
        assert c.error("POST", "/admin/nodes/a/drain", {"grace_s": "x"}).status == 422
        assert c.error("POST", "/admin/nodes/a/drain", {"grace_s": -1}).status == 422

    def test_weight_must_be_positive(self, c: Controller) -> None:
        """A zero weight is refused; a positive one flows into the endpoint list."""
        rid = c.replicas("m", "ready")[0]["id"]
        assert c.error("POST", f"/admin/replicas/{rid}/weight", {"weight": 0}).status == 422
        assert c.post(f"/admin/replicas/{rid}/weight", {"weight": 1.5})["weight"] == 1.5
        assert c.get("/v1/endpoints")["endpoints"][0]["weight"] == 1.5

    def test_bad_queries_are_400(self, c: Controller) -> None:
        """Bad state filter, limit or long-poll parameters are 400 naming the parameter."""
        assert c.error("GET", "/admin/replicas?state=bogus").body["error"]["param"] == "state"
        assert c.error("GET", "/admin/events?limit=0").body["error"]["param"] == "limit"
        assert c.error("GET", "/v1/endpoints?after=x").body["error"]["param"] == "after"
        assert c.error("GET", "/v1/endpoints?timeout_s=x").body["error"]["param"] == "timeout_s"

    def test_heartbeat_for_another_node_is_400(self, c: Controller) -> None:
        """The body's node must match the URL's."""
        hb = {"node": "b", "address": "x", "gpus": []}
        assert c.error("POST", "/v1/agents/a/heartbeat", hb).status == 400

    def test_bad_usage_report_is_422(self, c: Controller) -> None:
        """A usage report without router_id is refused naming it."""
        err = c.error("POST", "/v1/usage", {"sent_at": 1.0})
        assert (err.status, err.body["error"]["param"]) == (422, "router_id")


class TestReads:
    def test_lists_are_sorted_and_shaped(self, c: Controller) -> None:
        """Nodes by name, models by name, replicas by id; unknown idle is -1."""
        assert [n["name"] for n in c.get("/admin/nodes")] == ["a"]
        names = [m["name"] for m in c.get("/admin/models")]
        assert names == sorted(names)
        reps = c.replicas()
        assert [r["id"] for r in reps] == sorted(r["id"] for r in reps)
        assert reps[0]["idle_seconds"] == -1

    def test_summary_uses_the_seed_names(self, c: Controller) -> None:
        """The summary JSON has the seed's fields."""
        s = c.get("/admin/summary")
        assert s["nodes"]["total"] == 1
        assert s["gpus"][0]["class"] == "H100-80G"
        assert {"ready", "starting", "draining", "failed"} <= set(s["replicas"])

    def test_events_explain_what_happened(self, c: Controller) -> None:
        """The log has the model's application, placement and readiness, oldest first."""
        kinds = [e.split()[0] for e in c.events(model="m")]
        assert kinds[:3] == ["model.applied", "replica.placed", "replica.ready"]

    def test_openapi_describes_every_route(self, c: Controller) -> None:
        """Every route of the app appears in /openapi.json with its method."""
        from llmgw.controller.api import routes

        doc = c.get("/openapi.json")
        for r in routes():
            path = r.path.replace("{name:.+}", "{name}")  # type: ignore[attr-defined]
            assert r.method.lower() in doc["paths"][path], (r.method, path)  # type: ignore[attr-defined]
