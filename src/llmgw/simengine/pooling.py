"""vLLM's tokenizer and scoring routes: `/tokenize`, `/detokenize`, `/rerank`, `/score`.

Shapes as vLLM serves them. The model may be left out (vLLM then uses its
one model). Scores are deterministic stand-ins: the cosine of the two texts'
sim embeddings (api.embedding), squashed into (0, 1) as a cross-encoder's are.
"""

from __future__ import annotations

import math
import time
from typing import Any

import msgspec

from llmgw.simengine import api, tokenizer
from llmgw.simengine.config import SimConfig

_enc = msgspec.json.Encoder()
_DIMS = 64


class TokenizeBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False


class DetokenizeBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    tokens: list[int]


class RerankBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    query: str
    documents: list[str | dict[str, Any]]
    top_n: int = 0


class ScoreBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    text_1: str | list[str]
    text_2: str | list[str]


def _model(given: str | None, cfg: SimConfig) -> str:
    return cfg.model_name if given is None else api.check_model(given, cfg)


def tokenize(raw: bytes, cfg: SimConfig) -> bytes:
    body = api.decode_as(raw, TokenizeBody)
    _model(body.model, cfg)
    if body.messages is not None:
        ids = tokenizer.chat_prompt_ids(
            body.messages, add_generation_prompt=body.add_generation_prompt
        )
    elif body.prompt is not None:
        ids = tokenizer.tokenize(body.prompt)
        if body.add_special_tokens:
            ids = [tokenizer.BOS, *ids]
    else:
        raise api.SimApiError(400, "Either prompt or messages is required", param="prompt")
    strs = [f"<{i}>" for i in ids] if body.return_token_strs else None
    doc = {"count": len(ids), "max_model_len": cfg.max_model_len, "tokens": ids, "token_strs": strs}
    return _enc.encode(doc)


def detokenize(raw: bytes, cfg: SimConfig) -> bytes:
    body = api.decode_as(raw, DetokenizeBody)
    _model(body.model, cfg)
    for t in body.tokens:
        if not 0 <= t < tokenizer.VOCAB_SIZE:
            raise api.SimApiError(400, f"Token id {t} is out of vocabulary", param="tokens")
    return _enc.encode({"prompt": tokenizer.output_text(body.tokens)})


def _score(a: str, b: str, cfg: SimConfig) -> tuple[float, int]:
    n = tokenizer.text_tokens(a) + tokenizer.text_tokens(b)
    if n > cfg.max_model_len:
        # Counted before tokenized, as prompts are (api.chat_ids).
        raise api.too_long(n, cfg)
    ia, ib = tokenizer.tokenize(a), tokenizer.tokenize(b)
    if not ia or not ib:
        return 0.5, len(ia) + len(ib)
    cos = sum(
        x * y for x, y in zip(api.embedding(ia, _DIMS), api.embedding(ib, _DIMS), strict=True)
    )
    return 1.0 / (1.0 + math.exp(-4.0 * cos)), len(ia) + len(ib)


def rerank(raw: bytes, cfg: SimConfig, rid: str) -> bytes:
    body = api.decode_as(raw, RerankBody)
    model = _model(body.model, cfg)
    if not body.documents:
        raise api.SimApiError(400, "documents must not be empty", param="documents")
    results = []
    total = 0
    for i, doc in enumerate(body.documents):
        text = doc if isinstance(doc, str) else str(doc.get("text", ""))
        score, n = _score(body.query, text, cfg)
        total += n
        results.append({"index": i, "document": {"text": text}, "relevance_score": score})
    results.sort(key=lambda r: -float(r["relevance_score"]))  # type: ignore[arg-type]
    if body.top_n > 0:
        results = results[: body.top_n]
    return _enc.encode(
        {
            "id": f"rerank-{rid}",
            "model": model,
            "usage": {"total_tokens": total},
            "results": results,
        }
    )


def score(raw: bytes, cfg: SimConfig, rid: str) -> bytes:
    body = api.decode_as(raw, ScoreBody)
    model = _model(body.model, cfg)
    left = [body.text_1] if isinstance(body.text_1, str) else body.text_1
    right = [body.text_2] if isinstance(body.text_2, str) else body.text_2
    if len(left) == 1:
        left = left * len(right)
    if not right or len(left) != len(right):
        raise api.SimApiError(400, "text_1 must be one text or as many as text_2", param="text_1")
    data = []
    total = 0
    for i, (a, b) in enumerate(zip(left, right, strict=True)):
        s, n = _score(a, b, cfg)
        total += n
        data.append({"index": i, "object": "score", "score": s})
    return _enc.encode(
        {
            "id": f"score-{rid}",
            "object": "list",
            "created": int(time.time()),
            "model": model,
            "data": data,
            "usage": {"prompt_tokens": total, "total_tokens": total, "completion_tokens": 0},
        }
    )
