"""Strings a model spec hands the OS when the agent starts its engine: a NUL anywhere and
a control character in a path are refused where the spec comes in, naming the field."""

from __future__ import annotations

import json
from typing import Any

import pytest

from llmgw.controller.api.decode import decode_specs
from llmgw.controller.api.validate import check_spec
from llmgw.controller.errors import InvalidSpec
from llmgw.wire.adapters import source_problem
from llmgw.wire.agent import SecretRef
from llmgw.wire.models import ModelSpec, RoutingSpec, launch_problem
from llmgw.wire.osstrings import control_at, nul_at


def _spec(**kw: Any) -> ModelSpec:
    return ModelSpec(**{"name": "m", "engine": "sim", "gpu_classes": ("H100-80G",), **kw})


def _raw(**kw: Any) -> dict[str, Any]:
    return {"name": "m", "engine": "sim", "gpu_classes": ["H100-80G"], **kw}


class TestRules:
    """The two rules, each written once."""

    def test_nul_is_found_where_it_is(self) -> None:
        """nul_at gives the NUL's index, and None for text without one."""
        assert nul_at("ab\x00c") == 2
        assert nul_at("a\nb\x1bc") is None

    def test_control_characters_are_found(self) -> None:
        """control_at gives the first of U+0000 to U+001F and U+007F; other text passes."""
        assert [control_at(s) for s in ("/p\x00", "/p\n", "/\x1b[2J", "/p\x7f")] == [2, 2, 1, 2]
        assert control_at("/models/é-ü\u202e x") is None

    def test_the_adapter_source_rule_is_the_path_rule(self) -> None:
        """An adapter's source is refused by the same rule as every other path."""
        assert source_problem("/p\tq") is not None
        assert source_problem("/p q") is None


class TestLaunchProblem:
    """launch_problem names the first string the OS could not be given."""

    @pytest.mark.parametrize(
        ("kw", "field"),
        [
            ({"source": "/m\x00"}, "source"),
            ({"source": "/m\x1b[2J"}, "source"),
            ({"source": "org/m\n"}, "source"),
            ({"args": ("--a", "1", "x\x00y")}, "args[2]"),
            ({"env": {"A": "1", "B": "x\x00"}}, "env.B"),
            ({"env": {"A\x00B": "1"}}, "env"),
            ({"env": {"A=B": "1"}}, "env"),
            ({"env": {"": "1"}}, "env"),
            ({"env_from": {"T": SecretRef(file="/run/\x00t")}}, "env_from.T.file"),
            ({"env_from": {"T": SecretRef(file="/run/t\r")}}, "env_from.T.file"),
            (
                {"engine": "vllm", "routing": RoutingSpec(kv_events=True, tokenizer="hf:/t\x00")},
                "routing.tokenizer",
            ),
        ],
    )
    def test_refused_strings_name_their_field(self, kw: dict[str, Any], field: str) -> None:
        """A NUL anywhere, a control character in a path, `=` in a variable's name or an
        empty one: the field is named, and check_spec refuses the spec with it."""
        problem = launch_problem(_spec(**kw))
        assert problem is not None
        assert field == problem[0]
        assert check_spec(_spec(**kw)) == problem

    def test_free_text_keeps_its_line_ends(self) -> None:
        """A newline or a tab in an argument or an environment value passes: a chat
        template and a PEM certificate hold them, and the OS passes them."""
        spec = _spec(
            source="/models/m",
            args=("--chat-template", "{% for m in messages %}\n\t{{ m }}\n{% endfor %}"),
            env={"CERT": "-----BEGIN-----\nAAAA\n-----END-----\n", "E": "\x1b"},
            env_from={"T": SecretRef(file="/run/secrets/t")},
        )
        assert launch_problem(spec) is None

    def test_a_long_argument_is_not_echoed(self) -> None:
        """The refusal says where the NUL is and does not repeat the argument."""
        problem = launch_problem(_spec(args=("a" * 10_000 + "\x00",)))
        assert problem is not None
        assert len(problem[1]) < 200, problem


