"""Router: where a reloaded configuration lands."""

from __future__ import annotations

import logging

import pytest

from llmgw.router.config import parse
from llmgw.router.wiring import Router
from llmgw.wire.endpoints import EndpointInfo, EndpointList

STATIC = """
endpoints:
  - {id: a, url: "http://127.0.0.1:9001", models: [m]}
  - {id: b, url: "http://127.0.0.1:9002", models: [m]}
"""
CONTROLLED = """
controller: {url: "http://127.0.0.1:9000"}
models: [m]
"""


class TestApplyConfig:
    """Where a reloaded configuration lands."""

    def test_file_that_switches_to_a_controller_keeps_the_endpoints(self) -> None:
        """A static router whose file now names a controller (a restart-only change) keeps
        serving its endpoints until restarted, instead of being emptied by the reload."""
        state = Router(parse(STATIC))
        state.apply_config(parse(CONTROLLED))
        assert state.registry.ids() == ["a", "b"]
        assert "m" in state.known_models

    def test_file_that_drops_its_controller_keeps_the_controllers_list(self) -> None:
        """A router following a controller keeps the controller's list when the file loses
        its controller section, through later reloads too (restart-only)."""
        state = Router(parse(CONTROLLED))
        info = EndpointInfo(id="r1", url="http://127.0.0.1:9003", models=("m",))
        state.apply_list(EndpointList(version=1, endpoints=(info,), models=("m",)))
        state.apply_config(parse("models: [m]\n"))
        state.apply_config(parse("models: [m, n]\n"))
        assert state.registry.ids() == ["r1"]


class TestRestartOnlyOnReload:
    """A reload leaves the restart-only settings in force until the router restarts."""

    def test_restart_only_settings_keep_their_running_values(self) -> None:
        """A reload that changes breaker, max_body_bytes and controller changes none of
        what the running router reads (waits.py read the reloaded breaker's cooldown,
        /healthz the reloaded controller), while a live setting changes."""
        state = Router(parse(STATIC + "breaker: {cooldown_s: 10}\nmax_body_bytes: 262144\n"))
        state.apply_config(
            parse(
                CONTROLLED + "breaker: {cooldown_s: 1, max_cooldown_s: 2}\n"
                "max_body_bytes: 65536\nhold_timeout_s: 7\n"
            )
        )
        assert (
            state.cfg.breaker.cooldown_s,
            state.cfg.max_body_bytes,
            state.cfg.controller,
        ) == (10.0, 262144, None)
        assert state.cfg.hold_timeout_s == 7.0
        assert state.registry.ids() == ["a", "b"]

    def test_each_reload_names_what_still_waits_for_a_restart(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Every reload names the restart-only fields its file sets otherwise than the
        running router, and none once the file is back to what is in force."""
        state = Router(parse(STATIC))
        with caplog.at_level(logging.WARNING, logger="llmgw"):
            state.apply_config(parse(STATIC + "stale_after_s: 5\n"))
            state.apply_config(parse(STATIC + "stale_after_s: 5\nmodels: [n]\n"))
            assert caplog.text.count("field=stale_after_s") == 2
            caplog.clear()
            state.apply_config(parse(STATIC))
        assert "needs a restart" not in caplog.text
