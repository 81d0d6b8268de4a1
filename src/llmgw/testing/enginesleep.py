"""vLLM's sleep-mode routes, read from the pinned release's source (as engineflags reads flags).

What the agent and the sim-engine rely on, each read from the wheel's own files:
- the routes `POST /sleep` (query `level`, an int between bounds, and `mode`),
  `POST /wake_up` (repeated query `tags`) and `GET /is_sleeping`, in
  vllm/entrypoints/serve/dev/sleep/api_router.py (the `@router.<method>(path)`
  decorators, the handlers' query parameters and `Query(ge=, le=)` bounds, and
  the `query_params.getlist(...)` reads);
- that they are registered only under `envs.VLLM_SERVER_DEV_MODE`
  (vllm/entrypoints/launchers/api_server/routers.py), which vllm/envs.py reads
  from the environment variable of that name;
- which paths vLLM's API key guards (`GUARDED_PREFIX`,
  vllm/entrypoints/serve/middleware/authenticate.py): the sleep routes are not
  among them, which is why llmgw puts its own guard in front (docs/security.md).
engineflags.fetch keeps these files next to the parser's (`SOURCES`).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from llmgw.testing import engineflags
from llmgw.testing.engineflags.reading import parse

SOURCES = (
    "vllm/entrypoints/serve/dev/sleep/api_router.py",
    "vllm/entrypoints/serve/middleware/authenticate.py",
    "vllm/entrypoints/launchers/api_server/routers.py",
    "vllm/envs.py",
)
DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"


@dataclass(frozen=True)
class Route:
    method: str  # upper case
    path: str
    # Query parameters the handler reads: name → (min, max) for a bounded int, else None.
    query: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    # Parameters read as repeated values (`?tags=a&tags=b`).
    repeated: frozenset[str] = frozenset()


@dataclass(frozen=True)
class SleepContract:
    version: str
    routes: dict[str, Route]  # "POST /sleep" → Route
    guarded_prefixes: tuple[str, ...]
    # The dev routes are registered only when envs.VLLM_SERVER_DEV_MODE is set.
    dev_mode_gated: bool
    # vllm/envs.py reads VLLM_SERVER_DEV_MODE from the environment.
    dev_mode_var_read: bool


def read(version: str | None = None) -> SleepContract:
    """The pinned release's contract, from the fetched sources (fetched if needed)."""
    version = version or engineflags.PINNED["vllm"]
    engineflags.fetch("vllm", version)
    src = engineflags.cache_root() / f"vllm-{version}" / "src"
    return extract(version, src)


def extract(version: str, src: Path) -> SleepContract:
    trees = {rel: parse(src / rel) for rel in SOURCES}
    return SleepContract(
        version=version,
        routes=_routes(trees[SOURCES[0]]),
        guarded_prefixes=_guarded(trees[SOURCES[1]]),
        dev_mode_gated=_gated(trees[SOURCES[2]]),
        dev_mode_var_read=any(
            isinstance(n, ast.Constant) and n.value == DEV_MODE_VAR
            for n in ast.walk(trees[SOURCES[3]])
        ),
    )


def _routes(tree: ast.Module) -> dict[str, Route]:
    out: dict[str, Route] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for deco in fn.decorator_list:
            if not (
                isinstance(deco, ast.Call)
                and isinstance(deco.func, ast.Attribute)
                and deco.func.attr in ("get", "post", "put", "delete")
                and deco.args
                and isinstance(deco.args[0], ast.Constant)
            ):
                continue
            method, path = deco.func.attr.upper(), str(deco.args[0].value)
            out[f"{method} {path}"] = Route(
                method=method, path=path, query=_query(fn), repeated=_repeated(fn)
            )
    return out


def _query(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, tuple[int, int] | None]:
    """Parameters annotated `Annotated[T, Query(...)]`, with int bounds where given."""
    out: dict[str, tuple[int, int] | None] = {}
    for arg in fn.args.args:
        ann = arg.annotation
        if not (isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple)):
            continue
        for meta in ann.slice.elts[1:]:
            if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "Query":
                bounds = {
                    k.arg: k.value.value
                    for k in meta.keywords
                    if isinstance(k.value, ast.Constant) and isinstance(k.value.value, int)
                }
                lo, hi = bounds.get("ge"), bounds.get("le")
                out[arg.arg] = (lo, hi) if lo is not None and hi is not None else None
    return out


def _repeated(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> frozenset[str]:
    return frozenset(
        str(n.args[0].value)
        for n in ast.walk(fn)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "getlist"
        and n.args
        and isinstance(n.args[0], ast.Constant)
    )


def _guarded(tree: ast.Module) -> tuple[str, ...]:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", "") == "GUARDED_PREFIX" for t in node.targets)
            and isinstance(node.value, ast.Tuple)
        ):
            return tuple(str(e.value) for e in node.value.elts if isinstance(e, ast.Constant))
    raise engineflags.EngineFlagsError("GUARDED_PREFIX not found in vLLM's auth middleware")


def _gated(tree: ast.Module) -> bool:
    """Whether `register_vllm_dev_api_routers` is called only under `envs.VLLM_SERVER_DEV_MODE`."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Attribute)
            and node.test.attr == DEV_MODE_VAR
        ):
            inside = {
                getattr(n.func, "id", "")
                for stmt in node.body
                for n in ast.walk(stmt)
                if isinstance(n, ast.Call)
            }
            if "register_vllm_dev_api_routers" in inside:
                return True
    return False
