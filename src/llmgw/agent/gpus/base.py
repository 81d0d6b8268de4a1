"""The one seam for GPU discovery: NVML on real nodes, a fake in dev and tests.

Errors:

    GpuError                      base of everything this package raises
    ├── GpuDiscoveryError         no driver, no GPUs, bad fake spec: the agent cannot start
    ├── UnknownGpu                no GPU has that index (the faults endpoint answers 404)
    └── FaultInjectionUnsupported real GPUs cannot be made unhealthy on request (409)
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass
from typing import Protocol

from llmgw.agent.errors import AgentError
from llmgw.wire.agent import GPU


@dataclass(frozen=True, slots=True)
class Telemetry:
    """One card's readings for /metrics; None where the card or driver cannot say."""

    index: int
    temperature_c: float | None = None
    utilization: float | None = None  # 0..1
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    # Since the agent started: critical XID events seen, uncorrectable volatile ECC errors.
    xid_events: int | None = None
    ecc_uncorrected: int | None = None


class GpuError(AgentError):
    """Base of the GPU package's errors."""


class GpuDiscoveryError(GpuError):
    """Discovery failed; the message is one line meant for a person."""


class UnknownGpu(GpuError):
    def __init__(self, index: int) -> None:
        super().__init__(f"no GPU with index {index}")
        self.index = index


class FaultInjectionUnsupported(GpuError):
    """Only the fake inventory takes injected faults."""


class GpuInventory(Protocol):
    """What the agent knows of its GPUs. Health is sticky until the agent restarts."""

    @property
    def kind(self) -> str:
        """ "nvml" or "fake"; shown in /status."""
        ...

    def gpus(self) -> tuple[GPU, ...]:
        """A snapshot sorted by index; cheap, never blocks."""
        ...

    async def refresh(self) -> None:
        """Poll health once (XID events, ECC counters) without blocking the loop."""
        ...

    def telemetry(self, busy: Set[int]) -> tuple[Telemetry, ...]:
        """The last readings per card (NVML: from the last refresh; the fake derives
        plausible ones from `busy`, the cards engines run on). Cheap, never blocks."""
        ...

    def set_fault(self, index: int, reason: str | None) -> GPU:
        """Mark a GPU unhealthy with `reason`, or healthy again when None (fake only)."""
        ...

    def close(self) -> None: ...
