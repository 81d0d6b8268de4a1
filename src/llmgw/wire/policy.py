"""What a model spec may make a node run: the agent's policy, as the agent reports it.

The agent checks every shard against its own policy before starting it, and reports
the policy in each heartbeat (`Heartbeat.policy`) so the controller can refuse, when the
spec is applied, a spec that no node would run. Both sides call `SpecPolicy.refusal`,
so they cannot disagree on what a flag or a variable is.

Flags are compared the way the engines' parsers read them: `--trust_remote_code` is
`--trust-remote-code` (vLLM turns `_` into `-`), `--trust-remote-code=true` is the flag
with a value, argparse takes any unambiguous abbreviation (`--trust-remote`), so an
argument that is a prefix of a denied flag is refused as that flag, and vLLM reads
`--kv-events-config.endpoint X` as one key of the JSON flag `--kv-events-config`, so a
flag is what comes before its first `.`.

A spec's `env_from: {NAME: {env: VAR}}` reads VAR from the agent's own environment, so
the agent names the variables specs may read (`secret_env`); any other is refused, so a
line of YAML cannot hand an engine whatever else the agent's environment holds (a cloud
credential). File references are not limited here (secretrefs.py keeps the agent's own).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import msgspec

# Variables that load code into the engine, or that the agent sets itself. Beyond
# PYTHON*/LD_*/DYLD_*: libraries loaded by name (CUDA's injection library in every CUDA
# process, NCCL's plugins, glibc iconv's modules).
DENIED_ENV_PREFIXES: tuple[str, ...] = ("PYTHON", "LD_", "DYLD_")
DENIED_ENV: tuple[str, ...] = (
    "BASH_ENV",
    "CUDA_INJECTION32_PATH",
    "CUDA_INJECTION64_PATH",
    "CUDA_VISIBLE_DEVICES",
    "ENV",
    "GCONV_PATH",
    "LLAMA_API_KEY",
    "NCCL_NET_PLUGIN",
    "NCCL_PROFILER_PLUGIN",
    "NCCL_TUNER_PLUGIN",
    "PATH",
    "VLLM_API_KEY",
)
# Flags that run a model repository's own code, or override what the agent renders
# (llama-server's --api-key-file adds keys beside the agent's). The served names
# (`--served-model-name`, llama-server's `--alias` and its `-a`): the router sends each
# request's model as the controller named it, and an engine serving other names
# answered every one 404. The adapters' flags: vLLM keeps the last `--lora-modules`, so
# a spec's own dropped every adapter applied with `adapter_of`, which the agent still
# reported as served; llama-server's `--lora`/`--lora-scaled` files were added after the
# agent's, with no name a request could select them by.
DENIED_FLAGS: tuple[str, ...] = (
    "--alias",
    "--api-key",
    "--api-key-file",
    "--host",
    "--kv-events-config",
    "--lora",
    "--lora-modules",
    "--lora-scaled",
    "--port",
    "--served-model-name",
    "--trust-remote-code",
    "-a",
)


def normalize_flag(arg: str) -> str | None:
    """`--trust_remote_code=true` → `--trust-remote-code`, `--kv-events-config.endpoint` →
    `--kv-events-config`; a short flag (`-a`) as it is; None for what is no flag."""
    if len(arg) == 2 and arg[0] == "-" and arg[1] != "-":
        # Only as a whole argument: `-aX` is one flag with its value to argparse, but
        # a value (`-0.5`) or another flag to llama-server; none of ours is argparse's.
        return arg
    if not arg.startswith("--") or len(arg) <= 2:
        return None
    return "--" + arg[2:].partition("=")[0].partition(".")[0].replace("_", "-")


class SpecPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """One node's word on what a spec may set; the defaults are the agent's defaults."""

    denied_env: tuple[str, ...] = DENIED_ENV
    # Every variable whose name starts with one of these.
    denied_env_prefixes: tuple[str, ...] = DENIED_ENV_PREFIXES
    denied_flags: tuple[str, ...] = DENIED_FLAGS
    # Denied names this node allows all the same (the agent's allow_env / allow_flags).
    allow_env: tuple[str, ...] = ()
    allow_flags: tuple[str, ...] = ()
    # The agent's variables an `env_from` `{env: VAR}` reference may read (its
    # secret_env); None: not reported (an agent from before the list), not judged here.
    secret_env: tuple[str, ...] | None = None

    def env_refused(self, name: str) -> bool:
        if name in self.allow_env:
            return False
        return name in self.denied_env or name.startswith(self.denied_env_prefixes)

    def flag_refused(self, arg: str) -> str | None:
        """The denied flag `arg` is (or abbreviates); None when it is allowed."""
        flag = normalize_flag(arg)
        if flag is None:
            return None
        allowed = {normalize_flag(f) for f in self.allow_flags}
        for denied in self.denied_flags:
            # A short flag is no long one's abbreviation: `-a` is not `--alias`'s.
            short = not flag.startswith("--") or not denied.startswith("--")
            matches = denied == flag if short else denied.startswith(flag)
            if matches and normalize_flag(denied) not in allowed:
                return denied
        return None

    def source_refused(self, var: str) -> bool:
        """Whether an `{env: var}` reference may not read `var` of the agent's environment."""
        return self.secret_env is not None and var not in self.secret_env

    def refusal(
        self,
        *,
        env: Collection[str],
        env_from: Collection[str],
        args: Sequence[str],
        env_sources: Mapping[str, str] | None = None,
    ) -> tuple[str, str] | None:
        """(field, why) of the first variable or argument not allowed; None if all are.

        `env_sources`: the agent's variable each `{env: VAR}` reference of `env_from`
        reads, by the spec's name (file references have none). `field` is the spec's
        field path (`env.PYTHONPATH`, `env_from.LD_PRELOAD`, `env_from.HF_TOKEN.env`,
        `args[2]`); `why` reads "<what> is not allowed on this node (<setting>)".
        """
        for kind, names in (("env", env), ("env_from", env_from)):
            for name in sorted(names):
                if self.env_refused(name):
                    return (
                        f"{kind}.{name}",
                        f"{kind} {name} is not allowed on this node (the agent's allow_env)",
                    )
        sources = env_sources or {}
        for name in sorted(sources):
            var = sources[name]
            if self.source_refused(var):
                # The variable's name only: its value is the agent's, and may be a secret.
                return (
                    f"env_from.{name}.env",
                    f"env_from {name} reads the agent's variable {var}, which is not "
                    "allowed on this node (the agent's secret_env)",
                )
        for i, arg in enumerate(args):
            denied = self.flag_refused(arg)
            if denied is None:
                continue
            written = arg.partition("=")[0]
            shown = denied if written == denied else f"{written} (read as {denied})"
            return (
                f"args[{i}]",
                f"args[{i}] {shown} is not allowed on this node (the agent's allow_flags)",
            )
        return None
