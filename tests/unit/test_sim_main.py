"""sim-engine command line: flags to config, vLLM-style extras, defaults and refusals."""

from __future__ import annotations

import pytest

from llmgw.simengine.config import SimConfig
from llmgw.simengine.main import config_from_args, main, parser
from llmgw.simengine.timing import default_num_gpu_blocks


def cfg(*argv: str) -> SimConfig:
    args, _ = parser().parse_known_args(list(argv))
    return config_from_args(args)


class TestFlags:
    """sim-engine flags to config."""

    def test_defaults_are_llama3_8b_on_h100(self) -> None:
        """Without flags the engine is shaped like Llama-3-8B on one H100 under vLLM."""
        c = cfg("--model", "m")
        assert (c.num_gpu_blocks, c.block_size, c.max_num_seqs, c.max_model_len) == (
            default_num_gpu_blocks(block_size=16),
            16,
            1024,
            8192,
        )

    def test_served_names_replace_the_model(self) -> None:
        """--served-model-name lists the names served; the first labels the metrics."""
        c = cfg("--model", "org/path", "--served-model-name", "a", "b")
        assert (c.served_model_names, c.model_name, c.model) == (("a", "b"), "a", "org/path")

    def test_tensor_parallel_scales_speed_and_memory(self) -> None:
        """--tensor-parallel-size makes steps shorter and the KV cache larger."""
        one, two = cfg("--model", "m"), cfg("--model", "m", "--tensor-parallel-size", "2")
        assert two.timing.scale < one.timing.scale
        assert two.num_gpu_blocks > one.num_gpu_blocks

    def test_vllm_flags_are_ignored(self) -> None:
        """Flags meant for vLLM (dtype, memory utilisation) are accepted and ignored."""
        args, unknown = parser().parse_known_args(
            ["--model", "m", "--dtype", "bfloat16", "--gpu-memory-utilization", "0.9"]
        )
        assert (config_from_args(args).model, unknown[0]) == ("m", "--dtype")

    def test_positional_model(self) -> None:
        """`vllm serve MODEL` style: a positional model works without --model."""
        assert cfg("org/m").model == "org/m"

    def test_small_cache_shrinks_the_default_context(self) -> None:
        """With a small cache, max_model_len defaults to what fits."""
        assert cfg("--model", "m", "--num-gpu-blocks", "11").max_model_len == 160

    def test_faults_from_flags(self) -> None:
        """Fault flags land in the fault config."""
        c = cfg("--model", "m", "--fail-rate", "0.5", "--crash-after-requests", "3")
        assert (c.faults.fail_rate, c.faults.crash_after_requests) == (0.5, 3)

    def test_kv_events_config_as_vllm_takes_it(self) -> None:
        """vLLM's --kv-events-config JSON; fields the sim does not use are ignored."""
        c = cfg(
            "--model",
            "m",
            "--kv-events-config",
            '{"enable_kv_cache_events": true, "publisher": "zmq", '
            '"endpoint": "tcp://127.0.0.1:5557", "topic": "kv", "unknown_to_sim": 1}',
        )
        assert c.kv_events.enabled
        assert (c.kv_events.endpoint, c.kv_events.topic) == ("tcp://127.0.0.1:5557", "kv")
        assert not cfg("--model", "m").kv_events.enabled


class TestRefusals:
    """Bad sim-engine flags exit with 2."""

    @pytest.mark.parametrize(
        "argv",
        [
            [],
            ["--model", "m", "--num-gpu-blocks", "11", "--max-model-len", "1000"],
            ["--model", "m", "--speed", "0"],
            ["--model", "m", "--fail-rate", "2"],
            ["--model", "m", "--metrics-dialect", "tgi"],
            # Zero is a value, not "not given": it must not quietly become the default.
            ["--model", "m", "--block-size", "0"],
            ["--model", "m", "--num-gpu-blocks", "0"],
            ["--model", "m", "--max-model-len", "0"],
            ["--model", "m", "--tensor-parallel-size", "0"],
            ["--model", "m", "--kv-events-config", "{not json"],
            ["--model", "m", "--kv-events-config", '{"publisher": "kafka"}'],
            # The publisher cannot bind: the engine does not start without its events.
            [
                "--model",
                "m",
                "--kv-events-config",
                '{"enable_kv_cache_events": true, "publisher": "zmq", "endpoint": "bogus://x"}',
            ],
        ],
    )
    def test_bad_flags_exit_2(self, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
        """Impossible settings stop the program with exit code 2 and a message."""
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's own refusals
            code = int(exc.code or 0)
        assert code == 2
        assert capsys.readouterr().err
