"""The fleet file `llmgw up --fleet FILE` simulates: nodes, their fake GPUs, and models.

```yaml
nodes:                       # one agent per node, all on this machine
  - {prefix: h100-a, count: 2, gpus: 8xH100-80G, fabric: ib0, labels: {zone: a}}
sim_args: ["--speed", "4"]   # appended to every model's sim-engine args
controller_args: []          # extra flags for `llmgw controller`
agent_args: []               # extra flags for every `llmgw agent`
router: {}                   # extra keys for the router's config file
models:                      # model specs, as `llmgw ctl apply` takes them
  - {name: llama-8b, engine: sim, gpu_classes: [H100-80G], min_replicas: 1}
```

A `llamacpp` model runs a real llama.cpp `llama-server` (docs/llamacpp.md): its
`source` is a GGUF file, and a relative path is taken from the fleet file's
folder. `check_engines` refuses, before anything starts, a fleet whose GGUF
file or llama-server binary is missing, and says how to make them.
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
from importlib import resources
from pathlib import Path
from typing import Annotated

import msgspec

from llmgw.runtime import finite, safeyaml, textfile
from llmgw.up.errors import UpError
from llmgw.wire.agent import MAX_FAKE_GPUS
from llmgw.wire.models import ModelSpec
from llmgw.wire.names import label_problem

GPUS_RE = re.compile(r"^\d+x[A-Za-z0-9][A-Za-z0-9._-]*(,\d+x[A-Za-z0-9][A-Za-z0-9._-]*)*$")
# A fake class says its memory, in GiB, at its end, as real ones do (the agent's
# gpus/classes.memory_mib_of_class; tests/unit/test_up_fleet.py holds the two alike).
CLASS_MEMORY_RE = re.compile(r"-\d+G$")
# Named in the refusal of a class without its memory: the classes the default fleet and
# docs/agent.md use.
CLASS_EXAMPLES = "H100-80G, L40S-48G, CPU-16G"

# Lists of a command's arguments, and a model's env: their unquoted numbers are text.
_TEXT_LISTS = safeyaml.SPEC_TEXT | {"sim_args", "controller_args", "agent_args"}


class NodeGroup(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    # Node names are "<prefix>-<n>" with n from 1.
    prefix: Annotated[str, msgspec.Meta(pattern=r"^[a-z0-9][a-z0-9-]{0,40}$")]
    count: Annotated[int, msgspec.Meta(ge=1, le=500)] = 1
    # Fake inventory, as the agent's --gpus takes it: "8xH100-80G" or "2xH100-80G,2xL40S-48G".
    gpus: Annotated[str, msgspec.Meta(pattern=GPUS_RE.pattern)]
    fabric: str = "default"
    labels: dict[str, str] = {}


class Fleet(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    nodes: Annotated[tuple[NodeGroup, ...], msgspec.Meta(min_length=1)]
    models: tuple[ModelSpec, ...] = ()
    sim_args: tuple[str, ...] = ()
    # Extra command-line flags for the programs, e.g. shorter timeouts for a demo
    # of failure handling: controller_args: ["--heartbeat-timeout-s", "3"].
    controller_args: tuple[str, ...] = ()
    agent_args: tuple[str, ...] = ()
    # Extra keys merged into the router's YAML config (timings, policy, …).
    router: dict[str, object] = {}

    def node_names(self) -> list[tuple[str, NodeGroup]]:
        return [(f"{g.prefix}-{i}", g) for g in self.nodes for i in range(1, g.count + 1)]

    def models_for_apply(self) -> list[ModelSpec]:
        """Model specs with the fleet's sim args appended to every sim model."""
        if not self.sim_args:
            return list(self.models)
        return [
            msgspec.structs.replace(m, args=(*m.args, *self.sim_args)) if m.engine == "sim" else m
            for m in self.models
        ]


class FleetError(UpError):
    """The fleet file is unreadable or invalid; the message names the file and field."""


