"""A spec's `env_from`: secret values read on this node, just before an engine starts.

The controller only ever holds the reference (`{env: NAME}` or `{file: /path}`); the
value is read here and goes to one place, the engine's environment. It is never written
to the state file (which keeps the spec, i.e. the reference), never logged (the engine
log's header names variables only), and masked in a failed engine's log tail before that
leaves the node.

Two references are refused even though the agent could read them: the agent's own
credentials (`LLMGW_*_TOKEN` variables, its token file, its state folder, which holds the
engines' keys). A spec's author runs code on the node anyway (docs/security.md), but a
secret reference must not hand them the fleet's credentials by a line of YAML.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path

from llmgw.agent.errors import AgentError
from llmgw.wire.agent import SecretRef

# A secret file larger than this is a mistake (a model file, a log), not a secret.
MAX_SECRET_BYTES = 64 * 1024


class SecretUnavailable(AgentError):
    """A spec's secret reference cannot be resolved here; the message names the variable
    and the reference, never a value."""


def is_private_env(name: str) -> bool:
    """The agent's own credentials: never inherited by, nor given to, an engine."""
    return name.startswith("LLMGW_") and name.endswith("_TOKEN")


def resolve(
    refs: Mapping[str, SecretRef],
    *,
    environ: Mapping[str, str] | None = None,
    private_paths: Collection[Path] = (),
) -> dict[str, str]:
    """Every reference's value, by variable name; SecretUnavailable on the first that fails."""
    env = os.environ if environ is None else environ
    out: dict[str, str] = {}
    for name in sorted(refs):
        ref = refs[name]
        if ref.env is not None:
            out[name] = _from_env(name, ref.env, env)
        elif ref.file is not None:
            out[name] = _from_file(name, Path(ref.file), private_paths)
    return out


def resolve_quietly(
    refs: Mapping[str, SecretRef], *, private_paths: Collection[Path] = ()
) -> tuple[str, ...]:
    """The values that still resolve (to mask an adopted engine's log tail); never raises."""
    values: list[str] = []
    for name, ref in refs.items():
        try:
            values.extend(resolve({name: ref}, private_paths=private_paths).values())
        except SecretUnavailable:
            continue
    return tuple(values)


def _from_env(name: str, var: str, env: Mapping[str, str]) -> str:
    if is_private_env(var):
        raise SecretUnavailable(
            f"env_from {name}: {var} is the agent's own credential and is never given to an engine"
        )
    value = env.get(var)
    if value is None:
        raise SecretUnavailable(f"env_from {name}: the agent's environment has no {var}")
    return _checked(name, f"variable {var}", value)


def _from_file(name: str, path: Path, private_paths: Collection[Path]) -> str:
    real = path.resolve()
    for private in private_paths:
        mine = private.resolve()
        if real == mine or mine in real.parents:
            raise SecretUnavailable(
                f"env_from {name}: {path} is the agent's own (its token or state folder) "
                "and is never given to an engine"
            )
    try:
        with path.open("rb") as f:
            data = f.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        raise SecretUnavailable(
            f"env_from {name}: cannot read {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    if len(data) > MAX_SECRET_BYTES:
        raise SecretUnavailable(
            f"env_from {name}: {path} is over {MAX_SECRET_BYTES} bytes, not a secret"
        )
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise SecretUnavailable(f"env_from {name}: {path} is not UTF-8 text") from None
    if text.endswith("\n"):
        text = text[:-1].removesuffix("\r")
    return _checked(name, f"file {path}", text)


def _checked(name: str, where: str, value: str) -> str:
    if not value:
        raise SecretUnavailable(f"env_from {name}: {where} is empty")
    if "\0" in value:
        raise SecretUnavailable(f"env_from {name}: {where} holds a NUL byte")
    return value
