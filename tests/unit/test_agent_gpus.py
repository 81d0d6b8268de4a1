"""GPU classes, fault classification, the fake inventory and the NVML adapter (fake library)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from llmgw.agent.gpus import open_inventory
from llmgw.agent.gpus.base import FaultInjectionUnsupported, GpuDiscoveryError, UnknownGpu
from llmgw.agent.gpus.classes import (
    ecc_unhealthy_reason,
    gpu_class,
    memory_mib_of_class,
    xid_unhealthy_reason,
)
from llmgw.agent.gpus.fake import FakeInventory
from llmgw.agent.gpus.nvml import NvmlInventory


class TestGpuClass:
    """GPU class names and the memory each class stands for."""

    @pytest.mark.parametrize(
        ("expected", "name", "memory_mib"),
        [
            ("H100-80G", "NVIDIA H100 80GB HBM3", 81559),
            ("H100-94G", "NVIDIA H100 NVL", 95830),
            ("A100-40G", "NVIDIA A100-SXM4-40GB", 40960),
            ("A100-80G", "NVIDIA A100 80GB PCIe", 81920),
            ("H200-140G", "NVIDIA H200", 143771),
            ("L40S-45G", "NVIDIA L40S", 46068),
            ("RTX4090-24G", "NVIDIA GeForce RTX 4090", 24564),
            ("RTXA6000-48G", "NVIDIA RTX A6000", 49140),
            ("V100-32G", "Tesla V100-SXM2-32GB", 32768),
            ("GPU-16G", "", 16384),
        ],
    )
    def test_names(self, expected: str, name: str, memory_mib: int) -> None:
        """The class is the bare model and the reported memory in rounded GiB."""
        assert expected == gpu_class(name, memory_mib)

    def test_memory_of_class(self) -> None:
        """A class name implies its memory; a class without a size implies none."""
        assert memory_mib_of_class("H100-80G") == 80 * 1024
        assert memory_mib_of_class("weird") is None


class TestHealthRules:
    """Which XID and ECC faults take a GPU out of service."""

    @pytest.mark.parametrize("xid", [13, 31, 43, 45, 68])
    def test_application_xids_keep_the_gpu(self, xid: int) -> None:
        """An XID caused by one program leaves the card in service."""
        assert xid_unhealthy_reason(xid) is None

    @pytest.mark.parametrize("xid", [48, 63, 64, 74, 79, 92, 94, 95])
    def test_critical_xids_take_the_gpu_out(self, xid: int) -> None:
        """A hardware or driver XID makes the card unhealthy, naming the XID."""
        reason = xid_unhealthy_reason(xid)
        assert reason is not None
        assert reason.startswith(f"xid {xid}: ")

    def test_unclassified_xid_is_unhealthy(self) -> None:
        """An XID nobody listed is treated as critical, as NVIDIA's device plugin does."""
        assert xid_unhealthy_reason(154) == "xid 154: unclassified"

    def test_fallen_off_the_bus_reason(self) -> None:
        """The reason says what happened in words."""
        assert xid_unhealthy_reason(79) == "xid 79: GPU has fallen off the bus"

    def test_ecc(self) -> None:
        """Uncorrectable ECC errors make a card unhealthy; zero and unknown do not."""
        assert ecc_unhealthy_reason(None) is None
        assert ecc_unhealthy_reason(0) is None
        assert ecc_unhealthy_reason(2) == "uncorrectable ECC errors: 2 since driver load"


