"""The sim-engine's settings, validated once at the edge (main) and trusted inside."""

from __future__ import annotations

from dataclasses import dataclass, field

from llmgw.simengine.batcher import FCFS, SCHEDULING_POLICIES
from llmgw.simengine.faults import FaultConfig
from llmgw.simengine.kvevents import KVEventsSettings
from llmgw.simengine.lora import LoraSettings
from llmgw.simengine.sleep import SleepSettings
from llmgw.simengine.timing import TimingModel

DIALECTS = ("vllm", "sglang")


@dataclass(frozen=True, kw_only=True)
class SimConfig:
    model: str
    # Names the API answers to, first one used as the metrics' model_name. vLLM
    # semantics: given --served-model-name, the --model path itself is not served.
    served_model_names: tuple[str, ...]
    num_gpu_blocks: int
    block_size: int = 16
    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    max_model_len: int = 8192
    # vLLM's --scheduling-policy: "fcfs" refuses a request priority other than 0;
    # "priority" serves the waiting queue by (priority, arrival) (batcher.py).
    scheduling_policy: str = FCFS
    timing: TimingModel = field(default_factory=TimingModel)
    metrics_dialect: str = "vllm"
    faults: FaultConfig = field(default_factory=FaultConfig)
    seed: int = 0
    embedding_dim: int = 1024
    # `--api-key`/VLLM_API_KEY: /v1/* needs one of these as a bearer token (auth.py).
    api_keys: tuple[str, ...] = field(default=(), repr=False)
    # vLLM's --kv-events-config: publish KV-cache events (kvevents.py) when enabled.
    kv_events: KVEventsSettings = field(default_factory=KVEventsSettings)
    # vLLM's --enable-lora and friends: LoRA adapters served as models (lora.py).
    lora: LoraSettings = field(default_factory=LoraSettings)
    # vLLM's --enable-sleep-mode and dev-mode routes, and what a wake costs (sleep.py).
    sleep: SleepSettings = field(default_factory=SleepSettings)
    # --request-log: append one JSON line per generation request (requestlog.py); None: off.
    request_log: str | None = None

    def __post_init__(self) -> None:
        if not self.served_model_names:
            raise ValueError("at least one served model name is needed")
        if self.metrics_dialect not in DIALECTS:
            raise ValueError(f"metrics dialect must be one of {', '.join(DIALECTS)}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy must be one of {', '.join(SCHEDULING_POLICIES)}")
        if self.block_size < 1 or self.num_gpu_blocks < 2:
            raise ValueError("need --block-size >= 1 and --num-gpu-blocks >= 2")
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1 or self.max_model_len < 2:
            raise ValueError(
                "max-num-seqs, max-num-batched-tokens must be >= 1, max-model-len >= 2"
            )
        if self.max_model_len > self.kv_capacity_tokens:
            # vLLM refuses to start in this case too: one full-length request must fit.
            raise ValueError(
                f"max-model-len {self.max_model_len} does not fit the KV cache "
                f"({self.kv_capacity_tokens} tokens = ({self.num_gpu_blocks} - 1) blocks "
                f"× {self.block_size})"
            )

    @property
    def model_name(self) -> str:
        return self.served_model_names[0]

    @property
    def kv_capacity_tokens(self) -> int:
        return (self.num_gpu_blocks - 1) * self.block_size
