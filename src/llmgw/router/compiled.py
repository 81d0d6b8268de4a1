"""The router's optional mypyc build of its hottest modules: found, checked, loaded.

`scripts/build-mypyc` compiles `MODULES` with mypyc into
`${XDG_CACHE_HOME:-~/.cache}/llmgw/mypyc/<key>/`, the key a hash of the modules'
exact sources, this interpreter's ABI and mypy's version; the folder's manifest
also lists every other llmgw module they import, directly or not, with its hash
(compiled code trusts their types). The router's `main` calls `load()`
before it imports any of them, so when a build matches the sources this
process would import, the compiled modules go into `sys.modules` under their own
names and every later `import llmgw.router.routing.prefix` gets them; otherwise, or if one
fails to load, the Python modules, as always (`STATUS` says which, and why).

A wheel (setup.py) carries the compiled modules instead, installed beside their
sources, where Python's own import would pick them; `load()` imports them the
same way when they are all there (no cache, no key: a wheel's sources and its
extension modules are built together). When they must not run (`0`, or they fail
to load) a finder placed first on `sys.meta_path` imports those modules from their
`.py` files.

`LLMGW_ROUTER_COMPILED`: `auto` (the default), `0` (always the Python modules),
`1` (the build is required: importing the router fails without one).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ENV = "LLMGW_ROUTER_COMPILED"
SETTINGS = ("auto", "0", "1")
# Compiled, in load order: each after the compiled modules it imports. Each is its
# own mypyc group: an extension module and its `<name>__mypyc` library beside it.
MODULES = (
    "llmgw.router.replicas.breaker",
    "llmgw.router.replicas.snapshot",
    "llmgw.router.replicas.registry",
    "llmgw.router.routing.blockhash",
    "llmgw.router.routing.prefix",
    "llmgw.router.routing.rendezvous",
    "llmgw.router.routing.affinity",
    "llmgw.router.routing.schedconfig",
    "llmgw.router.routing.scheduler",
    "llmgw.router.routing.policies",
    "llmgw.runtime.peers",
    "llmgw.router.http.heads",
    "llmgw.router.http.answers",
    "llmgw.router.http.connection",
    "llmgw.router.http.server",
    "llmgw.router.upstream.base",
    "llmgw.router.upstream.fastconn",
    "llmgw.router.upstream.fast",
    "llmgw.router.metrics",
    "llmgw.router.request.intake",
    "llmgw.router.request.tokens",
    "llmgw.router.request.inband",
    "llmgw.router.control.usagereports",
    "llmgw.router.wiring",
    "llmgw.router.request.call",
    "llmgw.router.request.enginepriority",
    "llmgw.router.request.accounting",
    "llmgw.router.request.admission",
    "llmgw.router.request.attempts",
    "llmgw.router.request.relay",
    "llmgw.router.request.waits",
    "llmgw.router.request.proxy",
    "llmgw.router.request.listing",
)
MANIFEST = "manifest.json"
# The directory holding the `llmgw` package this process imports.
SOURCES = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Status:
    # The modules running compiled; empty when the Python ones run.
    modules: tuple[str, ...]
    # The build's folder, or why the Python modules run.
    detail: str


STATUS = Status((), "not loaded yet")


class CompiledBuildError(ImportError):
    """`LLMGW_ROUTER_COMPILED=1` and no usable build, or a bad setting."""


def source(module: str) -> Path:
    """Where `module`'s source is (a module of this package, found without importing it)."""
    return SOURCES.joinpath(*module.split(".")).with_suffix(".py")


def extension(folder: Path, module: str, suffix: str = "") -> Path:
    """The extension module file of `module` (+ suffix, `__mypyc`: its library) in a build."""
    *package, name = module.split(".")
    return folder.joinpath(*package, name + suffix + EXTENSION_SUFFIXES[0])


