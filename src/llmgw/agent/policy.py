"""What a model spec may make this node run: the agent's own word, checked before a start.

A spec's `env` and `args` run on this node as the agent's user, so some are refused
unless this agent's config allows them by name (`allow_env`, `allow_flags`):

- variables that load code into the engine: PYTHON* (PYTHONPATH, PYTHONSTARTUP, …),
  LD_* (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, …), DYLD_*, and PATH;
- variables the agent sets itself: CUDA_VISIBLE_DEVICES, VLLM_API_KEY, LLAMA_API_KEY;
- flags that run a model repository's own code (`--trust-remote-code`) or override what
  the agent renders (`--host`, `--port`, `--api-key`: where the engine listens and its key).

A refused shard fails at once with the reason; it is never started.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from llmgw.agent.errors import AgentError
from llmgw.wire.agent import ShardSpec

DENIED_ENV_PREFIXES = ("PYTHON", "LD_", "DYLD_")
DENIED_ENV = frozenset(
    {"PATH", "CUDA_VISIBLE_DEVICES", "VLLM_API_KEY", "LLAMA_API_KEY", "BASH_ENV", "ENV"}
)
DENIED_FLAGS = frozenset({"--trust-remote-code", "--host", "--port", "--api-key"})


class SpecRefused(AgentError):
    """The spec asks for what this node's policy does not allow; the message says what."""


@dataclass(frozen=True, slots=True)
class SpecPolicy:
    allow_env: frozenset[str] = frozenset()
    allow_flags: frozenset[str] = frozenset()

    @classmethod
    def of(cls, allow_env: Collection[str], allow_flags: Collection[str]) -> SpecPolicy:
        return cls(frozenset(allow_env), frozenset(allow_flags))

    def check(self, spec: ShardSpec) -> None:
        """Raise SpecRefused naming the first variable or flag that is not allowed."""
        for name in sorted(spec.env):
            if name in self.allow_env:
                continue
            if name in DENIED_ENV or name.startswith(DENIED_ENV_PREFIXES):
                raise SpecRefused(
                    f"spec env {name} is not allowed on this node (the agent's allow_env)"
                )
        for i, arg in enumerate(spec.args):
            flag = arg.partition("=")[0]
            if flag in DENIED_FLAGS and flag not in self.allow_flags:
                raise SpecRefused(
                    f"spec args[{i}] {flag} is not allowed on this node (the agent's allow_flags)"
                )
