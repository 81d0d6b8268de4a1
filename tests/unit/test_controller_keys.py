"""Client keys decided purely: create, revoke, the views, and the endpoint list."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest

from llmgw.controller.errors import Conflict, DoesNotExist
from llmgw.controller.fleet.endpoints import endpoint_list
from llmgw.controller.fleet.index import FleetIndex
from llmgw.controller.fleet.keys import (
    create_key,
    describe,
    key_digest,
    key_view,
    new_key,
    revoke_key,
)
from llmgw.controller.fleet.records import FleetState
from llmgw.ctl.commands.keys import parse_duration
from llmgw.ctl.errors import CtlError
from llmgw.wire.keys import MAX_KEY_MODELS, Budget, ClientKey, KeyCreate
from llmgw.wire.names import MODEL_NAME_RULE
from tests.unit.test_ctl_commands import FakeController, run_ctl


def created(state: FleetState, **kw: object) -> FleetState:
    fields: dict[str, object] = {"name": "alice", "team": "research", **kw}
    batch = create_key(state, msgspec.convert(fields, KeyCreate), now=100.0, key="sk-llmgw-x")
    state.keys.update((k.name, k) for k in batch.changes.keys)
    return state


class TestCreate:
    """Creating a key."""

    def test_stores_the_hash_never_the_key(self) -> None:
        """The batch holds the key's SHA-256 and the limits asked for, and an event."""
        req = KeyCreate(name="a", team="t", rpm=5, expires_in_s=60.0)
        batch = create_key(FleetState(), req, now=100.0, key="sk-llmgw-secret")
        (k,) = batch.changes.keys
        assert k.key.sha256 == key_digest("sk-llmgw-secret")
        assert (k.key.rpm, k.key.expires_at, k.created_at) == (5, 160.0, 100.0)
        assert "sk-llmgw-secret" not in repr(batch.changes)
        assert [e.kind for e in batch.changes.events] == ["key.created"]

    def test_a_taken_name_is_a_conflict(self) -> None:
        """A second key under one name is refused; revoke first."""
        with pytest.raises(Conflict):
            created(created(FleetState()))

    def test_new_keys_differ(self) -> None:
        """Each new key is fresh and carries the prefix."""
        a, b = new_key(), new_key()
        assert a != b
        assert a.startswith("sk-llmgw-")
        assert len(a) > 40


class TestRevoke:
    """Revoking a key."""

    def test_deletes_with_an_event(self) -> None:
        """Revoking deletes the key and says so."""
        state = created(FleetState())
        batch = revoke_key(state, "alice", now=1.0)
        (tomb,) = batch.changes.keys
        assert (tomb.name, tomb.revoked_at, tomb.live) == ("alice", 1.0, False)
        assert [e.kind for e in batch.changes.events] == ["key.revoked"]
        state.keys["alice"] = tomb
        with pytest.raises(DoesNotExist):
            revoke_key(state, "alice", now=2.0)

    def test_a_revoked_name_may_be_reused(self) -> None:
        """A new key may take a revoked key's name."""
        state = created(FleetState())
        (tomb,) = revoke_key(state, "alice", now=1.0).changes.keys
        state.keys["alice"] = tomb
        assert created(state).keys["alice"].live

    def test_revoking_the_last_key_keeps_keys_required(self) -> None:
        """With every key revoked the list has none in force, but still requires one."""
        state = created(FleetState())
        (tomb,) = revoke_key(state, "alice", now=1.0).changes.keys
        state.keys["alice"] = tomb
        listed = endpoint_list(state, FleetIndex.build(state), version=1)
        assert (listed.keys, listed.keys_required) == ((), True)
        empty = endpoint_list(FleetState(), FleetIndex(), version=1)
        assert empty.keys_required is False

    def test_unknown_is_does_not_exist(self) -> None:
        """Revoking a name with no key is refused (404)."""
        with pytest.raises(DoesNotExist):
            revoke_key(FleetState(), "nobody", now=1.0)


