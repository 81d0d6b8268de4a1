"""llama.cpp engines on the llmgw side: spec rules, the fleet's GGUF paths, the tiny model."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from llmgw.router.config import parse as parse_router_config
from llmgw.testing import tinygguf
from llmgw.up.fleet import FleetError, check_engines, load_fleet
from llmgw.wire.models import ModelSpec

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet-llamacpp.yaml"


class TestLlamacppSpec:
    """llama.cpp specs, the fleet's GGUF paths and the tiny test model."""

    def test_llamacpp_spec_is_one_node(self) -> None:
        """A llamacpp model spanning nodes is refused when decoded; one node is fine."""
        base = {"name": "tiny", "engine": "llamacpp", "gpu_classes": ["CPU-16G"]}
        ok = msgspec.convert({**base, "gpus_per_node": 2}, ModelSpec)
        assert ok.engine == "llamacpp"
        with pytest.raises(msgspec.ValidationError, match="one node"):
            msgspec.convert({**base, "nodes": 2}, ModelSpec)

    def test_example_fleet_resolves_the_gguf_next_to_it(self) -> None:
        """examples/fleet-llamacpp.yaml: a relative source is taken from the file's folder."""
        fleet = load_fleet(EXAMPLE)
        (model,) = fleet.models
        assert model.engine == "llamacpp"
        assert model.source == str(EXAMPLE.parent / "tiny-llama.gguf")
        assert fleet.nodes[0].gpus == "2xCPU-16G"
        # The router section is a config the router takes (as `up` writes it).
        router = {**fleet.router, "controller": {"url": "http://127.0.0.1:1"}}
        cfg = parse_router_config(msgspec.yaml.encode(router).decode())
        assert cfg.scrape_timeout_s < cfg.scrape_interval_s

    def test_check_engines_names_what_is_missing(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """No llama-server, or no GGUF file: refused with the command that makes it."""
        fleet_file = tmp_path / "fleet.yaml"
        fleet_file.write_text(
            "nodes: [{prefix: c, gpus: 1xCPU-16G}]\n"
            "models: [{name: t, engine: llamacpp, source: t.gguf, gpu_classes: [CPU-16G]}]\n"
        )
        fleet = load_fleet(fleet_file)
        monkeypatch.setenv("LLMGW_LLAMA_SERVER", str(tmp_path / "nowhere"))
        with pytest.raises(FleetError, match="build-llama-server"):
            check_engines(fleet)
        binary = tmp_path / "llama-server"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        monkeypatch.setenv("LLMGW_LLAMA_SERVER", str(binary))
        with pytest.raises(FleetError, match=r"tinygguf .*t\.gguf"):
            check_engines(fleet)
        tinygguf.write(tmp_path / "t.gguf")
        check_engines(fleet)

    def test_tiny_gguf_is_a_llama_model_with_a_byte_vocabulary(self, tmp_path: Path) -> None:
        """The file gguf itself reads back: llama architecture, every byte a token, a few MB."""
        import gguf

        path = tinygguf.write(tmp_path / "m.gguf", seed=3)
        assert 1_000_000 < path.stat().st_size < 20_000_000
        reader = gguf.GGUFReader(path)
        arch = reader.fields["general.architecture"]
        assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
        tokens = reader.fields["tokenizer.ggml.tokens"]
        texts = [bytes(tokens.parts[i]).decode() for i in tokens.data]
        assert len(texts) == tinygguf.VOCAB_SIZE
        assert {f"<0x{b:02X}>" for b in range(256)} <= set(texts)
        names = {t.name for t in reader.tensors}
        assert {"token_embd.weight", "output.weight", "blk.1.ffn_down.weight"} <= names
        # Same seed, same bytes: the tests' model never changes under them.
        again = tinygguf.write(tmp_path / "again.gguf", seed=3)
        assert again.read_bytes() == path.read_bytes()
