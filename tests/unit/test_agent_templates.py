"""Rendered engine command lines for vLLM, SGLang, llama.cpp and the sim-engine."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from llmgw.agent.templates import (
    DEFAULT_COMMANDS,
    LLAMACPP_CACHE_REUSE_TOKENS,
    LLAMACPP_CTX_TOKENS,
    LLAMACPP_SLOTS,
    parse_engine_bins,
    render,
)
from llmgw.wire.agent import ShardSpec


def shard(**kw: Any) -> ShardSpec:
    base: dict[str, Any] = {
        "replica_id": "r1",
        "rank": 0,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "served_names": ("llama-8b", "llama"),
        "engine": "vllm",
        "gpu_indices": (2, 3),
    }
    base.update(kw)
    return ShardSpec(**base)


class TestVllm:
    """vLLM command lines for one node and for several."""

    def test_single_node(self) -> None:
        """One node: positional model, every served name, port, host and TP = GPUs."""
        plan = render(shard(), port=21000, host="10.1.2.3")
        assert plan.argv == (
            "vllm",
            "serve",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--served-model-name",
            "llama-8b",
            "llama",
            "--port",
            "21000",
            "--host",
            "10.1.2.3",
            "--tensor-parallel-size",
            "2",
            "--scheduling-policy",
            "priority",
        )
        assert plan.env == {"CUDA_VISIBLE_DEVICES": "2,3"}
        assert plan.health_path == "/health"
        assert plan.priority_scheduling is True

    def test_multi_node_rank0(self) -> None:
        """Rank 0 of a multi-node replica adds the mp executor's rendezvous flags and serves."""
        spec = shard(world_size=2, master_addr="10.0.0.1", master_port=29501)
        plan = render(spec, port=21000, host="10.1.2.3")
        tail = plan.argv[plan.argv.index("--tensor-parallel-size") :]
        assert tail == (
            "--tensor-parallel-size",
            "2",
            "--pipeline-parallel-size",
            "2",
            "--distributed-executor-backend",
            "mp",
            "--nnodes",
            "2",
            "--node-rank",
            "0",
            "--master-addr",
            "10.0.0.1",
            "--master-port",
            "29501",
            "--scheduling-policy",
            "priority",
        )
        assert plan.health_path == "/health"

    def test_multi_node_worker_is_headless(self) -> None:
        """Ranks above 0 run headless, so there is no health path to probe."""
        spec = shard(rank=1, world_size=2, master_addr="10.0.0.1", master_port=29501)
        plan = render(spec, port=21005, host="10.1.2.3")
        assert plan.argv[-1] == "--headless"
        assert plan.argv[plan.argv.index("--node-rank") + 1] == "1"
        assert plan.health_path is None
        assert "--scheduling-policy" not in plan.argv

    def test_a_spec_may_turn_priority_scheduling_off(self) -> None:
        """The spec's own `--scheduling-policy fcfs` wins (it comes last), and the plan
        then says the engine takes no priority field."""
        for args in (
            ("--scheduling-policy", "fcfs"),
            ("--scheduling-policy=fcfs",),
            ("--scheduling_policy", "fcfs"),
        ):
            plan = render(shard(args=args), port=21000, host="10.1.2.3")
            assert plan.priority_scheduling is False
        plan = render(shard(engine="llamacpp"), port=21000, host="10.1.2.3")
        assert plan.priority_scheduling is False

    def test_model_args_and_env_come_last(self) -> None:
        """Model args follow the rendered flags (so they win) and model env joins the GPUs."""
        spec = shard(args=("--max-model-len", "8192"), env={"VLLM_USE_V1": "1"})
        plan = render(spec, port=21000, host="10.1.2.3")
        assert plan.argv[-2:] == ("--max-model-len", "8192")
        assert plan.env == {"CUDA_VISIBLE_DEVICES": "2,3", "VLLM_USE_V1": "1"}

    def test_multi_node_needs_rendezvous(self) -> None:
        """A multi-node shard without master address is a spec error."""
        with pytest.raises(ValueError, match="master_addr"):
            render(shard(world_size=2), port=21000, host="10.1.2.3")