class TestViews:
    """What leaves the controller about a key."""

    def test_view_has_no_hash(self) -> None:
        """What the list shows holds the limits, not the hash."""
        state = created(FleetState(), rpm=7)
        view = msgspec.to_builtins(key_view(state.keys["alice"]))
        assert "sha256" not in view
        assert view["rpm"] == 7

    def test_view_shows_each_routers_share_of_the_limits_it_has(self) -> None:
        """Shares are listed by router, with None for a limit the key does not have."""
        state = created(FleetState(), rpm=7, budget={"tokens": 100, "per": "day"})
        view = key_view(state.keys["alice"], {"r2": (3.0, 0.0, 40.0), "r1": (4.0, 0.0, 60.0)})
        assert [(s.router, s.rpm, s.tpm, s.budget) for s in view.shares] == [
            ("r1", 4.0, None, 60.0),
            ("r2", 3.0, None, 40.0),
        ]
        assert key_view(state.keys["alice"]).shares == ()

    def test_describe_in_words(self) -> None:
        """Every limit set is named in the event's words."""
        limits = ClientKey(
            name="a", sha256="0" * 64, models=("m",), rpm=1, budget=Budget(tokens=9, per="day")
        )
        assert describe(limits) == "models m; rpm 1; budget 9/day; priority standard"

    def test_endpoint_list_carries_the_keys_by_name(self) -> None:
        """Routers get every key's hash and limits with the endpoints, sorted by name."""
        state = created(created(FleetState()), name="aaron")
        listed = endpoint_list(state, FleetIndex.build(state), version=1)
        assert [k.name for k in listed.keys] == ["aaron", "alice"]


class TestLimitsType:
    """The limits type."""

    def test_budget_needs_its_period(self) -> None:
        """A budget without its period is refused."""
        with pytest.raises(msgspec.ValidationError, match="per"):
            msgspec.convert({"name": "a", "team": "t", "budget": {"tokens": 5}}, KeyCreate)

    @pytest.mark.parametrize(
        ("models", "at"),
        [(["a b"], "models[0]"), (["m", "[/]"], "models[1]"), (["m\x1b[2J"], "models[0]"),
         (["m/scale"], "models[0]"), (["a/../b"], "models[0]"), (["m", "a//b"], "models[1]"),
         ([f"m{i}" for i in range(MAX_KEY_MODELS + 1)], "models")],
    )  # fmt: skip
    def test_models_must_be_served_names(self, models: list[str], at: str) -> None:
        """A model no model, alias or adapter can be called, or more than MAX_KEY_MODELS of
        them, is refused where a key is created."""
        with pytest.raises(msgspec.ValidationError, match=re.escape(f"at `$.{at}`")):
            msgspec.convert({"name": "a", "team": "t", "models": models}, KeyCreate)

    @pytest.mark.parametrize(
        ("fields", "at"),
        [({"name": "a\n"}, "name"), ({"team": "t\n"}, "team"), ({"models": ["m\n"]}, "models[0]")],
    )
    def test_a_trailing_line_end_is_refused(self, fields: dict[str, object], at: str) -> None:
        """A name, team or model ending in a line end is refused (Python's `$` matches
        before one): such a key could never be revoked, its name being no name."""
        body = {"name": "a", "team": "t", **fields}
        with pytest.raises(msgspec.ValidationError, match=re.escape(f"at `$.{at}`")):
            msgspec.convert(body, KeyCreate)

    def test_stored_keys_keep_any_model(self) -> None:
        """A stored or router-file key with such a model still decodes: the rule is the
        create request's, and a rule that changes must not make a stored key unreadable."""
        key = msgspec.convert({"name": "a b", "sha256": "0" * 64, "models": ["a b"]}, ClientKey)
        assert key.models == ("a b",)

    def test_limited_only_with_a_limit(self) -> None:
        """A key with only a model list needs no counting."""
        assert not ClientKey(name="a", sha256="0" * 64, models=("m",)).limited
        assert ClientKey(name="a", sha256="0" * 64, tpm=5).limited


