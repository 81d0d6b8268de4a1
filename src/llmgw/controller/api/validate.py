"""Edge checks the wire types cannot express: every bad input gets a clear refusal.

msgspec checks shapes and simple bounds while decoding. These check what spans
fields, or what would mislead the controller later if it got in: a port range
upside down, two GPUs claiming one index (placement would give one card
twice), a negative count no router can have seen (autoscaling would read it as
load). Each raises InvalidSpec (422) naming the field path in `param`, before
anything is decided, so a refused request changes nothing.

The agent and router protocols accept unknown fields on purpose: a newer agent
or router must keep working against an older controller. The admin bodies
forbid them (wire.admin, wire.models): a typo in an operator's command must
not pass silently.
"""

from __future__ import annotations

import ipaddress
import math
from collections.abc import Mapping

from llmgw.controller.errors import InvalidSpec
from llmgw.wire.agent import Heartbeat
from llmgw.wire.models import ModelSpec, spec_problem
from llmgw.wire.names import address_problem, label_problem
from llmgw.wire.osstrings import control_at
from llmgw.wire.usage import MAX_COUNT, UsageReport

_PORTS = (1, 65535)


def _unspecified(address: str) -> bool:
    try:
        return ipaddress.ip_address(address.strip().strip("[]")).is_unspecified
    except ValueError:
        return False  # a host name


def check_names(hb: Heartbeat) -> None:
    """The node's name, fabrics and GPU classes in wire.names' set: they are shown in
    terminals and pages and put in URLs, and the agent token is not trust enough."""
    named = [("node", hb.node)]
    named += [(f"fabrics[{i}]", f) for i, f in enumerate(hb.fabrics)]
    named += [(f"gpus[{i}].gpu_class", g.gpu_class) for i, g in enumerate(hb.gpus)]
    for param, value in named:
        problem = label_problem(value)
        if problem is not None:
            raise InvalidSpec(f"heartbeat: {param}: {problem}", param=param)


def check_heartbeat(hb: Heartbeat) -> None:
    check_names(hb)
    if not hb.address.strip():
        raise InvalidSpec(
            "heartbeat: address must not be empty (routers and peer shards reach the "
            "node's engines there)",
            param="address",
        )
    problem = address_problem(hb.address)
    if problem is not None:
        # It becomes the host of the engines' URLs: `a@b`, `/` or `?` would move them.
        raise InvalidSpec(f"heartbeat: address: {problem}", param="address")
    if _unspecified(hb.address):
        # An older agent (today's refuses it at start): routers sent to "0.0.0.0" would
        # connect to their own host.
        raise InvalidSpec(
            f"heartbeat: address {hb.address!r} is no one's address (it means every "
            "interface); start the agent with --address set to this node's address",
            param="address",
        )
    lo, hi = hb.port_range
    if not _PORTS[0] <= lo <= hi <= _PORTS[1]:
        raise InvalidSpec(
            f"heartbeat: port_range [{lo}, {hi}] must satisfy 1 <= low <= high <= 65535",
            param="port_range",
        )
    if hb.seq < 0:
        raise InvalidSpec(
            f"heartbeat: seq {hb.seq} is negative (0 when the agent does not number them)",
            param="seq",
        )
    seen: set[int] = set()
    for i, g in enumerate(hb.gpus):
        if g.index < 0:
            raise InvalidSpec(
                f"heartbeat: GPU index {g.index} is negative", param=f"gpus[{i}].index"
            )
        if g.index in seen:
            raise InvalidSpec(
                f"heartbeat: GPU index {g.index} is reported twice", param=f"gpus[{i}].index"
            )
        seen.add(g.index)
    for i, s in enumerate(hb.shards):
        if s.rank < 0:
            raise InvalidSpec(
                f"heartbeat: shard rank {s.rank} is negative", param=f"shards[{i}].rank"
            )
        if s.port is not None and not _PORTS[0] <= s.port <= _PORTS[1]:
            raise InvalidSpec(
                f"heartbeat: shard port {s.port} is not a TCP port", param=f"shards[{i}].port"
            )


def check_usage(report: UsageReport) -> None:
    if not report.router_id:
        raise InvalidSpec("usage report: router_id must not be empty", param="router_id")
    if not math.isfinite(report.sent_at):
        # Newer reports replace older ones by sent_at: an infinite one would never be replaced.
        raise InvalidSpec(
            f"usage report: sent_at must be a finite unix time, got {report.sent_at}",
            param="sent_at",
        )
    _counts(report.inflight, "inflight")
    _counts(report.demand, "demand")
    if _control(report.counter_id):
        raise InvalidSpec("usage report: counter_id holds a control character", param="counter_id")
    for i, row in enumerate(report.tokens):
        for field, text in (("key", row.key), ("team", row.team), ("model", row.model)):
            if _control(text):
                raise InvalidSpec(
                    f"usage report: tokens[{i}].{field} holds a control character",
                    param=f"tokens.{i}.{field}",
                )
    for model, load in report.load.items():
        # Bounded as the other counts are: autoscaling sums them over routers and
        # divides them as floats, where a larger one (or a sum of two) raises.
        _counts(
            {"inflight": load.inflight, "held": load.held, "requests": load.requests},
            f"load[{model!r}]",
            param=f"load.{model}",
        )
        if load.interval_s < 0 or not math.isfinite(load.interval_s):
            raise InvalidSpec(
                f"usage report: load[{model!r}].interval_s must be >= 0, got {load.interval_s}",
                param=f"load.{model}.interval_s",
            )


def _control(text: str) -> bool:
    # PostgreSQL's text holds no NUL; any control character is no name.
    return control_at(text) is not None


def _counts(counts: Mapping[str, int], field: str, *, param: str | None = None) -> None:
    for key, n in counts.items():
        if not 0 <= n <= MAX_COUNT:
            # Not the number itself: one of 10**400 digits would fill the log line.
            shown = n if -MAX_COUNT <= n <= MAX_COUNT else f"{len(str(abs(n)))} digits"
            raise InvalidSpec(
                f"usage report: {field}[{key!r}] must be within 0..2**53, got {shown}",
                param=f"{param or field}.{key}",
            )


def check_spec(spec: ModelSpec) -> tuple[str, str] | None:
    """(field, what is wrong) with a spec beyond its type; None when nothing is.

    Returned rather than raised: the caller names the spec and its index (one
    spec or a list of them) in the message and the param.
    """
    for cls in spec.gpu_classes:
        if not cls.strip():
            return "gpu_classes", "a GPU class must not be empty"
    return spec_problem(spec)
