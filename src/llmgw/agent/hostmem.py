"""The node's host memory for the heartbeat: /proc/meminfo's MemTotal, or the flag's figure.

The controller lets level-1 sleepers fill part of it with their weights
(controller/placement/wakes.py). A fake node (`--gpus 8xH100-80G`) says what it
pretends to have with `--host-memory-mib`, so tests can exercise both levels.
"""

from __future__ import annotations

from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def host_memory_mib(configured: int | None, *, meminfo: Path = MEMINFO) -> int | None:
    """`configured` when given, else MemTotal in MiB; None when it cannot be read."""
    if configured is not None:
        return configured
    try:
        text = meminfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == "MemTotal":
            parts = rest.split()
            if parts and parts[0].isdigit():
                return int(parts[0]) // 1024  # kB
    return None
