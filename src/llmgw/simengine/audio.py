"""vLLM's audio routes: `/v1/audio/transcriptions`, `/v1/audio/translations`, `/v1/audio/speech`.

Stand-ins with the real shapes. A transcription's text is a deterministic run
of the sim's output words, longer for a longer upload; `response_format`
`json` (the default) answers `{"text", "usage": {"type": "duration",
"seconds"}}`, `text` the bare text, and `stream=true` (or another spelling of
true that vLLM's pydantic reads: wire/formbool.py) the chunks vLLM streams
(`transcription.chunk`, then `[DONE]`). Speech answers a silent WAV (or raw
PCM) whose length follows the input's; no other audio format is made.
"""

from __future__ import annotations

import struct
import time
import zlib
from typing import Any

import msgspec

from llmgw.simengine import api, tokenizer
from llmgw.simengine.config import SimConfig
from llmgw.wire.formbool import form_bool

_enc = msgspec.json.Encoder()
_RATE = 8000  # samples a second of the speech made


def _form_model(fields: dict[str, Any], cfg: SimConfig) -> str:
    model = fields.get("model")
    return cfg.model_name if not isinstance(model, str) else api.check_model(model, cfg)


def _stream(fields: dict[str, Any]) -> bool:
    """`stream` as vLLM reads it (wire/formbool.py); an empty field is absent, as FastAPI
    takes it."""
    text = fields.get("stream")
    if not text:
        return False
    read = form_bool(text)
    if read is None:
        raise api.SimApiError(
            400,
            f"stream {text!r}: expected a bool (true/false, 1/0, yes/no, on/off)",
            param="stream",
        )
    return read


def transcript(audio: bytes) -> str:
    """Deterministic words for an upload: one per 256 bytes, at least one, at most 64."""
    n = max(1, min(64, len(audio) // 256))
    seed = zlib.crc32(audio)
    words = tokenizer.OUTPUT_PIECES
    return "".join(words[(seed + i * 7919) % len(words)] for i in range(n)).strip()


def transcription(
    fields: dict[str, Any], audio: bytes | None, cfg: SimConfig, rid: str
) -> tuple[bytes, str]:
    """The whole answer and its Content-Type (a stream's events when `stream` is set)."""
    model = _form_model(fields, cfg)
    if audio is None:
        raise api.SimApiError(400, "file: a file field is required", param="file")
    text = transcript(audio)
    seconds = max(1, len(audio) // 16000)
    fmt = fields.get("response_format") or "json"
    if _stream(fields):
        created = int(time.time())
        out = []
        for word in text.split(" "):
            chunk = {
                "id": f"trsc-{rid}",
                "object": "transcription.chunk",
                "created": created,
                "model": model,
                "choices": [{"delta": {"content": word + " "}, "finish_reason": None}],
            }
            out.append(api.sse(chunk))
        return b"".join(out) + api.DONE, "text/event-stream; charset=utf-8"
    if fmt == "text":
        return text.encode(), "text/plain; charset=utf-8"
    if fmt not in ("json", "verbose_json"):
        raise api.SimApiError(
            400, f"response_format {fmt!r} is not supported", param="response_format"
        )
    body = {"text": text, "usage": {"type": "duration", "seconds": seconds}}
    return _enc.encode(body), "application/json"


class SpeechBody(msgspec.Struct, frozen=True, kw_only=True):
    model: str | None = None
    input: str
    voice: str | None = None
    response_format: str = "wav"
    speed: float = 1.0


def speech(raw: bytes, cfg: SimConfig) -> tuple[bytes, str]:
    body = api.decode_as(raw, SpeechBody)
    api.check_model(body.model, cfg)
    if not body.input:
        raise api.SimApiError(400, "input must not be empty", param="input")
    if body.response_format not in ("wav", "pcm"):
        raise api.SimApiError(400, "the sim-engine makes wav and pcm only", param="response_format")
    samples = min(_RATE * 10, int(len(body.input) * _RATE * 0.06 / max(body.speed, 0.25)))
    pcm = bytes(2 * samples)
    if body.response_format == "pcm":
        return pcm, "audio/pcm"
    head = b"RIFF" + struct.pack("<I", 36 + len(pcm)) + b"WAVEfmt "
    head += struct.pack("<IHHIIHH", 16, 1, 1, _RATE, _RATE * 2, 2, 16)
    return head + b"data" + struct.pack("<I", len(pcm)) + pcm, "audio/wav"
