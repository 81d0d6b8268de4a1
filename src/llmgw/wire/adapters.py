"""LoRA adapters as models: `{name, adapter_of: BASE, source: PATH}` (docs/sleep-and-adapters.md).

An adapter is applied like a model (`ctl apply -f`, `POST /admin/models`) but has no
replicas of its own: it is served by its base's replicas, whose engines load it. A
spec entry is an adapter when it has `adapter_of`; everything else about it (engine,
GPUs, replicas) is its base's.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

from llmgw.wire.models import Name
from llmgw.wire.names import model_name_problem
from llmgw.wire.osstrings import char_at, control_at

# Engines that serve LoRA adapters, and how (the agent renders it). Why not the others:
ADAPTER_ENGINES: tuple[str, ...] = ("vllm", "llamacpp", "sim")
ADAPTERS_REFUSED: dict[str, str] = {
    "sglang": "SGLang's --lora-paths are not rendered by the agent here",
}


class AdapterSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A LoRA adapter served as a model by its base's replicas."""

    # Served name: what clients put in the request's "model".
    name: Name
    # The base model's name (not an alias, not another adapter).
    adapter_of: Name
    # Where the engine reads the adapter: a directory (vLLM, sim) or a GGUF file
    # (llama.cpp), as a path on the nodes that run the base.
    source: Annotated[str, msgspec.Meta(pattern=r"\S", max_length=4096)]

    def __post_init__(self) -> None:
        if self.name == self.adapter_of:
            raise ValueError("adapter_of must name another model than the adapter itself")


def names_problem(spec: AdapterSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with an adapter's name or its base's (wire.names); None
    when nothing is. Checked where a spec comes in, as wire.models.names_problem."""
    for field, name in (("name", spec.name), ("adapter_of", spec.adapter_of)):
        problem = model_name_problem(name)
        if problem is not None:
            return field, problem
    return None


def is_adapter(raw: Any) -> bool:
    """Whether a raw spec entry (decoded JSON or YAML) is an adapter's: it has `adapter_of`."""
    return isinstance(raw, dict) and "adapter_of" in raw


def adapter_engine_problem(engine: str) -> str | None:
    """Why a base on `engine` cannot serve adapters; None when it can."""
    if engine in ADAPTER_ENGINES:
        return None
    why = ADAPTERS_REFUSED.get(engine, "the agent does not render its LoRA flags")
    return f"engine {engine} cannot serve LoRA adapters: {why} (engines that can: " + (
        ", ".join(ADAPTER_ENGINES) + ")"
    )


# What vLLM reads to allow /v1/load_lora_adapter and /v1/unload_lora_adapter.
VLLM_RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"


def loads_at_run_time(engine: str, env: dict[str, str]) -> bool:
    """Whether a base's engine takes adapters while it runs (else only at start).

    The sim-engine always does; vLLM when its spec sets VLLM_ALLOW_RUNTIME_LORA_UPDATING
    (vLLM reads "1" and "true"); llama-server loads its `--lora` files at start only.
    Where it does not, the controller rolls the base's replicas over when its adapters
    change, and the agent renders the list as it is at each start.
    """
    if engine == "sim":
        return True
    if engine == "vllm":
        return env.get(VLLM_RUNTIME_LORA_ENV, "").strip().lower() in ("1", "true")
    return False


def source_problem(path: str) -> str | None:
    """Why no engine can be given `path` as an adapter's source; None when one can.

    The path rule of wire.osstrings: with a NUL every new replica of the base failed to
    start. No `..` part, as a model's source (wire.models.launch_problem says why).
    """
    at = control_at(path)
    if at is not None:
        return f"holds a control character ({char_at(path, at)}); a path has none"
    if ".." in path.split("/"):
        return (
            "has a '..' part; give an absolute path on the nodes that run the base "
            "(or, for vLLM, a repository id)"
        )
    return None


def adapter_problem(spec: AdapterSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with an adapter spec by the rules that need no base (the
    controller's apply and `ctl apply` call this one); None when none is."""
    wrong = names_problem(spec)
    if wrong is not None:
        return wrong
    bad = source_problem(spec.source)
    return None if bad is None else ("source", bad)


def llamacpp_path_problem(path: str) -> str | None:
    """Why llama-server cannot be given `path` in its `--lora-scaled FILE:SCALE,...`
    list; None when it can."""
    if "," in path or ":" in path:
        return (
            f"source {path!r}: llama.cpp takes adapter files as a list of FILE:SCALE, "
            "so a path with ',' or ':' cannot be given"
        )
    return None
