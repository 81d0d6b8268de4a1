"""Request input: JSON bodies and query parameters, decoded at the edge.

Everything a handler reads from a request comes through here: a body that is not
JSON (or not UTF-8, or nested too deeply) is 400 `InvalidRequest`, JSON of the
wrong type or a spec that breaks a rule is 422 `InvalidSpec` naming the field
(`param`); never a traceback. Integral floats (1039.0) count as the integers
/openapi.json publishes.
"""

from __future__ import annotations

import math
import re
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from llmgw.controller.api.validate import check_spec
from llmgw.controller.errors import InvalidRequest, InvalidSpec
from llmgw.wire.adapters import AdapterSpec, adapter_problem, is_adapter
from llmgw.wire.admin import DrainRequest
from llmgw.wire.models import ModelSpec, env_from_problem
from llmgw.wire.names import MODEL_NAME_RULE, STORED_MODEL_NAME_PATTERN, shown_name

T = TypeVar("T")

# Known __post_init__ messages of ModelSpec and KeyCreate → the field they are about.
_POST_INIT_FIELDS = (
    ("max_replicas", "max_replicas"),
    ("aliases", "aliases"),
    ("env_from", "env_from"),
    ("models", "models"),
)


def validation_param(message: str) -> str | None:
    """The field path a msgspec validation message names (`$[1].x` → `[1].x`)."""
    path = None
    m = re.search(r" - at `\$(.*)`$", message)
    if m:
        path = m.group(1).lstrip(".")
    f = re.search(r"field `([^`]+)`", message)
    if f:
        path = f"{path}.{f.group(1)}" if path else f.group(1)
    if path is None:
        for needle, field in _POST_INIT_FIELDS:
            if message.startswith(needle):
                return field
    return path or None


TOO_DEEP = "the JSON body is nested too deeply"


def integral_floats_as_ints(value: Any) -> Any:
    """`value` with every float that has no fraction (1039.0) as an int.

    JSON Schema's `integer` (what /openapi.json publishes) includes 1039.0, which
    msgspec's int refuses; a float field takes an int as is. RecursionError on a
    tree deeper than the stack: the caller's "nested too deeply".
    """
    if type(value) is float:
        return int(value) if value.is_integer() and abs(value) < 2**63 else value
    if type(value) is list:
        return [integral_floats_as_ints(v) for v in value]
    if type(value) is dict:
        return {k: integral_floats_as_ints(v) for k, v in value.items()}
    return value


def decode(body: bytes, type_: type[T], *, what: str) -> T:
    """The one way an API body comes in: 400 when it is not JSON (or too deep), 422 when
    it breaks its type; never a traceback."""
    if not body.strip():
        raise InvalidRequest(f"{what}: the request body is empty; a JSON object is required")
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        failed = exc
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"{what}: body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidRequest(f"{what}: {TOO_DEEP}") from None
    # Refused by type: once more with integral floats as ints (the schema's integers).
    try:
        return msgspec.convert(integral_floats_as_ints(msgspec.json.decode(body)), type_)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        # msgspec stops at the first type error: a body refused by type may be
        # malformed further on, or too deep; the type error is what it is told.
        raise InvalidSpec(f"{what}: {msg}", param=validation_param(msg)) from failed


def decode_specs(body: bytes) -> list[ModelSpec | AdapterSpec]:
    """One spec or a list of them; any invalid one refuses the whole request. An entry
    with `adapter_of` is a LoRA adapter's (wire.adapters)."""
    try:
        raw: Any = integral_floats_as_ints(msgspec.json.decode(body)) if body.strip() else None
    except msgspec.DecodeError as exc:
        raise InvalidRequest(f"body is not valid JSON: {exc}") from exc
    except RecursionError:
        raise InvalidRequest(TOO_DEEP) from None
    single = isinstance(raw, dict)
    items = [raw] if single else raw
    if not isinstance(items, list) or not items:
        raise InvalidRequest("body must be a model spec object or a non-empty list of them")
    specs: list[ModelSpec | AdapterSpec] = []
    for i, item in enumerate(items):
        where = "" if single else f"models[{i}]"
        label = _label(where, item.get("name") if isinstance(item, dict) else None)
        if not isinstance(item, dict):
            raise InvalidSpec(f"{where}: a model spec must be a JSON object", param=f"[{i}]")
        if is_adapter(item):
            specs.append(_decode_adapter(item, label, i, single=single))
            continue
        refs = env_from_problem(item)
        if refs is not None:
            ref_field, ref_why = refs
            raise InvalidSpec(
                f"model spec {label}: {ref_field}: {ref_why}; nothing was applied",
                param=_param(ref_field, i, single=single),
            )
        try:
            spec = msgspec.convert(item, ModelSpec)
        except msgspec.ValidationError as exc:
            msg = _in_words(str(exc))
            field = validation_param(msg)
            raise InvalidSpec(
                f"model spec {label}: {msg}; nothing was applied",
                param=_param(field, i, single=single),
            ) from exc
        wrong = check_spec(spec)
        if wrong is not None:
            field, why = wrong
            raise InvalidSpec(
                f"model spec {label}: {field}: {why}; nothing was applied",
                param=_param(field, i, single=single),
            )
        specs.append(spec)
    return specs


