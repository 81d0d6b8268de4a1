"""`llmgw sim-engine`: a simulated vLLM/SGLang replica.

Flags the agent passes to real engines are accepted so one template serves
all: `--tensor-parallel-size`/`--tp`/`--tp-size` scales speed and KV capacity (timing.py);
other vLLM/SGLang flags (`--gpu-memory-utilization`, `--dtype`, …) are
ignored with a log line. `vllm serve MODEL`-style positional models work too.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from llmgw.runtime import envflags, logs
from llmgw.runtime.cli import DefaultsFormatter
from llmgw.runtime.finite import finite_float
from llmgw.runtime.version import add_version_argument
from llmgw.simengine import auth, kvevents, lora, sleep, timing
from llmgw.simengine.batcher import FCFS, SCHEDULING_POLICIES
from llmgw.simengine.config import DIALECTS, SimConfig
from llmgw.simengine.faults import FaultConfig

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        formatter_class=DefaultsFormatter,
        prog="llmgw sim-engine",
        description="A simulated vLLM/SGLang engine: OpenAI API, KV cache, batching, metrics.",
    )
    p.add_argument("positional_model", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--model", help="model name (the default served name)")
    logs.add_format_argument(p)
    add_version_argument(p, "sim-engine")
    p.add_argument("--served-model-name", nargs="+", default=None, help="names to serve")
    p.add_argument("--host", default="127.0.0.1", help="listen address")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    p.add_argument("--num-gpu-blocks", type=int, default=None, help="default: Llama-3-8B/H100")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV-cache block")
    p.add_argument(
        "--max-num-seqs",
        type=int,
        default=timing.DEFAULT_MAX_NUM_SEQS,
        help="sequences running at once (the rest wait)",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=timing.DEFAULT_MAX_NUM_BATCHED_TOKENS,
        help="prefill + decode tokens per scheduler step",
    )
    p.add_argument("--max-model-len", type=int, default=None, help="default 8192 (or what fits)")
    p.add_argument(
        "--scheduling-policy",
        choices=SCHEDULING_POLICIES,
        default=FCFS,
        help="as vLLM: fcfs serves arrivals in order and refuses a request priority "
        "other than 0; priority serves lower priority first, then by arrival",
    )
    p.add_argument("--speed", type=finite_float, default=1.0, help="10 = ten times faster")
    p.add_argument(
        "--prefill-ms-per-token",
        type=finite_float,
        default=timing.DEFAULT_PREFILL_MS_PER_TOKEN,
        help="prefill cost of one uncached prompt token, at speed 1",
    )
    p.add_argument(
        "--decode-base-ms",
        type=finite_float,
        default=timing.DEFAULT_DECODE_BASE_MS,
        help="fixed cost of one decode step, at speed 1",
    )
    p.add_argument(
        "--decode-ms-per-seq",
        type=finite_float,
        default=timing.DEFAULT_DECODE_MS_PER_SEQ,
        help="added cost per running sequence of one decode step, at speed 1",
    )
    p.add_argument(
        "--tensor-parallel-size",
        "-tp",
        "--tp",
        "--tp-size",
        type=int,
        default=1,
        dest="tp",
        help="GPUs the engine spans (more KV blocks by default)",
    )
    p.add_argument(
        "--metrics-dialect",
        choices=DIALECTS,
        default="vllm",
        help="whose /metrics names to export",
    )
    p.add_argument(
        "--fail-rate", type=finite_float, default=0.0, help="fault: share of requests answered 500"
    )
    p.add_argument(
        "--stall-after-tokens", type=int, default=None, help="fault: streams stop sending after N"
    )
    p.add_argument(
        "--error-after-tokens", type=int, default=None, help="fault: streams fail after N tokens"
    )
    p.add_argument(
        "--crash-after-requests", type=int, default=None, help="fault: exit after N requests"
    )
    p.add_argument("--seed", type=int, default=0, help="random seed for generated text and faults")
    p.add_argument(
        "--api-key",
        nargs="+",
        default=None,
        help="require one of these bearer keys on /v1/* (as vLLM; default $VLLM_API_KEY)",
    )
    p.add_argument(
        "--kv-events-config",
        default=None,
        help="vLLM's KV-event publisher settings as JSON, e.g. "
        '\'{"enable_kv_cache_events": true, "publisher": "zmq", '
        '"endpoint": "tcp://127.0.0.1:5557"}\' (needs pyzmq)',
    )
    p.add_argument(
        "--enable-lora", action="store_true", help="serve LoRA adapters as models (as vLLM)"
    )
    p.add_argument(
        "--lora-modules", nargs="+", default=None, help="adapters to serve: name=path ..."
    )
    p.add_argument("--max-loras", type=int, default=1, help="adapters one batch may mix")
    p.add_argument(
        "--max-cpu-loras", type=int, default=None, help="adapters kept loaded (default --max-loras)"
    )
    p.add_argument(
        "--lora-load-ms",
        type=finite_float,
        default=lora.DEFAULT_LOAD_MS,
        help="reading in an adapter that is not loaded, at speed 1",
    )
    p.add_argument(
        "--enable-sleep-mode",
        action="store_true",
        help="allow POST /sleep (the routes need VLLM_SERVER_DEV_MODE=1, as vLLM)",
    )
    p.add_argument(
        "--weights-gb",
        type=finite_float,
        default=sleep.DEFAULT_WEIGHTS_GB,
        help="the model's weights, split over the GPUs: sets the wake time",
    )
    p.add_argument(
        "--wake-l1-s",
        type=finite_float,
        default=None,
        help="wake time from level 1 (default: by size)",
    )
    p.add_argument(
        "--wake-l2-s",
        type=finite_float,
        default=None,
        help="wake time from level 2 (default: by size)",
    )
    p.add_argument(
        "--sleep-s",
        type=finite_float,
        default=0.0,
        help="how long a sleep at level 1 or 2 takes before it answers (default 0: at once)",
    )
    p.add_argument(
        "--cold-factor",
        type=finite_float,
        default=sleep.COLD_FACTOR,
        help="how much slower the first request after a wake runs without a warm-up",
    )
    p.add_argument(
        "--request-log",
        default=None,
        metavar="PATH",
        help="append one JSON line per generation request to PATH as it ends (its x-request-id, "
        "prompt and cached tokens, and when it arrived, was scheduled, got its first token and "
        "ended, on the host's monotonic clock), to split a benchmark's TTFT; default: off",
    )
    p.add_argument(
        "--grace-s", type=finite_float, default=10.0, help="graceful stop window on SIGTERM"
    )
    return p


def sleep_settings(args: argparse.Namespace, env: dict[str, str]) -> sleep.SleepSettings:
    return sleep.SleepSettings(
        enabled=args.enable_sleep_mode,
        dev_mode=env.get("VLLM_SERVER_DEV_MODE", "0").strip() not in ("", "0"),
        weights_gb=args.weights_gb,
        wake_l1_s=args.wake_l1_s,
        wake_l2_s=args.wake_l2_s,
        sleep_s=args.sleep_s,
        cold_factor=args.cold_factor,
    )


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Turn parsed flags into a validated config; ValueError names what is wrong."""
    model = args.model or args.positional_model
    if not model:
        raise ValueError("--model is required")
    tp = args.tp
    if args.block_size < 1 or tp < 1:
        raise ValueError("need --block-size >= 1 and --tensor-parallel-size >= 1")
    # `is None`, not `or`: 0 was given, and is refused below rather than replaced.
    num_blocks = args.num_gpu_blocks
    if num_blocks is None:
        num_blocks = timing.default_num_gpu_blocks(block_size=args.block_size, tp=tp)
    max_model_len = args.max_model_len
    if max_model_len is None:
        capacity = (num_blocks - 1) * args.block_size
        max_model_len = min(timing.DEFAULT_MAX_MODEL_LEN, capacity)
    return SimConfig(
        model=model,
        served_model_names=tuple(args.served_model_name or [model]),
        num_gpu_blocks=num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        scheduling_policy=args.scheduling_policy,
        timing=timing.TimingModel(
            prefill_ms_per_token=args.prefill_ms_per_token,
            decode_base_ms=args.decode_base_ms,
            decode_ms_per_seq=args.decode_ms_per_seq,
            speed=args.speed,
            tp=tp,
        ),
        metrics_dialect=args.metrics_dialect,
        faults=FaultConfig(
            fail_rate=args.fail_rate,
            stall_after_tokens=args.stall_after_tokens,
            crash_after_requests=args.crash_after_requests,
            error_after_tokens=args.error_after_tokens,
        ).validate(),
        seed=args.seed,
        api_keys=auth.keys_from(args.api_key),
        kv_events=(
            kvevents.parse_settings(args.kv_events_config)
            if args.kv_events_config
            else kvevents.KVEventsSettings()
        ),
        lora=lora.LoraSettings(
            enabled=args.enable_lora,
            max_loras=args.max_loras,
            max_cpu_loras=args.max_cpu_loras,
            modules=lora.parse_modules(args.lora_modules or []),
            load_ms=args.lora_load_ms,
        ),
        sleep=sleep_settings(args, dict(os.environ)),
        request_log=args.request_log,
    )


