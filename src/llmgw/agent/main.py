"""`llmgw agent`: one per GPU node (docs/agent.md). See config.py for the flags.

`llmgw agent stop-engines NODE=STATE_DIR…` is the one subcommand: it stops the
engines agents left behind (leftovers.py).

Exit codes: 0 after SIGTERM/SIGINT, 1 if the agent's loops died or its own
port cannot be bound, 2 for a configuration a person must fix (bad flag, no
NVIDIA driver, a state or log dir another agent holds, an --address that is not this
node's) — always one line on stderr,
never a traceback.

On SIGTERM the agent leaves its engines running (unless
--stop-engines-on-exit): the next agent on this node re-adopts them from the
state file, so restarting or upgrading the agent never interrupts serving.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import msgspec

from llmgw.agent import leftovers
from llmgw.agent.app import build_app
from llmgw.agent.config import AgentConfig, AgentConfigError, check_address, parse_config
from llmgw.agent.engineprocs import PopenSpawner
from llmgw.agent.gpus import open_inventory
from llmgw.agent.gpus.base import GpuDiscoveryError, GpuInventory
from llmgw.agent.heartbeat import ControllerClient
from llmgw.agent.logfiles import LogDirBusy, lock_log_dir
from llmgw.agent.policy import policy_of
from llmgw.agent.ports import PortAllocator
from llmgw.agent.probe import HttpHealthProbe
from llmgw.agent.service import Agent
from llmgw.agent.statefile import StateDirBusy, StateStore, lock_state_dir
from llmgw.agent.supervisor import Supervisor
from llmgw.agent.templates import parse_engine_bins
from llmgw.runtime import logs
from llmgw.runtime.logs import kv
from llmgw.runtime.serve import run, serve_app

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    if argv[:1] == [leftovers.COMMAND]:
        return leftovers.main(argv[1:])
    try:
        fmt, argv = logs.take_format(argv)
    except logs.LogFormatError as exc:
        sys.stderr.write(f"llmgw agent: {exc}\n")
        return 2
    logs.setup(fmt=fmt)
    try:
        cfg = parse_config(argv)
        if not cfg.print_inventory:
            check_address(cfg.address)
    except AgentConfigError as exc:
        sys.stderr.write(f"llmgw agent: {exc}\n")
        return 2
    try:
        inventory = open_inventory(
            gpus=cfg.gpus,
            gpus_file=Path(cfg.gpus_file) if cfg.gpus_file else None,
            node=cfg.node or "local",
        )
    except GpuDiscoveryError as exc:
        sys.stderr.write(f"llmgw agent: {exc}\n")
        return 2
    if cfg.print_inventory:
        try:
            print_inventory(inventory)
        finally:
            inventory.close()
        return 0
    try:
        # Held until the process exits; taken before adoption reads the state file
        # and sweeps the log dir.
        lock = lock_state_dir(Path(cfg.state_dir))
        log_lock = lock_log_dir(cfg.engine_log_dir)
        agent = build_agent(cfg, inventory)
    except (OSError, StateDirBusy, LogDirBusy) as exc:
        inventory.close()
        sys.stderr.write(f"llmgw agent: {exc}\n")
        return 2
    with lock, log_lock:
        return run(lambda: _serve(agent))


def print_inventory(inventory: GpuInventory) -> None:
    """A table for people, then the same GPUs as one JSON line (what heartbeats carry)."""
    gpus = inventory.gpus()
    print(f"{'idx':>3}  {'class':<14} {'memory MiB':>10}  {'health':<9} name / uuid / reason")
    for g in gpus:
        health = "healthy" if g.healthy else "UNHEALTHY"
        why = f"  ({g.reason})" if g.reason else ""
        line = f"{g.index:>3}  {g.gpu_class:<14} {g.memory_mib:>10}  {health:<9} {g.name}"
        print(f"{line} / {g.uuid}{why}")
    print(msgspec.json.encode({"inventory": inventory.kind, "gpus": gpus}).decode())


def build_agent(cfg: AgentConfig, inventory: GpuInventory) -> Agent:
    """Everything but the event loop: state dir, re-adoption, supervisor, client."""
    state_dir = Path(cfg.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in cfg.secret_env:
        if not os.environ.get(name):
            # Said now, by name: otherwise only as each spec reading it fails.
            log.warning(kv("secret_env variable not set; specs reading it fail", variable=name))
    store = StateStore(state_dir, node=cfg.node)
    probe = HttpHealthProbe()
    supervisor = Supervisor(
        log_dir=cfg.engine_log_dir,
        store=store,
        ports=PortAllocator(*cfg.ports),
        spawner=PopenSpawner(withheld=cfg.secret_env),
        probe=probe,
        commands=parse_engine_bins(cfg.engine_bin),
        host=cfg.address,
        policy=policy_of(cfg.allow_env, cfg.allow_flags, cfg.secret_env),
        private_paths=(state_dir, *([Path(cfg.token_file)] if cfg.token_file else [])),
        # Wherever else it is kept (the config file's `token:`, a copy), never an engine's.
        private_values=(cfg.token,) if cfg.token else (),
        stop_grace_s=cfg.stop_grace_s,
        log_max_bytes=cfg.log_max_bytes,
        log_keep=cfg.log_keep,
        ended_logs_keep=cfg.ended_logs_keep,
    )
    # Before the first heartbeat: the first report already carries the survivors.
    supervisor.adopt(store.load())
    client = ControllerClient(
        cfg.controller, node=cfg.node, token=cfg.token, timeout_s=max(2.0, cfg.interval_s * 2)
    )
    return Agent(config=cfg, inventory=inventory, supervisor=supervisor, client=client, probe=probe)


async def _serve(agent: Agent) -> int:
    stop = asyncio.Event()
    app = build_app(agent, stop=stop)
    # The agent's own server is loopback-only (status and fault injection).
    await serve_app(app, host="127.0.0.1", port=agent.config.port, name="agent", stop_event=stop)
    if agent.refusal is not None:
        sys.stderr.write(f"llmgw agent: {agent.refusal}\n")
        return 2
    return 1 if agent.crashed else 0
