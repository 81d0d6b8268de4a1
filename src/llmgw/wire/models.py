"""Model specs: what an operator applies (`ctl apply -f`, `POST /admin/models`)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

import msgspec

from llmgw.wire.agent import ENV_NAME_PATTERN, EngineKind, EnvName, SecretRef
from llmgw.wire.names import (
    MODEL_NAME_PATTERN,
    MODEL_NAME_RULE,
    STORED_MODEL_NAME_PATTERN,
    label_problem,
    model_name_problem,
)
from llmgw.wire.osstrings import (
    MAX_LAUNCH_BYTES,
    MAX_STRING_BYTES,
    char_at,
    control_at,
    nul_at,
    os_bytes,
)

# The documented sets live in wire.names; these names stay for their importers. A spec
# is decoded with the stored set (the stored fleet is read with this type) and its names
# are held to the full rule where it comes in (names_problem).
NAME_PATTERN = MODEL_NAME_PATTERN
NAME_RULE = MODEL_NAME_RULE
Name = Annotated[str, msgspec.Meta(pattern=STORED_MODEL_NAME_PATTERN)]

# Engines whose KV-event publisher the agent starts (docs/routing.md, "Precise mode"):
# vLLM's ZeroMQ publisher and the sim-engine's copy of it. Why not the others:
KV_EVENTS_ENGINES: tuple[EngineKind, ...] = ("vllm", "sim")
KV_EVENTS_REFUSED: dict[str, str] = {
    "llamacpp": "llama-server publishes no KV-cache events",
    "sglang": (
        "SGLang's KV events (per radix-cache page, page size 1 by default) are not "
        "rendered or checked against the router here"
    ),
}


# Engines that can sleep instead of stopping (docs/sleep-and-adapters.md): vLLM's
# sleep mode and the sim-engine's copy of it. Why not the others:
SLEEP_ENGINES: tuple[EngineKind, ...] = ("vllm", "sim")
SLEEP_REFUSED: dict[str, str] = {
    "llamacpp": "llama-server cannot sleep (it has no way to free its GPU memory and keep running)",
    "sglang": "SGLang's memory release and resume routes are not driven by the agent here",
}


class RoutingSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How routers route to this model's replicas (docs/routing.md)."""

    # Precise mode: the agent starts each replica's engine with its KV-event publisher
    # (`--kv-events-config`) and routers follow what the engine caches instead of
    # guessing. vllm and sim engines only.
    kv_events: bool = False
    # How routers tokenize prompts in precise mode: "sim" (the sim-engine's tokenizer,
    # the default for sim engines) or "hf:<path to tokenizer.json>", a path on the
    # routers' hosts (needed for vllm). "": the engine's default.
    tokenizer: str = ""


class ModelSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Served name: what clients put in the request's "model".
    name: Name
    engine: EngineKind
    # Acceptable GPU classes, e.g. ["H100-80G", "H200-141G"]; at least one.
    gpu_classes: Annotated[
        tuple[Annotated[str, msgspec.Meta(pattern=r"\S")], ...], msgspec.Meta(min_length=1)
    ]
    # Other names clients may use for this model.
    aliases: tuple[Name, ...] = ()
    # Tensor parallel width: GPUs per shard, all on one node.
    gpus_per_node: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    # Shards per replica (multi-node); all on one fabric.
    nodes: Annotated[int, msgspec.Meta(ge=1, le=64)] = 1
    min_replicas: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 1
    max_replicas: Annotated[int, msgspec.Meta(ge=0, le=10_000)] = 1
    # A replica known idle this long may be drained to make room for a model that
    # cannot be placed (docs/controller.md, "Eviction"). Unknown idleness never counts.
    idle_timeout_s: Annotated[float, msgspec.Meta(ge=0)] = 600.0
    # Higher keeps its cards longer under eviction pressure.
    priority: int = 0
    # Idle replicas sleep instead of stopping when their cards are needed, and a
    # sleeping replica is woken rather than a new one started (docs/sleep-and-adapters.md).
    sleep_mode: bool = False
    # 1: the weights move to host memory; 2: they are dropped (a slower wake). None:
    # the controller picks 1 when the node's host memory holds the weights, else 2.
    sleep_level: Literal[1, 2] | None = None
    # The weights' size in GB: host memory a level-1 sleep takes. None: not given.
    weights_gb: Annotated[float, msgspec.Meta(gt=0)] | None = None
    # With sleep_mode: a replica known idle this long may be put to sleep for another
    # model, or ahead of another model's sleeper on its cards (docs/sleep-and-adapters.md),
    # since waking it again costs seconds, not a cold start. None: idle_timeout_s.
    sleep_after_s: Annotated[float, msgspec.Meta(ge=0)] | None = None

    @property
    def evictable_after_s(self) -> float:
        """Known idleness after which eviction may take a replica of this model."""
        if self.sleep_mode and self.sleep_after_s is not None:
            return self.sleep_after_s
        return self.idle_timeout_s

    # Engine model path/id when it differs from the served name (vLLM's positional).
    source: str | None = None
    args: tuple[str, ...] = ()
    # Stored in the database and shown by ctl: never put a secret here.
    env: dict[str, str] = {}
    # Secrets: each variable's value is read by the agent on its node, from its own
    # environment or a file, when it starts the engine; only the reference is stored.
    env_from: dict[EnvName, SecretRef] = {}
    routing: RoutingSpec = RoutingSpec()

    def __post_init__(self) -> None:
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})"
            )
        if self.name in self.aliases:
            raise ValueError("aliases must not repeat the model's name")
        if self.engine == "llamacpp" and self.nodes > 1:
            raise ValueError("llamacpp engines run on one node: nodes must be 1")
        both = sorted(set(self.env) & set(self.env_from))
        if both:
            raise ValueError(
                f"env_from: {', '.join(both)} also set in env (a variable comes from one of them)"
            )

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)

    @property
    def gpus_per_replica(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def kv_tokenizer(self) -> str:
        """The tokenizer routers use in precise mode: the spec's, else the engine's own."""
        if self.routing.tokenizer:
            return self.routing.tokenizer
        return "sim" if self.engine == "sim" else ""


class ScaleRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """`POST /admin/models/{name}/scale`: UNSET leaves a bound as it is."""

    min_replicas: Annotated[int, msgspec.Meta(ge=0, le=10_000)] | msgspec.UnsetType = msgspec.UNSET
    max_replicas: Annotated[int, msgspec.Meta(ge=0, le=10_000)] | msgspec.UnsetType = msgspec.UNSET


def env_from_problem(raw: Any) -> tuple[str, str] | None:
    """(field, what is wrong) with a raw spec's `env_from`, naming the variable.

    Checked before the spec is decoded (by the controller and by `ctl apply`): msgspec
    would say `env_from[...]`, and the operator needs to know which reference is wrong.
    None when nothing is (or when `env_from` is not a mapping at all, which the decoder
    says).
    """
    refs = raw.get("env_from") if isinstance(raw, dict) else None
    if not isinstance(refs, dict):
        return None
    for name, ref in refs.items():
        field = f"env_from.{name}"
        if not isinstance(name, str) or not re.fullmatch(ENV_NAME_PATTERN, name):
            return field, ("not a variable name (letters, digits and _, not starting with a digit)")
        if not isinstance(ref, dict):
            return field, "expected a reference: {env: VARIABLE} or {file: /absolute/path}"
        try:
            msgspec.convert(ref, SecretRef)
        except msgspec.ValidationError as exc:
            msg = str(exc)
            if "matching regex '^/'" in msg:
                return f"{field}.file", "must be an absolute path on the agent's node"
            if "at `$.env`" in msg:
                return f"{field}.env", "not a variable name"
            return field, msg.split(" - at `", 1)[0]
    return None


def names_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with a spec's served names or the GPU classes it asks for
    (wire.names); None when nothing is. A class no agent can report would only make the
    spec unplaceable."""
    named = [("name", spec.name)] + [(f"aliases[{i}]", a) for i, a in enumerate(spec.aliases)]
    for field, name in named:
        problem = model_name_problem(name)
        if problem is not None:
            return field, problem
    for i, cls in enumerate(spec.gpu_classes):
        problem = label_problem(cls)
        if problem is not None:
            return f"gpu_classes[{i}]", problem
    return None


_NO_NUL = "no command line or environment can pass one"
_NO_CONTROL = "a path has none"
# The source is the engine's model argument, vLLM's first (positional) one: one beginning
# with '-' was read as a flag there, so `source: --trust-remote-code` passed the policy
# that refuses that flag in `args`.
_FLAG_LIKE = (
    "begins with '-', which an engine would read as a flag; write a relative path as ./-name"
)
# A `..` part is never in a hub repository id (the hub refuses one), and an absolute path
# says where without it: one was a path relative to wherever the agent was started.
_DOT_DOT = "has a '..' part; give a repository id (org/name) or an absolute path on the nodes"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)


def launch_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with a string the OS would be handed for this spec; None
    when nothing is.

    What the agent puts in the engine's command line and environment may hold no NUL,
    and a path no control character (wire.osstrings says why); a variable's name is a
    variable name (`env_from`'s rule: the OS reads `=` as the end of the name, and a
    line end in one forged lines wherever names are listed); the source does not begin
    with '-' (an engine's flag) nor has a `..` part; and no string, nor all of them
    together, is larger than `execve` takes. Routers open the path of
    `routing.tokenizer`; served names are already in the name set. Checked where a spec
    comes in, as `routing_problem`. The refusal says where the character is rather than
    repeating the string: an argument may be megabytes.
    """
    paths = [("source", spec.source or "")]
    paths += [(f"env_from.{n}.file", ref.file or "") for n, ref in spec.env_from.items()]
    paths.append(("routing.tokenizer", spec.routing.tokenizer))
    for field, path in paths:
        at = control_at(path)
        if at is not None:
            return field, f"holds a control character ({char_at(path, at)}); {_NO_CONTROL}"
    if (spec.source or "").startswith("-"):
        return "source", _FLAG_LIKE
    if ".." in (spec.source or "").split("/"):
        return "source", _DOT_DOT
    for i, arg in enumerate(spec.args):
        at = nul_at(arg)
        if at is not None:
            return f"args[{i}]", f"holds a NUL ({char_at(arg, at)}); {_NO_NUL}"
    return _env_problem(spec.env) or _size_problem(spec)


def _env_problem(env: dict[str, str]) -> tuple[str, str] | None:
    for name, value in env.items():
        if not name:
            # The engine would get `=value` in its environment: nothing can read it by name.
            return "env", "a variable name must not be empty"
        if not _ENV_NAME.fullmatch(name):
            shown = repr(name[:64]) + ("..." if len(name) > 64 else "")
            return "env", (
                f"{shown} is not a variable name (letters, digits and _, not starting "
                f"with a digit; a NUL, '=' or a line end cannot be in one)"
            )
        at = nul_at(value)
        if at is not None:
            return f"env.{name}", f"holds a NUL ({char_at(value, at)}); {_NO_NUL}"
    return None


def _size_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """The first argument or variable larger than `execve` takes, or all of them together
    (wire.osstrings' sizes)."""
    total = 0
    sized = [(f"args[{i}]", os_bytes(a)) for i, a in enumerate(spec.args)]
    sized += [(f"env.{n}", os_bytes(f"{n}={v}")) for n, v in spec.env.items()]
    for field, size in sized:
        if size > MAX_STRING_BYTES:
            return field, (
                f"is {size} bytes; the OS takes at most {MAX_STRING_BYTES} in one "
                "argument or variable (read a large value from a file instead)"
            )
        total += size
    if total > MAX_LAUNCH_BYTES:
        return "args", (
            f"args and env take {total} bytes together; at most {MAX_LAUNCH_BYTES} are "
            "left to a spec of what the OS takes for a command line and its environment"
        )
    return None


# Bounds beyond the type's, checked where a spec comes in (as `routing_problem`), so a
# stored spec from before them stays readable. A priority is compared, not counted: a
# billion either way orders any fleet, and beyond it a number only misleads (2**64 in
# the endpoint list's JSON, which not every reader's integer holds). Seconds past about
# 31 years and weights past a petabyte are mistakes (a unit, an exponent): in sums and
# products with other figures they reached infinity, and a wait of 10**300 s was shown.
PRIORITY_LIMIT = 1_000_000_000
MAX_SECONDS = 1e9
MAX_WEIGHTS_GB = 1e6


def bounds_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with a number beyond its bound; None when none is."""
    if not -PRIORITY_LIMIT <= spec.priority <= PRIORITY_LIMIT:
        digits = len(str(abs(spec.priority)))
        shown = spec.priority if digits <= 20 else f"a number of {digits} digits"
        return "priority", f"must be within -{PRIORITY_LIMIT}..{PRIORITY_LIMIT}, got {shown}"
    for field, value in (
        ("idle_timeout_s", spec.idle_timeout_s),
        ("sleep_after_s", spec.sleep_after_s),
    ):
        if value is not None and value > MAX_SECONDS:
            return field, f"must be at most {MAX_SECONDS:g} s (about 31 years), got {value:g}"
    if spec.weights_gb is not None and spec.weights_gb > MAX_WEIGHTS_GB:
        return "weights_gb", f"must be at most {MAX_WEIGHTS_GB:g}, got {spec.weights_gb:g}"
    return None


def spec_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with a decoded spec, by every rule checked where a spec
    comes in (the controller's apply and `ctl apply` call this one); None when none is."""
    return (
        names_problem(spec)
        or bounds_problem(spec)
        or sleep_problem(spec)
        or routing_problem(spec)
        or launch_problem(spec)
    )


def sleep_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with a spec's sleep settings; None when nothing is.

    Checked where a spec comes in, as `routing_problem`.
    """
    if spec.sleep_level is not None and not spec.sleep_mode:
        return "sleep_level", "only used with sleep_mode: true"
    if spec.sleep_after_s is not None and not spec.sleep_mode:
        return "sleep_after_s", "only used with sleep_mode: true"
    if spec.sleep_mode and spec.engine not in SLEEP_ENGINES:
        why = SLEEP_REFUSED.get(spec.engine, "it has no sleep mode")
        return "sleep_mode", (
            f"engine {spec.engine} cannot sleep: {why} (engines that can: "
            f"{', '.join(SLEEP_ENGINES)}); leave sleep_mode out and idle replicas are stopped"
        )
    return None


def routing_problem(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with a spec's `routing`; None when nothing is.

    Checked where a spec comes in (the controller's apply, `ctl apply`), not when a
    stored spec is read, so a rule that changes never makes a stored spec unreadable.
    """
    r = spec.routing
    tok = r.tokenizer
    if tok and tok != "sim" and not (tok.startswith("hf:") and len(tok) > 3):
        return "routing.tokenizer", (
            f"{tok!r}: expected 'sim' or 'hf:<path to tokenizer.json on the routers' hosts>'"
        )
    if tok and not r.kv_events:
        return "routing.tokenizer", "only used with kv_events: true"
    if not r.kv_events:
        return None
    if spec.engine not in KV_EVENTS_ENGINES:
        why = KV_EVENTS_REFUSED.get(spec.engine, "it publishes no KV-cache events")
        return "routing.kv_events", (
            f"engine {spec.engine} cannot be followed in precise mode: {why} "
            f"(engines that can: {', '.join(KV_EVENTS_ENGINES)})"
        )
    if spec.engine == "sim" and tok not in ("", "sim"):
        return "routing.tokenizer", "a sim engine tokenizes with 'sim' (or leave it out)"
    if spec.engine == "vllm" and not tok.startswith("hf:"):
        return "routing.tokenizer", (
            "a vllm engine needs its model's tokenizer for precise mode: "
            "'hf:<path to tokenizer.json on the routers' hosts>'"
        )
    return None
