"""The static readers of vLLM's and SGLang's parsers, on small source trees of the same shape.

tests/integration/test_engine_flags.py runs them on the real releases; these pin
each rule (module docstring of llmgw.testing.engineflags) without a download.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from llmgw.testing.engineflags import Cli, EngineFlagsError, check, extract

VLLM_CONFIG = """
from typing import Literal
Backend = Literal["ray", "mp"]

class ParallelConfig:
    tensor_parallel_size: int = 1
    backend: str | Backend | None = None
    strict_backend: Backend | None = None
    nodes: list[str] | None = None
    eager: bool = False
    maybe: bool | str | None = None
    max_num_batched_tokens: int | None = None

class KVEventsConfig:
    endpoint: str = "tcp://*:5557"
    topic: str = ""
"""

VLLM_ARG_UTILS = """
import argparse

class EngineArgs:
    @staticmethod
    def add_cli_args(parser):
        parallel_kwargs = get_kwargs(ParallelConfig)
        human_readable_int_args = {"max_num_batched_tokens"}
        g = parser.add_argument_group("ParallelConfig")
        g.add_argument("--tensor-parallel-size", "-tp", **parallel_kwargs["tensor_parallel_size"])
        g.add_argument("--backend", **parallel_kwargs["backend"])
        g.add_argument("--strict-backend", **parallel_kwargs["strict_backend"])
        g.add_argument("--nodes", **parallel_kwargs["nodes"])
        g.add_argument("--eager", **parallel_kwargs["eager"])
        g.add_argument("--maybe", **parallel_kwargs["maybe"])
        g.add_argument("--max-num-batched-tokens", **parallel_kwargs["max_num_batched_tokens"])
        g.add_argument("--seed", type=int, default=0)
        g.add_argument("--tokens", nargs="+")
"""

VLLM_CLI_ARGS = """
class BaseFrontendArgs:
    api_key: list[str] | None = None
    _private: int = 0

    @classmethod
    def add_cli_args(cls, parser):
        for key, value in get_kwargs(cls).items():
            parser.add_argument(f"--{key.replace('_', '-')}", **value)

class FrontendArgs(BaseFrontendArgs):
    host: str | None = None
    port: int = 8000
    disable_log: bool = False

def make_arg_parser(parser):
    parser.add_argument("model_tag", nargs="?")
    parser.add_argument("--headless", action="store_true")
    return parser
"""

SGLANG_SERVER_ARGS = """
import argparse

_INPUT_NAMESPACES = [Parallel, Serving]

class ServerArgs:
    @staticmethod
    def add_cli_args(parser):
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--config", type=str)
        parser.add_argument("--nnodes", type=str)  # replaces the field's flag
        parser.add_argument("--port", type=int)
        parser.add_argument("--old-flag", action="store_true")
"""

SGLANG_PARALLEL = """
from typing import Literal, Optional
from sglang.srt.arg_groups.arg_utils import A, Arg

class Parallel(msgspec.Struct):
    tp_size: A[int, Arg(help="TP.", aliases=["--tensor-parallel-size"])] = 1
    nnodes: A[int, "Nodes."] = 1
    dist_init_addr: A[Optional[str], "Address."] = None
    hidden: A[int, Arg(help="x", no_cli=True)] = 0
    renamed_field: A[int, Arg(help="x", cli_name="--short")] = 0
    unannotated: int = 0
    attn_tp_size = Derived(fn="x")
"""

SGLANG_SERVING = """
from typing import List, Literal, Optional
from sglang.srt.arg_groups.arg_utils import A, Arg
from sglang.srt.arg_groups.choices import MODES

class Serving(msgspec.Struct):
    host: A[str, "Host."] = "127.0.0.1"
    trust_remote_code: A[bool, "Trust."] = False
    dtype: A[Literal["auto", "half"], "Type."] = "auto"
    mode: A[str, Arg(help="m", choices=MODES)] = "a"
    paths: A[Optional[List[str]], "Paths."] = None
    parsed: A[Optional[List[str]], Arg(help="p", type_parser=json_list_type)] = None
    flagged: A[bool, Arg(help="x", action=MyAction)] = False
