"""A spec's `env_from`: secret values read on this node, just before an engine starts.

The controller only ever holds the reference (`{env: NAME}` or `{file: /path}`); the
value is read here and goes to one place, the engine's environment. It is never written
to the state file (which keeps the spec, i.e. the reference), never logged (the engine
log's header names variables only), and masked in a failed engine's log tail before that
leaves the node.

Some references are refused even though the agent could read them: the agent's own
credentials (`LLMGW_*_TOKEN` variables, its token file, its state folder, which holds the
engines' keys), by name and by the file opened (a second name, a hard link, is the same
file), and any value that holds the agent's token or an engine's key (its config file, a
copy). A spec's author runs code on the node anyway (docs/security.md), but a secret
reference must not hand them the fleet's credentials by a line of YAML.

Only regular files are read, opened without waiting: a FIFO or a terminal would block the
agent's loop (and with it every heartbeat) until someone wrote to it.
"""

from __future__ import annotations

import os
import stat
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
    private_values: Collection[str] = (),
) -> dict[str, str]:
    """Every reference's value, by variable name; SecretUnavailable on the first that fails.

    `private_paths`: the agent's token file and state folder; `private_values`: its token
    and the engines' keys. No reference may read the one nor yield a value holding the other.
    """
    env = os.environ if environ is None else environ
    mine = tuple(v for v in private_values if v)
    out: dict[str, str] = {}
    for name in sorted(refs):
        ref = refs[name]
        if ref.env is not None:
            value, where = _from_env(name, ref.env, env), f"variable {ref.env}"
        elif ref.file is not None:
            value, where = _from_file(name, ref.file, private_paths), f"file {ref.file}"
        else:  # pragma: no cover  # SecretRef.__post_init__ refuses it
            continue
        if any(v in value for v in mine):
            raise SecretUnavailable(
                f"env_from {name}: {where} holds the agent's own credential (its token or "
                "an engine's key), which is never given to an engine"
            )
        out[name] = value
    return out


def resolve_quietly(
    refs: Mapping[str, SecretRef],
    *,
    private_paths: Collection[Path] = (),
    private_values: Collection[str] = (),
) -> tuple[str, ...]:
    """The values that still resolve (to mask an adopted engine's log tail); never raises."""
    values: list[str] = []
    for name, ref in refs.items():
        try:
            values.extend(
                resolve(
                    {name: ref}, private_paths=private_paths, private_values=private_values
                ).values()
            )
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


def _from_file(name: str, path: str, private_paths: Collection[Path]) -> str:
    """The file's text, checked on the file opened (not on its name, which can change)."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise SecretUnavailable(
            f"env_from {name}: cannot read {path}: {exc.strerror or type(exc).__name__}"
        ) from None
    except ValueError:  # a NUL byte in the path
        raise SecretUnavailable(f"env_from {name}: the path {path!r} is not usable") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise SecretUnavailable(f"env_from {name}: {path} is not a regular file")
    with os.fdopen(fd, "rb") as f:
        if _is_private(fd, path, info, private_paths):
            raise SecretUnavailable(
                f"env_from {name}: {path} is the agent's own (its token or state folder) "
                "and is never given to an engine"
            )
        try:
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


def _is_private(fd: int, path: str, info: os.stat_result, private_paths: Collection[Path]) -> bool:
    """Whether the open file is one of `private_paths` or lies in one of its folders."""
    try:
        # Where the open file really is (no second lookup of a name that may have moved).
        real = Path(os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        real = Path(os.path.realpath(path))
    for private in private_paths:
        try:
            mine = os.stat(private)
        except (OSError, ValueError):
            continue
        if (mine.st_dev, mine.st_ino) == (info.st_dev, info.st_ino):
            return True
        if stat.S_ISDIR(mine.st_mode):
            folder = Path(os.path.realpath(private))
            if folder in real.parents:
                return True
    return False


def _checked(name: str, where: str, value: str) -> str:
    if not value:
        raise SecretUnavailable(f"env_from {name}: {where} is empty")
    if "\0" in value:
        raise SecretUnavailable(f"env_from {name}: {where} holds a NUL byte")
    return value
