"""ctl commands end to end against an in-memory controller (a fake Transport, no sockets)."""

from __future__ import annotations

import io
import json
import urllib.parse
from collections.abc import Mapping
from pathlib import Path

import msgspec
import pytest

from llmgw.adminclient.client import Response
from llmgw.adminclient.errors import AdminUnreachable
from llmgw.ctl import bench as bench_driver
from llmgw.ctl import config, errors, main, specs
from llmgw.ctl.capacity import Level
from llmgw.ctl.context import Ctx
from llmgw.runtime.clock import ManualClock
from llmgw.wire.admin import (
    ClassUse,
    DrainWait,
    EngineKey,
    EventView,
    ModelView,
    NodeTotals,
    NodeView,
    ReplicaView,
    ShardView,
    Summary,
    UnplaceableModel,
)
from llmgw.wire.errors import error_body
from llmgw.wire.models import ModelSpec

TOKEN = "t0ken"


def node_view(name: str, state: str = "ready") -> NodeView:
    return NodeView(
        name=name, address="127.0.0.1", state=state, fabrics=("ib0",), labels={}, gpus=(),
        gpus_used=(), last_heartbeat=1.8e9 - 3, classes=("H100-80G",), gpu_total=8, gpu_free=8,
        unhealthy=(),
    )  # fmt: skip


def replica_view(
    rid: str, *, node: str = "gpu-01", idle: int = -1, state: str = "ready"
) -> ReplicaView:
    return ReplicaView(
        id=rid, model="m", state=state, reason=None,
        shards=(ShardView(node=node, rank=0, gpus=(0,), port=21000, state="ready"),),
        endpoint_url="http://127.0.0.1:21000", created_at=0.0, updated_at=0.0, restarts=0,
        idle_seconds=idle, pool="ib0/H100-80G", weight=1.0,
    )  # fmt: skip


def model_view(name: str) -> ModelView:
    spec = ModelSpec(name=name, engine="sim", gpu_classes=("H100-80G",))
    return ModelView(spec=spec, name=name, ready=1, total=1, min=1, max=1, desired=1)