class TestSglang:
    """SGLang command lines for one node and for several."""

    def test_single_node(self) -> None:
        """One node: model path, the served name, and TP = GPUs."""
        plan = render(shard(engine="sglang"), port=21001, host="10.1.2.3")
        assert plan.argv == (
            "python3",
            "-m",
            "sglang.launch_server",
            "--model-path",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--served-model-name",
            "llama-8b",
            "--port",
            "21001",
            "--host",
            "10.1.2.3",
            "--tp-size",
            "2",
        )
        assert plan.health_path == "/health"

    def test_multi_node(self) -> None:
        """Multi-node: --tp-size is the total over nodes, plus nnodes, node-rank, dist-init-addr."""
        spec = shard(
            engine="sglang",
            rank=1,
            world_size=2,
            gpu_indices=tuple(range(8)),
            master_addr="10.0.0.1",
            master_port=20000,
        )
        plan = render(spec, port=21002, host="10.1.2.3")
        tail = plan.argv[plan.argv.index("--tp-size") :]
        assert tail == (
            "--tp-size",
            "16",
            "--nnodes",
            "2",
            "--node-rank",
            "1",
            "--dist-init-addr",
            "10.0.0.1:20000",
        )
        assert plan.env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3,4,5,6,7"
        # Ranks above 0 serve a health endpoint of their own.
        assert plan.health_path == "/health"


class TestSim:
    """sim-engine command lines, workers included."""

    def test_single_node(self) -> None:
        """The sim-engine runs under this interpreter with vLLM-like flags and model args."""
        plan = render(shard(engine="sim", args=("--speed", "10")), port=21003, host="10.1.2.3")
        assert plan.argv == (
            sys.executable,
            "-m",
            "llmgw",
            "sim-engine",
            "--port",
            "21003",
            "--host",
            "10.1.2.3",
            "--model",
            "meta-llama/Llama-3.1-8B-Instruct",
            "--served-model-name",
            "llama-8b",
            "llama",
            "--tensor-parallel-size",
            "2",
            "--scheduling-policy",
            "priority",
            "--speed",
            "10",
        )

    def test_worker_rank_is_a_sim_engine_too(self) -> None:
        """A rank above 0 also runs a sim-engine, probed on /health like the rest."""
        spec = shard(engine="sim", rank=1, world_size=2, master_addr="h", master_port=1)
        plan = render(spec, port=21004, host="10.1.2.3")
        assert plan.argv[:4] == DEFAULT_COMMANDS["sim"]
        assert plan.health_path == "/health"


class TestLlamacpp:
    """llama.cpp command lines and its one-node limit."""

    def test_single_node(self) -> None:
        """GGUF file, every served name as one --alias, threads = units held, the
        defaults (slots, shared context, metrics, cache reuse), then the spec's args."""
        spec = shard(
            engine="llamacpp",
            model="/models/tiny.gguf",
            gpu_indices=(0, 1, 2),
            args=("--parallel", "8"),
            env={"LLAMA_LOG_VERBOSITY": "1"},
        )
        plan = render(
            spec, port=21007, host="10.1.2.3", commands={"llamacpp": ("/opt/llama-server",)}
        )
        assert plan.argv == (
            "/opt/llama-server",
            "--model",
            "/models/tiny.gguf",
            "--alias",
            "llama-8b,llama",
            "--host",
            "10.1.2.3",
            "--port",
            "21007",
            "--threads",
            "3",
            "--parallel",
            str(LLAMACPP_SLOTS),
            "--ctx-size",
            str(LLAMACPP_CTX_TOKENS),
            "--kv-unified",
            "--metrics",
            "--cache-reuse",
            str(LLAMACPP_CACHE_REUSE_TOKENS),
            "--no-webui",
            "--parallel",
            "8",
        )
        assert plan.env == {"CUDA_VISIBLE_DEVICES": "0,1,2", "LLAMA_LOG_VERBOSITY": "1"}
        # llama-server answers 503 on /health while loading, 200 once it serves.
        assert plan.health_path == "/health"

    def test_multi_node_is_refused(self) -> None:
        """llama.cpp has no multi-node mode here: the shard is refused, not half-started."""
        spec = shard(engine="llamacpp", rank=0, world_size=2, master_addr="h", master_port=1)
        with pytest.raises(ValueError, match="one node"):
            render(spec, port=1, host="10.1.2.3")

    def test_default_binary(self) -> None:
        """The default command is llama-server on PATH (or LLMGW_LLAMA_SERVER at import)."""
        assert len(DEFAULT_COMMANDS["llamacpp"]) == 1
        assert DEFAULT_COMMANDS["llamacpp"][0].endswith("llama-server")


