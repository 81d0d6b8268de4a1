"""Stored rows decoded one at a time, and what to do with one this code cannot read.

A row may hold JSON this version cannot decode: written by a newer llmgw (a spec
field it does not know, added without a schema change), changed by hand, or written
before a rule tightened. Guessing at such a row is never right, so each table says
whether the fleet can do without it:

- api_keys, models (and adapters), nodes, replicas: `load` fails, naming the table
  and the row (UnreadableRow). Left out, a key would be refused while routers kept
  its hash unknown (the last key gone: keys no longer required at all), and read
  past the field it does not know, served with fewer limits than stored; a model's
  replicas would be stopped as orphans; a node's cordon or drain, held only in its
  row, would be lost to its next heartbeat; a replica's GPUs would look free to
  placement. The controller does not start; the operator upgrades, or removes the row.
- retired_models, reservations: skipped with a warning (once per row per process, since
  a standby reloads every few seconds). Both are a drain or an eviction under way: a
  retired spec left out stops its deleted model's draining replicas at once instead of
  after their requests; a reservation left out lets the next tick plan that model's
  room again. The row itself stays untouched for the llmgw that can read it.

Pure (no SQL): the SQL store hands each table's rows here.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeVar

import msgspec

from llmgw.controller.store.base import UnreadableRow
from llmgw.runtime.logs import kv

log: Final = logging.getLogger(__name__)

T = TypeVar("T")

# Table → (key column, what the operator can do besides upgrading; {where} is the
# row's SQL condition). A table absent from REFUSED is skipped (SKIPPED: what that costs).
REFUSED: Final[Mapping[str, tuple[str, str]]] = {
    "api_keys": ("name", "delete that row (DELETE FROM api_keys WHERE {where}) and create "
                 "the key again"),
    "models": ("name", "delete that row (DELETE FROM models WHERE {where}) and apply the "
               "model again"),
    "nodes": ("name", "delete that row (DELETE FROM nodes WHERE {where}): its agent "
              "registers the node again, but a cordon or drain must be given again"),
    "replicas": ("id", "delete that row (DELETE FROM replicas WHERE {where}) once its "
                 "engines are stopped: its GPUs then count as free"),
}  # fmt: skip
SKIPPED: Final[Mapping[str, tuple[str, str]]] = {
    "retired_models": ("name", "the deleted model's draining replicas stop at once"),
    "reservations": ("model", "the room held for that model's eviction is planned again"),
}

# What a decoder raises on a row it cannot read: msgspec's errors for the JSON columns,
# and the records' own checks (ValueError, TypeError) for values out of shape.
_UNREADABLE = (msgspec.MsgspecError, ValueError, TypeError)


class RowReader:
    """Decodes rows by the policy above; remembers which skipped rows it warned of."""

    def __init__(self) -> None:
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def read(
        self,
        table: str,
        rows: Iterable[Mapping[Any, Any]],
        decode: Callable[[Mapping[Any, Any]], T],
    ) -> dict[str, T]:
        """Each row of `table` decoded, by its key; UnreadableRow, or a skip and a
        warning, for a row that does not decode (by the table's policy)."""
        column = (REFUSED.get(table) or SKIPPED[table])[0]
        out: dict[str, T] = {}
        for r in rows:
            key = str(r[column])
            try:
                out[key] = decode(r)
            except _UNREADABLE as exc:
                self._unreadable(table, key, exc)
        return out

    def _unreadable(self, table: str, key: str, exc: Exception) -> None:
        # One line: a decoder's message may carry a newline of the stored value.
        why = " ".join(str(exc).split()) or type(exc).__name__
        if table in REFUSED:
            column, remedy = REFUSED[table]
            literal = "'" + key.replace("'", "''") + "'"
            remedy = remedy.format(where=f"{column} = {literal}")
            raise UnreadableRow(table, key, why, remedy) from exc
        with self._lock:
            if (table, key) in self._warned:
                return
            self._warned.add((table, key))
        log.warning(
            kv("unreadable row skipped", table=table, row=key, error=why, cost=SKIPPED[table][1])
        )