class TestFakeInventory:
    """The fake GPU inventory: its spec strings, files and injected faults."""

    def test_spec(self) -> None:
        """A mixed spec numbers GPUs from 0 in the order given, with memory from the class."""
        inv = FakeInventory.from_spec("2xH100-80G,1xL40S-48G", uuid_prefix="n1")
        gpus = inv.gpus()
        assert [g.index for g in gpus] == [0, 1, 2]
        assert [g.gpu_class for g in gpus] == ["H100-80G", "H100-80G", "L40S-48G"]
        assert gpus[2].memory_mib == 48 * 1024
        assert gpus[0].uuid == "GPU-fake-n1-0"
        assert all(g.healthy for g in gpus)

    @pytest.mark.parametrize("spec", ["", "8H100", "x8", "0xH100-80G", "8xH100-80G,"])
    def test_bad_spec(self, spec: str) -> None:
        """A malformed or empty spec is a discovery error, not a crash."""
        with pytest.raises(GpuDiscoveryError):
            FakeInventory.from_spec(spec, uuid_prefix="n")

    def test_a_huge_count_is_refused_before_any_gpu_is_built(self) -> None:
        """`99999999999999999999xH100-80G` is refused at once, not built one GPU at a time."""
        with pytest.raises(GpuDiscoveryError, match="more than 1024 GPUs"):
            FakeInventory.from_spec("99999999999999999999xH100-80G", uuid_prefix="n")
        with pytest.raises(GpuDiscoveryError, match="more than 1024 GPUs"):
            FakeInventory.from_spec("1000xH100-80G,25xL40S-48G", uuid_prefix="n")

    def test_class_without_size_says_how_to_name_it(self) -> None:
        """`--gpus 2xA100`: the message shows the class spelled with its memory size."""
        with pytest.raises(GpuDiscoveryError, match=r"'A100' names no memory size.*A100-80G"):
            FakeInventory.from_spec("2xA100", uuid_prefix="n")

    def test_file_groups(self, tmp_path: Path) -> None:
        """A file lists groups, optionally starting unhealthy."""
        f = tmp_path / "gpus.yaml"
        f.write_text(
            "- {gpu_class: H100-80G, count: 2}\n"
            "- {gpu_class: X1, memory_mib: 1000, healthy: false, reason: broken}\n"
        )
        gpus = FakeInventory.from_file(f, uuid_prefix="n").gpus()
        assert len(gpus) == 3
        assert (gpus[2].healthy, gpus[2].reason, gpus[2].memory_mib) == (False, "broken", 1000)

    def test_file_spec_string(self, tmp_path: Path) -> None:
        """A file may hold the same text as --gpus (JSON is YAML too)."""
        f = tmp_path / "gpus.json"
        f.write_text('{"gpus": "4xA100-40G"}')
        assert len(FakeInventory.from_file(f, uuid_prefix="n").gpus()) == 4

    def test_fault_round_trip(self) -> None:
        """A GPU made unhealthy carries the reason; made healthy again it has none."""
        inv = FakeInventory.from_spec("2xH100-80G", uuid_prefix="n")
        bad = inv.set_fault(1, "injected")
        assert (bad.healthy, bad.reason) == (False, "injected")
        assert inv.gpus()[1] == bad
        good = inv.set_fault(1, None)
        assert (good.healthy, good.reason) == (True, None)

    def test_fault_unknown_gpu(self) -> None:
        """A fault for an index that does not exist is refused."""
        inv = FakeInventory.from_spec("1xH100-80G", uuid_prefix="n")
        with pytest.raises(UnknownGpu):
            inv.set_fault(5, "x")

    def test_open_inventory_picks_fake(self) -> None:
        """A count-x-class spec opens the fake inventory."""
        assert open_inventory(gpus="1xH100-80G", gpus_file=None, node="n").kind == "fake"


class _NVMLError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(f"nvml error {value}")
        self.value = value


def fake_nvml(
    *, init_error: int | None = None, count: int = 2, ecc: int = 0, events: list[Any] | None = None
) -> Any:
    """A stand-in for the pynvml module with just what NvmlInventory calls."""
    pending = list(events or [])

    def init() -> None:
        if init_error is not None:
            raise _NVMLError(init_error)

    def wait(_set: Any, _timeout_ms: int) -> Any:
        if not pending:
            raise _NVMLError(10)
        return pending.pop(0)

    def total_ecc(_h: int, _type: int, _counter: int) -> int:
        return ecc

    lib = SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_ERROR_LIBRARY_NOT_FOUND=12,
        NVML_ERROR_DRIVER_NOT_LOADED=9,
        NVML_ERROR_NO_PERMISSION=4,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1,
        NVML_VOLATILE_ECC=0,
        nvmlEventTypeXidCriticalError=8,
        nvmlEventTypeDoubleBitEccError=2,
        nvmlInit=init,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetUUID=lambda h: f"GPU-{h}",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(
            total=81559 * 1024 * 1024, used=1024 * 1024 * 1024
        ),
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetTemperature=lambda h, sensor: 41 + h,
        nvmlDeviceGetUtilizationRates=lambda h: SimpleNamespace(gpu=50, memory=10),
        nvmlEventSetCreate=lambda: "set",
        nvmlDeviceGetSupportedEventTypes=lambda h: 0xFF,
        nvmlDeviceRegisterEvents=lambda h, types, s: None,
        nvmlEventSetWait_v2=wait,
        nvmlDeviceGetIndex=lambda h: h,
        nvmlDeviceGetTotalEccErrors=total_ecc,
        nvmlEventSetFree=lambda s: None,
    )
    return lib


