"""A secret given to a spec by reference reaches the engine, and nothing else shows it.

A real controller (SQLite), agent (sim-engine children) and router. The spec's `env_from`
names a canary in the agent's own environment (a variable the agent lists in its
`--secret-env`) and another in a file on the node; the engine's environment
(/proc/PID/environ) has both, an engine of another model has neither, nor the agent's
source variable; a reference to a variable the agent does not list is refused, by the
agent and, once the agent has reported its policy, by the controller at apply time.
Then every file the programs wrote
(logs, state file, database and its journal), every row of every table, the events,
`ctl … --json` and every program's /metrics are searched for them. A literal `env` value
is shown as written (docs/security.md: `env` is configuration, `env_from` is for secrets).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from llmgw.testing.wait import until
from tests.integration.router_fixtures import base_config, chat_body, post, router
from tests.integration.test_agent_controller import (
    AUTH,
    TOKEN,
    ControllerRig,
    admin,
    agent_rig,
    ctrl,
    replicas,
    sim_model,
    wait_replicas,
)
from tests.integration.test_agent_supervision import AgentRig

pytestmark = pytest.mark.timeout(150)

# The fixtures, used by name below.
__all__ = ["agent_rig", "ctrl"]

FROM_ENV = "canary-env-5b1e0d9a7c3f"
FROM_FILE = "canary-file-9e4d2a6b8f10"
LITERAL = "literal-env-value-shown-4c2a"
# In the agent's environment but not in its --secret-env: no spec may read it.
UNDECLARED = "canary-undeclared-3d8f1b7e20a6"


def _get(url: str, headers: dict[str, str] | None = None) -> str:
    req = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as r:
        return str(r.read().decode(errors="replace"))


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace")
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _tables(db: Path) -> dict[str, str]:
    """Every row of every table of the SQLite file, as text, by table name."""
    out: dict[str, str] = {}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        assert {"models", "replicas", "events", "nodes"} <= set(names), names
        for name in names:
            rows = con.execute(f'SELECT * FROM "{name}"').fetchall()
            out[f"table {name}"] = repr(rows)
    finally:
        con.close()
    return out


def _ctl(url: str, *args: str) -> str:
    env = {**os.environ, "LLMGW_CONTROLLER": url, "LLMGW_TOKEN": TOKEN}
    out = subprocess.run(
        [sys.executable, "-m", "llmgw", "ctl", "--controller", url, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout + out.stderr


async def _failed(ctrl: ControllerRig, model: str) -> dict[str, Any]:
    """The model's first failed replica, waited for (its reason says why)."""

    async def check() -> list[dict[str, Any]]:
        return [r for r in await replicas(ctrl, model) if r["state"] == "failed"]

    failed = await until(check, timeout_s=60, every_s=0.2, what=f"a failed replica of {model}")
    return dict(failed[0])


