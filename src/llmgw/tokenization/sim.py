"""The sim-engine's tokenizer: deterministic, documented, about 4 characters per token.

Shared (not a program's): the sim-engine tokenizes prompts with it, and the
router uses it to map a prompt to the sim-engine's KV blocks in precise mode
(docs/routing.md). `llmgw.simengine.tokenizer` re-exports it.

Benchmarks reproduce prompts' token ids (and so their KV block hashes, see
`llmgw.simengine.kvcache.prompt_block_hashes`) from a request body with the functions here, so
the rules are exact:

Text
    `tokenize(text)` cuts the text into consecutive pieces of 4 Unicode code
    points (the last piece may be shorter; the empty string has no tokens). A
    piece's id is `FIRST_TEXT_ID + crc32(piece.encode("utf-8")) % TEXT_ID_RANGE`.

Special ids (below FIRST_TEXT_ID)
    `BOS` starts every prompt; `END` closes a message and is also the
    end-of-sequence token a generation stops with; `ROLE_IDS[role]` opens a
    message of that role (`ROLE_OTHER` followed by the role's text tokens for
    roles not listed); `TOOLS` opens the tool definitions; `SEP` separates a
    message's name or tool-call id from its content.

Chat (`chat_prompt_ids(messages, tools)`)
    `[BOS]`, then if tools are given `[TOOLS] + tokenize(canon(tools)) + [END]`,
    then per message in order
    `role_open + [tokenize(name) + [SEP]] + [tokenize(tool_call_id) + [SEP]]
    + tokenize(content_text) + [tokenize(canon(tool_calls))] + [END]`
    (bracketed parts only when the field is present), then the generation
    prompt `ROLE_IDS["assistant"]`. `canon(x)` is JSON with sorted keys and no
    spaces; `content_text` is the string content, or the `text` of each
    `{"type": "text"}` part and `canon(part)` of any other part, joined with "".
    Messages are tokenized one by one, so a conversation's prompt is always a
    token prefix of its next turn's prompt (what makes multi-turn prefix
    caching work, as with a real chat template).

Completions (`completion_prompt_ids(prompt)`)
    `[BOS] + tokenize(prompt)` for a string; a list of ints is used as is.

Generated text
    Each generated token is one of `OUTPUT_PIECES` (three letters and a space),
    so the text of a reply tokenizes back to exactly the ids generated: a client
    that sends the reply back as an assistant message hits the blocks cached
    while it was generated.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec

PIECE_CHARS = 4
BOS = 1
END = 2
TOOLS = 3
SEP = 4
ROLE_OTHER = 9
ROLE_IDS: Mapping[str, int] = {
    "system": 10,
    "user": 11,
    "assistant": 12,
    "tool": 13,
    "developer": 14,
    "function": 15,
}
FIRST_TEXT_ID = 256
# Llama 3's vocabulary size, so ids look like a real model's.
VOCAB_SIZE = 128_256
TEXT_ID_RANGE = VOCAB_SIZE - FIRST_TEXT_ID

_json = msgspec.json.Encoder(order="sorted")


def piece_id(piece: str) -> int:
    return FIRST_TEXT_ID + zlib.crc32(piece.encode("utf-8")) % TEXT_ID_RANGE


def tokenize(text: str) -> list[int]:
    """Token ids of `text` (4 code points per token)."""
    crc = zlib.crc32
    return [
        FIRST_TEXT_ID + crc(text[i : i + PIECE_CHARS].encode("utf-8")) % TEXT_ID_RANGE
        for i in range(0, len(text), PIECE_CHARS)
    ]


def canon(value: object) -> str:
    """Canonical JSON: sorted keys, no whitespace."""
    return _json.encode(value).decode("utf-8")


def content_text(content: object) -> str:
    """The text a message's `content` contributes (string, parts list, or nothing)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out: list[str] = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                out.append(text if isinstance(text, str) else canon(text))
            else:
                out.append(canon(part))
        return "".join(out)
    return canon(content)


class PromptTooLong(ValueError):
    """The prompt has more tokens than the limit it was built under; `tokens` is its
    exact count (counted, not built)."""

    def __init__(self, tokens: int) -> None:
        super().__init__(f"the prompt has {tokens} tokens")
        self.tokens = tokens


