"""Finding the router's mypyc build: by key, complete, current; and the setting.

Fake builds in a temporary cache (empty files where the libraries go): whether a real
build loads, and answers as the Python modules do, is tests/integration's
test_router_compiled.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from llmgw.router import compiled

MODULES = list(compiled.MODULES)
# A module the compiled ones import, as a manifest lists it.
BREAKER = "llmgw/router/replicas/breaker.py"


@pytest.fixture(autouse=True)
def _status_restored(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compiled, "STATUS", compiled.STATUS)


def mypy() -> str:
    version = compiled.mypy_version()
    assert version is not None, "mypy is a dev dependency"
    return version


def fake_build(cache: Path, *, version: str = "", **manifest: Any) -> Path:
    folder = cache / "llmgw" / "mypyc" / compiled.key(version or mypy())
    for module in compiled.MODULES:
        for suffix in ("", "__mypyc"):
            path = compiled.extension(folder, module, suffix)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
    breaker = compiled.digest(compiled.SOURCES / BREAKER)
    doc = {"modules": MODULES, "depends": {BREAKER: breaker}, **manifest}
    (folder / compiled.MANIFEST).write_text(json.dumps(doc))
    return folder


def env(cache: Path, setting: str | None = None) -> dict[str, str]:
    out = {"XDG_CACHE_HOME": str(cache)}
    if setting is not None:
        out[compiled.ENV] = setting
    return out


class TestFind:
    """Finding the compiled build that matches these sources."""

    def test_the_build_for_these_sources_is_found(self, tmp_path: Path) -> None:
        """The build for these sources is found."""
        folder = fake_build(tmp_path)
        assert compiled.find(env(tmp_path)) == folder

    def test_the_key_covers_sources_interpreter_and_mypy(self) -> None:
        """The key covers sources interpreter and mypy."""
        assert compiled.key("1.0") != compiled.key("1.1")
        assert len(compiled.key(mypy())) == 32
        assert compiled.abi().startswith(f"{sys.implementation.cache_tag} ")

    def test_a_build_for_another_key_is_not_used(self, tmp_path: Path) -> None:
        """A build for another key is not used."""
        fake_build(tmp_path, version="0.0")
        got = compiled.find(env(tmp_path))
        assert isinstance(got, str)
        assert got.startswith("no build for these sources at ")

    def test_a_missing_library_makes_it_incomplete(self, tmp_path: Path) -> None:
        """A missing library makes it incomplete."""
        folder = fake_build(tmp_path)
        compiled.extension(folder, MODULES[-1], "__mypyc").unlink()
        assert str(compiled.find(env(tmp_path))).startswith(f"incomplete build at {folder}")

    @pytest.mark.parametrize("text", ["", "{", "[]", '{"modules": []}'])
    def test_an_unreadable_manifest_is_not_used(self, tmp_path: Path, text: str) -> None:
        """An unreadable manifest is not used."""
        folder = fake_build(tmp_path)
        (folder / compiled.MANIFEST).write_text(text)
        assert str(compiled.find(env(tmp_path))).startswith(f"unreadable manifest in {folder}")

    def test_a_build_of_other_modules_is_not_used(self, tmp_path: Path) -> None:
        """A build of other modules is not used."""
        fake_build(tmp_path, modules=MODULES[:1])
        assert "has other modules" in str(compiled.find(env(tmp_path)))

    def test_a_changed_dependency_makes_it_stale(self, tmp_path: Path) -> None:
        """Compiled code trusts the types of what it imports: those sources must not move."""
        folder = fake_build(tmp_path, depends={BREAKER: "0" * 64})
        assert compiled.find(env(tmp_path)) == (
            f"stale build at {folder}: {BREAKER} changed since (scripts/build-mypyc)"
        )

    def test_a_vanished_dependency_makes_it_stale(self, tmp_path: Path) -> None:
        """A vanished dependency makes it stale."""
        fake_build(tmp_path, depends={"llmgw/router/gone.py": "0" * 64})
        assert "llmgw/router/gone.py changed since" in str(compiled.find(env(tmp_path)))


class TestLoad:
    """Loading the compiled build as the setting asks."""

    def test_zero_never_looks(self, tmp_path: Path) -> None:
        """LLMGW_ROUTER_COMPILED=0 never looks for a build, even when one exists."""
        fake_build(tmp_path)
        assert compiled.load(env(tmp_path, "0")) == compiled.Status((), "LLMGW_ROUTER_COMPILED=0")
        assert compiled.STATUS.modules == ()

    @pytest.mark.parametrize("setting", [None, "", "auto"])
    def test_auto_without_a_build_runs_python(self, tmp_path: Path, setting: str | None) -> None:
        """Auto without a build runs python."""
        status = compiled.load(env(tmp_path, setting))
        assert status.modules == ()
        assert status.detail.startswith("no build for these sources")
        assert status == compiled.STATUS

    def test_auto_with_a_build_that_does_not_load_runs_python(self, tmp_path: Path) -> None:
        """Empty files are no extension modules: the attempt is undone, nothing is raised."""
        folder = fake_build(tmp_path)
        status = compiled.load(env(tmp_path))
        assert status.modules == ()
        assert status.detail.startswith(f"the build at {folder} did not load: ImportError(")

    def test_one_without_a_build_fails_clearly(self, tmp_path: Path) -> None:
        """One without a build fails clearly."""
        with pytest.raises(compiled.CompiledBuildError, match=r"=1 but no build .*build-mypyc"):
            compiled.load(env(tmp_path, "1"))

    def test_one_with_a_build_that_does_not_load_fails(self, tmp_path: Path) -> None:
        """One with a build that does not load fails."""
        fake_build(tmp_path)
        with pytest.raises(compiled.CompiledBuildError, match=r"=1 but the build at .* did not"):
            compiled.load(env(tmp_path, "1"))

    def test_an_unknown_setting_fails(self, tmp_path: Path) -> None:
        """An unknown setting fails naming the accepted values."""
        with pytest.raises(compiled.CompiledBuildError, match="=yes: expected one of auto, 0, 1"):
            compiled.load(env(tmp_path, "yes"))


class TestInstalled:
    """A wheel's compiled modules, beside their sources, are found without a cache."""

    def test_all_beside_the_sources(self, tmp_path: Path) -> None:
        """Every module and its library there: installed."""
        folder = fake_build(tmp_path)
        assert compiled.installed(folder)

    def test_one_missing_is_not_installed(self, tmp_path: Path) -> None:
        """A wheel missing one library is not used (the Python modules run)."""
        folder = fake_build(tmp_path)
        compiled.extension(folder, MODULES[-1], "__mypyc").unlink()
        assert not compiled.installed(folder)

    def test_a_checkout_has_none(self) -> None:
        """scripts/build-mypyc never writes beside the sources: this checkout has none."""
        assert not compiled.installed()
