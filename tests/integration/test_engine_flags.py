"""Every vLLM and SGLang command line the agent renders, against the engines' real flags.

Neither engine runs here (both need a GPU) and neither parser imports without the
engine's dependencies, so the flags are read from the pinned releases' own source
(llmgw.testing.engineflags, which says how and what that leaves unchecked).
scripts/test fetches them into the user's cache; without them (no network) these
tests fetch once more and skip, saying why, when that fails too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import types
from typing import Any

import pytest

from llmgw.agent.templates import KVEventPorts, render
from llmgw.simengine import sleepapi
from llmgw.testing import engineflags, enginesleep
from llmgw.testing.engineflags import Cli, EngineFlagsError, check
from llmgw.wire.adapters import VLLM_RUNTIME_LORA_ENV, loads_at_run_time
from llmgw.wire.agent import ShardSpec

_cli: dict[str, Cli | str] = {}


def engine_cli(engine: str) -> Cli:
    """The pinned release's flags (cached, else fetched); skips when unobtainable."""
    if engine not in _cli:
        try:
            _cli[engine] = engineflags.cached(engine) or engineflags.fetch(engine)
        except (EngineFlagsError, OSError, subprocess.TimeoutExpired) as exc:
            _cli[engine] = f"{type(exc).__name__}: {exc}"
    got = _cli[engine]
    if isinstance(got, str):
        pytest.skip(
            f"{engine} {engineflags.PINNED[engine]} sources not fetched "
            f"(python -m llmgw.testing.engineflags): {got}"
        )
    return got


def shard(engine: str, **kw: Any) -> ShardSpec:
    base: dict[str, Any] = {
        "replica_id": "r1",
        "rank": 0,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "served_names": ("llama-8b", "llama"),
        "engine": engine,
        "gpu_indices": (0,),
    }
    base.update(kw)
    return ShardSpec(**base)


MULTI = {"world_size": 2, "master_addr": "10.0.0.1", "master_port": 29500}
KV = KVEventPorts(publish=5557, replay=5558)

# Every shape the agent renders: (id, spec overrides, render keywords).
VARIANTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("single-gpu", {}, {}),
    ("single-gpu-api-key", {}, {"api_key": "sk-test"}),
    ("tensor-parallel", {"gpu_indices": (0, 1, 2, 3)}, {"api_key": "sk-test"}),
    ("multi-node-rank0", {**MULTI, "gpu_indices": (0, 1)}, {"api_key": "sk-test"}),
    ("multi-node-rank1", {**MULTI, "rank": 1, "gpu_indices": (0, 1)}, {"api_key": "sk-test"}),
    ("one-name", {"served_names": ("llama-8b",)}, {}),
    ("sleep-mode", {"sleep_mode": True}, {"api_key": "sk-test"}),
    ("sleep-mode-asleep", {"sleep_mode": True, "sleep_level": 1}, {"api_key": "sk-test"}),
]
# LoRA adapters (agent/adapters.py): vLLM only, as SGLang's are not rendered.
LORA_VARIANTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("lora-modules", {"adapters": {"a": "/l/a", "b": "/l/b"}}, {"api_key": "sk-test"}),
    (
        "lora-many-at-run-time",
        {
            "adapters": {f"a{i}": f"/l/{i}" for i in range(12)},
            "env": {"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"},
        },
        {},
    ),
]
KV_VARIANTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("kv-events", {"kv_events": True}, {"kv_events": KV, "api_key": "sk-test"}),
    (
        "kv-events-multi-node-rank0",
        {**MULTI, "kv_events": True, "gpu_indices": (0, 1)},
        {"kv_events": KV},
    ),
]


def engine_args(engine: str, overrides: dict[str, Any], kw: dict[str, Any]) -> list[str]:
    """The rendered argv after the engine's command (`vllm serve`, `python3 -m …`)."""
    plan = render(shard(engine, **overrides), port=21000, host="10.1.2.3", **kw)
    prefix = 2 if engine == "vllm" else 3
    return list(plan.argv[prefix:])