"""

SGLANG_CHOICES = 'MODES = ["a", "b"]\n'


def write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


@pytest.fixture
def vllm(tmp_path: Path) -> Cli:
    src = write(
        tmp_path,
        {
            "vllm/config/parallel.py": VLLM_CONFIG,
            "vllm/engine/arg_utils.py": VLLM_ARG_UTILS,
            "vllm/entrypoints/common/cli_args.py": VLLM_CLI_ARGS,
        },
    )
    return extract("vllm", "0.0.0", src)


@pytest.fixture
def sglang(tmp_path: Path) -> Cli:
    src = write(
        tmp_path,
        {
            "sglang/srt/server_args.py": SGLANG_SERVER_ARGS,
            "sglang/srt/arg_groups/fields/parallel.py": SGLANG_PARALLEL,
            "sglang/srt/arg_groups/fields/serving.py": SGLANG_SERVING,
            "sglang/srt/arg_groups/choices.py": SGLANG_CHOICES,
        },
    )
    return extract("sglang", "0.0.0", src)


class TestVllmReader:
    """Reading vLLM's parser: flags, arities and value rules."""

    def test_flags_and_arity(self, vllm: Cli) -> None:
        """add_argument literals, config fields they spread, and frontend dataclass fields."""
        assert vllm.positionals == 1
        assert vllm.flags == {
            "--tensor-parallel-size": "one",
            "--backend": "one",
            "--strict-backend": "one",
            "--nodes": "many",
            "--eager": "none",
            "--no-eager": "none",  # BooleanOptionalAction's twin
            "--maybe": "optional",
            "--max-num-batched-tokens": "one",
            "--seed": "one",
            "--tokens": "many",
            "--headless": "none",
            "--api-key": "many",
            "--host": "one",
            "--port": "one",
            "--disable-log": "none",
            "--no-disable-log": "none",
        }
        assert vllm.kv_events_fields == {"endpoint", "topic"}

    def test_value_rules(self, vllm: Cli) -> None:
        """Plain int → integers (not the human-readable ones); Literal without str → choices."""
        assert vllm.ints == {"--tensor-parallel-size", "--port", "--seed"}  # --seed: type=int
        # `str | Backend` is a metavar in vLLM, not choices; `Backend | None` is choices.
        assert vllm.choices == {"--strict-backend": ["mp", "ray"]}

    def test_no_frontend_class_is_an_error(self, tmp_path: Path) -> None:
        """No frontend class is an error."""
        src = write(
            tmp_path,
            {
                "vllm/config/parallel.py": VLLM_CONFIG,
                "vllm/engine/arg_utils.py": VLLM_ARG_UTILS,
                "vllm/entrypoints/common/cli_args.py": "def make_arg_parser(p): return p\n",
            },
        )
        with pytest.raises(EngineFlagsError, match="BaseFrontendArgs"):
            extract("vllm", "0.0.0", src)


class TestSglangReader:
    """Reading SGLang's parser: flags, arities and value rules."""

    def test_flags_and_arity(self, sglang: Cli) -> None:
        """A[T, help] and A[T, Arg(...)] fields of the listed namespaces, plus add_argument."""
        assert sglang.positionals == 0
        assert sglang.flags == {
            "--tp-size": "one",
            "--tensor-parallel-size": "one",
            "--nnodes": "one",
            "--dist-init-addr": "one",
            "--short": "one",
            "--host": "one",
            "--trust-remote-code": "none",
            "--dtype": "one",
            "--mode": "one",
            "--paths": "many",
            "--parsed": "one",  # a type_parser takes the list as one string
            "--flagged": "any",  # a custom action
            "--config": "one",
            "--old-flag": "none",
            "--port": "one",
        }

    def test_value_rules(self, sglang: Cli) -> None:
        """SGLang's integer and choice flags are read from its parser."""
        assert sglang.ints == {"--tp-size", "--tensor-parallel-size", "--short", "--port"}
        assert sglang.choices == {"--dtype": ["auto", "half"], "--mode": ["a", "b"]}

    def test_missing_namespace_is_an_error(self, tmp_path: Path) -> None:
        """Missing namespace is an error."""
        src = write(
            tmp_path,
            {
                "sglang/srt/server_args.py": SGLANG_SERVER_ARGS,
                "sglang/srt/arg_groups/fields/parallel.py": SGLANG_PARALLEL,
            },
        )
        with pytest.raises(EngineFlagsError, match="Serving"):
            extract("sglang", "0.0.0", src)


class TestCheck:
    """The flag check accepts and refuses what the engine's parser would."""

    def test_accepts_what_the_parser_would(self, vllm: Cli) -> None:
        """Accepts what the parser would."""
        argv = ["m", "--tensor-parallel-size", "2", "--nodes", "a", "b", "--eager", "--maybe"]
        assert check(vllm, [*argv, "--port=8000", "--strict-backend", "mp"]) == []

    def test_refuses_what_the_parser_would(self, vllm: Cli, sglang: Cli) -> None:
        """Refuses what the parser would."""
        assert check(vllm, ["m", "--tensor-parallel", "2"]) == [
            "--tensor-parallel: not a vllm 0.0.0 flag"  # no prefix matching
        ]
        assert check(vllm, ["m", "--eager", "yes"]) == ["--eager: given 1 value(s), it takes none"]
        assert check(vllm, ["m", "--nodes"]) == ["--nodes: given 0 value(s), it takes many"]
        assert check(vllm, ["m", "--port", "8k"]) == ["--port: '8k' is not an integer"]
        assert check(vllm, ["m", "--strict-backend", "uni"]) == [
            "--strict-backend: 'uni' is not one of ['mp', 'ray']"
        ]
        assert check(sglang, ["m"]) == ["1 positional argument(s), sglang takes 0"]
        assert check(sglang, ["--mode", "c"]) == ["--mode: 'c' is not one of ['a', 'b']"]
