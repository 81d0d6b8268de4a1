"""A fake inventory for development and tests: `8xH100-80G`, `2xH100-80G,1xL40S-48G`, or a file.

Its GPUs can be made unhealthy and healthy again at run time (the agent's
loopback faults endpoint), which is how tests exercise the controller's
handling of bad cards without a GPU in sight.

The file is YAML or JSON: either the same text as `--gpus` or a list of
groups, each `{gpu_class: H100-80G, count: 8}` with optional `memory_mib`,
`name`, `healthy: false` and `reason`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Set
from pathlib import Path
from typing import Any

import msgspec

from llmgw.agent.gpus.base import GpuDiscoveryError, Telemetry, UnknownGpu
from llmgw.agent.gpus.classes import memory_mib_of_class
from llmgw.runtime import safeyaml, textfile
from llmgw.wire.agent import GPU, MAX_FAKE_GPUS
from llmgw.wire.names import label_problem

_GROUP = re.compile(r"^(\d+)x([A-Za-z0-9][A-Za-z0-9._-]*)$")


def parse_spec(text: str) -> list[dict[str, Any]]:
    """`2xH100-80G,1xL40S-48G` → groups; raises GpuDiscoveryError naming the bad part."""
    groups: list[dict[str, Any]] = []
    for part in (p.strip() for p in text.split(",")):
        m = _GROUP.match(part)
        if m is None:
            raise GpuDiscoveryError(
                f"bad fake GPU spec {part!r}: expected <count>x<class>, e.g. 8xH100-80G"
            )
        groups.append({"gpu_class": m.group(2), "count": int(m.group(1))})
    return groups


def load_file(path: Path) -> list[dict[str, Any]]:
    """Groups from a YAML/JSON file (JSON is YAML), see the module docstring."""
    try:
        doc = safeyaml.load(textfile.read(path))
    except (textfile.TextFileError, safeyaml.YamlError) as exc:
        raise GpuDiscoveryError(f"GPU file {path}: {exc}") from None
    if isinstance(doc, str):
        return parse_spec(doc)
    if isinstance(doc, Mapping) and "gpus" in doc:
        doc = doc["gpus"]
        if isinstance(doc, str):
            return parse_spec(doc)
    if not isinstance(doc, list) or not all(isinstance(g, Mapping) for g in doc):
        raise GpuDiscoveryError(f"GPU file {path}: expected a spec string or a list of groups")
    return [dict(g) for g in doc]


def build_gpus(groups: list[dict[str, Any]], *, uuid_prefix: str) -> tuple[GPU, ...]:
    """Number the groups' GPUs from 0; UUIDs are stable for one prefix (the node name)."""
    out: list[GPU] = []
    for g in groups:
        cls = g.get("gpu_class")
        count = g.get("count", 1)
        if not isinstance(cls, str) or not cls:
            raise GpuDiscoveryError(f"fake GPU group {g!r}: gpu_class is required")
        problem = label_problem(cls)
        if problem is not None:
            # Refused here: the controller would refuse every heartbeat (wire.names).
            raise GpuDiscoveryError(f"fake GPU group: gpu_class {problem}")
        if not isinstance(count, int) or count < 0:
            raise GpuDiscoveryError(f"fake GPU group {g!r}: count must be a whole number")
        memory = g.get("memory_mib") or memory_mib_of_class(cls)
        if not isinstance(memory, int):
            raise GpuDiscoveryError(
                f"fake GPU class {cls!r} names no memory size: write it like {cls}-80G, "
                "or give memory_mib in a --gpus-file group"
            )
        if len(out) + count > MAX_FAKE_GPUS:
            raise GpuDiscoveryError(f"the fake inventory has more than {MAX_FAKE_GPUS} GPUs")
        healthy = bool(g.get("healthy", True))
        reason = g.get("reason") if not healthy else None
        for _ in range(count):
            i = len(out)
            out.append(
                GPU(
                    index=i,
                    uuid=f"GPU-fake-{uuid_prefix}-{i}",
                    name=str(g.get("name") or f"Fake {cls}"),
                    gpu_class=cls,
                    memory_mib=memory,
                    healthy=healthy,
                    reason=(str(reason) if reason else "marked unhealthy") if not healthy else None,
                )
            )
    if not out:
        raise GpuDiscoveryError("the fake inventory has no GPUs")
    return tuple(out)


class FakeInventory:
    """GPUs as given, with injectable faults."""

    kind = "fake"

    def __init__(self, gpus: tuple[GPU, ...]) -> None:
        self._gpus = {g.index: g for g in gpus}

    @classmethod
    def from_spec(cls, text: str, *, uuid_prefix: str) -> FakeInventory:
        return cls(build_gpus(parse_spec(text), uuid_prefix=uuid_prefix))

    @classmethod
    def from_file(cls, path: Path, *, uuid_prefix: str) -> FakeInventory:
        return cls(build_gpus(load_file(path), uuid_prefix=uuid_prefix))

    def gpus(self) -> tuple[GPU, ...]:
        return tuple(self._gpus[i] for i in sorted(self._gpus))

    async def refresh(self) -> None:
        """Nothing to poll: faults arrive through set_fault."""

    def telemetry(self, busy: Set[int]) -> tuple[Telemetry, ...]:
        """Plausible readings: a card an engine runs on is warm, busy and ~90% full
        (vLLM takes gpu_memory_utilization of it at start); an idle one is cool and empty.
        No XID or ECC errors are made up; an injected fault shows in health only."""
        out = []
        for g in self.gpus():
            total = g.memory_mib * 1024 * 1024
            on = g.index in busy
            out.append(
                Telemetry(
                    index=g.index,
                    temperature_c=66.0 if on else 34.0,
                    utilization=0.85 if on else 0.0,
                    memory_used_bytes=int(total * 0.9) if on else 0,
                    memory_total_bytes=total,
                    xid_events=0,
                    ecc_uncorrected=0,
                )
            )
        return tuple(out)

    def set_fault(self, index: int, reason: str | None) -> GPU:
        gpu = self._gpus.get(index)
        if gpu is None:
            raise UnknownGpu(index)
        new = msgspec.structs.replace(gpu, healthy=reason is None, reason=reason)
        self._gpus[index] = new
        return new

    def close(self) -> None:
        pass
