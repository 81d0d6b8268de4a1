"""Bounds the API's edge checks add to the wire types' generated schemas (openapi.py).

api/validate.py and the name checks (wire.names) refuse values the wire types alone
accept; written into the published schemas, the document says what is refused.
"""

from __future__ import annotations

from typing import Any

from llmgw.wire.names import LABEL_PATTERN, MODEL_NAME_PATTERN
from llmgw.wire.usage import MAX_COUNT


def edge_rules(components: dict[str, Any]) -> None:
    """Bounds api/validate.py checks (with a field path naming the key) that the wire
    types leave out, written into their schemas so the document says what is refused."""
    usage = components["UsageReport"]["properties"]
    for field in ("inflight", "demand"):
        usage[field]["additionalProperties"].update(minimum=0, maximum=MAX_COUNT)
    load = components["ModelLoad"]["properties"]
    for prop in load.values():
        prop["minimum"] = 0
    # api/validate.py: the counts are bounded as a report's other counts.
    for field in ("inflight", "held", "requests"):
        load[field]["maximum"] = MAX_COUNT
    # fleet.commands.set_weight: a capacity weight and its measurement are positive.
    weight = components["WeightRequest"]["properties"]
    weight["weight"]["exclusiveMinimum"] = 0
    weight["capacity_tok_s"]["anyOf"][0]["exclusiveMinimum"] = 0
    # The name sets (wire.names), checked at the edge rather than by the stored types.
    hb = components["Heartbeat"]["properties"]
    hb["node"]["pattern"] = LABEL_PATTERN
    hb["fabrics"]["items"]["pattern"] = LABEL_PATTERN
    components["GPU"]["properties"]["gpu_class"]["pattern"] = LABEL_PATTERN
    components["ModelSpec"]["properties"]["gpu_classes"]["items"]["pattern"] = LABEL_PATTERN
    spec = components["ModelSpec"]["properties"]
    spec["name"]["pattern"] = spec["aliases"]["items"]["pattern"] = MODEL_NAME_PATTERN
    adapter = components["AdapterSpec"]["properties"]
    adapter["name"]["pattern"] = adapter["adapter_of"]["pattern"] = MODEL_NAME_PATTERN
    # KeyLimits.__post_init__: a model named twice is refused.
    for name in ("KeyCreate", "KeyCreated", "KeyView"):
        components[name]["properties"]["models"]["uniqueItems"] = True