class FakeController:
    """Answers the admin routes from memory, checks the token, records every call."""

    def __init__(self, *, token: str | None = TOKEN) -> None:
        self.token = token
        self.nodes = {"gpu-01": node_view("gpu-01")}
        self.replicas = [replica_view("r-1", idle=-1), replica_view("r-2", idle=240)]
        self.calls: list[tuple[str, str, Mapping[str, str], object]] = []
        # Each GET /admin/replicas during a drain removes one replica from the node.
        self.drain_progress = False
        # What GET /admin/nodes/{name} says a drain waits for.
        self.drain_waiting: tuple[DrainWait, ...] = ()
        # POST /admin/replicas/{id}/engine-key: these replicas' keys; another is 409,
        # or 403 for every replica when `engine_key_forbidden` (a read token's answer).
        self.engine_keys: dict[str, str] = {}
        self.engine_key_forbidden = False

    def request(
        self,
        method: str,
        url: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        timeout_s: float,
    ) -> Response:
        parts = urllib.parse.urlsplit(url)
        path = urllib.parse.unquote(parts.path)
        query = dict(urllib.parse.parse_qsl(parts.query))
        payload = None if body is None else json.loads(body)
        self.calls.append((method, path, query, payload))
        if self.token and headers.get("Authorization") != f"Bearer {self.token}":
            return Response(401, error_body("bad token", type="authentication_error"))
        return self._route(method, path, query, payload)

    def _ok(self, value: object) -> Response:
        return Response(200, msgspec.json.encode(value))

    def _route(self, method: str, path: str, query: Mapping[str, str], payload: object) -> Response:
        seg = path.strip("/").split("/")
        if (method, path) == ("GET", "/admin/summary"):
            return self._ok(
                Summary(
                    nodes=NodeTotals(total=1, ready=1),
                    gpus=[ClassUse(gpu_class="H100-80G", total=8, used=2, unhealthy=1)],
                    unplaceable=["big"],
                    unplaceable_reasons=[UnplaceableModel(model="big", reason="needs 2 nodes")],
                )
            )
        if (method, path) == ("GET", "/admin/nodes"):
            return self._ok(sorted(self.nodes.values(), key=lambda n: n.name))
        if method == "GET" and seg[:2] == ["admin", "nodes"] and len(seg) == 3:
            found = self.nodes.get(seg[2])
            if found is None:
                return Response(404, error_body(f"no node {seg[2]!r}", type="not_found_error"))
            return self._ok(msgspec.structs.replace(found, drain_waiting=self.drain_waiting))
        if method == "POST" and seg[:2] == ["admin", "nodes"] and len(seg) == 4:
            if seg[2] not in self.nodes:
                return Response(404, error_body(f"no node {seg[2]!r}", type="not_found_error"))
            state = {"cordon": "cordoned", "uncordon": "ready", "drain": "draining"}[seg[3]]
            self.nodes[seg[2]] = node_view(seg[2], state)
            return self._ok(self.nodes[seg[2]])
        if method == "GET" and seg[:2] == ["admin", "replicas"] and len(seg) == 3:
            found = [r for r in self.replicas if r.id == seg[2]]
            if not found:
                return Response(404, error_body(f"no replica {seg[2]!r}", type="not_found_error"))
            return self._ok(found[0])
        if method == "POST" and seg[:2] == ["admin", "replicas"] and seg[-1] == "weight":
            assert isinstance(payload, dict)
            self.replicas = [
                msgspec.structs.replace(
                    r, weight=payload["weight"], capacity_tok_s=payload.get("capacity_tok_s")
                )
                if r.id == seg[2]
                else r
                for r in self.replicas
            ]
            return self._ok(next(r for r in self.replicas if r.id == seg[2]))
        if method == "POST" and seg[:2] == ["admin", "replicas"] and seg[-1] == "engine-key":
            if self.engine_key_forbidden:
                return Response(403, error_body("read-only", type="permission_error"))
            if seg[2] not in self.engine_keys:
                return Response(409, error_body("no engine key", type="conflict_error"))
            return self._ok(EngineKey(replica=seg[2], api_key=self.engine_keys[seg[2]]))
        if (method, path) == ("GET", "/admin/replicas"):
            if self.drain_progress and self.replicas:
                self.replicas = self.replicas[1:]
            return self._ok([r for r in self.replicas if query.get("model") in (None, r.model)])
        if (method, path) == ("GET", "/admin/models"):
            return self._ok([model_view("a"), model_view("b")])
        if (method, path) == ("POST", "/admin/models"):
            assert isinstance(payload, list)
            return self._ok([model_view(p["name"]) for p in payload])
        if method == "DELETE" and seg[:2] == ["admin", "models"]:
            return self._ok({"deleted": "/".join(seg[2:])})
        if method == "POST" and seg[:2] == ["admin", "models"] and seg[-1] == "scale":
            return self._ok(model_view("/".join(seg[2:-1])))
        if (method, path) == ("GET", "/admin/events"):
            ev = EventView(
                id=1, at=1.8e9, kind="node.cordoned", subject="node", subject_id="gpu-01",
                model=None, message="cordoned by operator",
            )  # fmt: skip
            return self._ok([ev])
        return Response(404, b"404: Not Found")


class Unreachable:
    def request(self, method: str, url: str, **_kw: object) -> Response:
        raise AdminUnreachable(f"cannot reach the controller at {url}: [Errno 111] refused")


class Run:
    """One ctl invocation's exit code and output."""

    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> object:
        return json.loads(self.out)


def run_ctl(
    argv: list[str],
    transport: object,
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    clock: ManualClock | None = None,
) -> Run:
    out, err = io.StringIO(), io.StringIO()
    clock = clock or ManualClock()
    base = Ctx(
        out=out,
        err=err,
        clock=clock,
        sleep=clock.advance,
        transport=transport,  # type: ignore[arg-type]
        width=120,
    )
    env = {"LLMGW_TOKEN": TOKEN} if env is None else env
    code = main.main(argv, env=env, home=tmp_path, base=base)
    return Run(code, out.getvalue(), err.getvalue())


