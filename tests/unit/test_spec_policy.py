"""What a spec may run on a node: the policy's rules, the agent reporting them, and the
controller refusing at apply time a spec no node would run."""

from __future__ import annotations

import json

import msgspec
import pytest

from llmgw.controller.api.decode import decode_specs
from llmgw.controller.config import ControllerConfig
from llmgw.controller.errors import InvalidSpec
from llmgw.controller.fleet import commands
from llmgw.controller.fleet.live import Fleet
from llmgw.controller.store import MemoryStore
from llmgw.runtime.clock import ManualClock
from llmgw.wire.agent import Heartbeat, SecretRef
from llmgw.wire.models import ModelSpec
from llmgw.wire.policy import SpecPolicy, normalize_flag
from tests.unit.controller_fleet import gpus

DEFAULT = SpecPolicy()


def _refused(policy: SpecPolicy, *args: str, env: tuple[str, ...] = ()) -> str | None:
    out = policy.refusal(env=env, env_from=(), args=args)
    return out[1] if out else None


class TestFlags:
    """Engine flags the node policy refuses or lets pass, however spelled."""

    @pytest.mark.parametrize(
        ("arg", "flag"),
        [
            ("--trust-remote-code", "--trust-remote-code"),
            ("--trust_remote_code", "--trust-remote-code"),
            ("--trust-remote-code=true", "--trust-remote-code"),
            ("--trust_remote-code=1", "--trust-remote-code"),
            ("--kv-events-config.endpoint", "--kv-events-config"),
            ("--kv_events_config.topics+=a,b", "--kv-events-config"),
            ("-x", "-x"),
            ("-xy", None),
            ("-0.5", None),
            ("--", None),
            ("value", None),
        ],
    )
    def test_normalized_as_the_engines_parse_them(self, arg: str, flag: str | None) -> None:
        """Normalized as the engines parse them."""
        assert normalize_flag(arg) == flag

    @pytest.mark.parametrize(
        ("args", "field", "shown"),
        [
            (("--trust-remote-code",), "args[0]", "args[0] --trust-remote-code is"),
            (("--speed", "1", "--trust_remote_code"), "args[2]", "--trust_remote_code (read as"),
            (("--trust-remote-code=true",), "args[0]", "args[0] --trust-remote-code is"),
            (("--trust-remote",), "args[0]", "--trust-remote (read as --trust-remote-code)"),
            (("--trust_rem",), "args[0]", "(read as --trust-remote-code)"),
            (("--ho", "0.0.0.0"), "args[0]", "(read as --host)"),
            (("--api",), "args[0]", "(read as --api-key)"),
            (("--port=1",), "args[0]", "args[0] --port is"),
            # vLLM reads `--json-arg.key value` as a key of the JSON flag `--json-arg`.
            (("--kv-events-config.endpoint", "tcp://x"), "args[0]", "(read as --kv-events-config)"),
            (("--kv-events.publisher=null",), "args[0]", "(read as --kv-events-config)"),
        ],
    )
    def test_every_spelling_and_abbreviation_is_refused(
        self, args: tuple[str, ...], field: str, shown: str
    ) -> None:
        """`--trust_remote_code`, `=true` and argparse abbreviations are the denied flag."""
        out = DEFAULT.refusal(env=(), env_from=(), args=args)
        assert out is not None
        assert out[0] == field
        assert shown in out[1]
        assert "not allowed on this node (the agent's allow_flags)" in out[1]

    def test_llama_server_s_key_file_is_the_key(self) -> None:
        """llama-server's --api-key-file adds keys beside the agent's: one the spec's author
        knows would open the engine to anyone who reaches it, past the router."""
        out = DEFAULT.refusal(env=(), env_from=(), args=("--api-key-file", "/k"))
        assert out is not None
        assert out[0] == "args[0]"

    def test_other_flags_and_values_pass(self) -> None:
        """Other flags and values pass."""
        args = ("--max-model-len", "4096", "--hosted", "--portable", "--trust", "--speed=3")
        # `--trust` is a prefix of --trust-remote-code: argparse would take it as that.
        assert _refused(DEFAULT, *args[:4]) is None
        assert _refused(DEFAULT, "--speed=3", "some-value") is None
        assert _refused(DEFAULT, "--trust") is not None

    @pytest.mark.parametrize(
        ("args", "shown"),
        [
            (("--served-model-name", "x"), "args[0] --served-model-name is"),
            (("--served_model_name=x",), "(read as --served-model-name)"),
            (("--alias", "x"), "args[0] --alias is"),
            (("-a", "x"), "args[0] -a is"),
            (("--lora-modules", "a=/l"), "args[0] --lora-modules is"),
            (("--lora-scaled", "/l:1"), "args[0] --lora-scaled is"),
            (("--lora", "/l"), "args[0] --lora is"),
        ],
    )
    def test_flags_the_agent_renders_for_names_and_adapters_are_refused(
        self, args: tuple[str, ...], shown: str
    ) -> None:
        """Served names and adapter flags are the agent's: a spec's own would override them."""
        out = DEFAULT.refusal(env=(), env_from=(), args=args)
        assert out is not None
        assert shown in out[1]

    def test_a_short_flag_is_matched_whole(self) -> None:
        """`-a` is refused as itself only: not `-ab`, a value, or a long flag's prefix."""
        assert _refused(DEFAULT, "-ab", "-0.5", "--enable-lora", "--max-lora-rank", "64") is None
        assert _refused(SpecPolicy(allow_flags=("-a",)), "-a", "x") is None

    def test_allowed_flag_allows_every_spelling(self) -> None:
        """Allowed flag allows every spelling."""
        policy = SpecPolicy(allow_flags=("--trust_remote_code",))
        for arg in ("--trust-remote-code", "--trust_remote_code=true", "--trust-remote"):
            assert _refused(policy, arg) is None
        assert _refused(policy, "--host", "x") is not None


