"""The admin API against a real controller process: every command with bad input, auth, OpenAPI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration import pg
from tests.integration.controller_harness import (
    Controller,
    Db,
    FakeAgents,
    controller,
    spec,
    wait_for,
)

TOKEN = "s3cret"
# The fixture, seen by this module's tests as a global.
pg_schema = pg.pg_schema


@pytest.fixture(scope="module")
def c(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Controller]:
    """One controller for the module (SQLite), with a token and one node with a ready replica."""
    path: Path = tmp_path_factory.mktemp("api") / "controller.db"
    with controller(Db(f"sqlite:///{path}"), token=TOKEN) as ctl:
        ctl.post("/admin/models", spec("m", gpus_per_node=2))
        # Heartbeating throughout: the fleet stays as it is, so a test can tell that a
        # refused request changed nothing.
        with FakeAgents(ctl, {"a": 8}):
            wait_for(lambda: ctl.replicas("m", "ready"), what="a ready replica")
            yield ctl


class TestAuth:
    """The admin API's token checks."""

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
    """Unknown names are 404."""

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
            ("POST", "/admin/replicas/r-nope/engine-key", None),
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
    """Bad input to each admin command is refused naming the field."""

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


class TestUnknownQueryParameters:
    """A query parameter the route does not take is refused, not ignored."""

    @pytest.mark.parametrize(
        ("path", "param"),
        [
            ("/admin/events?modle=m", "modle"),
            ("/admin/events?since=1h", "since"),
            ("/admin/replicas?limit=5", "limit"),
            ("/admin/keys?offset=5", "offset"),
            ("/admin/models?name=m", "name"),
            ("/admin/nodes?state=active", "state"),
            ("/admin/usage?since=1h", "since"),
            ("/v1/endpoints?after=1&timeout=5", "timeout"),
        ],
    )
    def test_unknown_parameter_is_400(self, c: Controller, path: str, param: str) -> None:
        """A misspelt filter is a 400 naming it, never the unfiltered answer."""
        err = c.error("GET", path)
        assert (err.status, err.body["error"]["type"]) == (400, "invalid_request_error")
        assert err.body["error"]["param"] == param

    @pytest.mark.parametrize("param", ["model", "replica", "node"])
    def test_a_nul_in_an_event_filter_is_400(self, c: Controller, param: str) -> None:
        """No name holds a NUL: a filter with one is refused naming it (PostgreSQL would
        refuse the query, and the controller answered 503 as if the database were down)."""
        err = c.error("GET", f"/admin/events?{param}=m%00x")
        assert (err.status, err.body["error"]["param"]) == (400, param)
        err = c.error("GET", "/admin/replicas?model=m%00x")
        assert (err.status, err.body["error"]["param"]) == (400, "model")

    def test_known_parameters_still_pass(self, c: Controller) -> None:
        """Every parameter /openapi.json lists for a route is taken."""
        assert c.get("/admin/events?model=m&limit=5&node=a&replica=x") == []
        assert c.get("/admin/replicas?model=m&state=ready")
        assert c.get("/v1/endpoints?after=-1&timeout_s=0")["endpoints"]
        assert c.get("/admin/keys?after=a&limit=5") == []
        assert isinstance(c.get("/admin/models?after=a&limit=5"), list)


@pytest.mark.postgres
class TestEventFiltersOnPostgres:
    """Event filters PostgreSQL cannot compare are bad input, not a database failure."""

    def test_a_nul_in_a_filter_is_400_not_503(self, pg_schema: pg.PgSchema) -> None:
        """`?model=m%00x`: 400 naming the parameter; the log reads on."""
        with controller(Db(pg_schema.url, pg_schema.schema), token=TOKEN) as ctl:
            err = ctl.error("GET", "/admin/events?model=m%00x")
            assert (err.status, err.body["error"]["param"]) == (400, "model")
            assert ctl.get("/admin/events?limit=1")


