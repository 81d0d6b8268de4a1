"""Endpoint sources: the config file watcher and the controller long-poll follower."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from llmgw.router.config import RouterConfig, parse
from llmgw.router.control.reloadstatus import ReloadMetrics, ReloadStatus
from llmgw.router.control.sources import ConfigWatcher, ControllerSource
from llmgw.router.errors import ControllerCallFailed
from llmgw.runtime.clock import ManualClock
from llmgw.wire.endpoints import EndpointInfo, EndpointList

ONE = "endpoints: [{id: a, url: 'http://a', models: [m]}]\n"
TWO = ONE + "models: [cold]\n"
KEYED = ONE + "api_keys: [{name: a, sha256: %s}]\n" % ("ab" * 32)


def bump_mtime(path: Path) -> None:
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


class TestConfigWatcher:
    """The config file watcher reloads changes and keeps the running config on errors."""

    def test_unchanged_file_is_not_reloaded(self, tmp_path: Path) -> None:
        """No change, no reload."""
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        got: list[RouterConfig] = []
        w = ConfigWatcher(path, on_config=got.append)
        assert w.tick() is False
        assert got == []

    def test_changed_file_is_applied(self, tmp_path: Path) -> None:
        """A changed file is validated and handed over."""
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        got: list[RouterConfig] = []
        w = ConfigWatcher(path, on_config=got.append)
        path.write_text(TWO)
        bump_mtime(path)
        # Read at the next look, once it has held still.
        assert [w.tick(), w.tick()] == [False, True]
        assert got[0].models == ("cold",)

    def test_bad_file_keeps_running_config(self, tmp_path: Path) -> None:
        """An invalid file is rejected with its error and nothing is applied."""
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        got: list[RouterConfig] = []
        w = ConfigWatcher(path, on_config=got.append)
        path.write_text("endpoints: [{id: a}]\n")
        bump_mtime(path)
        assert [w.tick(), w.tick()] == [False, False]
        assert got == []
        assert w.last_error is not None
        assert "url" in w.last_error

    def test_reloaded_poll_interval_is_followed(self, tmp_path: Path) -> None:
        """A reload that changes reload_poll_s polls at the new interval from then on."""
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        w = ConfigWatcher(path, on_config=lambda _cfg: None, poll_s=1.0)
        path.write_text(ONE + "reload_poll_s: 5\n")
        bump_mtime(path)
        assert [w.tick(), w.tick()] == [False, True]
        assert w.poll_s == 5.0

    def test_forced_reload(self, tmp_path: Path) -> None:
        """request_reload() (SIGHUP) reloads an unchanged file."""
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        got: list[RouterConfig] = []
        w = ConfigWatcher(path, on_config=got.append)
        w.request_reload()
        assert w.tick() is True
        assert len(got) == 1

    def test_deleted_file_keeps_running_config(self, tmp_path: Path) -> None:
        """A file that disappears is an error, not an empty router."""
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        got: list[RouterConfig] = []
        w = ConfigWatcher(path, on_config=got.append)
        path.unlink()
        assert [w.tick(), w.tick()] == [False, False]
        assert got == []
        assert w.last_error is not None


class TestFileBeingWritten:
    """A file caught while it is being rewritten is never put in force."""

    def test_a_truncated_file_is_not_applied(self, tmp_path: Path) -> None:
        """A file emptied by its writer (`open(path, "w")`, an editor saving in place) and
        not yet written is refused with why: applied, it dropped every endpoint and key,
        so /v1 answered without a key until the next look."""
        path = tmp_path / "r.yaml"
        path.write_text(KEYED)
        got: list[RouterConfig] = []
        w = ConfigWatcher(path, on_config=got.append)
        path.write_text("")
        bump_mtime(path)
        assert [w.tick(), w.tick()] == [False, False]
        assert got == []
        assert w.last_error is not None
        assert "empty" in w.last_error

    def test_a_change_is_applied_once_the_file_holds_still(self, tmp_path: Path) -> None:
        """A file seen changed is read at the next look if it has not changed again: a
        half-written file (its endpoints, not yet its keys) is never applied."""
        path = tmp_path / "r.yaml"
        path.write_text(KEYED)
        got: list[RouterConfig] = []
        w = ConfigWatcher(path, on_config=got.append)
        path.write_text(ONE)
        bump_mtime(path)
        assert w.tick() is False
        path.write_text(KEYED + "models: [cold]\n")
        bump_mtime(path)
        assert [w.tick(), w.tick()] == [False, True]
        assert [(c.models, len(c.api_keys)) for c in got] == [(("cold",), 1)]


def lst(version: int, *ids: str) -> EndpointList:
    return EndpointList(
        version=version,
        endpoints=tuple(EndpointInfo(id=i, url=f"http://{i}", models=("m",)) for i in ids),
        models=("m", "cold"),
    )


class FakeClient:
    """Answers queued in order: an EndpointList, None (no change) or an exception."""

    def __init__(self, *answers: EndpointList | Exception | None) -> None:
        self.answers = list(answers)
        self.afters: list[int | None] = []

    async def endpoints(self, *, after: int | None) -> EndpointList | None:
        self.afters.append(after)
        got = self.answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got


class TestControllerSource:
    """The controller long-poll follower's versions and backoff."""

    async def test_list_is_applied_and_version_followed(self) -> None:
        """A new list is applied and the next poll asks for changes after its version."""
        applied: list[EndpointList] = []
        client = FakeClient(lst(3, "a"), None, lst(4, "a", "b"))
        src = ControllerSource(client, on_list=applied.append)  # type: ignore[arg-type]
        assert [await src.tick() for _ in range(3)] == [True, False, True]
        assert client.afters == [None, 3, 3]
        assert [len(x.endpoints) for x in applied] == [1, 2]

    async def test_same_version_is_not_reapplied(self) -> None:
        """A poll that returns the version already held changes nothing."""
        applied: list[EndpointList] = []
        src = ControllerSource(
            FakeClient(lst(3, "a"), lst(3, "a")),  # type: ignore[arg-type]
            on_list=applied.append,
        )
        await src.tick()
        assert await src.tick() is False
        assert len(applied) == 1

    async def test_smaller_version_is_taken(self) -> None:
        """A smaller version means a replaced store: its list is still the truth."""
        applied: list[EndpointList] = []
        src = ControllerSource(
            FakeClient(lst(9, "a"), lst(2, "b")),  # type: ignore[arg-type]
            on_list=applied.append,
        )
        await src.tick()
        await src.tick()
        assert src.version == 2
        assert applied[-1].endpoints[0].id == "b"

    async def test_unreachable_keeps_last_list(self) -> None:
        """A failed poll raises ControllerCallFailed and applies nothing."""
        applied: list[EndpointList] = []
        src = ControllerSource(
            FakeClient(lst(1, "a"), ControllerCallFailed("down")),  # type: ignore[arg-type]
            on_list=applied.append,
        )
        await src.tick()
        with pytest.raises(ControllerCallFailed):
            await src.tick()
        assert len(applied) == 1
        assert src.version == 1

    def test_backoff_is_jittered_and_capped(self) -> None:
        """Backoff grows with failures, stays under the cap, and varies between routers."""
        src = ControllerSource(
            FakeClient(),  # type: ignore[arg-type]
            on_list=lambda _l: None,
            backoff_s=0.5,
            max_backoff_s=8.0,
            rng=random.Random(1),
        )
        src.failures = 20
        waits = {round(src.next_backoff_s(), 3) for _ in range(50)}
        assert max(waits) <= 8.0
        assert min(waits) >= 0.25
        assert len(waits) > 10