class TestEnv:
    """Environment names the node policy refuses or lets pass."""

    def test_denied_names_and_prefixes(self) -> None:
        """Names that change what runs are refused, ordinary ones pass."""
        for name in ("PYTHONPATH", "LD_PRELOAD", "DYLD_INSERT_LIBRARIES", "PATH", "VLLM_API_KEY"):
            assert _refused(DEFAULT, env=(name,)) is not None, name
        assert _refused(DEFAULT, env=("HF_HOME", "VLLM_LOGGING_LEVEL", "MY_PATH")) is None

    def test_libraries_loaded_by_name_are_code_too(self) -> None:
        """LD_PRELOAD's kind outside LD_*: CUDA loads an injection library into every CUDA
        process, NCCL dlopens its plugins, glibc's iconv loads GCONV_PATH modules."""
        for name in (
            "CUDA_INJECTION64_PATH",
            "CUDA_INJECTION32_PATH",
            "NCCL_NET_PLUGIN",
            "NCCL_TUNER_PLUGIN",
            "NCCL_PROFILER_PLUGIN",
            "GCONV_PATH",
        ):
            assert _refused(DEFAULT, env=(name,)) is not None, name
        assert _refused(DEFAULT, env=("NCCL_DEBUG", "NCCL_IB_HCA", "CUDA_LAUNCH_BLOCKING")) is None

    def test_env_from_names_are_checked_too(self) -> None:
        """env_from names are checked too."""
        out = DEFAULT.refusal(env=(), env_from=("LD_PRELOAD",), args=())
        assert out == (
            "env_from.LD_PRELOAD",
            "env_from LD_PRELOAD is not allowed on this node (the agent's allow_env)",
        )

    def test_allow_env_lifts_one_name(self) -> None:
        """Allow env lifts one name."""
        policy = SpecPolicy(allow_env=("PYTHONPATH",))
        assert _refused(policy, env=("PYTHONPATH",)) is None
        assert _refused(policy, env=("PYTHONSTARTUP",)) is not None


