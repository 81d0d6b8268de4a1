"""Names from the fleet in one documented set: the controller's heartbeat and apply checks,
the agent's flags, the fake GPUs' classes (issue 34, item 10); and the files programs read
at start refused in one line whatever they hold."""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.agent.config import AgentConfigError, parse_config
from llmgw.agent.gpus.base import GpuDiscoveryError
from llmgw.agent.gpus.fake import build_gpus, load_file
from llmgw.controller.api.decode import decode_specs
from llmgw.controller.api.validate import check_heartbeat, check_spec
from llmgw.controller.config import read_node_tokens
from llmgw.controller.errors import InvalidSpec
from llmgw.ctl.errors import SpecError
from llmgw.ctl.specs import validate
from llmgw.runtime.secretfile import SecretError
from llmgw.up.fleet import FleetError, load_fleet
from llmgw.wire.agent import GPU, Heartbeat
from llmgw.wire.models import ModelSpec
from llmgw.wire.names import (
    ADDRESS_RULE,
    LABEL_RULE,
    MODEL_NAME_RULE,
    address_problem,
    label_problem,
    model_name_problem,
)

BAD = [
    "",
    ".",
    "..",
    "../etc",
    "-flag",
    "a/b",
    "a b",
    "n\x00",
    "n\x1b[2J",
    "n\u202e",
    "[/]",
    "[bold]x",
    "a" * 129,
    "ü",
]
GOOD = ["gpu-01", "node.example.com", "H100-80G", "ib0", "rack_3", "a" * 128, "0"]


class TestLabel:
    """Fleet names accepted and refused by the label rule."""

    @pytest.mark.parametrize("name", GOOD)
    def test_ordinary_names_pass(self, name: str) -> None:
        """Host names, GPU classes and fabrics as agents report them are valid."""
        assert label_problem(name) is None

    @pytest.mark.parametrize("name", BAD)
    def test_hostile_names_are_refused_with_the_rule(self, name: str) -> None:
        """Paths, control, bidi, markup, spaces, non-ASCII and too long are refused."""
        assert f"{name!r} is not a valid name: {LABEL_RULE}" == label_problem(name)

    @given(st.text(max_size=40))
    def test_a_valid_name_is_plain_ascii(self, name: str) -> None:
        """Whatever passes is printable ASCII with no markup, space or slash."""
        if label_problem(name) is None:
            assert name.isascii()
            assert name.isprintable()
            assert not set(name) & set("[]/ \\")


class TestAddress:
    """Addresses accepted and refused."""

    @pytest.mark.parametrize(
        "address", ["127.0.0.1", "::1", "[::1]", "fe80::1%eth0", "gpu-01.example.com", "h_1"]
    )
    def test_ip_addresses_and_host_names_pass(self, address: str) -> None:
        """IPv4, IPv6 (bracketed or not, with a zone) and host names are valid."""
        assert address_problem(address) is None

    @pytest.mark.parametrize(
        "address", ["a@b", "h/x", "h?x", "h#x", "h x", "h\x1b", "-h", "[::1", "h:80"]
    )
    def test_what_moves_a_url_is_refused(self, address: str) -> None:
        """Anything a URL parser would read as more than a host is refused with the rule."""
        assert address_problem(address) == f"{address!r} is not a valid address: {ADDRESS_RULE}"


# A segment between slashes that is empty, `.` or `..`: curl, browsers and proxies resolve
# or collapse it in /admin/models/<name>, so a command would reach another model.
DOT_SEGMENTS = ["a/../b", "a/./b", "a/..", "a/.", "..", ".", "./x", "../x", "a//b", "a/", "/a"]
MODEL_NAMES = ["meta-llama/Llama-3-8B", "qwen2:7b", "a/.hidden", "a/..b", "a../b", "a/b/c", "m"]


class TestModelName:
    """Model names, aliases and adapter names accepted and refused by the model name rule."""

    @pytest.mark.parametrize("name", MODEL_NAMES)
    def test_ordinary_names_pass(self, name: str) -> None:
        """Hub ids, tags and dots inside a segment are valid."""
        assert model_name_problem(name) is None

    @pytest.mark.parametrize("name", DOT_SEGMENTS)
    def test_dot_and_empty_segments_are_refused(self, name: str) -> None:
        """A segment that is exactly `.`, `..` or empty is refused with the rule."""
        assert f"{name!r} is not a valid name: {MODEL_NAME_RULE}" == model_name_problem(name)

    @given(st.text(alphabet="ab./", max_size=12))
    def test_a_valid_name_has_no_segment_a_url_resolves(self, name: str) -> None:
        """Whatever passes splits on `/` into segments none of which is empty, `.` or `..`."""
        if model_name_problem(name) is None:
            assert not {"", ".", ".."} & set(name.split("/"))

    @pytest.mark.parametrize(
        ("fields", "field"),
        [({"name": "a/../b"}, "name"), ({"aliases": ["x", "x//y"]}, "aliases[1]")],
    )
    def test_spec_served_names_refused(self, fields: dict[str, object], field: str) -> None:
        """The controller refuses a spec whose name or alias has such a segment, naming it."""
        spec = msgspec.convert(
            {"name": "m", "engine": "sim", "gpu_classes": ["g"], **fields}, ModelSpec
        )
        got, problem = check_spec(spec) or ("", "")
        assert (field, MODEL_NAME_RULE in problem) == (got, True)

    @pytest.mark.parametrize(
        ("fields", "param"), [({"name": "a/./b"}, "name"), ({"adapter_of": "b/"}, "adapter_of")]
    )
    def test_adapter_names_refused(self, fields: dict[str, str], param: str) -> None:
        """An adapter named so, or naming its base so, is a 422 naming the field."""
        entry = {"name": "ad", "adapter_of": "base", "source": "/a", **fields}
        with pytest.raises(InvalidSpec) as info:
            decode_specs(msgspec.json.encode(entry))
        assert (param, MODEL_NAME_RULE in str(info.value)) == (info.value.param, True)

    @pytest.mark.parametrize(
        "entry",
        [
            {"name": "a/../b", "engine": "sim", "gpu_classes": ["g"]},
            {"name": "m", "engine": "sim", "gpu_classes": ["g"], "aliases": ["a//b"]},
            {"name": "a/.", "adapter_of": "m", "source": "/a"},
        ],
    )
    def test_ctl_apply_refuses_before_sending(self, entry: dict[str, object]) -> None:
        """`ctl apply` refuses the same names in the file, with the rule."""
        with pytest.raises(SpecError, match=re.escape(MODEL_NAME_RULE)):
            validate([entry], "f.yaml")

    def test_stored_specs_with_such_names_stay_readable(self) -> None:
        """A spec stored before the rule still decodes (and so can be listed and deleted)."""
        stored = b'{"name": "a/../b", "engine": "sim", "gpu_classes": ["g"], "aliases": ["c//d"]}'
        assert msgspec.json.decode(stored, type=ModelSpec).served_names == ("a/../b", "c//d")