class TestRenderedCommandLines:
    """Rendered vLLM and SGLang command lines against the engines' real flags."""

    @pytest.mark.parametrize(("name", "overrides", "kw"), VARIANTS + KV_VARIANTS + LORA_VARIANTS)
    def test_vllm_command_lines(
        self, name: str, overrides: dict[str, Any], kw: dict[str, Any]
    ) -> None:
        """Every rendered vLLM command line is accepted by vLLM's real flags."""
        cli = engine_cli("vllm")
        argv = engine_args("vllm", overrides, kw)
        assert check(cli, argv) == [], f"{name}: {argv}"

    @pytest.mark.parametrize(("name", "overrides", "kw"), VARIANTS)
    def test_sglang_command_lines(
        self, name: str, overrides: dict[str, Any], kw: dict[str, Any]
    ) -> None:
        """Every rendered SGLang command line is accepted by SGLang's real flags."""
        cli = engine_cli("sglang")
        argv = engine_args("sglang", overrides, kw)
        assert check(cli, argv) == [], f"{name}: {argv}"

    def test_extraction_finds_the_known_flags(self) -> None:
        """The reading works: flags every release has, with arity and value rules; and the
        check refuses what the real parser would."""
        vllm = engine_cli("vllm")
        assert vllm.positionals == 1  # the model tag
        assert vllm.flags["--headless"] == "none"
        assert vllm.flags["--served-model-name"] == "many"
        assert vllm.flags["--port"] == "one"
        assert vllm.flags["--enforce-eager"] == vllm.flags["--no-enforce-eager"] == "none"
        assert {"endpoint", "replay_endpoint", "topic", "publisher"} <= vllm.kv_events_fields
        assert len(vllm.flags) > 200
        sglang = engine_cli("sglang")
        assert sglang.positionals == 0
        assert sglang.flags["--model-path"] == sglang.flags["--tp-size"] == "one"
        assert sglang.flags["--served-model-name"] == "one"
        assert sglang.flags["--trust-remote-code"] == "none"
        assert len(sglang.flags) > 200

        # And the check fails where the real parser would.
        assert check(vllm, ["m", "--no-such-flag", "1"]) == [
            f"--no-such-flag: not a vllm {vllm.version} flag"
        ]
        assert check(vllm, ["m", "--headless", "1"]) == [
            "--headless: given 1 value(s), it takes none"
        ]
        assert check(vllm, ["a", "b", "--port", "1"]) == ["2 positional argument(s), vllm takes 1"]
        assert check(sglang, ["--tp", "2"]) == [f"--tp: not a sglang {sglang.version} flag"]
        assert check(sglang, ["--served-model-name", "a", "b"]) == [
            "--served-model-name: given 2 value(s), it takes one"
        ]
        assert check(vllm, ["m", "--port", "eighty"]) == ["--port: 'eighty' is not an integer"]
        assert "--tp-size" in sglang.ints
        assert sglang.choices["--dtype"][:2] == ["auto", "half"]
        assert check(sglang, ["--dtype", "fp7"]) == [
            f"--dtype: 'fp7' is not one of {sglang.choices['--dtype']}"
        ]
        bad_kv = json.dumps({"endpoint": "tcp://*:1", "no_such_field": 1})
        assert check(vllm, ["m", "--kv-events-config", bad_kv]) == [
            "--kv-events-config: ['no_such_field'] are not KVEventsConfig fields"
        ]


_sleep: dict[str, enginesleep.SleepContract | str] = {}


def sleep_contract() -> enginesleep.SleepContract:
    """vLLM's sleep-mode routes from the pinned release; skips when unobtainable."""
    if "vllm" not in _sleep:
        try:
            _sleep["vllm"] = enginesleep.read()
        except (EngineFlagsError, OSError, subprocess.TimeoutExpired) as exc:
            _sleep["vllm"] = f"{type(exc).__name__}: {exc}"
    got = _sleep["vllm"]
    if isinstance(got, str):
        pytest.skip(f"vllm {engineflags.PINNED['vllm']} sources not fetched: {got}")
    return got


