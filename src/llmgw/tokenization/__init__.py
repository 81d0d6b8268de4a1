"""Prompt → token ids, for whoever must see a prompt as an engine does.

Shared by the programs (never one program's): the sim-engine tokenizes with
`sim`, and the router's precise mode (docs/routing.md) must map a request to the
same token ids the engine hashes into KV blocks, so it loads the tokenizer an
endpoint names:

- `sim`: the sim-engine's own tokenizer (`sim.py`), exact for sim-engines.
- `hf:<path to tokenizer.json>`: a Hugging Face `tokenizers` tokenizer (the
  optional `tokenizers` package). Completions prompts are encoded with the
  tokenizer's special tokens, as vLLM does; chat requests are refused
  (ValueError), because the chat template that vLLM renders first is not
  applied here, and those requests are routed by the guessing mode instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from llmgw.tokenization import sim


class TokenizerSpecError(ValueError):
    """A tokenizer spec that names nothing loadable (unknown kind, missing file or package)."""


class PromptTokenizer(Protocol):
    spec: str

    def prompt_ids(self, body: Mapping[str, Any]) -> list[int]:
        """The prompt's token ids; ValueError when this tokenizer cannot say."""
        ...


class SimTokenizer:
    """The sim-engine's tokenizer: chat and completions, exact."""

    spec = "sim"

    def prompt_ids(self, body: Mapping[str, Any]) -> list[int]:
        return sim.prompt_ids_for_body(body)


class HFTokenizer:
    """A `tokenizers` tokenizer.json: completions prompts only (see the module docstring)."""

    def __init__(self, spec: str, path: str) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise TokenizerSpecError(
                f"{spec!r} needs the 'tokenizers' package (pip install tokenizers)"
            ) from exc
        try:
            self._tok = Tokenizer.from_file(path)
        except Exception as exc:  # tokenizers raises its own Exception types
            raise TokenizerSpecError(f"{spec!r}: cannot load {path}: {exc}") from exc
        self.spec = spec

    def prompt_ids(self, body: Mapping[str, Any]) -> list[int]:
        if "messages" in body:
            raise ValueError("chat templates are not applied by the hf tokenizer")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, str):
            return list(self._tok.encode(prompt, add_special_tokens=True).ids)
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        raise ValueError("body has no single prompt")


def load_tokenizer(spec: str) -> PromptTokenizer:
    """The tokenizer a spec names (`sim`, `hf:<path>`); TokenizerSpecError otherwise."""
    if spec == "sim":
        return SimTokenizer()
    if spec.startswith("hf:") and len(spec) > 3:
        return HFTokenizer(spec, spec[3:])
    raise TokenizerSpecError(f"tokenizer {spec!r}: expected 'sim' or 'hf:<path to tokenizer.json>'")
