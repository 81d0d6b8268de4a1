"""The tokens `llmgw up` gives its programs: made once, kept in the state folder, 0600.

    .llmgw/tokens/          0700
        admin               0600  the controller's admin token (ctl, up itself)
        agent               0600  heartbeats only (every agent)
        router              0600  endpoint list and usage reports only (the router)
        read                0600  reads only (the status page link up prints)

Each child reads its token from one of these files (`--token-file`, the controller's
`--*-token-file`, the router's 0600 config file), never from its command line, which
every local user can read (`ps`). They are kept across runs, so a `ctl` or a status
page set up once keeps working; delete the folder to draw new ones. `ctl` finds the admin
token in `./.llmgw/tokens/admin` by itself when it talks to a loopback controller.
"""

from __future__ import annotations

import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from llmgw.runtime.lockfile import StateDirRefused, open_nofollow
from llmgw.up.errors import UpError

KINDS = ("admin", "agent", "router", "read")


class TokenFolderError(UpError):
    """The tokens folder or a token file cannot be used safely; the message says why."""


@dataclass(frozen=True, slots=True)
class Tokens:
    folder: Path
    admin: str
    agent: str
    router: str
    read: str

    def path(self, kind: str) -> Path:
        return self.folder / kind


def token_problem(value: str) -> str | None:
    """Why `value` cannot be a token (printable ASCII, nothing to strip); None when it can.

    Refused before any program starts: the programs read the file's first line stripped
    while up sent the value as given (a token with spaces at its ends was a 401 after
    everything had started), and an Authorization header carries printable ASCII only
    (a newline or a `€` was a traceback from deep inside http.client)."""
    if not value:
        return "is empty"
    if value != value.strip() or not (value.isascii() and value.isprintable()):
        return "must be printable ASCII without spaces at its ends"
    return None


def ensure_tokens(state: Path, *, admin: str | None = None) -> Tokens:
    """The state folder's tokens, drawn where missing; `admin` (up's --token) replaces that one.

    Files are created 0600 in a 0700 folder; an existing file readable by others is
    narrowed to 0600, and a symlink in place of one is replaced, never followed.
    """
    folder = state / "tokens"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
        if not stat.S_ISDIR(info.st_mode):
            raise TokenFolderError(f"{folder} is not a folder")
        os.chmod(folder, 0o700)
        values = {
            kind: _ensure(folder / kind, admin if kind == "admin" else None) for kind in KINDS
        }
    except StateDirRefused as exc:
        raise TokenFolderError(str(exc)) from None
    except OSError as exc:
        raise TokenFolderError(f"{folder}: {exc.strerror or exc}") from None
    if len(set(values.values())) != len(values):
        raise TokenFolderError(f"{folder}: two token files hold the same token; delete the folder")
    return Tokens(folder=folder, **values)


def _ensure(path: Path, given: str | None) -> str:
    if given is None and path.exists() and not path.is_symlink():
        fd = open_nofollow(path, os.O_RDONLY)
        with os.fdopen(fd) as f:
            os.fchmod(f.fileno(), 0o600)
            # The first line, as every program that reads a token file takes it
            # (runtime.secretfile): a file edited to hold more must not give up and
            # its children two different tokens.
            lines = f.read().strip().splitlines()
            value = lines[0].strip() if lines else ""
        if value:
            why = token_problem(value)
            if why is not None:
                raise TokenFolderError(f"the token in {path} {why}; delete the file to draw one")
            return value
    value = given or secrets.token_urlsafe(32)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(value + "\n")
    # A symlink at `path` is replaced, not followed (rename acts on the name).
    tmp.replace(path)
    return value
