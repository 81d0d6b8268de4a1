"""Engine command lines, one pure function per engine (docs/agent.md lists them).

`render(spec, port=…, commands=…)` → LaunchPlan: argv, the environment to add,
and the path that answers 200 once the engine is ready (None when the process
serves no HTTP, see vLLM below). The model's own `args` come last, so an
operator can override any flag rendered here (argparse keeps the last value).
`CUDA_VISIBLE_DEVICES` is the shard's GPU indices, comma-joined, and the
model's `env` is added on top.

Every engine listens on `host` (the agent's advertised address, never
0.0.0.0) and needs `api_key` on its OpenAI routes: vLLM and the sim-engine
read it from `VLLM_API_KEY` (vLLM's own variable, so the key is not in the
command line every local user can read in `ps`), llama-server from
`LLAMA_API_KEY` (its `--api-key`'s variable; it leaves /health and /v1/models
open but wants the key on /metrics too, so routers send it on scrapes), and
SGLang only takes `--api-key`. The agent's policy (policy.py) keeps a spec from overriding
`--host`, `--port` or the key, which the model's `args` could otherwise do.

Flags checked against the engines' current documentation and source, and by
tests/integration/test_engine_flags.py against the flags the pinned vLLM and
SGLang releases really define (llmgw.testing.engineflags):

vLLM (`vllm serve`): the model is positional; `--served-model-name` takes every
name. Multi-node without Ray uses the multiprocessing executor with
`--nnodes`, `--node-rank`, `--master-addr`, `--master-port` (ParallelConfig
fields `nnodes`, `node_rank`, `master_addr`, `master_port` in
vllm/config/parallel.py: "To use mp you must also set nnodes"), and every
rank but 0 runs `--headless`: no API server, so no /health to probe (such a
shard is ready while its process lives). vLLM's guide
(docs/serving/parallelism_scaling.md, "Running vLLM with MultiProcessing")
puts tensor parallelism inside a node and pipeline parallelism across nodes:
`--tensor-parallel-size <GPUs per node> --pipeline-parallel-size <nodes>`. The
Ray path (`--distributed-executor-backend ray` on a pre-built Ray cluster)
needs a Ray cluster that the agent does not run, so it is not rendered.

SGLang (`python -m sglang.launch_server`): `--model-path`, one
`--served-model-name` (a single string in SGLang, so aliases are the router's
business), `--tp-size` is the TOTAL tensor-parallel size across nodes (SGLang's
multi-node guide: two 8-GPU nodes run `--tp 16`; `--tp` only works as argparse's
prefix match of `--tp-size`, the real flag, so the full name is rendered), and multi-node adds
`--nnodes`, `--node-rank`, `--dist-init-addr HOST:PORT`. Ranks above 0 start a
small health server on `--host/--port` (sglang `launch_dummy_health_check_server`),
so every rank is probed on /health.

llama.cpp (`llama-server`, tools/server in llama.cpp; flags from common/arg.cpp):
`-m FILE` is the GGUF file (the spec's `source`), `--alias` takes the served
names comma-separated, `--metrics` turns on /metrics (`llamacpp:` names),
`--parallel` is the number of slots (concurrent sequences) and `--ctx-size` the
KV cache in tokens, shared by every slot with `--kv-unified` (without it each
slot gets ctx-size / parallel). Prompt caching is on by default; `--cache-reuse
N` also reuses cached chunks of at least N tokens that moved (KV shifting).
`--threads` is the number of inventory units the shard holds: on a node that
offers CPU units (`--gpus 2xCPU-16G`, docs/llamacpp.md) each unit is a thread;
GPU layers are llama.cpp's default ("auto": all that fit, on a GPU build).
/health answers 503 while the model loads and 200 once it serves. llama.cpp
has no multi-node mode here (its RPC backend is not rendered), so a llamacpp
shard of a multi-node replica is refused. Defaults (slots, context) are below;
the spec's `args` override them (llama.cpp keeps the last value).

KV events (a shard with `kv_events`, docs/routing.md "Precise mode"): vLLM's
`--kv-events-config` takes a JSON KVEventsConfig (vllm/config/kv_events.py:
`enable_kv_cache_events`, `publisher` "zmq", `endpoint`, `replay_endpoint`,
`topic`, with `buffer_steps`, `hwm` left at their defaults). vLLM's ZMQ publisher
binds its PUB `endpoint` only when the address holds a wildcard (`*`) and
connects to any other (vllm/distributed/kv_events.py), so vLLM's is
`tcp://*:<port>` (every interface, unlike its HTTP port); its replay ROUTER
socket always binds, so that one is on the advertised address. The sim-engine
binds whatever it is given, so both of its are on the advertised address. The
topic is the replica id: a router subscribed to a port that an engine of
another replica took over since hears nothing from it.

LoRA adapters (a shard with `adapters`): agent/adapters.py renders their flags.

Priority scheduling: vLLM and the sim-engine run `--scheduling-policy priority`, so
their waiting queue (rank 0's: ranks above it schedule nothing) is ordered by each
request's `priority` field (lower first, then
arrival; default 0, so a request without one waits as under FCFS). The router writes
a key's band there (docs/tenants.md, "Engine priority"). A spec's `args` may set
`--scheduling-policy fcfs`; the shard then reports no priority scheduling and the
router sends no `priority` field (vLLM refuses one other than 0 under FCFS).

sim-engine (`llmgw sim-engine`): the same shape as vLLM. A multi-node
replica's ranks above 0 also run a sim-engine: it serves /health, so the agent
supervises every rank the same way, and the router only ever sends traffic to
rank 0 (the replica's endpoint).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from llmgw.agent.adapters import start_args
from llmgw.agent.vllmguard import GUARD_DIR, GUARD_MIDDLEWARE
from llmgw.wire.agent import EngineKind, ShardSpec
from llmgw.wire.policy import normalize_flag

DEFAULT_COMMANDS: Mapping[EngineKind, tuple[str, ...]] = {
    "vllm": ("vllm", "serve"),
    "sglang": ("python3", "-m", "sglang.launch_server"),
    # LLMGW_LLAMA_SERVER: the binary scripts/build-llama-server printed.
    "llamacpp": (os.environ.get("LLMGW_LLAMA_SERVER") or "llama-server",),
    "sim": (sys.executable, "-m", "llmgw", "sim-engine"),
}

# The engines started with `--scheduling-policy priority` (module docstring).
PRIORITY_ENGINES: frozenset[EngineKind] = frozenset({"vllm", "sim"})

# llama-server defaults; the spec's args come later and win.
LLAMACPP_SLOTS = 4
LLAMACPP_CTX_TOKENS = 16384
LLAMACPP_CACHE_REUSE_TOKENS = 256


def parse_engine_bins(items: Mapping[str, str]) -> dict[EngineKind, tuple[str, ...]]:
    """`{"vllm": "/opt/vllm/bin/vllm serve"}` → argv prefixes over the defaults.

    Each value is split like a shell would (shlex). Raises ValueError for an
    engine name that does not exist or an empty command.
    """
    out: dict[EngineKind, tuple[str, ...]] = dict(DEFAULT_COMMANDS)
    for name, command in items.items():
        if name not in DEFAULT_COMMANDS:
            raise ValueError(f"unknown engine {name!r} (expected vllm, sglang, llamacpp or sim)")
        argv = tuple(shlex.split(command))
        if not argv:
            raise ValueError(f"empty command for engine {name!r}")
        out[name] = argv  # type: ignore[index]  # checked against DEFAULT_COMMANDS above
    return out


@dataclass(frozen=True, slots=True)
class KVEventPorts:
    """The ports the agent gave a shard's KV-event publisher (ports.py)."""

    publish: int
    replay: int