class TestConfig:
    """Where ctl takes its controller URL and token from."""

    def test_flag_beats_env_beats_file(self, tmp_path: Path) -> None:
        """A flag wins over the environment, which wins over the config file."""
        cfg = tmp_path / ".config" / "llmgw" / "ctl.yaml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text("controller: http://file:1\ntoken: file-token\n")
        env = {"LLMGW_CONTROLLER": "http://env:2"}
        t = config.resolve(flag_url=None, flag_token=None, env=env, home=tmp_path)
        assert (t.url, t.token) == ("http://env:2", "file-token")
        t = config.resolve(flag_url="flag:3", flag_token="f", env=env, home=tmp_path)
        assert (t.url, t.token, t.url_from) == ("http://flag:3", "f", "flag")

    def test_default_is_the_controller_port(self, tmp_path: Path) -> None:
        """With nothing set, ctl talks to 127.0.0.1:8081 without a token."""
        t = config.resolve(flag_url=None, flag_token=None, env={}, home=tmp_path)
        assert (t.url, t.token) == ("http://127.0.0.1:8081", None)

    def test_xdg_config_home(self, tmp_path: Path) -> None:
        """$XDG_CONFIG_HOME/llmgw/ctl.yaml is read when set."""
        (tmp_path / "x" / "llmgw").mkdir(parents=True)
        (tmp_path / "x" / "llmgw" / "ctl.yaml").write_text("controller: 10.0.0.5:8081\n")
        env = {"XDG_CONFIG_HOME": str(tmp_path / "x")}
        t = config.resolve(flag_url=None, flag_token=None, env=env, home=tmp_path)
        assert t.url == "http://10.0.0.5:8081"

    def test_bad_config_file_names_it(self, tmp_path: Path) -> None:
        """An unknown setting in the config file is an error naming the file."""
        cfg = tmp_path / ".config" / "llmgw" / "ctl.yaml"
        cfg.parent.mkdir(parents=True)
        cfg.write_text("controler: x\n")
        with pytest.raises(errors.CtlError, match=r"ctl\.yaml: unknown setting 'controler'"):
            config.resolve(flag_url=None, flag_token=None, env={}, home=tmp_path)


GOOD = """\
name: a
engine: sim
gpu_classes: [H100-80G]
"""


