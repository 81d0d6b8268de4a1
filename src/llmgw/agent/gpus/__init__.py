"""GPU discovery: NVML on real nodes, a fake inventory for development (base.py has the seam)."""

from __future__ import annotations

from pathlib import Path

from llmgw.agent.gpus.base import GpuInventory


def open_inventory(*, gpus: str | None, gpus_file: Path | None, node: str) -> GpuInventory:
    """`--gpus nvml` → NVML; `--gpus 8xH100-80G` or `--gpus-file F` → fake.

    Raises GpuDiscoveryError (one line for a person) when discovery fails.
    """
    from llmgw.agent.gpus.fake import FakeInventory

    if gpus_file is not None:
        return FakeInventory.from_file(gpus_file, uuid_prefix=node)
    if gpus is None or gpus == "nvml":
        from llmgw.agent.gpus.nvml import NvmlInventory

        return NvmlInventory.open()
    return FakeInventory.from_spec(gpus, uuid_prefix=node)