class TestEngineKey:
    """The engine-key route's refusals."""

    def test_a_replica_without_a_key_is_409(self, c: Controller) -> None:
        """These fake agents report no engine key: 409 conflict_error naming the replica."""
        rid = c.replicas("m", "ready")[0]["id"]
        err = c.error("POST", f"/admin/replicas/{rid}/engine-key")
        assert (err.status, err.body["error"]["type"]) == (409, "conflict_error")
        assert err.body["error"]["param"] == "id"
        assert rid in err.body["error"]["message"]

    def test_the_route_takes_no_body(self, c: Controller) -> None:
        """Like the other commands without a body: `{}` or nothing, else refused."""
        rid = c.replicas("m", "ready")[0]["id"]
        assert c.error("POST", f"/admin/replicas/{rid}/engine-key", {"x": 1}).status == 422


class TestReads:
    """The read routes' shapes, order and OpenAPI description."""

    def test_lists_are_sorted_and_shaped(self, c: Controller) -> None:
        """Nodes by name, models by name, replicas by id; unknown idle is -1."""
        assert [n["name"] for n in c.get("/admin/nodes")] == ["a"]
        names = [m["name"] for m in c.get("/admin/models")]
        assert names == sorted(names)
        reps = c.replicas()
        assert [r["id"] for r in reps] == sorted(r["id"] for r in reps)
        assert reps[0]["idle_seconds"] == -1

    def test_summary_uses_the_seed_names(self, c: Controller) -> None:
        """The summary JSON has the documented fields."""
        s = c.get("/admin/summary")
        assert s["nodes"]["total"] == 1
        assert s["gpus"][0]["class"] == "H100-80G"
        assert {"ready", "starting", "draining", "failed"} <= set(s["replicas"])

    def test_events_explain_what_happened(self, c: Controller) -> None:
        """The log has the model's application, placement and readiness, oldest first."""
        kinds = [e.split()[0] for e in c.events(model="m")]
        assert kinds[0] == "model.applied"
        # The model is applied before the node's first heartbeat: a tick in between
        # finds nowhere to place it and says so (model.unplaceable), as it should.
        told = [k for k in kinds if k in ("model.applied", "replica.placed", "replica.ready")]
        assert told[:3] == ["model.applied", "replica.placed", "replica.ready"]

    def test_openapi_describes_every_route(self, c: Controller) -> None:
        """Every route of the app appears in /openapi.json with its method."""
        from llmgw.controller.api.routes import routes

        doc = c.get("/openapi.json")
        for r in routes():
            path = r.path.replace("{name:.+}", "{name}")  # type: ignore[attr-defined]
            assert r.method.lower() in doc["paths"][path], (r.method, path)  # type: ignore[attr-defined]


def _fleet(c: Controller) -> tuple[Any, ...]:
    """What a refused request must not change: nodes, models, replicas (timestamps aside)."""
    nodes = [
        (n["name"], n["state"], n["address"], n["gpu_total"], n["drain_grace_s"], n["drain_force"])
        for n in c.get("/admin/nodes")
    ]
    models = [(m["name"], m["min"], m["max"], m["desired"]) for m in c.get("/admin/models")]
    replicas = [(r["id"], r["state"], r["weight"], r["idle_seconds"]) for r in c.replicas()]
    return nodes, models, replicas


def _rid(c: Controller) -> str:
    return str(c.replicas("m", "ready")[0]["id"])


HB = {"node": "fresh", "address": "10.0.0.9", "gpus": []}
GPU = {"index": 0, "uuid": "u", "name": "H100", "gpu_class": "H100-80G", "memory_mib": 1}

# Every route that reads a body: (method, path). RID stands for the ready replica's id.
BODY_ROUTES = [
    ("POST", "/v1/agents/fresh/heartbeat"),
    ("POST", "/v1/usage"),
    ("POST", "/admin/models"),
    ("POST", "/admin/models/m/scale"),
    ("POST", "/admin/nodes/a/drain"),
    ("POST", "/admin/nodes/a/cordon"),
    ("POST", "/admin/nodes/a/uncordon"),
    ("POST", "/admin/replicas/RID/weight"),
    ("DELETE", "/admin/models/m"),
]