class TestSecretEnv:
    """`{env: VAR}` reads only a variable the agent lists in its secret_env."""

    POLICY = SpecPolicy(secret_env=("HF_SRC",))

    def test_an_undeclared_source_is_refused_naming_the_field_and_the_variable(self) -> None:
        """An undeclared source is refused naming the field and the variable."""
        out = self.POLICY.refusal(
            env=(),
            env_from=("HF_TOKEN",),
            args=(),
            env_sources={"HF_TOKEN": "AWS_SECRET_ACCESS_KEY"},
        )
        assert out == (
            "env_from.HF_TOKEN.env",
            "env_from HF_TOKEN reads the agent's variable AWS_SECRET_ACCESS_KEY, which is "
            "not allowed on this node (the agent's secret_env)",
        )

    def test_declared_sources_and_file_references_pass(self) -> None:
        """Declared sources and file references pass."""
        ok = self.POLICY.refusal(
            env=(), env_from=("HF_TOKEN", "W"), args=(), env_sources={"HF_TOKEN": "HF_SRC"}
        )
        assert ok is None
        assert self.POLICY.refusal(env=(), env_from=("W",), args=()) is None

    def test_an_empty_list_refuses_every_source_and_an_unreported_one_none(self) -> None:
        """An empty list refuses every source and an unreported one none."""
        sources = {"HF_TOKEN": "HF_SRC"}
        refused = SpecPolicy(secret_env=()).refusal(
            env=(), env_from=("HF_TOKEN",), args=(), env_sources=sources
        )
        assert refused is not None
        # An agent from before secret_env reports no list: the agent itself decides.
        assert DEFAULT.refusal(env=(), env_from=("HF_TOKEN",), args=(), env_sources=sources) is None

    def test_the_list_travels_in_the_heartbeat(self) -> None:
        """The list travels in the heartbeat."""
        hb = Heartbeat(node="a", address="10.0.0.1", gpus=gpus(1), policy=self.POLICY)
        back = msgspec.json.decode(msgspec.json.encode(hb), type=Heartbeat)
        assert back.policy is not None
        assert back.policy.secret_env == ("HF_SRC",)
        raw = json.loads(msgspec.json.encode(hb))
        del raw["policy"]["secret_env"]
        old = msgspec.json.decode(json.dumps(raw).encode(), type=Heartbeat)
        assert old.policy is not None
        assert old.policy.secret_env is None


def _spec(**kw: object) -> ModelSpec:
    base: dict[str, object] = {"name": "m", "engine": "sim", "gpu_classes": ("H100-80G",)}
    base.update(kw)
    return ModelSpec(**base)  # type: ignore[arg-type]


class TestControllerRefusesAtApply:
    """The controller refuses a spec no node's policy allows."""

    async def _fleet(self, **policies: SpecPolicy | None) -> Fleet:
        fleet = Fleet(MemoryStore(), clock=ManualClock(), config=ControllerConfig())
        fleet.begin_term()
        for i, (name, policy) in enumerate(sorted(policies.items())):
            hb = Heartbeat(node=name, address=f"10.0.0.{i + 1}", gpus=gpus(2), policy=policy)
            await fleet.heartbeat(hb)
        return fleet

    async def test_every_node_refusing_refuses_the_spec_with_the_reason(self) -> None:
        """Every node refusing refuses the spec with the reason."""
        fleet = await self._fleet(a=DEFAULT, b=SpecPolicy(allow_env=("HF_HOME",)))
        spec = _spec(args=("--trust_remote_code",))
        with pytest.raises(InvalidSpec) as err:
            commands.apply_models(fleet.state, [spec], now=1.0, policies=fleet.policies)
        assert err.value.param == "[0].args[0]"
        msg = err.value.message
        assert "a: args[0] --trust_remote_code (read as --trust-remote-code)" in msg
        assert "b: args[0]" in msg
        assert "nothing was applied" in msg
        assert fleet.state.models == {}

    async def test_one_node_allowing_it_is_enough(self) -> None:
        """One node allowing it is enough."""
        allows = SpecPolicy(allow_flags=("--trust-remote-code",))
        fleet = await self._fleet(a=DEFAULT, b=allows)
        spec = _spec(args=("--trust-remote-code",))
        batch = commands.apply_models(fleet.state, [spec], now=1.0, policies=fleet.policies)
        assert [m.spec for m in batch.changes.models] == [spec]

    async def test_nodes_of_other_classes_and_silent_agents(self) -> None:
        """Only nodes that could run it are judged; one not reporting a policy may accept."""
        fleet = await self._fleet(a=DEFAULT, b=None)
        spec = _spec(env={"PYTHONPATH": "/x"})
        assert commands.apply_models(fleet.state, [spec], now=1.0, policies=fleet.policies)
        other = _spec(env={"PYTHONPATH": "/x"}, gpu_classes=("A100-40G",))
        fleet = await self._fleet(a=DEFAULT)
        assert commands.apply_models(fleet.state, [other], now=1.0, policies=fleet.policies)
        with pytest.raises(InvalidSpec) as err:
            commands.apply_models(fleet.state, [spec], now=1.0, policies=fleet.policies)
        assert err.value.param == "[0].env.PYTHONPATH"

    async def test_a_reference_to_an_undeclared_variable_is_refused(self) -> None:
        """A reference to an undeclared variable is refused."""
        fleet = await self._fleet(a=SpecPolicy(secret_env=("HF_SRC",)))
        ok = _spec(name="ok", env_from={"HF_TOKEN": SecretRef(env="HF_SRC")})
        assert commands.apply_models(fleet.state, [ok], now=1.0, policies=fleet.policies)
        bad = _spec(env_from={"HF_TOKEN": SecretRef(env="CLOUD_KEY")})
        with pytest.raises(InvalidSpec) as err:
            commands.apply_models(fleet.state, [bad], now=1.0, policies=fleet.policies)
        assert err.value.param == "[0].env_from.HF_TOKEN.env"
        assert "a: env_from HF_TOKEN reads the agent's variable CLOUD_KEY" in err.value.message
        assert "secret_env" in err.value.message
        files = _spec(env_from={"HF_TOKEN": SecretRef(file="/etc/hf")})
        assert commands.apply_models(fleet.state, [files], now=1.0, policies=fleet.policies)

    async def test_the_policy_follows_the_latest_heartbeat(self) -> None:
        """The policy follows the latest heartbeat."""
        fleet = await self._fleet(a=DEFAULT)
        assert fleet.policies["a"] == DEFAULT
        hb = Heartbeat(node="a", address="10.0.0.1", gpus=gpus(2), policy=None)
        await fleet.heartbeat(hb)
        assert "a" not in fleet.policies