class TestSpecs:
    """Reading spec files, and naming every problem in them before sending."""

    def test_single_mapping_list_and_documents(self, tmp_path: Path) -> None:
        """A mapping, a list and several documents all flatten to specs in order."""
        f = tmp_path / "m.yaml"
        f.write_text(
            GOOD + "---\n- {name: b, engine: vllm, gpu_classes: [L40S]}\n"
            "- {name: c, engine: sglang, gpu_classes: [L40S], gpus_per_node: 2}\n"
        )
        assert [s.name for s in specs.load_specs(f)] == ["a", "b", "c"]

    def test_error_names_file_model_and_field(self, tmp_path: Path) -> None:
        """A wrong field is reported with the file, the model and the field."""
        f = tmp_path / "m.yaml"
        f.write_text("- {name: big, engine: sim, gpu_classes: [H100-80G], gpus_per_node: two}\n")
        with pytest.raises(errors.SpecError) as exc:
            specs.load_specs(f)
        assert f"{f}: model 'big' (#1): field gpus_per_node: Expected `int`, got `str`" in str(
            exc.value
        )

    def test_unnamed_model_is_named_by_position(self, tmp_path: Path) -> None:
        """A spec without a name is identified by its index and the missing field."""
        f = tmp_path / "m.yaml"
        f.write_text(GOOD + "---\nengine: sim\ngpu_classes: [x]\n")
        with pytest.raises(errors.SpecError, match=r"model #2: field name: missing"):
            specs.load_specs(f)

    def test_every_problem_is_listed(self, tmp_path: Path) -> None:
        """All invalid specs are reported at once, one per line."""
        f = tmp_path / "m.yaml"
        f.write_text(
            "- {name: a, engine: nope, gpu_classes: [x]}\n"
            "- {name: b, engine: sim, gpu_classes: [x], colour: red}\n"
            "- {name: c, engine: sim, gpu_classes: [x], min_replicas: 3}\n"
            "- {name: c, engine: sim, gpu_classes: [x]}\n"
        )
        with pytest.raises(errors.SpecError) as exc:
            specs.load_specs(f)
        lines = str(exc.value).splitlines()
        assert lines[0] == "4 problem(s) in 4 model spec(s); nothing applied"
        assert "model 'a' (#1): field engine: Invalid enum value 'nope'" in lines[1]
        assert "model 'b' (#2): field colour: unknown field" in lines[2]
        assert "model 'c' (#3): spec: max_replicas (1) is below min_replicas (3)" in lines[3]
        assert "model 'c' (#4): field name: 'c' is already #3" in lines[4]

    def test_every_problem_of_one_spec_at_once(self, tmp_path: Path) -> None:
        """One spec with five mistakes: five lines, field paths, allowed values, a name rule
        in words (not a regular expression), and a guess for a misspelt field."""
        f = tmp_path / "m.yaml"
        f.write_text(
            "- name: '-x'\n  engine: vllm2\n  gpu_classes: []\n  aliases: [ok, 'no way']\n"
            "  min_replica: 2\n"
        )
        with pytest.raises(errors.SpecError) as exc:
            specs.load_specs(f)
        lines = str(exc.value).splitlines()
        assert lines[0] == "5 problem(s) in 1 model spec(s); nothing applied"
        text = "\n".join(lines[1:])
        assert "field min_replica: unknown field (did you mean min_replicas?)" in text
        assert "field engine: Invalid enum value 'vllm2'; allowed: " in text
        assert "sim" in text.split("allowed: ", 1)[1]
        assert "field gpu_classes: Expected `array` of length >= 1" in text
        assert "field aliases[1]: not a valid name: 1 to 128 characters" in text
        assert "field name: not a valid name" in text
        assert "regex" not in text
        assert "^[" not in text

    def test_yaml_syntax_error_has_a_line(self, tmp_path: Path) -> None:
        """Broken YAML is reported with its line number."""
        f = tmp_path / "m.yaml"
        f.write_text("name: a\n  engine: [sim\n")
        with pytest.raises(errors.SpecError, match=r"m\.yaml: not valid YAML at line \d+"):
            specs.load_specs(f)

    def test_invalid_file_sends_nothing(self, tmp_path: Path) -> None:
        """apply with one invalid spec exits 1 and never calls the controller."""
        f = tmp_path / "m.yaml"
        f.write_text(GOOD + "---\nname: b\nengine: sim\ngpu_classes: []\n")
        fake = FakeController()
        run = run_ctl(["apply", "-f", str(f)], fake, tmp_path)
        assert run.code == 1
        assert "model 'b' (#2): field gpu_classes" in run.err
        assert fake.calls == []

    def test_apply_posts_all_specs_in_one_call(self, tmp_path: Path) -> None:
        """Valid specs go to POST /admin/models as one list."""
        f = tmp_path / "m.yaml"
        f.write_text(GOOD + "---\n- {name: org/b, engine: sim, gpu_classes: [x]}\n")
        fake = FakeController()
        run = run_ctl(["apply", "-f", str(f)], fake, tmp_path)
        assert run.code == 0, run.err
        posts = [c for c in fake.calls if c[0] == "POST"]
        assert len(posts) == 1
        assert [s["name"] for s in posts[0][3]] == ["a", "org/b"]  # type: ignore[union-attr]
        assert "model org/b applied" in run.out


class TestJsonShapes:
    """ctl's JSON output keeps the controller's field names and shapes."""

    def test_status_json_uses_the_seed_names(self, tmp_path: Path) -> None:
        """status --json is the summary with its documented field names."""
        data = run_ctl(["status", "--json"], FakeController(), tmp_path).json()
        assert isinstance(data, dict)
        assert set(data) == {
            "nodes", "gpus", "fabrics", "replicas", "models", "unplaceable", "idle_replicas",
            "unplaceable_reasons", "waiting_unplaceable", "flow_queued",
        }  # fmt: skip
        assert data["gpus"] == [{"class": "H100-80G", "total": 8, "used": 2, "unhealthy": 1}]
        assert set(data["nodes"]) == {"total", "ready", "cordoned", "draining", "unreachable"}

    def test_replicas_json_unknown_idle_is_negative(self, tmp_path: Path) -> None:
        """replicas --json has id, model, state, endpoint_url, idle_seconds (-1 unknown)."""
        data = run_ctl(["replicas", "--json"], FakeController(), tmp_path).json()
        assert isinstance(data, list)
        assert [(r["id"], r["idle_seconds"]) for r in data] == [("r-1", -1), ("r-2", 240)]
        for key in ("model", "state", "endpoint_url"):
            assert key in data[0]

    @pytest.mark.parametrize(("command", "key"), [("nodes", "name"), ("models", "name")])
    def test_lists_are_the_controller_views(self, tmp_path: Path, command: str, key: str) -> None:
        """nodes/models --json print the controller's list of views."""
        data = run_ctl([command, "--json"], FakeController(), tmp_path).json()
        assert isinstance(data, list)
        assert all(key in item for item in data)

    def test_events_json_and_filters(self, tmp_path: Path) -> None:
        """events passes its filters as query parameters and prints the list."""
        fake = FakeController()
        run = run_ctl(["events", "--node", "gpu-01", "--limit", "5", "--json"], fake, tmp_path)
        assert run.json()[0]["kind"] == "node.cordoned"  # type: ignore[index]
        assert fake.calls[-1][2] == {"node": "gpu-01", "limit": "5"}


