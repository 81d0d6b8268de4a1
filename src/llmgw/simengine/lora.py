"""LoRA adapters on the sim-engine, as vLLM serves them (docs/sleep-and-adapters.md).

Flags (vLLM's): `--enable-lora`, `--max-loras N` (adapters one batch may mix),
`--max-cpu-loras N` (adapters kept loaded; default: `--max-loras`), and
`--lora-modules name=path ...` (vLLM also takes a JSON object per item, with
`name` and `path`). Routes (vLLM's, which it enables with
VLLM_ALLOW_RUNTIME_LORA_UPDATING and `--enable-lora`; here always, so that a
sim base started without adapters can be given one, as the agent expects):

    POST /v1/load_lora_adapter    {"lora_name", "lora_path"}  200 | 400 already loaded
    POST /v1/unload_lora_adapter  {"lora_name"}               200 | 404 not found

An adapter's name is served as a model: a request naming it is answered with its
name as the `model`, and /v1/models lists it with the base as its `parent`.

What it costs: the first request for an adapter that is not loaded waits while
it is read in (`--lora-load-ms`, scaled by `--speed`, once however many requests
arrive for it meanwhile); the `--max-cpu-loras` most recently used stay loaded,
and one evicted is read in again at its next use. A batch mixes at most
`--max-loras` adapters: a request of one more waits for a later step while the
others go on (batcher.py, as vLLM's scheduler). Not modelled: the adapter's own
compute (vLLM's LoRA kernels add a little to every step of a batch that uses
adapters). The adapter's files are not read.
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import msgspec
from aiohttp import web

from llmgw.wire.errors import error_body

DEFAULT_LOAD_MS = 50.0


@dataclass(frozen=True, kw_only=True)
class LoraSettings:
    enabled: bool = False
    max_loras: int = 1
    # Adapters kept loaded (vLLM's CPU cache); None: max_loras.
    max_cpu_loras: int | None = None
    # name → path, as --lora-modules gave them.
    modules: tuple[tuple[str, str], ...] = ()
    # Reading one adapter in, at speed 1.
    load_ms: float = DEFAULT_LOAD_MS

    def __post_init__(self) -> None:
        if self.max_loras < 1 or (self.max_cpu_loras is not None and self.max_cpu_loras < 1):
            raise ValueError("--max-loras and --max-cpu-loras must be >= 1")
        if self.load_ms < 0:
            raise ValueError("--lora-load-ms must be >= 0")
        if self.modules and not self.enabled:
            raise ValueError("--lora-modules needs --enable-lora (as in vLLM)")

    @property
    def cache_size(self) -> int:
        return max(self.max_loras, self.max_cpu_loras or self.max_loras)


def parse_modules(items: list[str]) -> tuple[tuple[str, str], ...]:
    """`--lora-modules` items, read by vLLM's rule (LoRAParserAction): `name=path` when the
    item has a '=' and no ',', split on every '='; else a JSON object with `name` and
    `path`. ValueError for anything vLLM refuses: a path with '=' or ',' given as
    `name=path` fails there, so it must fail here, where the agent's flags are tested."""
    out: list[tuple[str, str]] = []
    for item in items:
        if not item:
            continue  # vLLM skips empty items
        name: object
        path: object
        if "=" in item and "," not in item:
            parts = item.split("=")
            if len(parts) != 2:
                raise ValueError(f"--lora-modules: more than one '=' in {item!r} (vLLM fails)")
            name, path = parts
        else:
            try:
                obj = json.loads(item)
            except json.JSONDecodeError as exc:
                raise ValueError(f"--lora-modules: not name=path nor JSON: {item!r}") from exc
            if not isinstance(obj, dict):
                raise ValueError(f"--lora-modules: expected name=path, got {item!r}")
            name, path = obj.get("name"), obj.get("path")
        if not isinstance(name, str) or not isinstance(path, str) or not name or not path:
            raise ValueError(f"--lora-modules: expected name=path, got {item!r}")
        out.append((name, path))
    return tuple(out)


class LoraRegistry:
    """The adapters this engine serves, and which of them are loaded (an LRU)."""

    def __init__(self, settings: LoraSettings, *, speed: float = 1.0) -> None:
        self.settings = settings
        self._paths: dict[str, str] = dict(settings.modules)
        self._loaded: OrderedDict[str, None] = OrderedDict()
        self._loading: dict[str, asyncio.Future[None]] = {}
        self._load_s = settings.load_ms / 1000.0 / max(speed, 1e-9)
        # Reads counted for tests and the bench: adapters read in, and evictions.
        self.loads = 0
        self.evictions = 0
        # Called after the set of served adapters changed (/v1/models is rebuilt).
        self.on_change: Callable[[], None] = lambda: None

    @property
    def names(self) -> dict[str, str]:
        """Served adapter → its path (a live view; do not change it)."""
        return self._paths

    def add(self, name: str, path: str) -> None:
        self._paths[name] = path
        self.on_change()

    def remove(self, name: str) -> None:
        self._paths.pop(name, None)
        self._loaded.pop(name, None)
        self.on_change()

    async def use(self, name: str) -> None:
        """Wait until `name` is loaded (read it in on first use); a no-op when it is."""
        if name in self._loaded:
            self._loaded.move_to_end(name)
            return
        pending = self._loading.get(name)
        if pending is not None:
            # Another request reads it in: wait for that one read, not a second.
            await asyncio.shield(pending)
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._loading[name] = done
        try:
            await asyncio.sleep(self._load_s)
        finally:
            # Resolved even when this request is cancelled: the read itself goes on
            # in vLLM, and the waiters must not hang.
            del self._loading[name]
            done.set_result(None)
        self.loads += 1
        self._loaded[name] = None
        while len(self._loaded) > self.settings.cache_size:
            self._loaded.popitem(last=False)
            self.evictions += 1


class _Load(msgspec.Struct, frozen=True):
    lora_name: str
    lora_path: str


class _Unload(msgspec.Struct, frozen=True):
    lora_name: str
    lora_int_id: int | None = None


def _error(status: int, message: str, typ: str) -> web.Response:
    return web.Response(
        body=error_body(message, type=typ, code=status),
        status=status,
        content_type="application/json",
    )


def _bad(message: str) -> web.Response:
    return _error(400, message, "BadRequestError")


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def handlers(reg: LoraRegistry, base_names: tuple[str, ...]) -> tuple[Handler, Handler]:
    """(load, unload): vLLM's runtime routes over `reg`."""

    async def load(request: web.Request) -> web.StreamResponse:
        try:
            body = msgspec.json.decode(await request.read(), type=_Load)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _bad(f"Both 'lora_name' and 'lora_path' must be provided. ({exc})")
        if not body.lora_name or not body.lora_path:
            return _bad("Both 'lora_name' and 'lora_path' must be provided.")
        if body.lora_name in reg.names or body.lora_name in base_names:
            return _bad(f"The lora adapter '{body.lora_name}' has already been loaded.")
        reg.add(body.lora_name, body.lora_path)
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def unload(request: web.Request) -> web.StreamResponse:
        try:
            body = msgspec.json.decode(await request.read(), type=_Unload)
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            return _bad(f"'lora_name' needs to be provided to unload a LoRA adapter. ({exc})")
        if body.lora_name not in reg.names:
            return _error(
                404, f"The lora adapter '{body.lora_name}' cannot be found.", "NotFoundError"
            )
        reg.remove(body.lora_name)
        return web.Response(text=f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    return load, unload