class TestDuration:
    """ctl's --expires-in durations."""

    @pytest.mark.parametrize(
        ("text", "seconds"), [("30d", 30 * 86400.0), ("1h30m", 5400.0), ("2w", 1209600.0)]
    )
    def test_parses(self, text: str, seconds: float) -> None:
        """Numbers with units add up."""
        assert parse_duration(text) == seconds

    @pytest.mark.parametrize("text", ["", "30", "d", "1y", "0s", "-1d"])
    def test_refuses(self, text: str) -> None:
        """Anything but number-unit pairs above zero is refused."""
        with pytest.raises(CtlError):
            parse_duration(text)


class TestCreateFlags:
    """`ctl keys create` refuses bad flags in the words of the flags, before sending."""

    @pytest.mark.parametrize(
        ("argv", "said"),
        [
            (["--models", "m,a b"], f"--models: 'a b' is not a model's name: {MODEL_NAME_RULE}"),
            (["--models", "[/]"], f"--models: '[/]' is not a model's name: {MODEL_NAME_RULE}"),
            (["--models", "a/./b"], f"--models: 'a/./b' is not a model's name: {MODEL_NAME_RULE}"),
            (["--models", "a,b, a"], "--models: models must not repeat a name: 'a' is there twice"),
            (
                ["--models", ",".join(f"m{i}" for i in range(MAX_KEY_MODELS + 1))],
                f"--models: Expected array of length <= {MAX_KEY_MODELS}",
            ),
        ],
    )
    def test_models_that_no_model_can_be(self, argv: list[str], said: str, tmp_path: Path) -> None:
        """A model name no model can have is named with the rule, and nothing is sent."""
        fake = FakeController()
        run = run_ctl(["keys", "create", "k", "--team", "t", *argv], fake, tmp_path)
        assert (run.code, run.err) == (1, f"llmgw ctl: keys create k: {said}\n")
        assert fake.calls == []


class TestKeysTable:
    """`ctl keys list` rows."""

    def test_expiry_and_unset_limits(self) -> None:
        """Unset limits are `-`, every model `*`; expiry reads never, in …, or expired."""
        from llmgw.ctl.commands.keys import keys_table
        from llmgw.ctl.output import rows
        from llmgw.wire.keys import KeyView

        views = [
            KeyView(name="a", team="t", created_at=0.0),
            KeyView(name="b", team="t", created_at=0.0, models=("m",), rpm=5, expires_at=7300.0),
            KeyView(name="c", team="t", created_at=0.0, expires_at=50.0),
        ]
        _, body = rows(keys_table(views, now=100.0))
        assert [r[2:] for r in body] == [
            ["*", "-", "-", "-", "standard", "never", "-"],
            ["m", "5", "-", "-", "standard", "in 2h", "-"],
            ["*", "-", "-", "-", "standard", "expired", "-"],
        ]

    def test_leases_show_routers_and_the_largest_part(self) -> None:
        """A leased key shows how many routers hold a share and the largest one's part
        of its rpm (else tpm, else budget); nothing leased yet reads so."""
        from llmgw.ctl.commands.keys import leases_cell
        from llmgw.wire.keys import KeyShare, KeyView

        def view(*shares: KeyShare) -> KeyView:
            return KeyView(name="a", team="t", created_at=0.0, rpm=60, shares=shares)

        assert leases_cell(view()) == "-"
        three = view(
            KeyShare(router="r1", rpm=30.0),
            KeyShare(router="r2", rpm=20.0),
            KeyShare(router="r3", rpm=10.0),
        )
        assert leases_cell(three) == "3 (max 50%)"
        budget = KeyView(
            name="b",
            team="t",
            created_at=0.0,
            shares=(KeyShare(router="r1", budget=300.0), KeyShare(router="r2", budget=100.0)),
        )
        assert leases_cell(budget) == "2 (max 75%)"
        assert leases_cell(view(KeyShare(router="r1", rpm=0.0))) == "1 (none leased)"
