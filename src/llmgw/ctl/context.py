"""What every command gets: where the controller is, where output goes, how to wait.

Kept free of heavy imports: the client (msgspec, urllib) and rich are imported
when a command first asks for them, never by `llmgw ctl --help`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TextIO

from llmgw.runtime.clock import SYSTEM_CLOCK, Clock

if TYPE_CHECKING:
    from rich.console import Console

    from llmgw.adminclient.client import AdminClient, Transport


@dataclass(kw_only=True)
class Ctx:
    out: TextIO
    err: TextIO
    # Filled by main from flags, environment and the config file.
    url: str = ""
    token: str | None = None
    clock: Clock = SYSTEM_CLOCK
    sleep: Callable[[float], None] = time.sleep
    # Tests put a fake here; None means the real urllib transport.
    transport: Transport | None = None
    # Width for rich output when `out` is not a terminal (rich would pick 80).
    width: int | None = None
    # `-o`: table | wide | tsv | json, or None for "table in a terminal, wide when piped".
    output: str | None = None
    _client: AdminClient | None = field(default=None, repr=False)

    def client(self) -> AdminClient:
        if self._client is None:
            from llmgw.adminclient.client import AdminClient

            self._client = AdminClient(self.url, token=self.token, transport=self.transport)
        return self._client

    def console(self) -> Console:
        from rich.console import Console

        return Console(file=self.out, width=self.width, highlight=False)

    def is_terminal(self) -> bool:
        isatty = getattr(self.out, "isatty", None)
        return bool(isatty and isatty())

    def format(self, *, json_flag: bool = False) -> str:
        """The output format for this command (output.choose)."""
        from llmgw.ctl.output import choose

        return choose(self.output, json_flag=json_flag, is_terminal=self.is_terminal())

    def print_answer(self, *, index: int | None = None) -> None:
        """The controller's last answer (its item `index` of a list) as it sent it: docs/
        ctl.md promises the controller's value exactly, and the typed view leaves out
        what a newer controller added."""
        answer = self.client().answer
        if index is not None and isinstance(answer, list):
            answer = answer[index]
        self.print_json(answer)

    def print_json(self, value: object) -> None:
        """A wire value as indented JSON, field names exactly as the controller sends them."""
        import msgspec

        from llmgw.ctl.shown import json_visible

        document = msgspec.json.format(msgspec.json.encode(value), indent=2).decode()
        # The same value, but a bidi override or C1 control in a name or reason is an
        # escape, not something the operator's terminal obeys (ctl.shown).
        self.out.write(json_visible(document) + "\n")
