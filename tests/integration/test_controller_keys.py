"""Client keys through a real controller: the admin API, the scoped tokens, and `ctl keys`."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw.testing import Program, start_program
from llmgw.wire.names import LABEL_RULE
from tests.integration.test_ctl_controller import ctl, ctl_process

TOKEN = "integration-token"
READ = "read-token-2"
ROUTER = "router-token-3"


@pytest.fixture
def controller(tmp_path: Path) -> Iterator[Program]:
    router_file = tmp_path / "router.token"
    router_file.write_text(ROUTER + "\n")
    args = [
        "controller", "--port", "0", "--database", f"sqlite:///{tmp_path}/c.db",
        "--token", TOKEN, "--read-token", READ, "--router-token-file", str(router_file),
    ]  # fmt: skip
    prog = start_program(args, log_dir=tmp_path)
    try:
        yield prog
    finally:
        prog.stop()


def call(
    url: str, method: str, path: str, body: object = None, *, token: str = TOKEN
) -> tuple[int, Any]:
    data = (
        None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    )
    req = urllib.request.Request(url + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class TestKeysApi:
    """The /admin/keys routes."""

    def test_create_answers_the_key_once_and_lists_never_show_it(self, controller: Program) -> None:
        """POST answers 201 with the key; GET lists limits but neither the key nor its hash."""
        status, created = call(
            controller.url,
            "POST",
            "/admin/keys",
            {"name": "alice", "team": "research", "models": ["m1"], "rpm": 60},
        )
        assert status == 201
        assert created["key"].startswith("sk-llmgw-")
        assert (created["name"], created["team"], created["rpm"]) == ("alice", "research", 60)
        status, listed = call(controller.url, "GET", "/admin/keys")
        assert status == 200
        assert [k["name"] for k in listed] == ["alice"]
        text = json.dumps(listed)
        digest = hashlib.sha256(created["key"].encode()).hexdigest()
        assert created["key"] not in text
        assert digest not in text
        assert "sha256" not in listed[0]

    def test_router_token_reads_hashes_and_limits_but_cannot_create(
        self, controller: Program
    ) -> None:
        """The endpoint list carries each key's hash and limits; creating with it is 403."""
        _, created = call(
            controller.url, "POST", "/admin/keys", {"name": "bob", "team": "t", "tpm": 1000}
        )
        status, listed = call(controller.url, "GET", "/v1/endpoints?timeout_s=0", token=ROUTER)
        assert status == 200
        (key,) = listed["keys"]
        assert key["sha256"] == hashlib.sha256(created["key"].encode()).hexdigest()
        assert (key["name"], key["team"], key["tpm"]) == ("bob", "t", 1000)
        status, body = call(
            controller.url, "POST", "/admin/keys", {"name": "x", "team": "t"}, token=ROUTER
        )
        assert (status, body["error"]["type"]) == (403, "permission_error")

    def test_read_token_lists_but_cannot_create_or_revoke(self, controller: Program) -> None:
        """The read-only token may GET /admin/keys and nothing else of them."""
        call(controller.url, "POST", "/admin/keys", {"name": "c", "team": "t"})
        assert call(controller.url, "GET", "/admin/keys", token=READ)[0] == 200
        assert (
            call(controller.url, "POST", "/admin/keys", {"name": "d", "team": "t"}, token=READ)[0]
            == 403
        )
        assert call(controller.url, "DELETE", "/admin/keys/c", token=READ)[0] == 403

    def test_revoke_deletes_and_records_events(self, controller: Program) -> None:
        """DELETE revokes; the events say created then revoked; a second DELETE is 404."""
        call(controller.url, "POST", "/admin/keys", {"name": "eve", "team": "ops"})
        assert call(controller.url, "DELETE", "/admin/keys/eve") == (200, {"revoked": "eve"})
        assert call(controller.url, "GET", "/admin/keys") == (200, [])
        _, events = call(controller.url, "GET", "/admin/events")
        assert [(e["kind"], e["subject"], e["subject_id"]) for e in events[-2:]] == [
            ("key.created", "key", "eve"),
            ("key.revoked", "key", "eve"),
        ]
        status, body = call(controller.url, "DELETE", "/admin/keys/eve")
        assert (status, body["error"]["type"]) == (404, "not_found_error")

    @pytest.mark.parametrize(
        ("body", "status", "param"),
        [
            (b"", 400, None),
            (b"{not json", 400, None),
            ({"name": "a"}, 422, "team"),
            ({"name": "a b", "team": "t"}, 422, "name"),
            ({"name": "a\n", "team": "t"}, 422, "name"),
            ({"name": "a", "team": "t\n"}, 422, "team"),
            ({"name": "a", "team": "t", "models": ["m\n"]}, 422, "models[0]"),
            ({"name": "a", "team": "t", "rpm": 0}, 422, "rpm"),
            ({"name": "a", "team": "t", "tpm": -5}, 422, "tpm"),
            ({"name": "a", "team": "t", "budget": {"tokens": 10}}, 422, "budget.per"),
            (
                {"name": "a", "team": "t", "budget": {"tokens": 10, "per": "year"}},
                422,
                "budget.per",
            ),
            ({"name": "a", "team": "t", "priority": "urgent"}, 422, "priority"),
            ({"name": "a", "team": "t", "models": ["m", "m"]}, 422, "models"),
            ({"name": "a", "team": "t", "models": ["m", "a b"]}, 422, "models[1]"),
            ({"name": "a", "team": "t", "models": ["[/]"]}, 422, "models[0]"),
            ({"name": "a", "team": "t", "models": [f"m{i}" for i in range(1025)]}, 422, "models"),
            ({"name": "a", "team": "t", "expires_in_s": 0}, 422, "expires_in_s"),
            ({"name": "a", "team": "t", "key": "sk-mine"}, 422, "key"),
        ],
    )
    def test_bad_create_bodies_are_refused_in_the_error_shape(
        self, controller: Program, body: object, status: int, param: str | None
    ) -> None:
        """A malformed or invalid body is 400/422 naming the field; nothing is stored."""
        got, answer = call(controller.url, "POST", "/admin/keys", body)
        assert got == status
        assert answer["error"]["type"] == "invalid_request_error"
        assert answer["error"]["param"] == param
        assert call(controller.url, "GET", "/admin/keys") == (200, [])

    def test_revoke_refuses_a_body_and_a_bad_name(self, controller: Program) -> None:
        """DELETE with a body is 400 and revokes nothing; a name no key can have is 400."""
        call(controller.url, "POST", "/admin/keys", {"name": "k", "team": "t"})
        status, body = call(controller.url, "DELETE", "/admin/keys/k", b'{"x": 1}')
        assert (status, body["error"]["param"]) == (400, "body")
        assert [k["name"] for k in call(controller.url, "GET", "/admin/keys")[1]] == ["k"]
        status, body = call(controller.url, "DELETE", "/admin/keys/-bad")
        assert (status, body["error"]["param"]) == (400, "name")

    def test_a_taken_name_is_409(self, controller: Program) -> None:
        """Creating a key under a name in use is a conflict, and the first key stays."""
        call(controller.url, "POST", "/admin/keys", {"name": "dup", "team": "a"})
        status, body = call(controller.url, "POST", "/admin/keys", {"name": "dup", "team": "b"})
        assert (status, body["error"]["param"]) == (409, "name")
        assert [k["team"] for k in call(controller.url, "GET", "/admin/keys")[1]] == ["a"]

    def test_keys_survive_a_restart(self, tmp_path: Path, controller: Program) -> None:
        """A key created before a restart is still listed, with its expiry, after it."""
        call(
            controller.url,
            "POST",
            "/admin/keys",
            {"name": "keep", "team": "t", "expires_in_s": 3600},
        )
        controller.stop()
        args = ["controller", "--port", "0", "--database", f"sqlite:///{tmp_path}/c.db"]
        again = start_program([*args, "--token", TOKEN], log_dir=tmp_path / "again")
        try:
            _, listed = call(again.url, "GET", "/admin/keys")
            assert [k["name"] for k in listed] == ["keep"]
            assert listed[0]["expires_at"] == pytest.approx(time.time() + 3600, abs=120)
        finally:
            again.stop()


