"""LoRA adapters on a base's engine: the start flags, and loading them while it runs.

At start (`start_args`, added by templates.render) the shard's adapters as the
controller listed them then:

- vLLM and the sim-engine: `--enable-lora --max-loras N --lora-modules name=path ...`
  (vLLM's flags; `--lora-modules` takes `name=path` items, or a JSON object for a
  path with '=' or ',', which vLLM cannot split out of `name=path`). `--max-loras` is how
  many adapters one batch may mix; the sim-engine reads it too. A vLLM base that
  loads adapters at run time (wire.adapters.loads_at_run_time) starts with LoRA on
  even without adapters, so one applied later can be loaded (the sim-engine's
  runtime routes need no flag).
- llama.cpp: `--lora-scaled FILE:0,FILE:0,...` in name order: loaded with scale 0,
  so the base's own requests run without any (llama-server applies `--lora`
  files to every request, and `--lora-init-without-apply` did not stop that in
  the pinned build); a request selects its adapter by position (`"lora": [{"id":
  i, "scale": 1.0}]`), which routers add for an adapter's name (router/request/lora.py).

While it runs (`AdapterSync`, engines that allow it): the adapters added since
are loaded with `POST /v1/load_lora_adapter {lora_name, lora_path}` and those
removed unloaded with `POST /v1/unload_lora_adapter {lora_name}` (vLLM's routes,
enabled by VLLM_ALLOW_RUNTIME_LORA_UPDATING; the sim-engine has the same),
with the engine's key. What the engine serves is reported in the heartbeat, and
routers send an adapter's requests only to replicas that report it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import aiohttp

from llmgw.agent.probe import netloc
from llmgw.runtime.logs import kv
from llmgw.wire.adapters import llamacpp_path_problem, loads_at_run_time
from llmgw.wire.agent import ShardSpec

log = logging.getLogger(__name__)

# `--max-loras` when the agent renders it: enough for a handful of adapters in one
# batch without reserving GPU memory for dozens; a spec's args override it.
MAX_LORAS = 8
# `--max-cpu-loras` for an engine that loads adapters at run time (how many it keeps
# loaded, in host memory for vLLM): adapters beyond it are read in again at use.
MAX_CPU_LORAS = 64
# A load the engine refused is tried again after this long, not every tick.
RETRY_S = 30.0


def start_args(spec: ShardSpec, env: Mapping[str, str]) -> list[str]:
    """The engine flags for the shard's adapters at start; [] when it needs none."""
    names = sorted(spec.adapters)
    if spec.engine == "llamacpp":
        if not names:
            return []
        for name in names:
            problem = llamacpp_path_problem(spec.adapters[name])
            if problem is not None:
                raise ValueError(f"adapter {name}: {problem}")
        # Scale 0: loaded, applied to no request unless the request asks for it.
        return ["--lora-scaled", ",".join(f"{spec.adapters[n]}:0" for n in names)]
    if spec.engine not in ("vllm", "sim"):
        return []
    runtime = loads_at_run_time(spec.engine, dict(env))
    # vLLM must start with LoRA on to load any later; the sim-engine always can.
    if not names and (not runtime or spec.engine == "sim"):
        return []
    slots = MAX_LORAS if runtime else min(MAX_LORAS, max(1, len(names)))
    out = ["--enable-lora", "--max-loras", str(slots)]
    # Kept loaded between uses: every adapter it serves, and room for those loaded
    # later; fewer would read adapters in again and again under a mixed load.
    kept = max(len(names), MAX_CPU_LORAS if runtime else 0)
    if kept > slots:
        out += ["--max-cpu-loras", str(kept)]
    if names:
        out += ["--lora-modules", *(lora_module(n, spec.adapters[n]) for n in names)]
    return out


def lora_module(name: str, path: str) -> str:
    """One `--lora-modules` item: `name=path`, or vLLM's JSON form when the path has a
    '=' or a ','. vLLM reads `name=path` only without a ',' and splits it on every '=':
    an adapter at /lora/lr=1e-4 or /lora/a,b failed every start of its base."""
    if "=" in path or "," in path:
        return json.dumps({"name": name, "path": path})
    return f"{name}={path}"


def serves_at_start(spec: ShardSpec) -> dict[str, str]:
    """The adapters an engine started from `spec` serves once ready (its start flags),
    each with the path it reads it from."""
    if spec.engine in ("vllm", "sim", "llamacpp"):
        return dict(spec.adapters)
    return {}


