"""Pure rules: a GPU's placement class, and which faults make a GPU unhealthy.

No NVML here, so the rules are unit-tested with plain values.

## Class names: `<model>-<memory GiB, rounded>G`
The model is the marketing name without vendor words ("NVIDIA", "Tesla",
"GeForce", "Quadro") and without form-factor or size suffixes; the memory is
what the card reports (NVML's total, MiB → GiB, rounded to the nearest
integer), not the size printed on the box. So:

| NVML name                 | memory (MiB) | class       |
|---------------------------|--------------|-------------|
| NVIDIA H100 80GB HBM3     | 81559        | H100-80G    |
| NVIDIA A100-SXM4-40GB     | 40960        | A100-40G    |
| NVIDIA H200               | 143771       | H200-140G   |
| NVIDIA L40S               | 46068        | L40S-45G    |
| NVIDIA GeForce RTX 4090   | 24564        | RTX4090-24G |

Deriving the size from the reported memory, never from the name, keeps one
rule for every card: two cards whose engines get the same memory are the same
class, whatever the marketing says (an H200 sells as "141GB" but gives engines
140 GiB). Operators copy the class from `scripts/gpu-check.sh`.

## Health
XIDs are the driver's error reports. Source for the meanings: NVIDIA's Xid
catalog (docs.nvidia.com/deploy/xid-errors). Application XIDs come from one
program misbehaving and leave the card usable; the list is the one NVIDIA's
Kubernetes device plugin skips (k8s-device-plugin, internal/rm/health.go).
Every other XID makes the GPU unhealthy, as the device plugin does: a card
wrongly kept in service costs failed replicas again and again, one wrongly
taken out costs only its capacity until someone looks. The critical table only
gives the common ones a readable reason.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

# Application XIDs: the GPU stays healthy (k8s-device-plugin's skip list).
APPLICATION_XIDS: Mapping[int, str] = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup, due to previous errors",
    68: "video processor exception",
}

# Hardware and driver XIDs that take a GPU out of service (NVIDIA Xid catalog).
CRITICAL_XIDS: Mapping[int, str] = {
    48: "double-bit ECC error",
    62: "internal micro-controller halt",
    63: "ECC page retirement or row remapping recorded; needs a GPU reset",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
    140: "unrecovered ECC error",
}

_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
# Words that name a product line and need the next word to mean anything.
_LINE_WORDS = frozenset({"RTX", "GTX", "TITAN"})
_NOT_ALNUM = re.compile(r"[^A-Za-z0-9]")


def model_name(name: str) -> str:
    """The model part of a class: "NVIDIA A100-SXM4-80GB" → "A100"; "" stays "GPU"."""
    words = [w for w in name.split() if w.upper() not in _VENDOR_WORDS]
    if not words:
        return "GPU"
    first = words[0].split("-")[0]
    if first.upper() in _LINE_WORDS and len(words) > 1:
        first += words[1].split("-")[0]
    return _NOT_ALNUM.sub("", first) or "GPU"


def memory_gib(memory_mib: int) -> int:
    """Reported memory in whole GiB, rounded to the nearest (half up)."""
    return int((memory_mib + 512) // 1024)


def gpu_class(name: str, memory_mib: int) -> str:
    """Placement class, `<model>-<GiB>G` (module docstring has the rule and examples)."""
    return f"{model_name(name)}-{memory_gib(memory_mib)}G"


def memory_mib_of_class(gpu_class_: str) -> int | None:
    """The memory a class name implies ("H100-80G" → 81920); None if it names none."""
    m = re.search(r"-(\d+)G$", gpu_class_)
    return int(m.group(1)) * 1024 if m else None


def xid_unhealthy_reason(xid: int) -> str | None:
    """Why this XID takes the GPU out of service; None for application XIDs."""
    if xid in APPLICATION_XIDS:
        return None
    what = CRITICAL_XIDS.get(xid, "unclassified")
    return f"xid {xid}: {what}"


def ecc_unhealthy_reason(uncorrected_volatile: int | None) -> str | None:
    """Uncorrectable ECC errors since the last driver load make a GPU unhealthy.

    None (the card has no ECC, or does not report it) is unknown, not zero, and
    is not a fault either: it cannot be acted on.
    """
    if uncorrected_volatile is None or uncorrected_volatile <= 0:
        return None
    return f"uncorrectable ECC errors: {uncorrected_volatile} since driver load"
