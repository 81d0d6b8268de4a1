"""Log-probabilities of generated tokens, in the shapes vLLM answers `logprobs` with.

The sim samples from no distribution, so the figures are made up, but stable: a
token's logprob depends on the token and its position only, the sampled token
ranks first, and its alternatives are other output pieces with lower figures.
Clients that read `logprobs` (evaluation harnesses, confidence filters) get a
list as long as the text, not the `null` that broke them.

Every generated token is one output piece of `tokenizer.PIECE_CHARS` characters
(the END token renders as nothing), so a delta's text cuts back into its tokens.
"""

from __future__ import annotations

import zlib
from typing import Any

from llmgw.simengine import tokenizer

# vLLM's --max-logprobs default: more alternatives than this is a 400.
MAX_LOGPROBS = 20


def pieces(text: str) -> list[str]:
    """The generated tokens of `text`."""
    n = tokenizer.PIECE_CHARS
    return [text[i : i + n] for i in range(0, len(text), n)]


def _ranked(piece: str, pos: int, k: int) -> list[tuple[str, float]]:
    """The sampled `piece` at position `pos` and `k - 1` alternatives, most likely first."""
    h = zlib.crc32(f"{pos}:{piece}".encode())
    top = -((h % 1000) / 1000.0) * 2.0  # in (-2, 0]
    out = [(piece, top)]
    alts = tokenizer.OUTPUT_PIECES
    i = h % len(alts)
    while len(out) < k:
        alt = alts[i % len(alts)]
        i += 1
        if alt != piece:
            out.append((alt, top - 0.5 * len(out)))
    return out


def _entry(token: str, logprob: float) -> dict[str, Any]:
    return {"token": token, "logprob": logprob, "bytes": list(token.encode("utf-8"))}


def chat(text: str, top: int, start: int) -> dict[str, Any]:
    """`choice.logprobs` of chat text whose first token is the `start`-th generated."""
    content = []
    for j, piece in enumerate(pieces(text)):
        ranked = _ranked(piece, start + j, max(top, 1))
        entry = _entry(*ranked[0])
        entry["top_logprobs"] = [_entry(t, lp) for t, lp in ranked[:top]]
        content.append(entry)
    return {"content": content}


def completion(text: str, top: int, start: int, offset: int) -> dict[str, Any]:
    """`choice.logprobs` of completion text: its first token is the `start`-th generated,
    and begins `offset` characters into the choice's text."""
    out: dict[str, list[Any]] = {
        "text_offset": [],
        "token_logprobs": [],
        "tokens": [],
        "top_logprobs": [],
    }
    for j, piece in enumerate(pieces(text)):
        ranked = _ranked(piece, start + j, max(top, 1))
        out["text_offset"].append(offset + j * tokenizer.PIECE_CHARS)
        out["token_logprobs"].append(ranked[0][1])
        out["tokens"].append(piece)
        out["top_logprobs"].append(dict(ranked))
    return out


def echoed(prompt: str, top: int) -> dict[str, Any]:
    """`choice.logprobs` of an echoed prompt: as `completion`'s, but the first token has
    none (nothing comes before it), as with vLLM's prompt logprobs."""
    out = completion(prompt, top, -len(pieces(prompt)), 0)
    if out["tokens"]:
        out["token_logprobs"][0] = None
        out["top_logprobs"][0] = None
    return out


def joined(head: dict[str, Any], tail: dict[str, Any]) -> dict[str, Any]:
    """Completion logprobs of `head`'s text followed by `tail`'s."""
    return {k: [*head[k], *tail[k]] for k in head}