class TestReloadStatus:
    """The watcher's status says whether the file's last load went in, and what waits."""

    def watched(self, tmp_path: Path, text: str) -> tuple[Path, ConfigWatcher, ManualClock]:
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        clock = ManualClock(start_wall=1.8e9)
        w = ConfigWatcher(path, on_config=lambda _cfg: None, running=parse(ONE), clock=clock)
        clock.advance(10.0)
        path.write_text(text)
        bump_mtime(path)
        return path, w, clock

    def test_a_refused_reload_says_why_and_keeps_the_last_success(self, tmp_path: Path) -> None:
        """A file that does not validate leaves last_successful False with its error, and
        the last success still the start's."""
        _, w, _ = self.watched(tmp_path, "endpoints: [{id: a}]\n")
        assert [w.tick(), w.tick()] == [False, False]
        st = w.status
        assert (
            st.last_successful,
            st.last_success_at,
            st.last_attempt_at,
        ) == (False, 1.8e9, 1.8e9 + 10.0)
        assert st.last_error is not None
        assert "url" in st.last_error

    def test_an_empty_file_is_a_refused_reload(self, tmp_path: Path) -> None:
        """A file caught empty is refused: the status says so, not only the log."""
        _, w, _ = self.watched(tmp_path, "")
        w.tick()
        w.tick()
        assert w.status.last_successful is False
        assert "empty" in (w.status.last_error or "")

    def test_an_applied_reload_clears_the_error_and_names_what_waits(self, tmp_path: Path) -> None:
        """Fixed again with restart-only changes, the file is in force and the fields
        that wait for a restart are listed, sorted."""
        path, w, clock = self.watched(tmp_path, "endpoints: [{id: a}]\n")
        w.tick()
        w.tick()
        clock.advance(5.0)
        path.write_text(ONE + "max_body_bytes: 1000\nbreaker: {cooldown_s: 9}\n")
        bump_mtime(path)
        assert [w.tick(), w.tick()] == [False, True]
        assert w.status == ReloadStatus(
            last_successful=True,
            last_success_at=1.8e9 + 15.0,
            last_attempt_at=1.8e9 + 15.0,
            last_error=None,
            restart_pending=("breaker", "max_body_bytes"),
        )

    def test_a_config_that_fails_to_apply_is_a_refused_reload_and_watching_goes_on(
        self, tmp_path: Path
    ) -> None:
        """A config the router fails to put in force (a defect of its own) is reported
        as a refused reload, and the next change of the file is still read."""
        path = tmp_path / "r.yaml"
        path.write_text(ONE)
        got: list[RouterConfig] = []

        def apply(cfg: RouterConfig) -> None:
            if cfg.models == ("cold",):
                raise TypeError("boom")
            got.append(cfg)

        w = ConfigWatcher(path, on_config=apply)
        path.write_text(TWO)
        bump_mtime(path)
        assert [w.tick(), w.tick()] == [False, False]
        assert w.status.last_successful is False
        assert "boom" in (w.status.last_error or "")
        path.write_text(ONE + "models: [warm]\n")
        bump_mtime(path)
        assert [w.tick(), w.tick()] == [False, True]
        assert got[0].models == ("warm",)

    def test_the_gauges_follow_the_status(self, tmp_path: Path) -> None:
        """/metrics shows 0 after a refused reload, the last success's time, and how many
        restart-only fields wait."""
        _, w, _ = self.watched(tmp_path, "endpoints: [{id: a}]\n")
        w.tick()
        w.tick()
        registry = CollectorRegistry()
        registry.register(ReloadMetrics(lambda: w.status))
        get = registry.get_sample_value
        assert get("llmgw_router_config_last_reload_successful") == 0.0
        assert get("llmgw_router_config_last_reload_success_timestamp_seconds") == 1.8e9
        assert get("llmgw_router_config_restart_pending") == 0.0
