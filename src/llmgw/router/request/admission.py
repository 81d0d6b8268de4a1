"""Whether a request whose body is read goes on to routing: its model is one the
router knows, and its key's limits admit it (tenants.py), each refusal counted.

Shared by the proxied routes (proxy.py) and the passed-through APIs (apis/passthrough.py).
"""

from __future__ import annotations

from llmgw.router.errors import NoReplica
from llmgw.router.http.answers import Whole
from llmgw.router.metrics import UNAVAILABLE
from llmgw.router.request.accounting import refused
from llmgw.router.request.intake import Intake
from llmgw.router.request.refusals import model_not_found, unavailable
from llmgw.router.request.tenants import Charge, Tenant
from llmgw.router.wiring import Router


def admit(
    st: Router,
    tenant: Tenant | None,
    model: str,
    got: Intake,
    rid: str,
    *,
    t0: float,
    path: str,
    metered: bool = True,
) -> Charge | Whole | None:
    """What a guarded key is charged for the request, or the refusal of it by the key's
    limits, counted; None for a key without limits (or no key). Unmetered (a count of
    tokens): one request, no tokens."""
    if tenant is None or not tenant.guarded:
        return None
    admitted = st.tenants.admit(tenant, model, len(got.body) if metered else 0)
    if isinstance(admitted, Whole):
        return refused(st, admitted, rid, path, t0, tenant=tenant)
    return admitted


def unknown_model(st: Router, model: str, rid: str, path: str, t0: float) -> Whole:
    """The refusal of a model the router does not know: 503 before its first endpoint
    list, else 404."""
    if st.awaiting_list:
        why = "the router has not received its endpoint list from the controller yet"
        resp = unavailable(NoReplica(model, why, retry_after_s=5))
        return refused(st, resp, rid, path, t0, outcome=UNAVAILABLE)
    # Not the asked-for name as a label: anyone could mint series with it.
    return refused(st, model_not_found(model), rid, path, t0)