class TestHumanOutput:
    """ctl's screens and tables for people."""

    def test_status_screen(self, tmp_path: Path) -> None:
        """status prints the summary with unhealthy apart and the unplaceable reason."""
        run = run_ctl(["status"], FakeController(), tmp_path)
        assert run.code == 0
        assert "needs 2 nodes" in run.out
        assert "unhealthy" in run.out

    def test_replicas_idle_dash(self, tmp_path: Path) -> None:
        """The replicas table shows '-' for unknown idle and 4m for 240 s."""
        out = run_ctl(["replicas"], FakeController(), tmp_path).out
        assert next(ln for ln in out.splitlines() if "r-1" in ln).split()[5] == "-"
        assert next(ln for ln in out.splitlines() if "r-2" in ln).split()[5] == "4m"

    def test_nodes_table(self, tmp_path: Path) -> None:
        """nodes prints a row per node with its heartbeat age."""
        out = run_ctl(["nodes"], FakeController(), tmp_path).out
        assert "gpu-01" in out
        assert "3s ago" in out


class TestConnectionFlags:
    """Connection flags anywhere on the line, and reasons fetched when missing."""

    def test_flags_after_the_command(self, tmp_path: Path) -> None:
        """--controller and --token are accepted after the command too."""
        fake = FakeController()
        run = run_ctl(
            ["nodes", "--controller", "10.0.0.9:8081", "--token", TOKEN, "--json"],
            fake,
            tmp_path,
            env={},
        )
        assert run.code == 0, run.err
        assert fake.calls[0][1] == "/admin/nodes"

    def test_reasons_fetched_when_the_summary_lacks_them(self, tmp_path: Path) -> None:
        """An unplaceable model without a reason in the summary gets it from the models list."""

        class NoReasons(FakeController):
            def _route(
                self, method: str, path: str, query: Mapping[str, str], payload: object
            ) -> Response:
                if path == "/admin/summary":
                    return self._ok(Summary(unplaceable=["a"]))
                if path == "/admin/models":
                    view = msgspec.structs.replace(model_view("a"), unplaceable_reason="no L40S")
                    return self._ok([view])
                return super()._route(method, path, query, payload)

        run = run_ctl(["status"], NoReasons(), tmp_path)
        assert "no L40S" in run.out


class TestErrors:
    """ctl's one-line errors and their exit codes."""

    def test_unreachable_is_one_line_exit_1(self, tmp_path: Path) -> None:
        """No controller: exit 1, one line on stderr, no traceback."""
        run = run_ctl(["nodes"], Unreachable(), tmp_path)
        assert run.code == 1
        assert run.err.count("\n") == 1
        assert run.err.startswith("llmgw ctl: cannot reach the controller")

    def test_wrong_token_exit_1(self, tmp_path: Path) -> None:
        """A rejected token: exit 1 with a message that says so."""
        run = run_ctl(["status"], FakeController(), tmp_path, env={"LLMGW_TOKEN": "nope"})
        assert run.code == 1
        assert "rejected the token (401)" in run.err
        assert run.err.count("\n") == 1

    @pytest.mark.parametrize("command", ["cordon", "uncordon", "drain"])
    def test_unknown_node_exit_1(self, tmp_path: Path, command: str) -> None:
        """A node command on an unknown node exits 1 with the controller's message."""
        run = run_ctl([command, "gpu-99"], FakeController(), tmp_path)
        assert run.code == 1
        assert run.err == "llmgw ctl: no node 'gpu-99'\n"

    def test_scale_needs_a_bound(self, tmp_path: Path) -> None:
        """scale without --min or --max is refused before any call."""
        fake = FakeController()
        run = run_ctl(["scale", "m"], fake, tmp_path)
        assert run.code == 1
        assert fake.calls == []

    def test_scale_max_below_min(self, tmp_path: Path) -> None:
        """scale --min 3 --max 1 is refused locally."""
        run = run_ctl(["scale", "m", "--min", "3", "--max", "1"], FakeController(), tmp_path)
        assert (run.code, run.err) == (1, "llmgw ctl: scale: --max 1 is below --min 3\n")

    def test_scale_sends_only_given_bounds(self, tmp_path: Path) -> None:
        """scale --max 4 sends max_replicas only, leaving min as it is."""
        fake = FakeController()
        run = run_ctl(["scale", "org/m", "--max", "4"], fake, tmp_path)
        assert run.code == 0, run.err
        assert fake.calls[-1][1:] == ("/admin/models/org/m/scale", {}, {"max_replicas": 4})

    def test_no_command_prints_help(self, tmp_path: Path) -> None:
        """`llmgw ctl` alone prints usage and exits 2."""
        run = run_ctl([], FakeController(), tmp_path)
        assert run.code == 2
        assert "COMMAND" in run.out