class TestSizesNamesAndDotDot:
    """What execve refuses by size, what is no variable name, and a `..` in a source."""

    @pytest.mark.parametrize(
        ("kw", "field", "words"),
        [
            ({"args": ("a", "x" * 131_071)}, "args[1]", "is 131072 bytes"),
            ({"args": ("\u00e9" * 65_536,)}, "args[0]", "is 131073 bytes"),
            ({"env": {"A": "x" * 131_069}}, "env.A", "is 131072 bytes"),
            ({"args": ("x" * 100_000,) * 11}, "args", "together"),
            ({"env": {"A\nB": "1"}}, "env", "not a variable name"),
            ({"env": {"1A": "1"}}, "env", "not a variable name"),
            ({"source": "../m"}, "source", "'..' part"),
            ({"source": "/models/../m"}, "source", "'..' part"),
            ({"priority": -(10**9) - 1}, "priority", "within"),
            ({"idle_timeout_s": 1.5e9}, "idle_timeout_s", "at most"),
        ],
    )
    def test_refused_naming_the_field(self, kw: dict[str, Any], field: str, words: str) -> None:
        """Each is refused by the rules both the controller and ctl apply."""
        problem = check_spec(_spec(**kw))
        assert problem is not None
        assert field == problem[0]
        assert words in problem[1]

    def test_what_the_os_takes_passes(self) -> None:
        """The largest single argument, lower-case names, `..` inside a part, and the bounds."""
        spec = _spec(
            args=("x" * 131_070,),
            env={"http_proxy": "h", "_X1": ""},
            source="/models/a..b/c",
            priority=-(10**9),
            idle_timeout_s=1e9,
        )
        assert check_spec(spec) is None

    def test_an_adapter_source_with_dot_dot_is_refused(self) -> None:
        """An adapter's source has the model source's `..` rule."""
        assert "'..' part" in (source_problem("/l/../x") or "")
        assert source_problem("/l/x..y") is None


class TestDecodeSpecs:
    """The admin API's decoder refuses the whole request with the field's path."""

    @pytest.mark.parametrize(
        ("body", "param"),
        [
            (_raw(args=["--a", "1", "x\x00y"]), "args[2]"),
            ([_raw(name="ok"), _raw(args=["--a", "1", "x\x00y"])], "[1].args[2]"),
            ([_raw(source="/m\x07")], "[0].source"),
            ([_raw(env={"B": "x\x00"})], "[0].env.B"),
            ([_raw(env_from={"T": {"file": "/t\x00"}})], "[0].env_from.T.file"),
        ],
    )
    def test_param_names_the_field(self, body: Any, param: str) -> None:
        """A list names the spec's index; one spec names the field alone."""
        with pytest.raises(InvalidSpec) as info:
            decode_specs(json.dumps(body).encode())
        assert param == info.value.param
        assert "nothing was applied" in info.value.message


class TestCtlApply:
    """ctl refuses the same spec before sending it."""

    def test_ctl_names_the_field(self) -> None:
        """`ctl apply` names args[0] and sends nothing."""
        from llmgw.ctl.errors import SpecError
        from llmgw.ctl.specs import validate

        with pytest.raises(SpecError, match=r"field args\[0\]: holds a NUL"):
            validate([_raw(args=["\x00"])], "f.yaml")


class TestSourceIsNoFlag:
    """A source beginning with '-' is refused: the engine would read it as a flag."""

    @pytest.mark.parametrize("source", ["--trust-remote-code", "-x", "--api-key=k"])
    def test_a_dash_source_is_refused_at_apply(self, source: str) -> None:
        """vLLM takes the model as its first argument, so `--trust-remote-code` there
        passed the flag policy that refuses it in `args`."""
        problem = launch_problem(_spec(engine="vllm", source=source))
        assert problem is not None
        assert problem[0] == "source"
        assert "flag" in problem[1]
        with pytest.raises(InvalidSpec) as info:
            decode_specs(json.dumps(_raw(engine="vllm", source=source)).encode())
        assert info.value.param == "source"

    def test_paths_and_repository_ids_pass(self) -> None:
        """Absolute and relative paths and repository ids, a '-' inside them too."""
        for source in ("/models/-m", "./-m", "org/m-1", "m-"):
            assert launch_problem(_spec(engine="vllm", source=source)) is None, source

    def test_ctl_refuses_it_before_sending(self) -> None:
        """`ctl apply` names the field and sends nothing."""
        from llmgw.ctl.errors import SpecError
        from llmgw.ctl.specs import validate

        with pytest.raises(SpecError, match=r"field source: begins with '-'"):
            validate([_raw(engine="vllm", source="--trust-remote-code")], "f.yaml")
