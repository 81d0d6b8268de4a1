"""docs/ctl.md's `--json` shapes name every field ctl prints.

Each entry of `SHAPES` ties the passage of docs/ctl.md that describes a command's JSON
(the bullet under "`--json` shapes", or the command's row in the commands table) to
the msgspec types ctl prints there: the answer's type and the types nested in it. Every
field of each type, by its encoded name, must appear in that passage as a word, so a
field added to a wire type without a word on the page (a script would meet it
undocumented) fails here. What a field means is not checked, only that it is named.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest

PAGE = Path(__file__).resolve().parents[2] / "docs" / "ctl.md"

# Where a passage starts (its first line holds this text) → the types it describes.
SHAPES: dict[str, tuple[str, ...]] = {
    "- `status --json`": (
        "llmgw.wire.admin.Summary",
        "llmgw.wire.admin.NodeTotals",
        "llmgw.wire.admin.ClassUse",
        "llmgw.wire.admin.FabricUse",
        "llmgw.wire.admin.ReplicaTotal",
        "llmgw.wire.admin.ModelTotals",
        "llmgw.wire.admin.IdleReplica",
        "llmgw.wire.admin.UnplaceableModel",
        "llmgw.wire.admin.WaitingModel",
        "llmgw.wire.usage.FlowQueued",
    ),
    "- `nodes --json`": (
        "llmgw.wire.admin.NodeView",
        "llmgw.wire.agent.GPU",
        "llmgw.wire.admin.DrainWait",
    ),
    "- `models --json`": ("llmgw.wire.admin.ModelView", "llmgw.wire.adapters.AdapterSpec"),
    "- `replicas --json`": ("llmgw.wire.admin.ReplicaView", "llmgw.wire.admin.ShardView"),
    "- `events --json`": ("llmgw.wire.admin.EventView",),
    "- `keys list --json`": (
        "llmgw.wire.keys.KeyView",
        "llmgw.wire.keys.KeyShare",
        "llmgw.wire.keys.KeyRevoked",
    ),
    "- `usage --json`": ("llmgw.wire.usage.UsageAnswer", "llmgw.wire.usage.UsageRow"),
    "| `keys create NAME": ("llmgw.wire.keys.KeyCreated",),
}


def passage(text: str, start: str) -> str:
    """The lines from the one beginning with `start` to the next bullet, heading or
    blank line outside a code fence (a table row is one line)."""
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith(start)), None)
    assert first is not None, f"docs/ctl.md has no line starting {start!r}"
    out = [lines[first]]
    if start.startswith("|"):
        return out[0]
    fenced = False
    for line in lines[first + 1 :]:
        if line.strip().startswith("```"):
            fenced = not fenced
        elif not fenced and (line.startswith(("- ", "#")) or not line.strip()):
            break
        out.append(line)
    return "\n".join(out)


def unnamed(text: str, kind: Any) -> list[str]:
    """The encoded names of `kind`'s fields that `text` does not hold as a word."""
    return [
        f.encode_name
        for f in msgspec.structs.fields(kind)
        if not re.search(r"(?<![\w-])" + re.escape(f.encode_name) + r"(?![\w-])", text)
    ]


def resolve(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


class TestDocsJsonShapes:
    """docs/ctl.md names every field of each `--json` answer."""

    @pytest.mark.parametrize("start", sorted(SHAPES))
    def test_passage_names_every_field(self, start: str) -> None:
        """Each field of the types a command prints appears in the passage that shows it."""
        text = passage(PAGE.read_text(), start)
        missing = {d: unnamed(text, resolve(d)) for d in SHAPES[start]}
        assert {d: m for d, m in missing.items() if m} == {}

    def test_the_check_catches_an_unnamed_field(self) -> None:
        """A passage that leaves a field out is caught; a name inside another word is no name."""
        text = passage("- `events --json` — `id, at, kind, subject_id`, model\n\nnext", "- `ev")
        assert unnamed(text, resolve("llmgw.wire.admin.EventView")) == ["subject", "message"]