def text_tokens(text: str) -> int:
    """How many ids `tokenize(text)` gives, without making them."""
    return -(-len(text) // PIECE_CHARS)


class _Prompt:
    """Prompt ids, built while they fit `limit` (None: no limit), and past it only counted.

    A prompt too long for the engine is refused anyway; building its ids first cost the
    sim-engine a Python int and a 4-character string per token (a 7.9 MB body: two million
    of each, gigabytes across ten concurrent requests). Counting is exact because a text's
    token count is its length in pieces.
    """

    __slots__ = ("ids", "limit", "n")

    def __init__(self, limit: int | None) -> None:
        self.ids: list[int] = []
        self.n = 0
        self.limit = limit

    def _fits(self) -> bool:
        return self.limit is None or self.n <= self.limit

    def add(self, token: int) -> None:
        self.n += 1
        if self._fits():
            self.ids.append(token)

    def text(self, text: str) -> None:
        self.n += text_tokens(text)
        if self._fits():
            self.ids += tokenize(text)

    def done(self) -> list[int]:
        if not self._fits():
            raise PromptTooLong(self.n)
        return self.ids


def _message(out: _Prompt, message: Mapping[str, Any]) -> None:
    role = message.get("role")
    role_s = role if isinstance(role, str) else canon(role)
    opener = ROLE_IDS.get(role_s)
    if opener is not None:
        out.add(opener)
    else:
        out.add(ROLE_OTHER)
        out.text(role_s)
    name = message.get("name")
    if name is not None:
        out.text(str(name))
        out.add(SEP)
    call_id = message.get("tool_call_id")
    if call_id is not None:
        out.text(str(call_id))
        out.add(SEP)
    out.text(content_text(message.get("content")))
    calls = message.get("tool_calls")
    if calls:
        out.text(canon(calls))
    out.add(END)


def message_ids(message: Mapping[str, Any]) -> list[int]:
    """Token ids of one chat message, from its role opener to its END."""
    out = _Prompt(None)
    _message(out, message)
    return out.done()


def chat_prompt_ids(
    messages: Iterable[Mapping[str, Any]],
    tools: Sequence[object] | None = None,
    *,
    add_generation_prompt: bool = True,
    limit: int | None = None,
) -> list[int]:
    """The prompt token ids of a chat request (see the module docstring).

    PromptTooLong when there are more than `limit`, before they are made.
    """
    out = _Prompt(limit)
    out.add(BOS)
    if tools:
        out.add(TOOLS)
        out.text(canon(tools))
        out.add(END)
    for m in messages:
        _message(out, m)
    if add_generation_prompt:
        out.add(ROLE_IDS["assistant"])
    return out.done()


def completion_prompt_ids(prompt: str | Sequence[int], *, limit: int | None = None) -> list[int]:
    """The prompt token ids of a completions request: BOS + text, or given ids as is.

    PromptTooLong when there are more than `limit`, before they are made.
    """
    if isinstance(prompt, str):
        out = _Prompt(limit)
        out.add(BOS)
        out.text(prompt)
        return out.done()
    if limit is not None and len(prompt) > limit:
        raise PromptTooLong(len(prompt))
    return list(prompt)


def prompt_ids_for_body(body: Mapping[str, Any], *, limit: int | None = None) -> list[int]:
    """Prompt token ids for a chat (`messages`) or completions (`prompt`) request body.

    The one function a benchmark oracle needs; a batch prompt (a list of
    several prompts) is not a single prompt and raises ValueError. PromptTooLong (a
    ValueError too) when there are more than `limit` ids, before they are made.
    """
    if "messages" in body:
        messages = body["messages"]
        # Anything else is the engine's to refuse (a 400); not this function's to crash on.
        if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages):
            raise ValueError("messages is not a list of objects")
        return chat_prompt_ids(messages, body.get("tools"), limit=limit)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return completion_prompt_ids(prompt, limit=limit)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return completion_prompt_ids(prompt, limit=limit)
    if isinstance(prompt, list) and len(prompt) == 1:
        return prompt_ids_for_body({"prompt": prompt[0]}, limit=limit)
    raise ValueError("body has neither messages nor a single prompt")


# Generated text. Three-letter words and a space: each is exactly one piece, so
# generated text re-tokenizes to the ids that were generated.
# One string rather than a 64-line tuple literal, which is harder to read.
_WORDS = (  # noqa: SIM905
    "the and for are but not you all any can had her was one our out day get has him his how "
    "man new now old see two way who boy did its let put say she too use art bit car dog egg "
    "fun hat ink joy key log map net oak pen red sun top van web yes zip ace bay cup"
).split()
OUTPUT_PIECES: tuple[str, ...] = tuple(w + " " for w in _WORDS)
OUTPUT_IDS: tuple[int, ...] = tuple(piece_id(p) for p in OUTPUT_PIECES)
_TEXT_OF: dict[int, str] = dict(zip(OUTPUT_IDS, OUTPUT_PIECES, strict=True))
_TEXT_OF[END] = ""


def output_text(ids: Iterable[int]) -> str:
    """The text of generated ids (END and unknown ids render as nothing)."""
    get = _TEXT_OF.get
    return "".join(get(i, "") for i in ids)


def prompt_seed(ids: Sequence[int]) -> int:
    """A stable 32-bit fingerprint of a prompt, used when a request gives no seed."""
    return zlib.crc32(b"".join(i.to_bytes(4, "little") for i in ids))
