"""The wheel's one build step beyond pyproject.toml: the router's hot modules, compiled.

Run by build_backend/llmgw_build.py, which sets `LLMGW_BUILD_MYPYC=1` for a wheel
and nothing for an editable install. The modules are those `llmgw.router.compiled`
loads (its MODULES, read from its source: llmgw itself is not imported here), each
its own mypyc group, as scripts/build-mypyc compiles them. The extension modules go
into the wheel beside their sources, where the router finds them at start.

Without mypyc, a C compiler or the Python headers the wheel is pure Python and
says why on stderr; `LLMGW_MYPYC=1` makes that an error.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import setup

HERE = Path(__file__).resolve().parent
COMPILED = HERE / "src" / "llmgw" / "router" / "compiled.py"


def modules() -> list[str]:
    """`MODULES` of llmgw.router.compiled, read from its source."""
    for node in ast.parse(COMPILED.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "MODULES" for t in node.targets
        ):
            return [str(v) for v in ast.literal_eval(node.value)]
    raise SystemExit(f"setup.py: no MODULES in {COMPILED}")


def cannot() -> str | None:
    """Why this build cannot compile, or None."""
    if importlib.util.find_spec("mypyc") is None:
        return "mypyc is not installed in the build environment"
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(cc) is None:
        return f"no C compiler ({cc})"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        return "no Python headers (python3-dev)"
    return None


def extensions() -> list[Any]:
    if os.environ.get("LLMGW_BUILD_MYPYC") != "1":
        return []
    why = cannot()
    if why is not None:
        if os.environ.get("LLMGW_MYPYC") == "1":
            raise SystemExit(f"setup.py: LLMGW_MYPYC=1 but {why}")
        print(f"setup.py: {why}; the wheel's router runs its Python modules", file=sys.stderr)
        return []
    from mypyc.build import mypycify

    paths = [str(Path("src", *m.split(".")).with_suffix(".py")) for m in modules()]
    print(f"setup.py: compiling {len(paths)} router modules with mypyc", file=sys.stderr)
    return list(mypycify(["--ignore-missing-imports", *paths], separate=True, opt_level="3"))


setup(ext_modules=extensions())