class TestSecretRefs:
    """A secret given by reference reaches the engine and shows nowhere else."""

    async def test_a_canary_secret_reaches_the_engine_and_shows_nowhere(
        self, tmp_path: Path, ctrl: ControllerRig, agent_rig: AgentRig
    ) -> None:
        """A canary secret reaches the engine and shows nowhere."""
        secrets_dir = tmp_path.parent / f"{tmp_path.name}-node-secrets"
        secrets_dir.mkdir()
        secret_file = secrets_dir / "wandb"
        secret_file.write_text(FROM_FILE + "\n")
        secret_file.chmod(0o600)
        spec: dict[str, Any] = {
            **sim_model("guarded"),
            "env": {"PLAIN_SETTING": LITERAL},
            "env_from": {
                "HF_TOKEN": {"env": "NODE_SECRET_SRC"},
                "WANDB_API_KEY": {"file": str(secret_file)},
            },
        }
        # A reference the node cannot resolve: that shard fails, saying which, not a value.
        broken = {**sim_model("unresolved"), "env_from": {"HF_TOKEN": {"env": "NO_SUCH_SECRET"}}}
        # A model without references, on the same node.
        plain = sim_model("plain")
        # A variable the agent holds but does not list. Applied before the agent has reported
        # its policy, so the controller cannot judge it: the agent refuses it.
        undeclared = {
            **sim_model("undeclared"),
            "env_from": {"HF_TOKEN": {"env": "UNDECLARED_SRC"}},
        }
        await admin("POST", f"{ctrl.url}/admin/models", [spec, broken, plain, undeclared])
        agent_rig.gpus = "4xH100-80G"
        agent = agent_rig.start(
            "--secret-env",
            "NODE_SECRET_SRC",
            "--secret-env",
            "NO_SUCH_SECRET",
            env={"NODE_SECRET_SRC": FROM_ENV, "UNDECLARED_SRC": UNDECLARED},
        )
        (ready,) = await wait_replicas(ctrl, "guarded", ready=1)
        pid = ready["shards"][0]["pid"]

        # The engine has both values, under the spec's names; not the agent's source variable.
        env = _environ(pid)
        assert env["HF_TOKEN"] == FROM_ENV
        assert env["WANDB_API_KEY"] == FROM_FILE
        assert env["PLAIN_SETTING"] == LITERAL
        assert "NODE_SECRET_SRC" not in env
        # Another model's engine on the same node has no secret at all.
        (other,) = await wait_replicas(ctrl, "plain", ready=1)
        other_env = _environ(other["shards"][0]["pid"])
        assert "NODE_SECRET_SRC" not in other_env
        assert "HF_TOKEN" not in other_env
        assert FROM_ENV not in other_env.values()
        assert FROM_FILE not in other_env.values()

        failed = await _failed(ctrl, "unresolved")
        assert (
            "env_from HF_TOKEN: the agent's environment has no NO_SUCH_SECRET" in failed["reason"]
        )
        refused = await _failed(ctrl, "undeclared")
        assert (
            "env_from HF_TOKEN reads the agent's variable UNDECLARED_SRC, which is not allowed "
            "on this node (the agent's secret_env)" in refused["reason"]
        )

        # Now the controller knows the agent's list: such a spec is refused at apply time.
        again = {**undeclared, "name": "undeclared-again"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{ctrl.url}/admin/models", json=again, headers=AUTH) as resp,
        ):
            body = await resp.json()
            assert resp.status == 422, body
        assert body["error"]["param"] == "[0].env_from.HF_TOKEN.env"
        assert (
            "n1: env_from HF_TOKEN reads the agent's variable UNDECLARED_SRC"
            in (body["error"]["message"])
        )
        assert UNDECLARED not in json.dumps(body)
        names = [m["name"] for m in await admin("GET", f"{ctrl.url}/admin/models")]
        assert "undeclared-again" not in names

        # Traffic through a router, so its logs and /metrics have seen this model.
        cfg = base_config(controller={"url": ctrl.url, "token": TOKEN, "poll_timeout_s": 5.0})
        with router(tmp_path, cfg) as rt:
            async with aiohttp.ClientSession() as session:
                # Until the router has the controller's list and the replica answers it.
                async def served() -> bool:
                    reply = await post(session, rt.url, chat_body("hello", model="guarded"))
                    assert reply.status == 200, reply.body  # shown if it never holds
                    return True

                await until(
                    served, timeout_s=20, every_s=0.2, ignore=(AssertionError,), what="a 200"
                )
            shown: dict[str, str] = {"router /metrics": _get(rt.url + "/metrics")}

        endpoint = ready["endpoint_url"]
        shown |= {
            "controller /metrics": _get(f"{ctrl.url}/metrics", AUTH),
            "agent /metrics": _get(agent.url + "/metrics"),
            "agent /status": _get(agent.url + "/status"),
            "engine /metrics": _get(endpoint + "/metrics"),
            "admin models": _get(f"{ctrl.url}/admin/models", AUTH),
            "admin replicas": _get(f"{ctrl.url}/admin/replicas", AUTH),
            "admin events": _get(f"{ctrl.url}/admin/events?limit=500", AUTH),
            "admin status": _get(f"{ctrl.url}/admin/status", AUTH),
        }
        for cmd in ("models", "replicas", "events", "nodes", "status"):
            shown[f"ctl {cmd} --json"] = _ctl(ctrl.url, cmd, "--json")
        shown |= _tables(tmp_path / "c.db")
        # Every file any program wrote: logs (controller, agent, engines, router), the
        # agent's state file, the database and its journal.
        files = [p for p in tmp_path.rglob("*") if p.is_file()]
        assert any(p.name == "agent-state.json" for p in files)
        assert any(p.suffix == ".log" and "rank0" in p.name for p in files)
        for path in files:
            shown[f"file {path.relative_to(tmp_path)}"] = path.read_bytes().decode(errors="replace")

        # A listed variable the agent does not have is said at start, by name.
        assert any(
            "secret_env variable not set" in text and "NO_SUCH_SECRET" in text
            for where, text in shown.items()
            if where.startswith("file ")
        ), "the agent did not say that a listed variable is not set"
        for where, text in shown.items():
            for canary in (FROM_ENV, FROM_FILE, UNDECLARED):
                assert canary not in text, f"a secret shows in {where}"
        # The references themselves are what is stored and shown.
        models = json.loads(shown["ctl models --json"])
        guarded = next(m for m in models if m["name"] == "guarded")
        assert guarded["spec"]["env_from"]["HF_TOKEN"] == {"env": "NODE_SECRET_SRC"}
        # A literal env value is configuration: stored and shown as written.
        assert LITERAL in shown["ctl models --json"]
        assert LITERAL in shown["table models"]
