"""Names that come from the fleet: one character set each, checked where they enter.

Node names, fabrics and GPU classes come from agents (anyone holding an agent
token); model names and the GPU classes a spec asks for come from operators.
All of them end up in tables, the status page, logs, metric labels, and node and
model names in URLs. A name that holds an escape sequence, a bidirectional
override, markup (`[/]`) or a path (`..`, or a `..` part of a model name) would be read
by a terminal, a browser or a URL parser rather than shown, so these are refused where
they come in (the controller's heartbeat and apply, the agent's own flags, `ctl apply`)
with the rule in words. docs/controller.md ("Names") documents the sets.

Checked by functions where input enters, never by the wire types that stored
records are decoded with: a rule that changes must not make a stored fleet
unreadable (wire.models.routing_problem does the same).

Free text (a GPU's unhealthy reason, an engine's log tail, event messages) is
not a name: it is kept as sent and escaped where it is shown (ctl's
`shown.visible`, the status page's text nodes).
"""

from __future__ import annotations

import ipaddress
import re

# The end of a pattern that msgspec checks. msgspec matches with Python's `re.search`,
# where `$` also matches before a final line end: with a bare `$`, a key named "a\n"
# was created and could never be revoked (its DELETE's name is checked whole). The
# lookahead keeps the end the end, and reads the same in a JSON Schema's ECMA regex.
END = r"(?!\n)$"

# Node names, fabrics and GPU classes: what a host name, an interface or
# `H100-80G` needs, and nothing a terminal, shell, markup or URL reads.
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}" + END
LABEL_RULE = "1 to 128 characters, starting with a letter or digit, then letters, digits and . _ -"

# Model names, aliases and adapters: as a label, and also `:` and `/`
# (`meta-llama/Llama-3.1-8B`, `qwen2:7b`); not ending in "/scale": /admin/models/<name>/scale
# is the scale command's URL. No part between slashes empty, `.` or `..`: curl, browsers and
# most proxies resolve `/admin/models/a/../b` to `/admin/models/b` and collapse `//`, so
# `curl -X DELETE` typed for one model deleted another (ctl percent-encodes; they do not).
MODEL_NAME_PATTERN = (
    r"^(?!.*/scale$)(?!(?:.*/)?\.{1,2}(?:/|$))(?!.*//)(?!.*/$)[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}"
    + END
)
MODEL_NAME_RULE = (
    "1 to 128 characters, starting with a letter or digit, then letters, digits and . _ : / -,"
    " not ending in /scale, no part between slashes empty, . or .."
)
# What stored specs' names are decoded with: the set before empty, `.` and `..` parts were
# refused, so a fleet stored then stays readable and such a model can still be deleted.
STORED_MODEL_NAME_PATTERN = r"^(?!.*/scale$)[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"

# A node's address (heartbeats): an IP address, or a host name in the label set up to
# DNS's 253 characters. It becomes the host of engine URLs and KV-event endpoints, so
# nothing a URL parser reads (`/`, `@`, `?`, `#`, spaces) may be in it.
ADDRESS_RULE = "an IP address, or a host name of letters, digits and . _ - (up to 253)"
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")
_LABEL = re.compile(LABEL_PATTERN)
_MODEL_NAME = re.compile(MODEL_NAME_PATTERN)


def shown_name(value: object) -> str:
    """`value` for a refusal: its repr, cut past 200 characters (a name holds 128 at
    most). A 10 KB name was repeated whole in the answer and in the log line of every
    refusal."""
    if isinstance(value, str) and len(value) > 200:
        return repr(value[:128])[:-1] + f"...' ({len(value)} characters)"
    return repr(value)


def address_problem(value: str) -> str | None:
    """Why `value` is not a node address routers can put in a URL; None when it is."""
    try:
        bracketed = value.startswith("[") and value.endswith("]")
        ipaddress.ip_address(value[1:-1] if bracketed else value)
    except ValueError:
        pass
    else:
        return None
    if _HOST.fullmatch(value):
        return None
    return f"{shown_name(value)} is not a valid address: {ADDRESS_RULE}"


def label_problem(value: object) -> str | None:
    """Why `value` is not a valid node name, fabric or GPU class; None when it is."""
    if isinstance(value, str) and _LABEL.fullmatch(value):
        return None
    return f"{shown_name(value)} is not a valid name: {LABEL_RULE}"


def model_name_problem(value: object) -> str | None:
    """Why `value` is not a valid model name, alias or adapter name; None when it is."""
    if isinstance(value, str) and _MODEL_NAME.fullmatch(value):
        return None
    return f"{shown_name(value)} is not a valid name: {MODEL_NAME_RULE}"