def main(argv: list[str]) -> int:
    try:
        fmt, argv = logs.take_format(argv)
    except logs.LogFormatError as exc:
        sys.stderr.write(f"llmgw sim-engine: {exc}\n")
        return 2
    logs.setup(fmt=fmt)
    p = parser()
    envflags.apply(p, "sim-engine")
    args, unknown = p.parse_known_args(argv)
    envflags.drop_defaults_of_repeated(p, args)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        sys.stderr.write(f"llmgw sim-engine: {exc}\n")
        return 2
    if unknown:
        log.info("ignoring engine flags %s", " ".join(unknown))

    from llmgw.runtime import serve
    from llmgw.simengine.app import build_app

    try:
        app = build_app(cfg)
    except (ValueError, OSError) as exc:  # the KV-event publisher or request log did not open
        sys.stderr.write(f"llmgw sim-engine: {exc}\n")
        return 2
    log.info(
        "sim-engine model=%s blocks=%d block_size=%d max_num_seqs=%d speed=%s dialect=%s",
        cfg.model_name,
        cfg.num_gpu_blocks,
        cfg.block_size,
        cfg.max_num_seqs,
        cfg.timing.speed,
        cfg.metrics_dialect,
    )
    return serve.run(
        lambda: serve.serve_app(
            app, host=args.host, port=args.port, name="sim-engine", grace_s=args.grace_s
        )
    )
