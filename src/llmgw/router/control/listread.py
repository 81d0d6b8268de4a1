"""The endpoint list as this router reads it from a controller that may be newer.

Controllers are upgraded first (docs/operations.md#which-versions-run-together), so a
list may carry fields and values this version does not know. Decoded as one strict
struct, one such entry cost the router the whole list: it kept its last one, with no
new endpoint, key or revocation, until it was upgraded too. So each entry is read on
its own:

- an endpoint's unknown fields are ignored (what the router does not know of an
  engine it does not use); an endpoint it still cannot read is left out;
- an outlook entry it cannot read (a state added since) is left out: its model is
  held as one idle at zero would be;
- a key in a priority band added since is served in the `standard` band;
- any other key it cannot read is left out, so its requests are refused: a field it
  does not know may be a limit, and a key is never served with fewer limits than it
  has (fail closed).

What is left out is logged when it first appears, not with every list.
"""

from __future__ import annotations

import logging
from typing import Any, Final, get_args

import msgspec

from llmgw.runtime.logs import kv
from llmgw.wire.endpoints import EndpointInfo, EndpointList, ModelOutlook
from llmgw.wire.keys import ClientKey, Priority

log: Final = logging.getLogger(__name__)

_ENDPOINT_FIELDS: Final = frozenset(EndpointInfo.__struct_fields__)
_BANDS: Final = frozenset(get_args(Priority))
# The band a key of an unknown one is served in: the default of a key that names none.
FALLBACK_BAND: Final[Priority] = "standard"


class _Entries(msgspec.Struct, frozen=True, kw_only=True):
    """EndpointList with its entries undecoded, each read on its own below."""

    version: int
    endpoints: tuple[msgspec.Raw, ...]
    models: tuple[str, ...] = ()
    outlook: tuple[msgspec.Raw, ...] = ()
    keys: tuple[msgspec.Raw, ...] = ()
    keys_required: bool = False


class ListReader:
    """Reads lists one after another, remembering what it logged as left out."""

    def __init__(self) -> None:
        # The log lines of the last list's entries left out (or read leniently).
        self._noted: frozenset[str] = frozenset()

    def read(self, body: bytes) -> EndpointList:
        """The list in `body`, less the entries it cannot read.

        Raises msgspec.DecodeError when the list itself cannot be read (not JSON, no
        version): the caller keeps its last list.
        """
        got = msgspec.json.decode(body, type=_Entries)
        notes: list[str] = []
        endpoints = tuple(e for raw in got.endpoints if (e := _endpoint(raw, notes)) is not None)
        outlook = tuple(o for raw in got.outlook if (o := _outlook(raw, notes)) is not None)
        keys = tuple(k for raw in got.keys if (k := _key(raw, notes)) is not None)
        for line in notes:
            if line not in self._noted:
                log.warning(line)
        self._noted = frozenset(notes)
        return EndpointList(
            version=got.version,
            endpoints=endpoints,
            models=got.models,
            outlook=outlook,
            keys=keys,
            keys_required=got.keys_required,
        )


def _field(doc: Any, name: str) -> Any:
    """`doc[name]` for the log line of an entry left out; None when there is none."""
    return doc.get(name) if isinstance(doc, dict) else None


def _endpoint(raw: msgspec.Raw, notes: list[str]) -> EndpointInfo | None:
    doc: Any = msgspec.json.decode(raw)
    if isinstance(doc, dict):
        doc = {k: v for k, v in doc.items() if k in _ENDPOINT_FIELDS}
    try:
        return msgspec.convert(doc, EndpointInfo)
    except msgspec.ValidationError as exc:
        notes.append(kv("endpoint left out, not understood", id=_field(doc, "id"), error=exc))
        return None


def _outlook(raw: msgspec.Raw, notes: list[str]) -> ModelOutlook | None:
    try:
        return msgspec.json.decode(raw, type=ModelOutlook)
    except msgspec.ValidationError as exc:
        models = _field(msgspec.json.decode(raw), "models")
        notes.append(kv("outlook left out, not understood", models=models, error=exc))
        return None


def _key(raw: msgspec.Raw, notes: list[str]) -> ClientKey | None:
    try:
        return msgspec.json.decode(raw, type=ClientKey)
    except msgspec.ValidationError as exc:
        first = exc
    doc: Any = msgspec.json.decode(raw)
    name, band = _field(doc, "name"), _field(doc, "priority")
    if isinstance(band, str) and band not in _BANDS:
        try:
            key = msgspec.convert({**doc, "priority": FALLBACK_BAND}, ClientKey)
        except msgspec.ValidationError as exc:
            first = exc
        else:
            notes.append(kv("key band unknown, served as standard", key=name, band=band))
            return key
    # Whatever it is, it may be a limit: refused rather than served without it.
    notes.append(kv("key refused, not understood", key=name, error=first))
    return None
