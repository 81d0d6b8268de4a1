"""Router: where a reloaded configuration lands."""

from __future__ import annotations

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