def kv_events_topic(spec: ShardSpec) -> str:
    """The publisher's topic: the replica's id (the module docstring says why)."""
    return spec.replica_id


def kv_events_config(spec: ShardSpec, ports: KVEventPorts, host: str) -> str:
    """`--kv-events-config`'s JSON for this shard's engine (module docstring)."""
    pub_host = "*" if spec.engine == "vllm" else host
    return json.dumps(
        {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://{_zmq_host(pub_host)}:{ports.publish}",
            "replay_endpoint": f"tcp://{_zmq_host(host)}:{ports.replay}",
            "topic": kv_events_topic(spec),
        },
        separators=(",", ":"),
    )


def _zmq_host(host: str) -> str:
    """An IPv6 literal in brackets, as ZeroMQ's tcp:// addresses want it."""
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    argv: tuple[str, ...]
    # Added to the agent's own environment.
    env: Mapping[str, str] = field(default_factory=dict)
    # GET this on 127.0.0.1:<port> → 200 means ready; None: ready while alive.
    health_path: str | None = "/health"
    # The engine orders its queue by the request's `priority` field (`argv`'s last
    # `--scheduling-policy` is "priority").
    priority_scheduling: bool = False


# vLLM's switch for its development routes (sleep mode's among them).
DEV_MODE_ENV = "VLLM_SERVER_DEV_MODE"

