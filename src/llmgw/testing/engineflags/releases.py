"""The pinned engine releases: fetching their parser sources, reading and caching the flags.

`fetch` downloads a pinned wheel with pip (no dependencies, nothing built),
keeps only the parser's source files and the extracted flags under
${XDG_CACHE_HOME:-~/.cache}/llmgw/engine-flags/<name>-<version>/; a second call
finds them cached. `main` (`python -m llmgw.testing.engineflags`) fetches every
pinned release and prints that folder.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from llmgw.testing.engineflags.commandline import Cli, EngineFlagsError
from llmgw.testing.engineflags.sglang import read_sglang
from llmgw.testing.engineflags.vllm import read_vllm

# The releases checked; a bump is a one-line change and a test run.
PINNED: dict[str, str] = {"vllm": "0.33.0", "sglang": "0.5.23"}

# The wheel members each extractor reads (prefixes of paths inside the wheel).
SOURCES: dict[str, tuple[str, ...]] = {
    "vllm": (
        "vllm/engine/arg_utils.py",
        "vllm/entrypoints/common/cli_args.py",
        "vllm/config/",
        # The sleep-mode routes, their gate and the API key's reach (enginesleep.py).
        "vllm/entrypoints/serve/dev/sleep/api_router.py",
        "vllm/entrypoints/serve/middleware/authenticate.py",
        "vllm/entrypoints/launchers/api_server/routers.py",
        "vllm/envs.py",
    ),
    "sglang": ("sglang/srt/server_args.py", "sglang/srt/arg_groups/"),
}


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw" / "engine-flags"


def cached(engine: str, version: str | None = None) -> Cli | None:
    """The extracted flags of a fetched release, or None when not fetched yet."""
    version = version or PINNED[engine]
    path = cache_root() / f"{engine}-{version}" / "cli.json"
    try:
        return Cli.from_json(path.read_text())
    except (OSError, ValueError, KeyError):
        return None  # not fetched, cut short or read by older rules: fetch() again


def fetch(engine: str, version: str | None = None, *, python: str = sys.executable) -> Cli:
    """The release's flags, from the cache or from its wheel (pip download, no deps).

    Keeps the parser's source files next to cli.json (a few MB) and drops the
    wheel; with those sources kept, a new reader (READER) reads them again
    without a download. One fetch at a time per release (a lock file), so two
    test runs starting together share one download.
    """
    version = version or PINNED[engine]
    folder = cache_root() / f"{engine}-{version}"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        hit = cached(engine, version)
        if hit is not None:
            return hit
        src = folder / "src"
        try:
            lacking = [p for p in SOURCES[engine] if p.endswith(".py") and not (src / p).exists()]
            if lacking:  # kept from before a file was added to SOURCES
                raise EngineFlagsError(f"kept sources lack {lacking}")
            cli = extract(engine, version, src)
        except EngineFlagsError:
            with tempfile.TemporaryDirectory(prefix="llmgw-engine-flags-") as tmp:
                wheel = _download(engine, version, Path(tmp), python)
                # Unpacked beside, then renamed: a cut-short run leaves no half tree.
                part = folder / "src.part"
                shutil.rmtree(part, ignore_errors=True)
                _unpack(wheel, SOURCES[engine], part)
                shutil.rmtree(src, ignore_errors=True)
                part.rename(src)
            cli = extract(engine, version, src)
        (folder / "cli.json.tmp").write_text(cli.to_json())
        (folder / "cli.json.tmp").replace(folder / "cli.json")
        return cli


def _download(engine: str, version: str, into: Path, python: str) -> Path:
    # A wheel, not the sdist: pip cannot download an sdist without preparing its
    # metadata, which for vLLM installs its build dependencies (torch, GBs).
    cmd = [
        python,
        "-m",
        "pip",
        "download",
        "-q",
        "--disable-pip-version-check",
        "--no-cache-dir",
        # Without a network pip gives up in about a minute, not five.
        "--retries",
        "1",
        "--timeout",
        "20",
        "--no-deps",
        "--only-binary",
        ":all:",
        f"{engine}=={version}",
        "-d",
        str(into),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise EngineFlagsError(
            f"pip download {engine}=={version} failed (exit {done.returncode}): " + " / ".join(tail)
        )
    return wheels[0]


def _unpack(wheel: Path, prefixes: Sequence[str], into: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if n.endswith(".py") and n.startswith(tuple(prefixes))]
        for name in names:
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(zf.read(name))
    missing = [p for p in prefixes if not any(n.startswith(p) for n in names)]
    if missing:
        raise EngineFlagsError(f"{wheel.name} has none of {missing} (the engine moved its parser)")


def extract(engine: str, version: str, src: Path) -> Cli:
    """Flags from the unpacked sources (the rules: the `vllm` and `sglang` modules)."""
    if engine == "vllm":
        return read_vllm(version, src)
    if engine == "sglang":
        return read_sglang(version, src)
    raise EngineFlagsError(f"no extractor for engine {engine!r}")


def main(argv: Sequence[str] | None = None) -> int:
    """Fetch every pinned release (or those named) and print the cache folder."""
    names = list(argv if argv is not None else sys.argv[1:]) or sorted(PINNED)
    status = 0
    for name in names:
        if name not in PINNED:
            print(
                f"engine-flags: unknown engine {name!r} (expected {sorted(PINNED)})",
                file=sys.stderr,
            )
            return 2
        try:
            cli = fetch(name)
        except (EngineFlagsError, OSError, subprocess.TimeoutExpired) as exc:
            print(f"engine-flags: {name}: {exc}", file=sys.stderr)
            status = 1
            continue
        print(f"engine-flags: {name} {cli.version}: {len(cli.flags)} flags", file=sys.stderr)
    print(cache_root())
    return status
