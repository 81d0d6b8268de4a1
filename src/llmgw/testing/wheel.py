"""llmgw's wheel, built once per source tree: `python -m llmgw.testing.wheel` prints its path.

The wheel is what `pip wheel .` makes (build_backend/llmgw_build.py: the router's
hot modules compiled with mypyc when this machine can). Building takes a minute or
more, so it is cached under `${XDG_CACHE_HOME:-~/.cache}/llmgw/wheels/<key>/`, the
key a hash of every file the build reads and of this interpreter's ABI. The build
runs on a copy of those files, never in the checkout: setuptools' `build/` folder
would otherwise carry files deleted from the sources into later wheels.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# What the build reads: files at the root, and folders copied whole.
FILES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")
FOLDERS = ("src", "build_backend")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "*.egg-info")
KEEP = 4


class WheelBuildFailed(RuntimeError):
    """`pip wheel` failed; the message carries its output's tail."""


def _inputs() -> list[Path]:
    out = [ROOT / f for f in FILES]
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*")):
            parts = path.relative_to(ROOT).parts
            skipped = any(p == "__pycache__" or p.endswith(".egg-info") for p in parts)
            if path.is_file() and not skipped and path.suffix not in (".pyc", ".so"):
                out.append(path)
    return out


def key() -> str:
    h = hashlib.sha256(f"{sys.implementation.cache_tag} {EXTENSION_SUFFIXES[0]}\n".encode())
    for path in _inputs():
        data = path.read_bytes()
        h.update(f"{path.relative_to(ROOT).as_posix()} {len(data)}\n".encode())
        h.update(data)
    return h.hexdigest()[:32]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "llmgw" / "wheels"


def cached() -> Path | None:
    found = sorted((cache_root() / key()).glob("llmgw-*.whl"))
    return found[0] if found else None


def build(*, python: str = sys.executable, timeout_s: float = 900.0) -> Path:
    """The wheel for the current sources: from the cache, or built now (minutes)."""
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test runs share one build
        found = cached()
        if found is not None:
            return found
        folder = root / key()
        with tempfile.TemporaryDirectory(prefix="llmgw-wheel-") as tmp:
            tree = Path(tmp) / "tree"
            tree.mkdir()
            for name in FILES:
                shutil.copy2(ROOT / name, tree / name)
            for name in FOLDERS:
                shutil.copytree(ROOT / name, tree / name, ignore=SKIP)
            out = Path(tmp) / "out"
            done = subprocess.run(
                [python, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(tree)],
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
            wheels = sorted(out.glob("llmgw-*.whl"))
            if done.returncode != 0 or not wheels:
                raise WheelBuildFailed(
                    f"pip wheel exited {done.returncode}:\n{done.stderr[-4000:]}"
                )
            staging = Path(tempfile.mkdtemp(prefix=".new-", dir=root))
            shutil.copy2(wheels[0], staging / wheels[0].name)
            (staging / "build.log").write_text(done.stdout + done.stderr)
            if folder.exists():  # left without a wheel by an interrupted build
                shutil.rmtree(folder)
            staging.rename(folder)
        _prune(root)
        return folder / wheels[0].name


def _prune(root: Path) -> None:
    builds = sorted(
        (p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")),
        key=lambda p: p.stat().st_mtime,
    )
    for old in builds[:-KEEP]:
        shutil.rmtree(old, ignore_errors=True)


if __name__ == "__main__":
    print(build())