# The flag whose value the agent's logs and the engine log's header never show.
SECRET_FLAGS = frozenset({"--api-key"})
# The variable each engine reads its key from (llama-server: `--api-key`'s env).
KEY_ENV: Mapping[EngineKind, str] = {
    "vllm": "VLLM_API_KEY",
    "sim": "VLLM_API_KEY",
    "llamacpp": "LLAMA_API_KEY",
}


def render(
    spec: ShardSpec,
    *,
    port: int,
    host: str,
    api_key: str = "",
    env: Mapping[str, str] | None = None,
    commands: Mapping[EngineKind, tuple[str, ...]] = DEFAULT_COMMANDS,
    kv_events: KVEventPorts | None = None,
) -> LaunchPlan:
    """The command line and environment for one shard (module docstring has the flags).

    `env` is the spec's environment as the agent resolved it (`env` plus the
    `env_from` references); default `spec.env`. `kv_events`: the publisher's ports,
    for a shard whose spec asks for them (`spec.kv_events`; vllm and sim only).
    """
    if spec.world_size > 1 and (spec.master_addr is None or spec.master_port is None):
        raise ValueError(
            f"shard {spec.replica_id}/{spec.rank}: a multi-node shard needs master_addr "
            "and master_port"
        )
    if spec.model.startswith("-"):
        # The controller refuses such a source at apply; one stored before it did would
        # reach vLLM's positional as a flag (`--trust-remote-code`) past the policy.
        raise ValueError(
            f"shard {spec.replica_id}/{spec.rank}: model {spec.model[:100]!r} begins with "
            "'-', which the engine would read as a flag"
        )
    prefix = commands.get(spec.engine, DEFAULT_COMMANDS[spec.engine])
    if spec.engine == "vllm":
        body, health = _vllm(spec, port, host)
    elif spec.engine == "sglang":
        body, health = _sglang(spec, port, host)
        if api_key:
            body += ["--api-key", api_key]
    elif spec.engine == "llamacpp":
        body, health = _llamacpp(spec, port, host)
    else:
        body, health = _sim(spec, port, host)
    if kv_events is not None:
        if spec.engine not in ("vllm", "sim"):
            raise ValueError(
                f"shard {spec.replica_id}/{spec.rank}: engine {spec.engine} publishes no "
                "KV events the router follows (vllm and sim do)"
            )
        body += ["--kv-events-config", kv_events_config(spec, kv_events, host)]
    if spec.engine in PRIORITY_ENGINES and spec.rank == 0:
        body += ["--scheduling-policy", "priority"]
    body += start_args(spec, spec.env if env is None else env)
    out = {
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in spec.gpu_indices),
        **(spec.env if env is None else env),
    }
    if spec.sleep_mode and spec.engine in ("vllm", "sim"):
        body += sleep_args(spec)
        out.update(sleep_env(spec, out))
    elif spec.engine == "vllm" and dev_mode(out):
        # The spec's own dev mode opens the same routes as sleep mode's: the same guard.
        # Without it they answered anyone who reached the port, the key unasked.
        body += ["--middleware", GUARD_MIDDLEWARE]
        out["PYTHONPATH"] = _guard_path(out)
    if api_key and spec.engine != "sglang":
        out[KEY_ENV[spec.engine]] = api_key
    argv = (*prefix, *body, *spec.args)
    return LaunchPlan(
        argv=argv,
        env=out,
        health_path=health,
        priority_scheduling=scheduling_policy(argv) == "priority",
    )


def scheduling_policy(argv: tuple[str, ...] | list[str]) -> str:
    """The value of the last `--scheduling-policy` in `argv` (argparse keeps the last;
    vLLM also reads `--scheduling_policy`, as `normalize_flag` spells it out); "" when
    there is none."""
    out = ""
    for i, arg in enumerate(argv):
        if normalize_flag(arg) != "--scheduling-policy":
            continue
        if "=" in arg:
            out = arg.partition("=")[2]
        elif i + 1 < len(argv):
            out = argv[i + 1]
    return out


def sleep_args(spec: ShardSpec) -> list[str]:
    """Flags of a shard that may sleep: vLLM's sleep mode, and for vLLM the guard that
    keeps its development routes behind the engine key (agent/vllmguard)."""
    if spec.engine == "vllm":
        return ["--enable-sleep-mode", "--middleware", GUARD_MIDDLEWARE]
    return ["--enable-sleep-mode"]