class TestEngineBins:
    """Overriding engine binaries, and unknown engines."""

    def test_override(self) -> None:
        """--engine-bin replaces one engine's command, split like a shell."""
        commands = parse_engine_bins({"vllm": "/opt/venv/bin/vllm serve"})
        assert commands["vllm"] == ("/opt/venv/bin/vllm", "serve")
        assert commands["sim"] == DEFAULT_COMMANDS["sim"]
        plan = render(shard(), port=1, host="10.1.2.3", commands=commands)
        assert plan.argv[:2] == ("/opt/venv/bin/vllm", "serve")

    def test_unknown_engine(self) -> None:
        """An engine name that does not exist is refused."""
        with pytest.raises(ValueError, match="unknown engine"):
            parse_engine_bins({"tgi": "x"})


class TestEngineKey:
    """How each engine is given its API key, and that shown command lines hide it."""

    def test_vllm_and_sim_get_the_key_in_vllms_variable(self) -> None:
        """vLLM and the sim-engine read VLLM_API_KEY: the key stays out of argv (ps)."""
        for engine in ("vllm", "sim"):
            plan = render(shard(engine=engine), port=1, host="10.1.2.3", api_key="k-123")
            assert plan.env["VLLM_API_KEY"] == "k-123"
            assert not any("k-123" in a for a in plan.argv)

    def test_sglang_gets_the_flag(self) -> None:
        """SGLang has no variable for it: --api-key on the command line."""
        plan = render(shard(engine="sglang"), port=1, host="10.1.2.3", api_key="k-9")
        i = plan.argv.index("--api-key")
        assert plan.argv[i + 1] == "k-9"
        assert "VLLM_API_KEY" not in plan.env

    def test_no_key_no_variable(self) -> None:
        """Without a key the engine gets no key variable."""
        plan = render(shard(), port=1, host="10.1.2.3")
        assert "VLLM_API_KEY" not in plan.env

    def test_spec_env_cannot_replace_the_key(self) -> None:
        """The key is set after the spec's env, so a spec naming VLLM_API_KEY loses."""
        spec = shard(env={"VLLM_API_KEY": "mine", "A": "1"})
        plan = render(spec, port=1, host="10.1.2.3", api_key="agent-key")
        assert plan.env["VLLM_API_KEY"] == "agent-key"
        assert plan.env["A"] == "1"

    def test_shown_argv_hides_the_key(self) -> None:
        """Both spellings of the flag lose their value in a logged command line."""
        from llmgw.agent.templates import shown_argv

        assert shown_argv(["x", "--api-key", "s3", "--api-key=s4", "--port", "1"]) == [
            "x",
            "--api-key",
            "***",
            "--api-key=***",
            "--port",
            "1",
        ]


class TestModelIsNoFlag:
    """A model beginning with '-' is never put on a command line."""

    @pytest.mark.parametrize("engine", ["vllm", "sglang", "llamacpp", "sim"])
    def test_a_dash_model_is_refused(self, engine: str) -> None:
        """A spec stored before the controller refused it fails the shard, never reaching
        vLLM's positional as `--trust-remote-code`."""
        with pytest.raises(ValueError, match="begins with '-'"):
            render(shard(engine=engine, model="--trust-remote-code"), port=1, host="10.1.2.3")