class AdapterClient(Protocol):
    """The engine's runtime adapter routes; each call says whether the engine agreed."""

    async def load(self, host: str, port: int, api_key: str, name: str, path: str) -> str | None:
        """None when loaded (or already there); else why not, for the log."""
        ...

    async def unload(self, host: str, port: int, api_key: str, name: str) -> str | None: ...

    async def close(self) -> None: ...


class HttpAdapterClient:
    """vLLM's /v1/load_lora_adapter and /v1/unload_lora_adapter over one session."""

    def __init__(self, *, timeout_s: float = 120.0) -> None:
        # Loading reads the adapter's files: seconds for a large one.
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None

    async def load(self, host: str, port: int, api_key: str, name: str, path: str) -> str | None:
        body = {"lora_name": name, "lora_path": path}
        status, text = await self._post(host, port, api_key, "/v1/load_lora_adapter", body)
        # vLLM answers 400 "...has already been loaded" for a name it serves: that is
        # the state we want (an adopted engine, a retried load).
        if status == 200 or (status == 400 and "already been loaded" in text):
            return None
        return f"HTTP {status}: {text[:300]}"

    async def unload(self, host: str, port: int, api_key: str, name: str) -> str | None:
        body = {"lora_name": name}
        status, text = await self._post(host, port, api_key, "/v1/unload_lora_adapter", body)
        if status in (200, 404) or (status == 400 and "not found" in text.lower()):
            return None
        return f"HTTP {status}: {text[:300]}"

    async def _post(
        self, host: str, port: int, api_key: str, path: str, body: dict[str, str]
    ) -> tuple[int, str]:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        url = f"http://{netloc(host)}:{port}{path}"
        try:
            async with self._session.post(url, json=body, headers=headers) as resp:
                return resp.status, await resp.text()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            return 0, f"{type(exc).__name__}: {exc}"

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


@dataclass(slots=True)
class AdapterState:
    """What one ready engine serves, and when a refused load may be tried again."""

    # Adapter → the path the engine loaded it from: an adapter applied again with
    # another source is reloaded (by name alone the engine kept serving the old one).
    served: dict[str, str] = field(default_factory=dict)
    # Adapter → monotonic time before which it is not tried again.
    retry_at: dict[str, float] = field(default_factory=dict)

    def todo(self, want: Mapping[str, str], now: float) -> tuple[list[str], list[str]]:
        """(to load, to unload), each sorted; loads still backing off are left out. An
        adapter whose source changed is in both: unloaded, then loaded from its new path."""
        load = sorted(
            n for n in want if self.served.get(n) != want[n] and self.retry_at.get(n, 0) <= now
        )
        unload = sorted(n for n, path in self.served.items() if want.get(n) != path)
        return load, unload


async def sync(
    client: AdapterClient,
    st: AdapterState,
    spec: ShardSpec,
    *,
    host: str,
    port: int,
    api_key: str,
    now: float,
) -> None:
    """Load and unload until the engine serves `spec.adapters` (one pass; the tick repeats)."""
    load, unload = st.todo(spec.adapters, now)
    for name in unload:
        why = await client.unload(host, port, api_key, name)
        if why is None:
            del st.served[name]
            log.info(kv("adapter unloaded", replica=spec.replica_id, adapter=name))
        else:
            log.warning(kv("adapter not unloaded", replica=spec.replica_id, adapter=name, why=why))
    for name in load:
        if name in st.served:
            continue  # its old source is still loaded (the unload was refused): next pass
        path = spec.adapters[name]
        why = await client.load(host, port, api_key, name, path)
        if why is None:
            st.served[name] = path
            st.retry_at.pop(name, None)
            log.info(kv("adapter loaded", replica=spec.replica_id, adapter=name, path=path))
        else:
            st.retry_at[name] = now + RETRY_S
            log.warning(kv("adapter not loaded", replica=spec.replica_id, adapter=name, why=why))


def sync_due(spec: ShardSpec, st: AdapterState, now: float) -> bool:
    """Whether a ready engine from `spec` has adapters to load or unload now (it takes
    them at run time, and a load it refused is no longer backing off)."""
    return loads_at_run_time(spec.engine, spec.env) and any(st.todo(spec.adapters, now))