def cache_root(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw" / "mypyc"


def abi() -> str:
    """The interpreter a build is for: its cache tag, extension suffix and exact version."""
    return f"{sys.implementation.cache_tag} {EXTENSION_SUFFIXES[0]} {sys.hexversion:x}"


def mypy_version() -> str | None:
    """The installed mypy's version, from its dist-info folder's name; None without mypy.

    Not importlib.metadata: importing it costs more than everything else here."""
    spec = importlib.util.find_spec("mypy")
    if spec is None or spec.origin is None:
        return None
    site = Path(spec.origin).parent.parent
    found = sorted(site.glob("mypy-*.dist-info"))
    return found[0].name[len("mypy-") : -len(".dist-info")] if found else None


def key(mypy: str) -> str:
    """The build's folder name for the current sources, interpreter and `mypy` version."""
    h = hashlib.sha256(f"{abi()}\nmypy {mypy}\n".encode())
    for module in MODULES:
        data = source(module).read_bytes()
        h.update(f"{module} {len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()[:32]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed(folder: Path = SOURCES) -> bool:
    """Whether every compiled module and its library lie beside the sources (a wheel's)."""
    return all(extension(folder, m, s).is_file() for m in MODULES for s in ("", "__mypyc"))


def find(environ: Mapping[str, str]) -> Path | str:
    """The complete build for the current sources, or why there is none."""
    mypy = mypy_version()
    if mypy is None:
        return "mypy is not installed (a build's key names the mypy that made it)"
    try:
        folder = cache_root(environ) / key(mypy)
    except (OSError, RuntimeError) as exc:  # unreadable sources; no home directory
        return f"no build to look for: {exc}"
    try:
        manifest = json.loads((folder / MANIFEST).read_bytes())
        modules = tuple(manifest["modules"])
        depends = dict(manifest["depends"])
    except FileNotFoundError:
        return f"no build for these sources at {folder} (scripts/build-mypyc)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"unreadable manifest in {folder}: {exc}"
    if modules != MODULES:
        return f"the build at {folder} has other modules: {', '.join(modules)}"
    for module in MODULES:
        for suffix in ("", "__mypyc"):
            if not extension(folder, module, suffix).is_file():
                return f"incomplete build at {folder}: no {extension(folder, module, suffix)}"
    for rel, want in depends.items():
        try:
            same = digest(SOURCES / rel) == want
        except OSError:
            same = False
        if not same:
            return f"stale build at {folder}: {rel} changed since (scripts/build-mypyc)"
    return folder


def load(environ: Mapping[str, str] = os.environ) -> Status:
    """Load the build when there is one and the setting allows; sets and returns `STATUS`."""
    global STATUS
    setting = environ.get(ENV) or "auto"
    if setting not in SETTINGS:
        raise CompiledBuildError(f"{ENV}={setting}: expected one of {', '.join(SETTINGS)}")
    if setting == "0":
        if installed():
            _sources_first()
        STATUS = Status((), f"{ENV}=0")
        return STATUS
    if installed():
        return _load_installed(setting)
    found = find(environ)
    if isinstance(found, Path):
        try:
            _import(found)
        except Exception as exc:  # noqa: BLE001 - any failure leaves the Python modules
            found = f"the build at {found} did not load: {exc!r}"
        else:
            STATUS = Status(MODULES, str(found))
            return STATUS
    if setting == "1":
        raise CompiledBuildError(f"{ENV}=1 but {found}")
    STATUS = Status((), found)
    return STATUS


def _load_installed(setting: str) -> Status:
    global STATUS
    try:
        _import(SOURCES)
    except Exception as exc:  # any failure leaves the Python modules (unless `1`)
        why = f"the compiled modules installed in {SOURCES} did not load: {exc!r}"
        if setting == "1":
            raise CompiledBuildError(f"{ENV}=1 but {why}") from exc
        _sources_first()
        STATUS = Status((), why)
        return STATUS
    STATUS = Status(MODULES, f"installed with the package in {SOURCES}")
    return STATUS


class _SourcesFirst(importlib.abc.MetaPathFinder):
    """Imports the compiled modules' names from their `.py` files, although extension
    modules of the same names lie beside them (which Python's own finder would pick)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname))


def _sources_first() -> None:
    if not any(isinstance(f, _SourcesFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, _SourcesFirst())


def _import(folder: Path) -> None:
    """Put the build's modules into sys.modules, libraries first; all of them or none."""
    before = set(sys.modules)
    try:
        for module in MODULES:
            _extension(module + "__mypyc", extension(folder, module, "__mypyc"))
        for module in MODULES:
            if module in sys.modules:
                # A compiled module listed earlier imported its Python source: the two
                # would hold different classes of the same name.
                raise ImportError(f"{module} was imported before its build (MODULES order)")
            _extension(module, extension(folder, module))
    except BaseException:
        # Whatever the attempt imported may hold a compiled module: import it again.
        for name in set(sys.modules) - before:
            if name.startswith("llmgw."):
                del sys.modules[name]
        raise
    for module in MODULES:
        parent, _, name = module.rpartition(".")
        setattr(importlib.import_module(parent), name, sys.modules[module])


def _extension(name: str, path: Path) -> None:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"not an extension module: {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