class TestCtlKeys:
    """`llmgw ctl keys`."""

    def test_create_prints_the_key_alone_on_the_last_line(self, controller: Program) -> None:
        """`keys create` ends with the key alone; `keys list` shows limits, never the key."""
        r = ctl(
            controller.url,
            "keys", "create", "alice", "--team", "research", "--models", "m1,m2",
            "--rpm", "60", "--tpm", "5000", "--budget-tokens", "100000", "--per", "week",
            "--priority", "batch", "--expires-in", "30d",
        )  # fmt: skip
        assert r.code == 0, r.err
        key = r.out.splitlines()[-1]
        assert key.startswith("sk-llmgw-")
        assert " " not in key
        listed = ctl(controller.url, "keys", "list", "-o", "wide")
        assert listed.code == 0
        assert key not in listed.out
        row = listed.out.splitlines()[1].split()
        assert row[:7] == ["alice", "research", "m1,m2", "60", "5000", "100000/week", "batch"]
        assert row[7:9] in (["in", "30d"], ["in", "29d"])  # rounded down
        # No router follows this controller: the key is leased to none.
        assert row[9:] == ["-"]

    def test_json_output_has_name_and_key(self, controller: Program) -> None:
        """`-o json` prints the answer with name and key; list -o json omits the key."""
        r = ctl(controller.url, "keys", "create", "bot", "--team", "t", "-o", "json")
        created = r.json()
        assert isinstance(created, dict)
        assert created["name"] == "bot"
        assert created["key"].startswith("sk-llmgw-")
        listed = ctl(controller.url, "keys", "list", "-o", "json").json()
        assert isinstance(listed, list)
        assert "key" not in listed[0]

    def test_revoke(self, controller: Program) -> None:
        """`keys revoke` removes the key; revoking again says there is no such key."""
        ctl(controller.url, "keys", "create", "tmp", "--team", "t")
        r = ctl(controller.url, "keys", "revoke", "tmp")
        assert (r.code, r.out) == (0, "key tmp revoked; routers refuse it within seconds\n")
        again = ctl_process(controller.url, "keys", "revoke", "tmp")
        assert again.returncode == 1
        assert again.stderr == "llmgw ctl: no key named 'tmp'\n"

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--rpm", "0"], "keys create k: --rpm: Expected int >= 1"),
            (["--budget-tokens", "5"], "keys create: --budget-tokens and --per go together"),
            (
                ["--expires-in", "soon"],
                "--expires-in 'soon': not a duration; use a number and a unit "
                "(s, m, h, d, w), e.g. 30d or 12h",
            ),
            (["--models", ","], "keys create: --models names no model (omit it for every model)"),
        ],
    )
    def test_bad_flags_are_one_line_errors(
        self, controller: Program, argv: list[str], message: str
    ) -> None:
        """Bad flags exit 1 with one line on stderr, and no key is created."""
        r = ctl_process(controller.url, "keys", "create", "k", "--team", "t", *argv)
        assert (r.returncode, r.stderr) == (1, f"llmgw ctl: {message}\n")
        assert call(controller.url, "GET", "/admin/keys") == (200, [])

    def test_keys_without_a_subcommand_says_which(self, controller: Program) -> None:
        """`ctl keys` alone is one line naming the subcommands."""
        r = ctl_process(controller.url, "keys")
        assert (r.returncode, r.stderr) == (
            1,
            "llmgw ctl: keys: give a subcommand: create, list or revoke\n",
        )

    def test_a_bad_name_says_what_a_name_may_hold(self, controller: Program) -> None:
        """A name with a slash is refused before it is sent, in one line naming the rule."""
        r = ctl_process(controller.url, "keys", "create", "no/slash", "--team", "t")
        assert r.returncode == 1
        assert r.stderr == f"llmgw ctl: keys create no/slash: NAME: {LABEL_RULE}\n"
