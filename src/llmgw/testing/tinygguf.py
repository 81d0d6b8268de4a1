"""A tiny llama-architecture GGUF with random weights, for real llama.cpp engines in tests.

`write(path)` makes a file of a few MB that llama.cpp's `llama-server` loads like
any llama model: two layers, 256-wide, and a byte-level vocabulary (SentencePiece
"llama" tokenizer with byte fallback: every UTF-8 byte has a `<0xNN>` token, plus
"▁" for a space), so any text tokenizes to about one token per byte. Nothing is
downloaded; the weights come from a seeded generator, so one seed gives the same
file every time. The output is gibberish, but loading, batching, prompt caching,
metrics and errors are the engine's own.

The output is kept to printable ASCII on purpose: random weights would otherwise
sample stray bytes that are not valid UTF-8. Every token embedding carries a
constant 1.0 in dimension 0 and no layer writes to that dimension, so the final
hidden state always has a large positive first component; the output row of every
token that must never be sampled (control tokens, non-printable bytes, bytes ≥
0x80) has a large negative weight there. So generation never stops early (there
is no end-of-text token to sample) and runs to `max_tokens`, which keeps token
counts exact in tests.

Needs the `gguf` package (the `dev` extra): `python -m llmgw.testing.tinygguf OUT`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# A chat template in ChatML form, which llama.cpp's Jinja engine renders.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

N_EMBD = 256
N_FF = 512
N_LAYER = 2
N_HEAD = 4
CONTEXT_LENGTH = 8192

# Token ids: 0 <unk>, 1 <s>, 2 </s>, 3..258 the bytes 0x00..0xFF, 259 "▁".
_BYTE0 = 3
SPACE_TOKEN = _BYTE0 + 256
VOCAB_SIZE = SPACE_TOKEN + 1


def _vocab() -> tuple[list[str], list[int], list[bool]]:
    """Token texts, token types (gguf TokenType values), and which may be sampled."""
    import gguf

    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    allowed = [False, False, False]
    for b in range(256):
        tokens.append(f"<0x{b:02X}>")
        types.append(gguf.TokenType.BYTE)
        allowed.append(0x21 <= b <= 0x7E)
    tokens.append("\u2581")
    types.append(gguf.TokenType.NORMAL)
    allowed.append(True)
    return tokens, [int(t) for t in types], allowed


def write(path: Path | str, *, seed: int = 0, name: str = "llmgw-tiny-llama") -> Path:
    """Write the model to `path` (parents created) and return the path."""
    import gguf
    import numpy as np

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)

    def rand(*shape: int, std: float = 0.02) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    tokens, types, allowed = _vocab()
    head_dim = N_EMBD // N_HEAD

    w = gguf.GGUFWriter(str(out), "llama")
    w.add_name(name)
    w.add_context_length(CONTEXT_LENGTH)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(N_LAYER)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_vocab_size(VOCAB_SIZE)

    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * VOCAB_SIZE)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    w.add_chat_template(CHAT_TEMPLATE)

    # numpy shape is (rows, cols) = ggml's (ne1, ne0): a weight maps ne0 → ne1.
    embd = rand(VOCAB_SIZE, N_EMBD)
    embd[:, 0] = 1.0
    w.add_tensor("token_embd.weight", embd)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_k.weight", rand(N_EMBD, N_EMBD))
        w.add_tensor(p + "attn_v.weight", rand(N_EMBD, N_EMBD))
        wo = rand(N_EMBD, N_EMBD)
        wo[0, :] = 0.0  # nothing writes to dimension 0 (module docstring)
        w.add_tensor(p + "attn_output.weight", wo)
        w.add_tensor(p + "ffn_norm.weight", np.ones(N_EMBD, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", rand(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", rand(N_FF, N_EMBD))
        down = rand(N_EMBD, N_FF)
        down[0, :] = 0.0
        w.add_tensor(p + "ffn_down.weight", down)
    w.add_tensor("output_norm.weight", np.ones(N_EMBD, dtype=np.float32))
    head = rand(VOCAB_SIZE, N_EMBD, std=0.1)
    head[:, 0] = np.where(np.array(allowed), 0.0, -20.0).astype(np.float32)
    w.add_tensor("output.weight", head)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def write_lora(path: Path | str, *, seed: int = 1, rank: int = 4, alpha: float = 4.0) -> Path:
    """Write a LoRA adapter for the model `write` makes (llama.cpp's GGUF adapter form).

    It adapts only the output head: `output.weight.lora_a` (rank × N_EMBD) and
    `.lora_b` (VOCAB_SIZE × rank), numpy shapes, which llama.cpp reads as
    A: ne0 = the weight's inputs, B: ne1 = its outputs. Its change is large enough
    that greedy output differs from the base's, and leaves the module docstring's
    guarantee alone: A reads nothing from dimension 0 and B writes nothing to the
    tokens that must never be sampled.
    """
    import gguf
    import numpy as np

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    _, _, allowed = _vocab()
    w = gguf.GGUFWriter(str(out), "llama")
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    a = (rng.standard_normal((rank, N_EMBD)) * 0.5).astype(np.float32)
    a[:, 0] = 0.0
    b = (rng.standard_normal((VOCAB_SIZE, rank)) * 0.5).astype(np.float32)
    b[~np.array(allowed), :] = 0.0
    w.add_tensor("output.weight.lora_a", a)
    w.add_tensor("output.weight.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m llmgw.testing.tinygguf OUT.gguf", file=sys.stderr)
        return 2
    print(write(argv[0]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