def _param(field: str | None, i: int, *, single: bool) -> str | None:
    """The `param` of a refusal of spec `i`'s `field` (None: the spec as a whole): the
    field alone for a body of one spec, `[i].field` for a list."""
    if single:
        return field
    return f"[{i}].{field}" if field else f"[{i}]"


def _label(where: str, name: object) -> str:
    """How a refusal names a spec: its place in a list and its name, `models[1] ('m')`.
    A name that is not a string is left out (the refusal says what is wrong with it):
    `None` or `['m']` would read as the spec's name."""
    shown = shown_name(name) if isinstance(name, str) else ""
    if where:
        return f"{where} ({shown})" if shown else where
    return shown or "(no name)"


_NAME_REGEX = f"Expected `str` matching regex {STORED_MODEL_NAME_PATTERN!r}"


def _in_words(message: str) -> str:
    """msgspec's refusal of a name, with the rule in words rather than its regex (as
    `ctl apply` says it): `Expected `str` matching regex '^(?!.*/scale$)…'` told an
    operator who typed a Cyrillic `о` nothing."""
    return message.replace(_NAME_REGEX, f"not a valid name: {MODEL_NAME_RULE}")


def _decode_adapter(item: Any, label: str, i: int, *, single: bool) -> AdapterSpec:
    try:
        spec = msgspec.convert(item, AdapterSpec)
    except msgspec.ValidationError as exc:
        msg = _in_words(str(exc))
        if msg.startswith("adapter_of must"):
            field: str | None = "adapter_of"
        elif "Object contains unknown field" in msg:
            # Engine, GPUs and replicas are the base's: say so rather than just "unknown".
            field = validation_param(msg)
            msg += " (an adapter takes only name, adapter_of and source: the rest is its base's)"
        else:
            field = validation_param(msg)
        raise InvalidSpec(
            f"adapter spec {label}: {msg}; nothing was applied",
            param=_param(field, i, single=single),
        ) from exc
    wrong = adapter_problem(spec)
    if wrong is not None:
        field, why = wrong
        raise InvalidSpec(
            f"adapter spec {label}: {field}: {why}; nothing was applied",
            param=_param(field, i, single=single),
        )
    return spec


def decode_drain(body: bytes) -> DrainRequest:
    """A drain request (an empty body: the defaults; grace UNSET: the controller's)."""
    if not body.strip():
        return DrainRequest()
    req = decode(body, DrainRequest, what="drain request")
    if isinstance(req.grace_s, msgspec.UnsetType):
        return req
    if not math.isfinite(req.grace_s) or req.grace_s < 0:
        raise InvalidSpec(
            f"grace_s must be a finite number of seconds >= 0, got {req.grace_s}",
            param="grace_s",
        )
    return req


class _NoBody(msgspec.Struct, forbid_unknown_fields=True):
    """Commands that take no body accept none, or `{}`; anything else is refused."""


async def no_body(request: web.Request, what: str) -> None:
    body = await request.read()
    if body.strip():
        decode(body, _NoBody, what=f"{what} (takes no body)")


def query(request: web.Request, name: str) -> str | None:
    """A query parameter given at most once (the schema's scalar); None when absent."""
    values = request.query.getall(name, [])
    if len(values) > 1:
        raise InvalidRequest(f"query parameter {name} is given {len(values)} times", param=name)
    return values[0] if values else None


def query_name(request: web.Request, name: str) -> str | None:
    """A name to filter by (`?model=`); None when absent or empty. A NUL is refused: no
    name holds one, and PostgreSQL refuses the whole query over it, which would read as
    the database failing (503) rather than the request."""
    value = query(request, name)
    if value is not None and "\x00" in value:
        raise InvalidRequest(f"query parameter {name} holds a NUL; no name does", param=name)
    return value or None


def only_known_query(request: web.Request, known: frozenset[str]) -> None:
    """Refuse a query parameter the route does not take: ignored, a misspelt filter
    (`?modle=`) would answer as if none were given, the whole unfiltered list."""
    for name in request.query:
        if name not in known:
            takes = ", ".join(sorted(known)) or "none"
            raise InvalidRequest(
                f"unknown query parameter {name[:64]!r} (this route takes: {takes})",
                param=name[:64],
            )


def query_int(request: web.Request, name: str, default: int | None, lo: int, hi: int) -> int | None:
    text = query(request, name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        # "1039.0" is an integer to JSON Schema (what /openapi.json publishes).
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number.is_integer()):
            raise InvalidRequest(
                f"query parameter {name} must be an integer, got {text!r}", param=name
            ) from None
        value = int(number)
    if not lo <= value <= hi:
        raise InvalidRequest(
            f"query parameter {name} must be in {lo}..{hi}, got {value}", param=name
        )
    return value
