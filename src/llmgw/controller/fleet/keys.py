"""Client keys created and revoked, decided purely (docs/tenants.md).

The key is drawn here and hashed at once: the batch, the store and the routers
hold only its SHA-256; the caller shows the key once and forgets it. Revoking marks
the row (`revoked_at`) and takes it out of the endpoint list, so a revoked key is
an unknown key to every router (401), and its name is free for a new key. The
row stays so that routers keep requiring a key after the last one is revoked
(`EndpointList.keys_required`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
from collections.abc import Mapping

from llmgw.controller.errors import Conflict, DoesNotExist
from llmgw.controller.fleet.batch import Batch
from llmgw.controller.fleet.records import FleetState, TenantKey
from llmgw.wire.keys import ClientKey, KeyCreate, KeyLimits, KeyShare, KeyView

# What every key starts with: easy to spot in a leaked log or a secret scanner.
KEY_PREFIX = "sk-llmgw-"


def new_key() -> str:
    """A fresh client key: 256 random bits."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


def key_digest(key: str) -> str:
    """The lowercase hex SHA-256 that stands for `key` everywhere but its creation."""
    return hashlib.sha256(key.encode()).hexdigest()


def create_key(state: FleetState, req: KeyCreate, *, now: float, key: str) -> Batch:
    """A batch that adds the key `key` for `req`; Conflict when the name is taken."""
    old = state.keys.get(req.name)
    if old is not None and old.live:
        raise Conflict(
            f"key {req.name!r} exists; revoke it first or choose another name", param="name"
        )
    expires_at = None if req.expires_in_s is None else now + req.expires_in_s
    client = ClientKey(
        name=req.name,
        sha256=key_digest(key),
        team=req.team,
        models=req.models,
        rpm=req.rpm,
        tpm=req.tpm,
        budget=req.budget,
        priority=req.priority,
        expires_at=expires_at,
    )
    batch = Batch(base=state, now=now)
    batch.changes.keys.append(TenantKey(key=client, created_at=now))
    batch.event(
        "key.created", "key", req.name, f"key of team {req.team}: {describe(client)}", model=None
    )
    return batch


def revoke_key(state: FleetState, name: str, *, now: float) -> Batch:
    """A batch that deletes key `name`; DoesNotExist when there is none."""
    held = state.keys.get(name)
    if held is None or not held.live:
        raise DoesNotExist(f"no key named {name!r}", param="name")
    batch = Batch(base=state, now=now)
    batch.changes.keys.append(dataclasses.replace(held, revoked_at=now))
    batch.event("key.revoked", "key", name, f"key of team {held.key.team} revoked", model=None)
    return batch


def describe(limits: KeyLimits) -> str:
    """The limits in words, for events: "models a,b; rpm 60; budget 1000000/day"."""
    parts = [f"models {','.join(limits.models)}" if limits.models else "every model"]
    if limits.rpm is not None:
        parts.append(f"rpm {limits.rpm}")
    if limits.tpm is not None:
        parts.append(f"tpm {limits.tpm}")
    if limits.budget is not None:
        parts.append(f"budget {limits.budget.tokens}/{limits.budget.per}")
    parts.append(f"priority {limits.priority}")
    return "; ".join(parts)


def key_view(
    k: TenantKey, leased: Mapping[str, tuple[float, float, float]] | None = None
) -> KeyView:
    """What `GET /admin/keys` shows of a key; `leased`: router → (rpm, tpm, budget)
    granted of this key (LeaseBook.by_key), None where no router holds a share."""
    c = k.key
    shares = tuple(
        KeyShare(
            router=router,
            rpm=None if c.rpm is None else got[0],
            tpm=None if c.tpm is None else got[1],
            budget=None if c.budget is None else got[2],
        )
        for router, got in sorted((leased or {}).items())
    )
    return KeyView(
        name=c.name,
        team=c.team,
        models=c.models,
        rpm=c.rpm,
        tpm=c.tpm,
        budget=c.budget,
        priority=c.priority,
        created_at=k.created_at,
        expires_at=c.expires_at,
        shares=shares,
    )
