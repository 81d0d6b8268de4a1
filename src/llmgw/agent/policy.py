"""What a model spec may make this node run: the agent's own word, checked before a start.

A spec's `env`, `env_from` and `args` run on this node as the agent's user, so some
are refused unless this agent's config allows them by name (`allow_env`, `allow_flags`):

- variables that load code into the engine: PYTHON* (PYTHONPATH, PYTHONSTARTUP, …),
  LD_* (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, …), DYLD_*, PATH, BASH_ENV, ENV, and
  libraries loaded by name (CUDA_INJECTION64_PATH, NCCL_*_PLUGIN, GCONV_PATH);
- variables the agent sets itself: CUDA_VISIBLE_DEVICES, VLLM_API_KEY, LLAMA_API_KEY;
- flags that run a model repository's own code (`--trust-remote-code`) or override what
  the agent renders (`--host`, `--port`, `--api-key`, `--api-key-file`,
  `--kv-events-config`: where the engine listens, its key, where it publishes KV
  events; `--served-model-name`, `--alias`/`-a`: the names it serves; `--lora-modules`,
  `--lora`, `--lora-scaled`: its adapters), however spelled
  (`--trust_remote_code`, `--trust-remote-code=true`, `--trust-remote`: wire/policy.py
  normalises them as the engines' parsers do);
- `env_from` references to the agent's own environment (`{env: VAR}`) unless VAR is in
  this agent's `secret_env`: those variables, and only those, are secrets specs may read.
  The spawner also withholds them from every engine's inherited environment, so each
  reaches only the engines whose spec references it, under the spec's name.

The rules live in wire/policy.py: the agent reports its policy in every heartbeat and the
controller refuses, at apply time, a spec no node would run. The agent still checks every
shard itself: a refused shard fails at once with the reason; it is never started.
"""

from __future__ import annotations

from collections.abc import Collection

from llmgw.agent.errors import AgentError
from llmgw.wire.agent import ShardSpec, env_sources
from llmgw.wire.policy import SpecPolicy

__all__ = ["SpecPolicy", "SpecRefused", "check", "policy_of"]


class SpecRefused(AgentError):
    """The spec asks for what this node's policy does not allow; the message says what."""


def policy_of(
    allow_env: Collection[str], allow_flags: Collection[str], secret_env: Collection[str] = ()
) -> SpecPolicy:
    """The default policy with this agent's exceptions (its allow_env / allow_flags) and
    the variables its specs may read (its secret_env; none by default)."""
    return SpecPolicy(
        allow_env=tuple(sorted(allow_env)),
        allow_flags=tuple(sorted(allow_flags)),
        secret_env=tuple(sorted(set(secret_env))),
    )


def check(policy: SpecPolicy, spec: ShardSpec) -> None:
    """Raise SpecRefused naming the first variable or flag that is not allowed."""
    refused = policy.refusal(
        env=spec.env,
        env_from=spec.env_from,
        args=spec.args,
        env_sources=env_sources(spec.env_from),
    )
    if refused is not None:
        raise SpecRefused(f"spec {refused[1]}")