class TestDrain:
    """ctl drain waits for the node, times out or returns at once as asked."""

    def test_waits_until_the_node_is_empty(self, tmp_path: Path) -> None:
        """drain returns 0 once no replica holds cards on the node."""
        fake = FakeController()
        fake.drain_progress = True
        run = run_ctl(["drain", "gpu-01", "--timeout", "60"], fake, tmp_path)
        assert run.code == 0, run.err
        assert "node gpu-01 drained" in run.out

    def test_timeout_exits_1(self, tmp_path: Path) -> None:
        """A node that stays busy past --timeout exits 1 naming what is left."""
        clock = ManualClock()
        run = run_ctl(
            ["drain", "gpu-01", "--timeout", "5"], FakeController(), tmp_path, clock=clock
        )
        assert run.code == 1
        assert "still holds 2 replica(s) after 5s: r-1, r-2" in run.err
        assert clock.monotonic() - 1000.0 == pytest.approx(5.0)

    def test_no_wait(self, tmp_path: Path) -> None:
        """drain --no-wait starts the drain and returns at once."""
        run = run_ctl(["drain", "gpu-01", "--no-wait"], FakeController(), tmp_path)
        assert (run.code, run.out) == (0, "node gpu-01 draining (state draining)\n")

    @pytest.mark.parametrize(
        ("flags", "body"),
        [
            ([], None),
            (["--force"], {"force": True}),
            (["--grace-s", "5"], {"grace_s": 5.0}),
            (["--grace-s", "0", "--force"], {"grace_s": 0.0, "force": True}),
            (["--evict-idle"], {"evict_idle": True}),
            (["--evict-idle", "--force"], {"force": True, "evict_idle": True}),
        ],
    )
    def test_force_and_grace_are_sent(self, tmp_path: Path, flags: list[str], body: object) -> None:
        """--force asks for a forced drain, --evict-idle for eviction of idle replicas;
        without flags no body (the controller's defaults); defaults are never sent."""
        fake = FakeController()
        run = run_ctl(["drain", "gpu-01", "--no-wait", *flags], fake, tmp_path)
        assert run.code == 0, run.err
        assert fake.calls[-1] == ("POST", "/admin/nodes/gpu-01/drain", {}, body)

    def test_timeout_says_why_the_drain_waits(self, tmp_path: Path) -> None:
        """A drain stalled for lack of room names the replica and the reason on timeout."""
        fake = FakeController()
        fake.drain_waiting = (
            DrainWait(
                replica="r-1", model="m", reason="no replacement fits: needs 8", blocked=True
            ),
        )
        run = run_ctl(["drain", "gpu-01", "--timeout", "1"], fake, tmp_path, clock=ManualClock())
        assert run.code == 1
        assert run.err.endswith("r-1, r-2; r-1 (m): no replacement fits: needs 8\n")


