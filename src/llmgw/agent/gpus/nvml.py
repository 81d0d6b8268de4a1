"""GPU discovery and health through NVML (the `pynvml` module of nvidia-ml-py).

Discovery reads index, UUID, name and total memory once at start. Health is
polled once a tick, off the event loop (`asyncio.to_thread`):

- XID events: an event set registered for critical-XID and double-bit-ECC
  events per device (nvmlEventSetCreate / nvmlDeviceRegisterEvents), drained
  with a zero timeout so a poll never waits. Cards or containers that do not
  deliver events are logged once and still get the ECC check.
- Uncorrectable volatile ECC errors (nvmlDeviceGetTotalEccErrors with
  UNCORRECTED, VOLATILE): above zero takes the card out (classes.py).

An unhealthy card stays unhealthy until the agent restarts: a fault that came
and went is still a card to look at before it gets engines again.

Every NVML error is translated here, once; a machine without the
driver gets GpuDiscoveryError with one line a person can act on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Set
from typing import Any

import msgspec

from llmgw.agent.gpus.base import (
    FaultInjectionUnsupported,
    GpuDiscoveryError,
    Telemetry,
    UnknownGpu,
)
from llmgw.agent.gpus.classes import ecc_unhealthy_reason, gpu_class, xid_unhealthy_reason
from llmgw.runtime.logs import kv
from llmgw.wire.agent import GPU

log = logging.getLogger(__name__)

# A poll drains at most this many events, so a storm cannot hold the worker thread.
_MAX_EVENTS_PER_POLL = 1000

FAKE_HINT = "use --gpus 8xH100-80G (or --gpus-file) for a fake inventory"


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _init_message(lib: Any, exc: Exception) -> str:
    code = getattr(exc, "value", None)
    if code == getattr(lib, "NVML_ERROR_LIBRARY_NOT_FOUND", object()):
        return f"no NVIDIA driver on this machine (libnvidia-ml.so not found); {FAKE_HINT}"
    if code == getattr(lib, "NVML_ERROR_DRIVER_NOT_LOADED", object()):
        return f"the NVIDIA driver is not loaded; {FAKE_HINT}"
    if code == getattr(lib, "NVML_ERROR_NO_PERMISSION", object()):
        return "no permission to talk to the NVIDIA driver (NVML)"
    return f"NVML could not start: {exc}"


class NvmlInventory:
    """Real GPUs. Create with `NvmlInventory.open()`; `lib` is pynvml unless a test passes one."""

    kind = "nvml"

    def __init__(self, lib: Any, gpus: tuple[GPU, ...], handles: dict[int, Any]) -> None:
        self._lib = lib
        self._gpus = {g.index: g for g in gpus}
        self._handles = handles
        self._event_set: Any = None
        self._ecc_unsupported: set[int] = set()
        # Critical XID events seen per card since start, and the last readings.
        self._xids: dict[int, int] = dict.fromkeys(self._gpus, 0)
        self._ecc: dict[int, int] = {}
        self._readings: dict[int, Telemetry] = {}
        self._closed = False

    @classmethod
    def open(cls, lib: Any = None) -> NvmlInventory:
        if lib is None:
            try:
                import pynvml
            except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
                raise GpuDiscoveryError("nvidia-ml-py is not installed") from exc
            lib = pynvml
        try:
            lib.nvmlInit()
        except lib.NVMLError as exc:
            raise GpuDiscoveryError(_init_message(lib, exc)) from exc
        try:
            gpus, handles = cls._discover(lib)
        except lib.NVMLError as exc:
            lib.nvmlShutdown()
            raise GpuDiscoveryError(f"NVML could not list the GPUs: {exc}") from exc
        if not gpus:
            lib.nvmlShutdown()
            raise GpuDiscoveryError(f"NVML found no NVIDIA GPUs; {FAKE_HINT}")
        inv = cls(lib, gpus, handles)
        inv._register_events()
        inv._apply(*inv._poll())
        return inv

    @staticmethod
    def _discover(lib: Any) -> tuple[tuple[GPU, ...], dict[int, Any]]:
        gpus: list[GPU] = []
        handles: dict[int, Any] = {}
        for i in range(int(lib.nvmlDeviceGetCount())):
            h = lib.nvmlDeviceGetHandleByIndex(i)
            name = _text(lib.nvmlDeviceGetName(h))
            memory_mib = int(lib.nvmlDeviceGetMemoryInfo(h).total) // (1024 * 1024)
            handles[i] = h
            gpus.append(
                GPU(
                    index=i,
                    uuid=_text(lib.nvmlDeviceGetUUID(h)),
                    name=name,
                    gpu_class=gpu_class(name, memory_mib),
                    memory_mib=memory_mib,
                )
            )
        return tuple(gpus), handles

    def _register_events(self) -> None:
        lib = self._lib
        wanted = lib.nvmlEventTypeXidCriticalError | lib.nvmlEventTypeDoubleBitEccError
        try:
            self._event_set = lib.nvmlEventSetCreate()
        except lib.NVMLError as exc:
            log.warning(kv("xid events unavailable", error=exc))
            return
        for i, h in self._handles.items():
            try:
                types = wanted & int(lib.nvmlDeviceGetSupportedEventTypes(h))
                if not types:
                    log.warning(kv("xid events not supported", gpu=i))
                    continue
                lib.nvmlDeviceRegisterEvents(h, types, self._event_set)
            except lib.NVMLError as exc:
                # Common in containers without the right capabilities; ECC still works.
                log.warning(kv("xid events unavailable", gpu=i, error=exc))

    def gpus(self) -> tuple[GPU, ...]:
        return tuple(self._gpus[i] for i in sorted(self._gpus))

    async def refresh(self) -> None:
        if self._closed:
            return
        # NVML calls may block in the driver: never on the event loop. The worker
        # only reads; health is applied here, on the loop, so gpus() never races.
        marks, readings = await asyncio.to_thread(self._poll)
        self._apply(marks, readings)

    def telemetry(self, busy: Set[int]) -> tuple[Telemetry, ...]:
        return tuple(self._readings[i] for i in sorted(self._readings))

    def _apply(self, marks: dict[int, str], readings: dict[int, Telemetry]) -> None:
        self._readings = readings
        for index, reason in marks.items():
            gpu = self._gpus[index]
            if gpu.healthy:
                log.warning(kv("gpu unhealthy", gpu=index, uuid=gpu.uuid, reason=repr(reason)))
                self._gpus[index] = msgspec.structs.replace(gpu, healthy=False, reason=reason)

    def _poll(self) -> tuple[dict[int, str], dict[int, Telemetry]]:
        """Worker thread: new faults by GPU index (first reason wins), and readings."""
        marks: dict[int, str] = {}
        for index, reason in self._drain_events():
            marks.setdefault(index, reason)
            self._xids[index] = self._xids.get(index, 0) + 1
        lib = self._lib
        for i, h in self._handles.items():
            if i in self._ecc_unsupported:
                continue
            try:
                count = int(
                    lib.nvmlDeviceGetTotalEccErrors(
                        h, lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, lib.NVML_VOLATILE_ECC
                    )
                )
            except lib.NVMLError:
                # No ECC on this card (or not readable): unknown, never a fault.
                self._ecc_unsupported.add(i)
                continue
            self._ecc[i] = count
            ecc_reason = ecc_unhealthy_reason(count)
            if ecc_reason is not None:
                marks.setdefault(i, ecc_reason)
        return marks, {i: self._read(i, h) for i, h in self._handles.items()}

    def _read(self, i: int, h: Any) -> Telemetry:
        """Worker thread: one card's temperature, utilisation and memory; None if unreadable."""
        lib = self._lib
        temp: float | None = None
        util: float | None = None
        used: int | None = None
        total: int | None = None
        with contextlib.suppress(lib.NVMLError):
            temp = float(lib.nvmlDeviceGetTemperature(h, lib.NVML_TEMPERATURE_GPU))
        with contextlib.suppress(lib.NVMLError):
            util = float(lib.nvmlDeviceGetUtilizationRates(h).gpu) / 100.0
        try:
            mem = lib.nvmlDeviceGetMemoryInfo(h)
            used, total = int(mem.used), int(mem.total)
        except lib.NVMLError:
            pass
        return Telemetry(
            index=i,
            temperature_c=temp,
            utilization=util,
            memory_used_bytes=used,
            memory_total_bytes=total,
            xid_events=self._xids.get(i, 0) if self._event_set is not None else None,
            ecc_uncorrected=self._ecc.get(i),
        )

    def _drain_events(self) -> list[tuple[int, str]]:
        lib = self._lib
        if self._event_set is None:
            return []
        out: list[tuple[int, str]] = []
        for _ in range(_MAX_EVENTS_PER_POLL):
            try:
                data = lib.nvmlEventSetWait_v2(self._event_set, 0)
            except lib.NVMLError:
                # NVML_ERROR_TIMEOUT: nothing pending. Anything else: try next tick.
                break
            if int(data.eventType) == lib.nvmlEventTypeDoubleBitEccError:
                reason: str | None = "double-bit ECC error event"
            else:
                reason = xid_unhealthy_reason(int(data.eventData))
            if reason is None:
                continue
            try:
                targets = [int(lib.nvmlDeviceGetIndex(data.device))]
            except lib.NVMLError:
                # An event without a device concerns every GPU (NVML's convention).
                targets = list(self._handles)
            out.extend((t, reason) for t in targets if t in self._handles)
        return out

    def set_fault(self, index: int, reason: str | None) -> GPU:
        if index not in self._gpus:
            raise UnknownGpu(index)
        raise FaultInjectionUnsupported("real GPUs take no injected faults; use a fake inventory")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        lib = self._lib
        try:
            if self._event_set is not None:
                lib.nvmlEventSetFree(self._event_set)
            lib.nvmlShutdown()
        except lib.NVMLError as exc:
            log.warning(kv("nvml shutdown failed", error=exc))