class TestNvmlAdapter:
    """The NVML adapter's discovery and fault events, on a fake library."""

    def test_discovery(self) -> None:
        """NVML names and memory become GPUs with their class."""
        inv = NvmlInventory.open(fake_nvml())
        gpus = inv.gpus()
        assert [(g.index, g.uuid, g.gpu_class) for g in gpus] == [
            (0, "GPU-0", "H100-80G"),
            (1, "GPU-1", "H100-80G"),
        ]
        assert gpus[0].name == "NVIDIA H100 80GB HBM3"

    def test_no_driver_is_one_line(self) -> None:
        """A machine without the driver gets a one-line message that suggests the fake."""
        with pytest.raises(GpuDiscoveryError) as err:
            NvmlInventory.open(fake_nvml(init_error=12))
        assert "no NVIDIA driver" in str(err.value)
        assert "\n" not in str(err.value)

    def test_no_gpus(self) -> None:
        """A driver with no GPUs is a discovery error too."""
        with pytest.raises(GpuDiscoveryError, match="no NVIDIA GPUs"):
            NvmlInventory.open(fake_nvml(count=0))

    def test_critical_xid_event(self) -> None:
        """A critical XID event makes its GPU unhealthy and leaves the other alone."""
        ev = SimpleNamespace(device=1, eventType=8, eventData=79)
        inv = NvmlInventory.open(fake_nvml(events=[ev]))
        gpus = inv.gpus()
        assert gpus[0].healthy
        assert (gpus[1].healthy, gpus[1].reason) == (False, "xid 79: GPU has fallen off the bus")

    def test_application_xid_event(self) -> None:
        """An application XID event changes nothing."""
        ev = SimpleNamespace(device=0, eventType=8, eventData=13)
        inv = NvmlInventory.open(fake_nvml(events=[ev]))
        assert all(g.healthy for g in inv.gpus())

    async def test_ecc_errors(self) -> None:
        """Uncorrectable volatile ECC errors found by a refresh make the GPUs unhealthy."""
        inv = NvmlInventory.open(fake_nvml(ecc=3))
        await inv.refresh()
        assert all(not g.healthy for g in inv.gpus())
        assert inv.gpus()[0].reason == "uncorrectable ECC errors: 3 since driver load"

    def test_no_fault_injection(self) -> None:
        """Real GPUs refuse injected faults."""
        inv = NvmlInventory.open(fake_nvml())
        with pytest.raises(FaultInjectionUnsupported):
            inv.set_fault(0, "x")
        with pytest.raises(UnknownGpu):
            inv.set_fault(9, "x")


class TestNvmlTelemetry:
    """Card readings the NVML adapter reports after a refresh."""

    async def test_readings_after_refresh(self) -> None:
        """Temperature, utilisation, memory and error counts come from NVML per card."""
        inv = NvmlInventory.open(fake_nvml(ecc=0))
        await inv.refresh()
        t0, t1 = inv.telemetry(frozenset())
        assert (t0.temperature_c, t1.temperature_c) == (41.0, 42.0)
        assert t0.utilization == 0.5
        assert t0.memory_used_bytes == 1024 * 1024 * 1024
        assert t0.memory_total_bytes == 81559 * 1024 * 1024
        assert (t0.xid_events, t0.ecc_uncorrected) == (0, 0)