def sleep_env(spec: ShardSpec, env: Mapping[str, str]) -> dict[str, str]:
    """Environment of a shard that may sleep: the development routes on, and for vLLM the
    guard's folder on PYTHONPATH (ahead of any the spec set)."""
    out = {DEV_MODE_ENV: "1"}
    if spec.engine == "vllm":
        out["PYTHONPATH"] = _guard_path(env)
    return out


def dev_mode(env: Mapping[str, str]) -> bool:
    """Whether vLLM started with `env` serves its development routes: it reads
    VLLM_SERVER_DEV_MODE as `bool(int(value))`; a value that is no integer is taken as on
    (vLLM then fails to start, guarded or not)."""
    value = env.get(DEV_MODE_ENV, "").strip()
    if not value:
        return False
    try:
        return int(value) != 0
    except ValueError:
        return True


def _guard_path(env: Mapping[str, str]) -> str:
    """PYTHONPATH with the guard's folder ahead of any the spec set."""
    path = env.get("PYTHONPATH")
    return f"{GUARD_DIR}:{path}" if path else str(GUARD_DIR)


def shown_argv(argv: tuple[str, ...] | list[str]) -> list[str]:
    """argv for a log: the value after a secret flag (`--api-key`) replaced by `***`."""
    out: list[str] = []
    hide = False
    for arg in argv:
        if hide:
            out.append("***")
            hide = False
        elif arg in SECRET_FLAGS:
            out.append(arg)
            hide = True
        elif arg.partition("=")[0] in SECRET_FLAGS and "=" in arg:
            out.append(arg.partition("=")[0] + "=***")
        else:
            out.append(arg)
    return out


def _tp(spec: ShardSpec) -> int:
    return max(1, len(spec.gpu_indices))


def _vllm(spec: ShardSpec, port: int, host: str) -> tuple[list[str], str | None]:
    argv = [
        spec.model,
        "--served-model-name",
        *spec.served_names,
        "--port",
        str(port),
        "--host",
        host,
        "--tensor-parallel-size",
        str(_tp(spec)),
    ]
    if spec.world_size == 1:
        return argv, "/health"
    argv += [
        "--pipeline-parallel-size",
        str(spec.world_size),
        "--distributed-executor-backend",
        "mp",
        "--nnodes",
        str(spec.world_size),
        "--node-rank",
        str(spec.rank),
        "--master-addr",
        str(spec.master_addr),
        "--master-port",
        str(spec.master_port),
    ]
    if spec.rank > 0:
        return [*argv, "--headless"], None
    return argv, "/health"


def _sglang(spec: ShardSpec, port: int, host: str) -> tuple[list[str], str | None]:
    argv = [
        "--model-path",
        spec.model,
        "--served-model-name",
        spec.served_names[0] if spec.served_names else spec.model,
        "--port",
        str(port),
        "--host",
        host,
        "--tp-size",
        str(_tp(spec) * spec.world_size),
    ]
    if spec.world_size > 1:
        argv += [
            "--nnodes",
            str(spec.world_size),
            "--node-rank",
            str(spec.rank),
            "--dist-init-addr",
            f"{spec.master_addr}:{spec.master_port}",
        ]
    return argv, "/health"


def _llamacpp(spec: ShardSpec, port: int, host: str) -> tuple[list[str], str | None]:
    if spec.world_size > 1:
        raise ValueError(
            f"shard {spec.replica_id}/{spec.rank}: llamacpp engines run on one node "
            f"(the replica asks for {spec.world_size})"
        )
    argv = [
        "--model",
        spec.model,
        "--alias",
        ",".join(spec.served_names or (spec.model,)),
        "--host",
        host,
        "--port",
        str(port),
        "--threads",
        str(_tp(spec)),
        "--parallel",
        str(LLAMACPP_SLOTS),
        "--ctx-size",
        str(LLAMACPP_CTX_TOKENS),
        "--kv-unified",
        "--metrics",
        "--cache-reuse",
        str(LLAMACPP_CACHE_REUSE_TOKENS),
        "--no-webui",
    ]
    return argv, "/health"


def _sim(spec: ShardSpec, port: int, host: str) -> tuple[list[str], str | None]:
    argv = [
        "--port",
        str(port),
        "--host",
        host,
        "--model",
        spec.model,
        "--served-model-name",
        *(spec.served_names or (spec.model,)),
        "--tensor-parallel-size",
        str(_tp(spec)),
    ]
    return argv, "/health"
