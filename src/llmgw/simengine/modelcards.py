"""GET /v1/models in vLLM's shape (split from api.py, which holds the generation APIs)."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from llmgw.simengine.config import SimConfig

_enc = msgspec.json.Encoder()


def models_body(cfg: SimConfig, created: int, adapters: Mapping[str, str] | None = None) -> bytes:
    """GET /v1/models in vLLM's shape, one entry per served name, then one per LoRA
    adapter (`adapters`: name → path), whose parent is the base's first name."""
    owner = "sglang" if cfg.metrics_dialect == "sglang" else "vllm"
    data = [
        {
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": owner,
            "root": cfg.model,
            "parent": None,
            "max_model_len": cfg.max_model_len,
            "permission": [
                {
                    "id": f"modelperm-{i:032x}",
                    "object": "model_permission",
                    "created": created,
                    "allow_create_engine": False,
                    "allow_sampling": True,
                    "allow_logprobs": True,
                    "allow_search_indices": False,
                    "allow_view": True,
                    "allow_fine_tuning": False,
                    "organization": "*",
                    "group": None,
                    "is_blocking": False,
                }
            ],
        }
        for i, name in enumerate(cfg.served_model_names)
    ]
    for name, path in sorted((adapters or {}).items()):
        data.append(
            {
                "id": name,
                "object": "model",
                "created": created,
                "owned_by": owner,
                "root": path,
                "parent": cfg.model_name,
                "max_model_len": cfg.max_model_len,
                "permission": [],
            }
        )
    return _enc.encode({"object": "list", "data": data})
