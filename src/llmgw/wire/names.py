"""Names that come from the fleet: one character set each, checked where they enter.

Node names, fabrics and GPU classes come from agents (anyone holding an agent
token); model names and the GPU classes a spec asks for come from operators.
All of them end up in tables, the status page, logs, metric labels, and node and
model names in URLs. A name that holds an escape sequence, a bidirectional
override, markup (`[/]`) or a path (`..`) would be read by a terminal, a browser
or a URL parser rather than shown, so these are refused where they come in (the
controller's heartbeat and apply, the agent's own flags, `ctl apply`) with the
rule in words. docs/controller.md ("Names") documents the sets.

Checked by functions where input enters, never by the wire types that stored
records are decoded with: a rule that changes must not make a stored fleet
unreadable (wire.models.routing_problem does the same).

Free text (a GPU's unhealthy reason, an engine's log tail, event messages) is
not a name: it is kept as sent and escaped where it is shown (ctl's
`shown.visible`, the status page's text nodes).
"""

from __future__ import annotations

import re

# Node names, fabrics and GPU classes: what a host name, an interface or
# `H100-80G` needs, and nothing a terminal, shell, markup or URL reads.
LABEL_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
LABEL_RULE = "1 to 128 characters, starting with a letter or digit, then letters, digits and . _ -"

# Model names and aliases: as a label, and also `:` and `/` (`meta-llama/Llama-3.1-8B`,
# `qwen2:7b`); not ending in "/scale": /admin/models/<name>/scale is the scale
# command's URL.
MODEL_NAME_PATTERN = r"^(?!.*/scale$)[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$"
MODEL_NAME_RULE = (
    "1 to 128 characters, starting with a letter or digit, then letters, digits and . _ : / -,"
    " not ending in /scale"
)

_LABEL = re.compile(LABEL_PATTERN)


def label_problem(value: object) -> str | None:
    """Why `value` is not a valid node name, fabric or GPU class; None when it is."""
    if isinstance(value, str) and _LABEL.fullmatch(value):
        return None
    return f"{value!r} is not a valid name: {LABEL_RULE}"
