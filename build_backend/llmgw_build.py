"""The build backend: setuptools', plus what a wheel needs to compile the router with mypyc.

`pip wheel .`, `pip install .` and `python -m build` build a wheel: this backend
asks for mypy and the packages whose types the compiled modules use, and tells
setup.py to compile (`LLMGW_BUILD_MYPYC=1`), so the wheel carries the router's hot
modules as extension modules beside their sources, as black's wheels do. An
editable install (`pip install -e .`) asks for nothing more and compiles nothing:
an extension module beside the sources would shadow every later edit of them
(a checkout uses scripts/build-mypyc's cache instead).

`LLMGW_MYPYC=0` builds a pure-Python wheel; `LLMGW_MYPYC=1` fails the build when it
cannot compile (no C compiler, no Python headers) instead of falling back.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from setuptools import build_meta
from setuptools.build_meta import (
    build_editable,
    build_sdist,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    prepare_metadata_for_build_editable,
    prepare_metadata_for_build_wheel,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

# mypyc comes with mypy. The others are what the compiled modules import, directly or
# not (scripts/build-mypyc's closure): mypyc compiles against their types; one left
# out would be typed Any (--ignore-missing-imports) and compile to slower code.
COMPILE_REQUIRES = [
    "mypy>=1.11",
    "aiohttp>=3.10",
    "httptools>=0.6",
    "msgspec>=0.18",
    "mypy-extensions>=1.0",
    "prometheus-client>=0.20",
    "pyyaml>=6",
    "types-pyyaml>=6",
]


def _compiling() -> bool:
    return os.environ.get("LLMGW_MYPYC", "auto") != "0"


def get_requires_for_build_wheel(config_settings: dict[str, Any] | None = None) -> list[str]:
    base = build_meta.get_requires_for_build_wheel(config_settings)
    return [*base, *COMPILE_REQUIRES] if _compiling() else base


def build_wheel(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    # pip builds in the source tree, and setuptools copies the package into build/lib*
    # without removing what is gone from the sources: a module deleted since the last
    # build would ship again. Its compiled C (build/ elsewhere) is kept.
    for stale in Path("build").glob("lib*"):
        shutil.rmtree(stale, ignore_errors=True)
    os.environ["LLMGW_BUILD_MYPYC"] = "1" if _compiling() else "0"
    try:
        return build_meta.build_wheel(wheel_directory, config_settings, metadata_directory)
    finally:
        del os.environ["LLMGW_BUILD_MYPYC"]
