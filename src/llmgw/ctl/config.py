"""Which controller ctl talks to, and with what token.

Each of the two settings is taken from the first place that gives it:
flags (`--controller`, `--token`, `--token-file`), then the environment
(`LLMGW_CONTROLLER`, `LLMGW_TOKEN`, `LLMGW_TOKEN_FILE`), then the config file
`$XDG_CONFIG_HOME/llmgw/ctl.yaml` (`~/.config/llmgw/ctl.yaml` when XDG_CONFIG_HOME is
unset):

    controller: http://10.0.0.5:8081
    token: s3cret

The controller URL defaults to http://127.0.0.1:8081 (the controller's own
default port; the router's is 8080). The file is read only when a flag or the
environment left something unset, and yaml is imported only then, so the
common case stays quick to start.

Last, for a controller on loopback only: the admin token `llmgw up` keeps in
`./.llmgw/tokens/admin` (its default state folder, in the current folder), so
`llmgw up` then `llmgw ctl status` in the same folder needs no setting at all. A
token from a local file is never sent to a controller on another host, and that file is
read only as up makes it (a regular 0600 file of this user in a 0700 folder of theirs).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from llmgw.ctl.errors import CtlError

DEFAULT_CONTROLLER = "http://127.0.0.1:8081"
ENV_CONTROLLER = "LLMGW_CONTROLLER"
ENV_TOKEN = "LLMGW_TOKEN"
ENV_TOKEN_FILE = "LLMGW_TOKEN_FILE"
# Where `llmgw up` (default state folder) keeps the admin token, from the current folder.
UP_TOKEN_FILE = Path(".llmgw") / "tokens" / "admin"
_NULLS = frozenset(("", "~", "null", "Null", "NULL"))


@dataclass(frozen=True, kw_only=True)
class Target:
    url: str
    # None: send no Authorization header (a controller started without --token).
    token: str | None
    # Where the URL came from ("flag", "env", the config file's path, "default"), for messages.
    url_from: str


def config_path(env: Mapping[str, str], home: Path) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(home / ".config")
    return Path(base) / "llmgw" / "ctl.yaml"


def read_config(path: Path) -> dict[str, str]:
    """The config file's settings; {} when it does not exist."""
    from llmgw.runtime import textfile

    try:
        text = textfile.read(path)
    except textfile.TextFileMissing:
        return {}
    except textfile.TextFileError as exc:
        raise CtlError(f"{path}: {exc}") from None
    from llmgw.runtime import safeyaml  # only here: yaml is imported when a file is read

    try:
        # Both settings are text: `token: 0123` is the token 0123, not YAML's octal 83.
        data = safeyaml.load(text, as_typed=True)
    except safeyaml.YamlError as exc:
        raise CtlError(f"{path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CtlError(f"{path}: expected a mapping with 'controller' and 'token'")
    unknown = sorted(str(k) for k in data if k not in ("controller", "token"))
    if unknown:
        raise CtlError(f"{path}: unknown setting {unknown[0]!r} (known: controller, token)")
    for k, v in data.items():
        if not isinstance(v, str):
            # Only a list or a mapping is left: every scalar is read as the text written.
            kind = "a list" if isinstance(v, list) else "a mapping"
            raise CtlError(f"{path}: {k!r} must be text, not {kind}")
    # YAML's spellings of null leave a setting unset, as they did when read typed.
    return {str(k): v for k, v in data.items() if v not in _NULLS}


def normalize_url(url: str) -> str:
    """Accept `host:port` as well as a full URL; never a trailing slash."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url.rstrip("/")


def check_url(url: str) -> str | None:
    """Why ctl cannot send requests to `url` (a normalized URL), or None when it can.

    Checked up front: urllib would raise these as ValueErrors from deep inside a
    request, a traceback where the operator needs one line.
    """
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  # raises ValueError for a port that is not 0-65535
    except ValueError as exc:
        return str(exc)
    if not url.isprintable():
        # A control character or half of one (a surrogate) cannot be sent; urllib would
        # fail deep in the request.
        return "it holds characters that are not printable text"
    if parts.scheme not in ("http", "https"):
        return f"the scheme must be http or https, not {parts.scheme!r}"
    if not parts.hostname:
        return "there is no host"
    try:
        # How the resolver is asked for the name: a part of it empty (`a..b`) or longer
        # than 63 characters failed there, with a UnicodeError and a traceback.
        parts.hostname.encode("idna")
    except UnicodeError:
        return "the host name is not valid (each part between dots: 1 to 63 characters)"
    if "@" in parts.netloc:
        # urllib takes `user:pw@host` for a host name, fails to resolve it, and prints it.
        return "it holds a user name or password (user@host); give the token as a token"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        # ctl appends the API's paths: after a `?` or `#` they are no path at all.
        return "it holds a query or fragment (? or #); give the controller's base URL"
    if any(c.isspace() for c in url):
        return "it holds a space"
    return None


def _without_userinfo(url: str) -> str:
    """`url` with what stands before a host's `@` masked: it may be a password."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    netloc, slash, path = rest.partition("/")
    _, at, host = netloc.rpartition("@")  # a password may hold an @ itself
    return f"{scheme}{sep}***@{host}{slash}{path}" if at else url


def read_token_file(path: Path) -> str:
    """The token on the file's first line; CtlError when it cannot be read or is empty."""
    from llmgw.runtime import textfile

    try:
        text = textfile.read(path, max_bytes=textfile.SECRET_MAX_BYTES)
    except textfile.TextFileError as exc:
        raise CtlError(f"token file {path}: {exc}") from None
    lines = text.strip().splitlines()
    if not lines or not lines[0].strip():
        raise CtlError(f"token file {path} is empty")
    return lines[0].strip()


def read_up_token(path: Path) -> str | None:
    """The admin token `llmgw up` keeps at `path`; None when there is none.

    The current folder may be anyone's (a shared /tmp/project): a planted symlink there
    would have ctl read one of this user's own files and send its first line (in
    ~/.git-credentials, a credential) to whatever listens on the loopback port. So the
    file is taken only as up makes it: a regular file of this user, not readable by
    others, in a folder of this user that no one else may enter (checked on what is
    opened, no symlink followed); anything else is an error, never a silent read.
    """
    import os
    import stat

    def refused(why: str) -> CtlError:
        return CtlError(
            f"{path} is not the one llmgw up makes ({why}): not read; give --token-file "
            "or LLMGW_TOKEN"
        )

    nofollow = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        folder = os.open(path.parent, nofollow | os.O_DIRECTORY)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise refused(f"its folder: {exc.strerror}") from None
    try:
        info = os.fstat(folder)
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise refused("its folder must be yours, mode 0700")
        try:
            fd = os.open(path.name, nofollow | os.O_NONBLOCK, dir_fd=folder)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise refused(f"{exc.strerror}; a symlink is never followed") from None
    finally:
        os.close(folder)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise refused("not a regular file")
        if info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise refused("it must be yours, mode 0600")
        data = f.read(4096)
    try:
        lines = data.decode("utf-8").strip().splitlines()
    except UnicodeDecodeError:
        raise refused("not UTF-8 text") from None
    if not lines or not lines[0].strip():
        raise CtlError(f"token file {path} is empty")
    return lines[0].strip()


def _loopback(url: str) -> bool:
    import ipaddress
    from urllib.parse import urlsplit

    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def resolve(
    *,
    flag_url: str | None,
    flag_token: str | None,
    env: Mapping[str, str],
    home: Path,
    flag_token_file: str | None = None,
    cwd: Path | None = None,
) -> Target:
    """Flags, then environment, then the config file, then the default; per setting.

    `cwd`: where to look for `llmgw up`'s admin token (UP_TOKEN_FILE) when nothing else
    gave one and the controller is on loopback; None: do not look.
    """
    url, url_from = flag_url, "flag"
    if not url and env.get(ENV_CONTROLLER):
        url, url_from = env[ENV_CONTROLLER], "env"
    token = flag_token
    if token is None and flag_token_file:
        token = read_token_file(Path(flag_token_file))
    if token is None:
        token = env.get(ENV_TOKEN)
    if token is None and env.get(ENV_TOKEN_FILE):
        token = read_token_file(Path(env[ENV_TOKEN_FILE]))
    if not url or token is None:
        path = config_path(env, home)
        file = read_config(path)
        if not url and file.get("controller"):
            url, url_from = file["controller"], str(path)
        if token is None:
            token = file.get("token")
    if not url:
        url, url_from = DEFAULT_CONTROLLER, "default"
    normalized = normalize_url(url)
    why = check_url(normalized)
    if why is not None:
        where = {"flag": "the --controller flag", "env": ENV_CONTROLLER}.get(url_from, url_from)
        shown = url if "@" not in url else _without_userinfo(url)
        raise CtlError(f"controller URL {shown!r} from {where} is not usable: {why}")
    if token is None and cwd is not None and _loopback(normalized):
        token = read_up_token(cwd / UP_TOKEN_FILE)
    if token and not (token.isascii() and token.isprintable()):
        # An Authorization header carries printable ASCII; urllib would raise deep inside.
        raise CtlError("the token holds characters an HTTP header cannot carry")
    return Target(url=normalized, token=token or None, url_from=url_from)