def load_fleet(path: Path | None) -> Fleet:
    """Read and validate a fleet file; None means the built-in default fleet."""
    if path is None:
        text = resources.files("llmgw.up").joinpath("default_fleet.yaml").read_text()
        where = "<default fleet>"
    else:
        try:
            text = textfile.read(path)
        except textfile.TextFileError as exc:
            raise FleetError(f"{path}: {exc}") from None
        where = str(path)
    try:
        # safeyaml, as every other config file: an alias bomb was walked copy by copy.
        doc = safeyaml.load(text, text_under=_TEXT_LISTS)
        bad = finite.nonfinite_path(doc)
        if bad is not None:
            # Before msgspec's range checks, which pass +inf; a model's NaN would reach the
            # controller as JSON null, and the router's keys reach its file as they are.
            raise FleetError(f"{where}: {bad}: {finite.NOT_FINITE}")
        # As msgspec.yaml.decode(text, type=Fleet) converts what it loads.
        fleet = msgspec.convert(doc, Fleet, builtin_types=(datetime.datetime, datetime.date))
    except msgspec.ValidationError as exc:
        raise FleetError(f"{where}: {exc}") from exc
    except safeyaml.YamlError as exc:
        raise FleetError(f"{where}: {exc}") from None
    except RecursionError:
        raise FleetError(f"{where}: not valid YAML: nested too deeply") from None
    names = [m.name for m in fleet.models]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise FleetError(f"{where}: model names repeat: {', '.join(dupes)}")
    nodes = [n for n, _ in fleet.node_names()]
    if len(set(nodes)) != len(nodes):
        raise FleetError(f"{where}: node prefixes overlap, node names would repeat")
    for i, group in enumerate(fleet.nodes):
        why = _group_problem(group)
        if why is not None:
            raise FleetError(f"{where}: nodes[{i}].{why}")
    if path is not None:
        fleet = _resolve_gguf_paths(fleet, path.parent)
    return fleet


def _group_problem(g: NodeGroup) -> str | None:
    """What the agent would refuse (or choke on) in `g`, said before anything starts.

    Without it, each was found by the agent after the controller had started: `0xH100-80G`
    and a fabric like `a b` each an agent's exit; `--help` as a fabric, the agent's usage;
    `99999999999999999999xH100-80G`, an agent growing without end; a label key with `=`
    split elsewhere by the agent's KEY=VALUE flag; `1xFOO`, a class whose memory the
    agent cannot know, its refusal after every other program had started."""
    counts = [int(part.split("x", 1)[0]) for part in g.gpus.split(",")]
    if min(counts) < 1 or sum(counts) > MAX_FAKE_GPUS:
        return f"gpus {g.gpus}: each count at least 1, at most {MAX_FAKE_GPUS} GPUs a node"
    classes = [part.split("x", 1)[1] for part in g.gpus.split(",")]
    for value, field in [(g.fabric, "fabric"), *((c, "gpus") for c in classes)]:
        why = label_problem(value)
        if why is not None:
            return f"{field}: {why}"
    for c in classes:
        if CLASS_MEMORY_RE.search(c) is None:
            return (
                f"gpus {g.gpus}: class {c!r} names no memory size: write it like {c}-80G, "
                f"its memory in GiB at the end ({CLASS_EXAMPLES})"
            )
    for key in g.labels:
        if not key or "=" in key:
            return f"labels: key {key!r}: not empty and without '='"
    return None


def _resolve_gguf_paths(fleet: Fleet, base: Path) -> Fleet:
    """llamacpp sources (GGUF files) relative to the fleet file's folder, `~` expanded."""
    models = []
    for m in fleet.models:
        if m.engine == "llamacpp":
            source = Path(m.source or m.name).expanduser()
            if not source.is_absolute():
                source = (base / source).resolve()
            m = msgspec.structs.replace(m, source=str(source))
        models.append(m)
    return msgspec.structs.replace(fleet, models=tuple(models))


def llama_server_command() -> str | None:
    """The llama-server the agents will run (LLMGW_LLAMA_SERVER, else PATH); None: not found."""
    given = os.environ.get("LLMGW_LLAMA_SERVER")
    if given:
        return given if os.access(given, os.X_OK) else None
    return shutil.which("llama-server")


def check_engines(fleet: Fleet) -> None:
    """Refuse a fleet whose llamacpp models cannot start here (FleetError says what to do)."""
    llama = [m for m in fleet.models if m.engine == "llamacpp"]
    if not llama:
        return
    if llama_server_command() is None:
        raise FleetError(
            "the fleet has llamacpp models but no llama-server was found: build it with "
            "scripts/build-llama-server and set LLMGW_LLAMA_SERVER to the path it prints "
            "(or put llama-server on PATH)"
        )
    for m in llama:
        if m.source is not None and not Path(m.source).is_file():
            raise FleetError(
                f"model {m.name}: no GGUF file at {m.source}; make the tiny test model "
                f"with: python -m llmgw.testing.tinygguf {m.source}"
            )
