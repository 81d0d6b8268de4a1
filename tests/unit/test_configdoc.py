"""docs/configuration.md is what the programs' parsers say (python -m llmgw.testing.configdoc)."""

from __future__ import annotations

from llmgw.testing.configdoc import PAGE, render


class TestConfigurationPage:
    """The generated page cannot drift from the code."""

    def test_page_is_current(self) -> None:
        """Regenerate with `python -m llmgw.testing.configdoc` when this fails."""
        assert PAGE.read_text() == render(), (
            "docs/configuration.md is out of date: run .venv/bin/python -m llmgw.testing.configdoc"
        )

    def test_every_program_has_a_section(self) -> None:
        """Each long-running program and `up` has its table."""
        text = render()
        for name in ("controller", "router", "agent", "sim-engine", "up"):
            assert f"\n## llmgw {name}\n" in text