class TestVllmSleepContract:
    """vLLM's sleep routes and flags as llmgw calls them."""

    def test_the_routes_llmgw_calls_exist(self) -> None:
        """POST /sleep, POST /wake_up and GET /is_sleeping exist, as the sim-engine answers them."""
        c = sleep_contract()
        assert {"POST /sleep", "POST /wake_up", "GET /is_sleeping"} <= set(c.routes)
        assert set(sleepapi.PATHS) <= {r.path for r in c.routes.values()}

    def test_sleep_takes_a_level_between_zero_and_two(self) -> None:
        """/sleep reads `level` bounded 0..2 and a `mode`, as the sim-engine does."""
        q = sleep_contract().routes["POST /sleep"].query
        assert q["level"] == (0, 2)
        assert "mode" in q

    def test_wake_up_reads_repeated_tags(self) -> None:
        """/wake_up reads `tags` as a repeated query parameter."""
        assert "tags" in sleep_contract().routes["POST /wake_up"].repeated

    def test_routes_exist_only_in_dev_mode(self) -> None:
        """The routes are registered only with VLLM_SERVER_DEV_MODE, read from the environment."""
        c = sleep_contract()
        assert c.dev_mode_gated
        assert c.dev_mode_var_read
        assert sleepapi.DEV_ENV_VAR == enginesleep.DEV_MODE_VAR

    def test_the_api_key_does_not_guard_the_sleep_routes(self) -> None:
        """vLLM's key guards /v1-like prefixes only: the sleep routes need llmgw's own guard."""
        c = sleep_contract()
        assert "/v1" in c.guarded_prefixes
        assert not any(p.startswith(c.guarded_prefixes) for p in sleepapi.PATHS)

    def test_enable_sleep_mode_is_a_flag(self) -> None:
        """--enable-sleep-mode takes no value, and --middleware (the guard's hook) one or more."""
        cli = engine_cli("vllm")
        assert cli.flags["--enable-sleep-mode"] == "none"
        assert cli.flags["--middleware"] == "many"


class TestRuntimeLoraVariable:
    """The agent reads vLLM's runtime LoRA variable as vLLM does."""

    @pytest.mark.parametrize("value", ["1", "true", "True", " TRUE ", "0", "false", "yes", ""])
    def test_agent_reads_it_as_vllm_does(self, value: str) -> None:
        """wire.adapters.loads_at_run_time reads VLLM_ALLOW_RUNTIME_LORA_UPDATING as the
        pinned vLLM's envs.py does (its lambda, evaluated on the value)."""
        engine_cli("vllm")  # skips when the pinned sources are not fetched
        src = engineflags.cache_root() / f"vllm-{engineflags.PINNED['vllm']}" / "src/vllm/envs.py"
        tree = ast.parse(src.read_text())
        table = next(
            n.value
            for n in tree.body
            if isinstance(n, ast.AnnAssign)
            and isinstance(n.target, ast.Name)
            and n.target.id == "environment_variables"
        )
        assert isinstance(table, ast.Dict)
        read = next(
            v
            for k, v in zip(table.keys, table.values, strict=True)
            if isinstance(k, ast.Constant) and k.value == VLLM_RUNTIME_LORA_ENV
        )
        env = {VLLM_RUNTIME_LORA_ENV: value}
        fake_os = types.SimpleNamespace(environ=env, getenv=env.get)
        # vLLM's own lambda from the pinned wheel's source, run against a fake `os`.
        vllm_reads = eval(compile(ast.Expression(read), str(src), "eval"), {"os": fake_os})()
        assert loads_at_run_time("vllm", env) is bool(vllm_reads)
