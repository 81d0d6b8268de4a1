"""How vLLM reads a bool sent as a form field's text (`stream` of an audio upload).

The router counts an upload as a stream by the same rule the engine streams it by,
and the sim-engine answers as vLLM does: both read it here, since the programs may
not import each other. vLLM's request models are pydantic's, which in lax mode take
these spellings in any ASCII case and refuse any other text (spaces around it
included). Read as `== "true"`, an upload with `stream=True` or `1` was streamed by
vLLM, counted by the router as not streaming, and answered whole by the sim-engine.
"""

from __future__ import annotations

from typing import Final

_TRUE: Final = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE: Final = frozenset({"0", "off", "f", "false", "n", "no"})


def form_bool(text: str | None) -> bool | None:
    """A form field's text as vLLM reads a bool; None when absent or no bool (which the
    engine refuses)."""
    if text is None or not text.isascii():
        return None
    folded = text.lower()
    if folded in _TRUE:
        return True
    return False if folded in _FALSE else None
