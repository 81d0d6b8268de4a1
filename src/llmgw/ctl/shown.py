"""Data from the fleet, as ctl shows it: text, never markup or terminal control.

Names are checked where they enter (wire.names), but much of what ctl prints is
free text (a GPU's unhealthy reason, an engine's log tail, an event message,
an error the controller echoes) and a controller older than the check may hold
names from before it. A string shown raw can clear the screen, recolour the
terminal, plant an OSC-8 link, or reorder a line with a bidirectional override;
passed to rich as a `str` it is parsed as markup, and `[/]` ends ctl with
rich's MarkupError. So everything from the fleet goes through one of these:

- `visible(s)`: control characters (C0, DEL, C1), format characters (the bidi
  overrides and isolates, zero-width joiners), line and paragraph separators
  and lone surrogates written as Python escapes (`\\x1b`, `\\u202e`); every
  other character as it is.
- `text(s)`: `visible(s)` as a rich `Text`, which rich never parses as markup.

A backslash is left as it is: a name cannot hold one (wire.names), and in free
text it is more often a Windows path than an attempt to look like an escape.
"""

from __future__ import annotations

import unicodedata

from rich.text import Text

# Categories a terminal acts on or a reader cannot see: control, format
# (U+200E-U+200F, U+202A-U+202E, U+2066-U+2069, U+200B-U+200D, U+FEFF),
# surrogate (a lone one cannot even be encoded), line and paragraph separators.
_HIDDEN = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


# Written as Python writes them; any other hidden character by its code.
_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def visible(value: object) -> str:
    """`value` as text a terminal shows and does not act on (module docstring)."""
    s = value if isinstance(value, str) else str(value)
    if s.isprintable():
        return s  # the common case, and no character of it is hidden
    return "".join(_escape(ch) if unicodedata.category(ch) in _HIDDEN else ch for ch in s)


def json_visible(document: str) -> str:
    """A JSON text with every hidden character (as `visible` means it) written as a JSON
    `\\uXXXX` escape: the same value for a program, nothing a terminal acts on.

    msgspec escapes C0 controls in strings but writes DEL, C1 controls and bidi
    overrides as they are. The layout's own line breaks and indents are kept.
    """
    if document.isprintable():
        return document
    out = []
    for ch in document:
        if ch in "\n\t" or unicodedata.category(ch) not in _HIDDEN:
            out.append(ch)
            continue
        for unit in range(0, len(ch.encode("utf-16-be")), 2):
            code = int.from_bytes(ch.encode("utf-16-be")[unit : unit + 2], "big")
            out.append(f"\\u{code:04x}")
    return "".join(out)


def text(value: object, style: str = "") -> Text:
    """`visible(value)` as a rich Text: shown as it is, never parsed as markup."""
    return Text(visible(value), style=style)


def lines(message: object) -> str:
    """A message of several lines (ctl's own, quoting fleet data), each line made visible."""
    return "\n".join(visible(line) for line in str(message).split("\n"))
