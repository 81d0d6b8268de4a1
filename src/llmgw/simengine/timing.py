"""How long one engine step takes, and the default engine shape: Llama-3-8B on one H100.

Step time (one forward pass of the batch the scheduler picked)
    step_ms = decode_base_ms
              + decode_ms_per_seq * (sequences decoding one token this step)
              + prefill_ms_per_token * (prompt tokens computed this step)
    then divided by `speed` and by `tp ** TP_EXPONENT`.
    Cached prompt tokens are never computed, so they cost nothing; a step that
    only prefills still pays the base (the weights are read once per step).

Where the defaults come from (Llama-3-8B, bf16, one H100 SXM 80 GB, vLLM V1)
    decode_base_ms = 6.5: a decode step reads all 16.06 GB of weights; at the
        H100's 3.35 TB/s that is 4.8 ms, and public vLLM figures for one stream
        are about 150 tokens/s, i.e. 6-7 ms per token.
    decode_ms_per_seq = 0.08: the same figures put the inter-token latency at
        batch 256 around 25-30 ms, i.e. (27 - 6.5) / 256 ≈ 0.08 ms per extra
        sequence (KV reads and sampling grow with the batch).
    prefill_ms_per_token = 0.05: 2 × 8.03 GFLOP per token at about 40% of the
        H100's 989 dense bf16 TFLOPS is 0.04 ms; with attention and overheads,
        20k prompt tokens/s, i.e. ~55 ms to first token for a 1k-token prompt.
    num_gpu_blocks: KV per token = 2 (K, V) × 32 layers × 8 KV heads × 128 dims
        × 2 bytes = 128 KiB; memory for KV = 0.9 × 85.5 GB (80 GiB) − 16.06 GB
        weights − 3.2 GB activations and CUDA graphs ≈ 57.7 GB → 440k tokens,
        27.5k blocks of 16 (vLLM's own table has 543k tokens on the 94 GB
        H100 NVL, the same arithmetic). With tensor parallelism each GPU holds
        1/tp of the weights and adds its memory to the pool.
    max_num_seqs = 1024, max_num_batched_tokens = 8192: vLLM's defaults for
        GPUs with ≥ 70 GiB (`EngineArgs.get_batch_defaults`, OpenAI server).
    max_model_len = 8192: Llama-3-8B's context.
    TP_EXPONENT = 0.8: tensor parallelism splits the work but adds all-reduces;
        TP 2 ≈ 1.74×, TP 4 ≈ 3.0×, TP 8 ≈ 5.3× faster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TP_EXPONENT = 0.8
DEFAULT_PREFILL_MS_PER_TOKEN = 0.05
DEFAULT_DECODE_BASE_MS = 6.5
DEFAULT_DECODE_MS_PER_SEQ = 0.08
DEFAULT_MAX_NUM_SEQS = 1024
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_MAX_MODEL_LEN = 8192

_GPU_BYTES_FOR_KV = 0.9 * 85.5e9 - 3.2e9  # per GPU, before weights
_WEIGHT_BYTES = 16.06e9  # whole model; split over tp GPUs
_KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2


def default_num_gpu_blocks(*, block_size: int, tp: int = 1) -> int:
    """KV blocks a Llama-3-8B replica on `tp` H100s would have (see module docstring)."""
    kv_bytes = tp * _GPU_BYTES_FOR_KV - _WEIGHT_BYTES
    return int(kv_bytes // (_KV_BYTES_PER_TOKEN * block_size))


@dataclass(frozen=True, slots=True)
class TimingModel:
    """Step durations; every per-step figure is at speed 1 and TP 1."""

    prefill_ms_per_token: float = DEFAULT_PREFILL_MS_PER_TOKEN
    decode_base_ms: float = DEFAULT_DECODE_BASE_MS
    decode_ms_per_seq: float = DEFAULT_DECODE_MS_PER_SEQ
    speed: float = 1.0  # 10: everything ten times faster
    tp: int = 1

    def __post_init__(self) -> None:
        if self.speed <= 0 or self.tp < 1:
            raise ValueError("speed must be > 0 and tp >= 1")
        if min(self.prefill_ms_per_token, self.decode_base_ms, self.decode_ms_per_seq) < 0:
            raise ValueError("step costs cannot be negative")

    @property
    def scale(self) -> float:
        """Seconds per simulated millisecond."""
        return 1e-3 / (self.speed * math.pow(self.tp, TP_EXPONENT))

    def step_s(self, *, prefill_tokens: int, decode_seqs: int) -> float:
        """Wall seconds one step takes."""
        ms = (
            self.decode_base_ms
            + self.decode_ms_per_seq * decode_seqs
            + self.prefill_ms_per_token * prefill_tokens
        )
        return ms * self.scale
