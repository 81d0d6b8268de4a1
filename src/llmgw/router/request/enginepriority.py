"""Engine priority: a request's band written into the engine's own queue order.

Flow control orders requests only while the router holds them; once sent, a request
waits in its engine's queue behind whatever came first. vLLM run with
`--scheduling-policy priority` (the agent starts vLLM and the sim-engine so;
`EndpointInfo.priority_scheduling`) orders its waiting queue by each request's
`priority` field, lower first, then by arrival, and preempts the highest value first
when its KV cache runs out. So for such an endpoint the router writes:

- the key's band: `critical` -10, `standard` 0, `batch` 10;
- plus 1 for a request flow control let go while its tenant still has requests
  queued in the band (a tenant over its fair share waits behind those within it,
  in the engine as in the router's queue).

The proxy's routes (chat, completions, embeddings) and the Responses API carry it
(vLLM's requests for them have the field); the other passed-through APIs do not.
A client's own `priority` is replaced there (the key's band decides, not the
client); elsewhere the body goes as the client sent it. A request whose value is 0
and whose body names no `priority` is sent untouched (`Call.engine_priority` None).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from llmgw.router.request.tenants import Tenant

BAND_PRIORITY: Final = {"critical": -10, "standard": 0, "batch": 10}
# Added for a tenant with requests still queued in its band when one is let go.
BACKLOGGED: Final = 1

_decoder = msgspec.json.Decoder()
_encoder = msgspec.json.Encoder()


def of(tenant: Tenant | None, doc: dict[str, Any]) -> int | None:
    """The priority to write for a request of `tenant` whose body is `doc`; None: none
    to write (band 0, and the body names no `priority` of its own)."""
    n = 0 if tenant is None else BAND_PRIORITY.get(tenant.key.priority, 0)
    if n == 0 and "priority" not in doc:
        return None
    return n


def granted(n: int | None, *, backlogged: bool) -> int | None:
    """`n` for a request flow control let go: one later while its tenant is backlogged."""
    if not backlogged:
        return n
    return (n or 0) + BACKLOGGED


def with_priority(body: bytes, n: int) -> bytes:
    """The request body with `priority` set to `n` (the body is a JSON object: intake
    decoded it once already)."""
    doc: dict[str, Any] = _decoder.decode(body)
    doc["priority"] = n
    return _encoder.encode(doc)