class TestBenchCommand:
    """bench with the load driver replaced: lookup, weight against peers, what is recorded."""

    @pytest.fixture
    def levels(self, monkeypatch: pytest.MonkeyPatch) -> list[Level]:
        measured = [
            Level(concurrency=c, completed=10 * c, failed=0, tokens=tok, elapsed_s=1.0,
                  latency_p50_s=0.1, latency_p95_s=0.2)
            for c, tok in ((1, 100), (2, 190), (4, 300), (8, 305), (16, 306))
        ]  # fmt: skip
        seen: dict[str, object] = {}

        async def fake_ramp(url: str, model: str, **kw: object) -> tuple[list[Level], str]:
            seen.update(url=url, model=model, **kw)
            return measured, "plateau"

        monkeypatch.setattr(bench_driver, "ramp", fake_ramp)
        return measured

    def test_weight_relative_to_benched_peers(self, tmp_path: Path, levels: list[Level]) -> None:
        """Capacity 306 tok/s against a peer benched at 153 records weight 2.0 and the capacity."""
        fake = FakeController()
        fake.replicas = [
            msgspec.structs.replace(replica_view("r-1"), capacity_tok_s=153.0, weight=1.0),
            replica_view("r-2"),
        ]
        run = run_ctl(["bench", "r-2", "--json"], fake, tmp_path)
        assert run.code == 0, run.err
        report = run.json()
        assert isinstance(report, dict)
        assert report["weight"] == pytest.approx(2.0)
        assert report["capacity_tok_s"] == pytest.approx(306.0)
        assert report["peak_concurrency"] == 16
        stored = next(r for r in fake.replicas if r.id == "r-2")
        assert (stored.weight, stored.capacity_tok_s) == (pytest.approx(2.0), pytest.approx(306.0))

    def test_first_benched_is_one(self, tmp_path: Path, levels: list[Level]) -> None:
        """With no benched peer the weight is 1.0 and the human output says why."""
        run = run_ctl(["bench", "r-1"], FakeController(), tmp_path)
        assert run.code == 0, run.err
        assert "weight 1.00 (first benched replica of its model)" in run.out

    @pytest.fixture
    def sent_key(self, monkeypatch: pytest.MonkeyPatch, levels: list[Level]) -> list[object]:
        """The api_key each ramp was given."""
        keys: list[object] = []

        async def fake_ramp(url: str, model: str, **kw: object) -> tuple[list[Level], str]:
            keys.append(kw.get("api_key"))
            return levels, "plateau"

        monkeypatch.setattr(bench_driver, "ramp", fake_ramp)
        return keys

    def test_the_engine_key_is_sent_never_shown(
        self, tmp_path: Path, sent_key: list[object]
    ) -> None:
        """The controller's engine key goes to the load driver, not into any output."""
        fake = FakeController()
        fake.engine_keys = {"r-1": "sekrit-engine-key-42"}
        runs = [run_ctl(["bench", "r-1", *flags], fake, tmp_path) for flags in ([], ["--json"])]
        assert [r.code for r in runs] == [0, 0], [r.err for r in runs]
        assert sent_key == ["sekrit-engine-key-42"] * 2
        assert not [t for r in runs for t in (r.out, r.err) if "sekrit-engine-key-42" in t]
        assert ("POST", "/admin/replicas/r-1/engine-key", {}, None) in fake.calls

    def test_no_engine_key_benches_without_one(
        self, tmp_path: Path, sent_key: list[object]
    ) -> None:
        """409 (the controller knows no key for the replica): the bench sends none."""
        run = run_ctl(["bench", "r-1"], FakeController(), tmp_path)
        assert run.code == 0, run.err
        assert sent_key == [None]

    def test_a_token_refused_the_key_says_so(self, tmp_path: Path, sent_key: list[object]) -> None:
        """403 (not the admin token): exit 1 with why, and no load sent."""
        fake = FakeController()
        fake.engine_key_forbidden = True
        run = run_ctl(["bench", "r-1"], fake, tmp_path)
        assert run.code == 1
        assert "admin token alone" in run.err
        assert sent_key == []

    def test_no_endpoint_fails(self, tmp_path: Path, levels: list[Level]) -> None:
        """A replica without an endpoint URL cannot be benched: exit 1."""
        fake = FakeController()
        fake.replicas = [msgspec.structs.replace(replica_view("r-1"), endpoint_url=None)]
        run = run_ctl(["bench", "r-1"], fake, tmp_path)
        assert run.code == 1
        assert "has no endpoint yet" in run.err