class TestBadInputChangesNothing:
    """Every route, every kind of bad input: a 4xx in the OpenAI error shape, and no change."""

    def _refused(
        self, c: Controller, method: str, path: str, raw: bytes, status: int
    ) -> dict[str, Any]:
        before = _fleet(c)
        err = c.error(method, path.replace("RID", _rid(c)), raw=raw)
        assert err.status == status, err.body
        body: dict[str, Any] = err.body["error"]
        assert set(body) == {"message", "type", "param", "code"}
        assert body["type"] == "invalid_request_error"
        assert body["message"]
        assert _fleet(c) == before
        assert c.error("GET", "/admin/nodes/fresh").status == 404
        return body

    @pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
    def test_malformed_json(self, c: Controller, method: str, path: str) -> None:
        """A body that is not JSON is 400 on every route that reads one."""
        body = self._refused(c, method, path, b'{"not json', 400)
        assert "not valid JSON" in body["message"]

    @pytest.mark.parametrize(("method", "path"), BODY_ROUTES)
    def test_json_of_the_wrong_shape(self, c: Controller, method: str, path: str) -> None:
        """A JSON value that is not the object the route takes is refused."""
        self._refused(c, method, path, b'"a string"', 400 if path == "/admin/models" else 422)

    @pytest.mark.parametrize(
        ("path", "body", "param"),
        [
            ("/v1/agents/fresh/heartbeat", {**HB, "gpus": "eight"}, "gpus"),
            ("/v1/agents/fresh/heartbeat", {**HB, "shards": [{"rank": 0}]}, "shards[0].replica_id"),
            (
                "/v1/usage",
                {"router_id": "r", "sent_at": 1.0, "inflight": {"x": "1"}},
                "inflight[...]",
            ),
            ("/admin/models", [spec("ok"), spec("bad", nodes="2")], "[1].nodes"),
            ("/admin/models/m/scale", {"min_replicas": "1"}, "min_replicas"),
            ("/admin/nodes/a/drain", {"force": "yes"}, "force"),
            ("/admin/replicas/RID/weight", {"weight": [1]}, "weight"),
        ],
    )
    def test_wrong_types_name_the_field(
        self, c: Controller, path: str, body: object, param: str
    ) -> None:
        """A wrongly typed field is 422 with its path as param."""
        err = self._refused(c, "POST", path, json.dumps(body).encode(), 422)
        assert err["param"] == param

    @pytest.mark.parametrize(
        ("method", "path", "body", "param"),
        [
            ("POST", "/admin/models", spec("x", replica=1), "replica"),
            ("POST", "/admin/models/m/scale", {"min": 1}, "min"),
            ("POST", "/admin/nodes/a/drain", {"grace": 5}, "grace"),
            ("POST", "/admin/nodes/a/cordon", {"why": "maintenance"}, "why"),
            ("POST", "/admin/nodes/a/uncordon", {"now": True}, "now"),
            ("POST", "/admin/replicas/RID/weight", {"weight": 2.0, "w": 1}, "w"),
            ("DELETE", "/admin/models/m", {"force": True}, "force"),
        ],
    )
    def test_unknown_fields_in_admin_bodies_are_refused(
        self, c: Controller, method: str, path: str, body: object, param: str
    ) -> None:
        """An operator's typo is 422 naming the field, never silently ignored."""
        err = self._refused(c, method, path, json.dumps(body).encode(), 422)
        assert err["param"] == param

    @pytest.mark.parametrize(
        ("path", "body", "param"),
        [
            ("/v1/agents/fresh/heartbeat", {**HB, "address": " "}, "address"),
            ("/v1/agents/fresh/heartbeat", {**HB, "port_range": [30000, 20000]}, "port_range"),
            ("/v1/agents/fresh/heartbeat", {**HB, "gpus": [GPU, GPU]}, "gpus[1].index"),
            (
                "/v1/agents/fresh/heartbeat",
                {**HB, "shards": [{"replica_id": "r", "rank": 0, "state": "ready", "port": 0}]},
                "shards[0].port",
            ),
            ("/v1/usage", {"router_id": "", "sent_at": 1.0}, "router_id"),
            (
                "/v1/usage",
                {"router_id": "r", "sent_at": 1.0, "inflight": {"RID": -1}},
                "inflight.RID",
            ),
            ("/v1/usage", {"router_id": "r", "sent_at": 1.0, "demand": {"m": -3}}, "demand.m"),
            (
                "/v1/usage",
                {"router_id": "r", "sent_at": 1.0, "load": {"m": {"inflight": -9}}},
                "load.m.inflight",
            ),
            ("/admin/models", spec("x", gpu_classes=[""]), "gpu_classes[0]"),
            ("/admin/models", [spec("x"), spec("y", gpu_classes=[" "])], "[1].gpu_classes[0]"),
            ("/admin/nodes/a/drain", {"grace_s": -1}, "grace_s"),
            ("/admin/replicas/RID/weight", {"weight": 2.0, "capacity_tok_s": 0}, "capacity_tok_s"),
        ],
    )
    def test_values_that_break_a_rule_are_refused(
        self, c: Controller, path: str, body: dict[str, Any] | list[Any], param: str
    ) -> None:
        """Well-typed values a rule forbids are 422 naming the field; nothing is recorded."""
        rid = _rid(c)
        raw = json.dumps(body).replace("RID", rid).encode()
        err = self._refused(c, "POST", path, raw, 422)
        assert err["param"] == param.replace("RID", rid)

    def test_scale_asking_for_nothing_is_400(self, c: Controller) -> None:
        """A scale request with neither bound is refused, not a silent no-op."""
        err = self._refused(c, "POST", "/admin/models/m/scale", b"{}", 400)
        assert "min_replicas, max_replicas or both" in err["message"]

    @pytest.mark.parametrize(
        ("method", "path"),
        [("POST", "/admin/models"), ("POST", "/v1/agents/fresh/heartbeat"), ("POST", "/v1/usage")],
    )
    def test_oversized_body_is_413(self, c: Controller, method: str, path: str) -> None:
        """A body over the 16 MiB limit is 413 in the error shape, and nothing is read of it."""
        raw = b'{"name": "' + b"x" * (16 * 1024 * 1024 + 1) + b'"}'
        err = self._refused(c, method, path, raw, 413)
        assert "Too Large" in err["message"]

    def test_bad_long_poll_timeout_is_400(self, c: Controller) -> None:
        """A timeout_s that is not a finite number (empty included) is refused, not defaulted."""
        for text in ("nan", "inf", "soon", ""):
            err = c.error("GET", f"/v1/endpoints?timeout_s={text}")
            assert (err.status, err.body["error"]["param"]) == (400, "timeout_s")

    def test_bodiless_commands_take_an_empty_object(self, c: Controller) -> None:
        """cordon, uncordon and delete accept no body or `{}`; the command then runs."""
        assert c.call("POST", "/admin/nodes/a/cordon", raw=b"{}")["state"] == "cordoned"
        assert c.call("POST", "/admin/nodes/a/uncordon", raw=b" ")["state"] == "ready"

    def test_agent_and_router_bodies_tolerate_unknown_fields(self, c: Controller) -> None:
        """A newer agent or router may send fields this controller does not know."""
        c.post("/v1/usage", {"router_id": "r", "sent_at": 1.0, "new_field": 1})
        reply = c.post("/v1/agents/newer/heartbeat", {**HB, "node": "newer", "cpu": "arm"})
        assert reply["shards"] == []