class TestEnvFromAtTheEdge:
    """env_from references are checked where they enter."""

    @pytest.mark.parametrize(
        ("env_from", "param", "words"),
        [
            ({"HF_TOKEN": {}}, "env_from.HF_TOKEN", "exactly one of env or file"),
            ({"HF_TOKEN": {"env": "A", "file": "/x"}}, "env_from.HF_TOKEN", "exactly one"),
            ({"HF_TOKEN": {"file": "relative"}}, "env_from.HF_TOKEN.file", "absolute path"),
            ({"HF_TOKEN": {"env": "A-B"}}, "env_from.HF_TOKEN.env", "not a variable name"),
            ({"HF_TOKEN": {"vault": "x"}}, "env_from.HF_TOKEN", "unknown field `vault`"),
            ({"HF_TOKEN": "hf_secret"}, "env_from.HF_TOKEN", "expected a reference"),
            ({"1X": {"env": "A"}}, "env_from.1X", "not a variable name"),
        ],
    )
    def test_bad_references_are_refused_naming_the_field(
        self, env_from: object, param: str, words: str
    ) -> None:
        """Bad references are refused naming the field."""
        body = {"name": "m", "engine": "sim", "gpu_classes": ["H100-80G"], "env_from": env_from}
        with pytest.raises(InvalidSpec) as err:
            decode_specs(json.dumps(body).encode())
        assert err.value.param == param
        assert words in err.value.message
        with pytest.raises(InvalidSpec) as err:
            decode_specs(json.dumps([body]).encode())
        assert err.value.param == f"[0].{param}"

    def test_a_variable_in_env_and_env_from_is_refused(self) -> None:
        """A variable in env and env_from is refused."""
        body = {
            "name": "m",
            "engine": "sim",
            "gpu_classes": ["H100-80G"],
            "env": {"HF_TOKEN": "x"},
            "env_from": {"HF_TOKEN": {"env": "HF_TOKEN"}},
        }
        with pytest.raises(InvalidSpec) as err:
            decode_specs(json.dumps(body).encode())
        assert err.value.param == "env_from"
        assert "also set in env" in err.value.message

    def test_good_references_decode(self) -> None:
        """Well-formed env_from references decode to SecretRefs."""
        body = {
            "name": "m",
            "engine": "sim",
            "gpu_classes": ["H100-80G"],
            "env_from": {"HF_TOKEN": {"file": "/etc/hf"}, "B": {"env": "B_SRC"}},
        }
        (spec,) = decode_specs(json.dumps(body).encode())
        assert spec.env_from == {"HF_TOKEN": SecretRef(file="/etc/hf"), "B": SecretRef(env="B_SRC")}

    def test_ctl_names_the_same_field_before_sending(self) -> None:
        """ctl names the same field before sending."""
        from llmgw.ctl.errors import SpecError
        from llmgw.ctl.specs import validate

        raw = {
            "name": "m",
            "engine": "sim",
            "gpu_classes": ["H100-80G"],
            "env_from": {"HF_TOKEN": {"file": "relative"}},
        }
        with pytest.raises(SpecError) as err:
            validate([raw], "f.yaml")
        assert "f.yaml: model 'm' (#1): field env_from.HF_TOKEN.file: must be an absolute" in str(
            err.value
        )
        good = {**raw, "env_from": {"HF_TOKEN": {"file": "/etc/hf"}}}
        assert validate([good], "f.yaml")[0].env_from == {"HF_TOKEN": SecretRef(file="/etc/hf")}