def _gpu(i: int, gpu_class: str = "H100-80G") -> GPU:
    return GPU(index=i, uuid=f"u{i}", name="H100", gpu_class=gpu_class, memory_mib=1)


class TestControllerChecks:
    """The controller's name checks on heartbeats and specs."""

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"node": ".."}, "node"),
            ({"node": "n\x00"}, "node"),
            ({"node": "n\x1b[2J"}, "node"),
            ({"fabrics": ("ib0", "[/]")}, "fabrics[1]"),
            ({"gpus": (_gpu(0), _gpu(1, "H100\u202e"))}, "gpus[1].gpu_class"),
        ],
    )
    def test_heartbeat_names_refused(self, fields: dict[str, object], param: str) -> None:
        """A heartbeat naming a node, fabric or class outside the set is a 422 naming it."""
        hb = msgspec.structs.replace(
            Heartbeat(node="n", address="10.0.0.1", gpus=(_gpu(0),)), **fields
        )
        with pytest.raises(InvalidSpec) as info:
            check_heartbeat(hb)
        assert param == info.value.param
        assert LABEL_RULE in str(info.value)

    def test_spec_gpu_class_refused(self) -> None:
        """A spec asking for a class no agent may report names the field."""
        spec = ModelSpec(name="m", engine="sim", gpu_classes=("H100-80G", "x\x1b[31m"))
        field, problem = check_spec(spec) or ("", "")
        assert (field, LABEL_RULE in problem) == ("gpu_classes[1]", True)


class TestAgentFlags:
    """The agent's name checks at start."""

    @pytest.mark.parametrize(
        "argv",
        [
            ["--node", "..", "--controller", "http://c:1", "--state-dir", "/tmp/s"],
            ["--node", "n", "--fabric", "[/]", "--controller", "http://c:1", "--state-dir", "/s"],
        ],
    )
    def test_bad_node_or_fabric_refused_at_start(self, argv: list[str]) -> None:
        """The agent refuses a name the controller would refuse in every heartbeat."""
        with pytest.raises(AgentConfigError, match="is not a valid name"):
            parse_config(argv)

    def test_fake_gpu_class_refused(self) -> None:
        """A fake GPU class outside the set is refused at discovery."""
        with pytest.raises(GpuDiscoveryError, match="is not a valid name"):
            build_gpus([{"gpu_class": "H100 80G", "count": 1}], uuid_prefix="n")


class TestStartFiles:
    """Names in the files llmgw up writes."""

    def test_node_tokens_file_names_only_valid_nodes(self, tmp_path: Path) -> None:
        """A node in --node-tokens-file outside the set is refused at start, by line."""
        f = tmp_path / "nodes"
        f.write_text("n1=a\nn\x1b[2J=b\n")
        with pytest.raises(SecretError, match=r"nodes:2: node 'n\\x1b\[2J' is not a valid name"):
            read_node_tokens(str(f))

    @pytest.mark.parametrize(
        ("content", "said"),
        [
            (b"\xff\xfe", "not UTF-8 text"),
            (b"[" * 50_000, "nested too deeply"),
            (b"node: [[[", "while parsing a flow node"),
        ],
    )
    def test_agent_files_are_one_line(self, content: bytes, said: str, tmp_path: Path) -> None:
        """A bad --config or --gpus-file is one line (exit 2), never a traceback."""
        f = tmp_path / "f.yaml"
        f.write_bytes(content)
        with pytest.raises(AgentConfigError, match=said) as info:
            parse_config(["--config", str(f)])
        assert "\n" not in str(info.value)
        with pytest.raises(GpuDiscoveryError, match=said) as gpu_info:
            load_file(f)
        assert "\n" not in str(gpu_info.value)

    @pytest.mark.parametrize(
        ("content", "said"),
        [
            (b"\xff\xfe", "not UTF-8 text"),
            (b"[" * 5_000, "nested too deeply"),
            (b"nodes: [[[", "while parsing a flow node"),
        ],
    )
    def test_up_fleet_file_is_one_line(self, content: bytes, said: str, tmp_path: Path) -> None:
        """A bad `llmgw up --fleet` file is one FleetError line, never a traceback."""
        f = tmp_path / "fleet.yaml"
        f.write_bytes(content)
        with pytest.raises(FleetError, match=said) as info:
            load_fleet(f)
        assert "\n" not in str(info.value)
