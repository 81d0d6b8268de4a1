"""`llmgw up [--port P] [--fleet FILE]`: the whole system on one machine.

Starts a controller (SQLite under ./.llmgw/), a router on 127.0.0.1:8080, and
one agent per simulated node (fake GPUs, sim-engine engines); applies the
fleet's models; shows replicas starting; prints what to try next; supervises
the programs (one that dies is restarted); Ctrl-C stops everything, engines
included.

`./.llmgw/up.json` says what is running (URLs and PIDs) for tests and tools.

Every program gets a token of its own scope (tokens.py: admin, agent, router, read),
kept in `./.llmgw/tokens/` (0600) and passed by file, never on a command line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Any

import msgspec

from llmgw.adminclient.client import AdminClient
from llmgw.adminclient.errors import AdminError, AdminUnreachable
from llmgw.runtime import envflags
from llmgw.runtime.cli import DefaultsFormatter
from llmgw.runtime.finite import finite_float
from llmgw.runtime.lockfile import open_nofollow
from llmgw.runtime.sdnotify import Notifier
from llmgw.runtime.serve import READY_PREFIX
from llmgw.runtime.version import add_version_argument
from llmgw.up.checks import Refused, check_ports, check_state_entries, lock_state_dir
from llmgw.up.children import Child, Interrupted, StartFailed, stop_all, stop_leftover_engines
from llmgw.up.fleet import Fleet, FleetError, check_engines, load_fleet
from llmgw.up.leftovers import stop_last_run
from llmgw.up.say import say
from llmgw.up.tokens import TokenFolderError, Tokens, ensure_tokens, token_problem

ENGINE_PORT_BASE = 21000
ENGINE_PORTS_PER_NODE = 50
# How long `up` waits for every agent's node to register before applying the models.
NODES_TIMEOUT_S = 30.0


def _folder(text: str) -> Path:
    """A folder argument; "" refused (Path("") is ".": the state would land in the cwd)."""
    if not text:
        raise argparse.ArgumentTypeError("empty; give a folder (./.llmgw by default)")
    return Path(text)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llmgw up",
        description=__doc__.split("\n\n")[0],
        formatter_class=DefaultsFormatter,
    )
    add_version_argument(p, "up")
    p.add_argument("--port", type=int, default=8080, help="router port (default 8080)")
    p.add_argument("--controller-port", type=int, default=None, help="default: router port + 1")
    p.add_argument("--fleet", type=Path, default=None, help="fleet file (default: built-in)")
    p.add_argument(
        "--engine-ports",
        type=int,
        default=ENGINE_PORT_BASE,
        metavar="FIRST",
        help=f"the engines' first port: node i's engines listen on FIRST+{ENGINE_PORTS_PER_NODE}i"
        f" to FIRST+{ENGINE_PORTS_PER_NODE}i+{ENGINE_PORTS_PER_NODE - 1}; give a second up on"
        " this machine another FIRST",
    )
    p.add_argument("--state-dir", type=_folder, default=Path(".llmgw"), help="default ./.llmgw")
    p.add_argument(
        "--token",
        default=None,
        help="the controller's admin token (default: drawn once into <state-dir>/tokens/admin); "
        "visible in ps: prefer writing it into that file",
    )
    p.add_argument(
        "--ready-timeout-s",
        type=finite_float,
        default=180.0,
        help="how long to show start-up progress",
    )
    p.add_argument("--quiet", action="store_true", help="no progress display")
    p.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=None,
        help="log format of every program up starts (default: $LLMGW_LOG_FORMAT, else text)",
    )
    return p


def check_engine_ports(up: Up) -> None:
    """Refuse an engine port range that leaves 1-65535 or holds the router's or the
    controller's port (the agents would skip that port, but it is surely a slip)."""
    nodes = len(up.fleet.node_names())
    first = up.args.engine_ports
    last = first + nodes * ENGINE_PORTS_PER_NODE - 1
    if first < 1 or last > 65535:
        raise Refused(
            f"--engine-ports {first}: {nodes} nodes need ports {first}-{last}; ports are 1-65535"
        )
    programs = {"router": up.router_port, "controller": up.controller_port}
    for name, port in programs.items():
        if first <= port <= last:
            raise Refused(
                f"the {name}'s port {port} is inside the engines' ports {first}-{last}; "
                "pass another --engine-ports FIRST"
            )


class Up:
    def __init__(self, args: argparse.Namespace, fleet: Fleet) -> None:
        self.args = args
        self.fleet = fleet
        # absolute(), not resolve(): a symlinked state folder must be seen (and refused).
        self.state: Path = args.state_dir.absolute()
        self.logs = self.state / "logs"
        self.router_port: int = args.port
        # `is None`, not `or`: a given 0 is refused by check_ports, not taken as "default".
        cport = args.controller_port
        self.controller_port: int = args.port + 1 if cport is None else cport
        self.controller_url = f"http://127.0.0.1:{self.controller_port}"
        self.router_url = f"http://127.0.0.1:{self.router_port}"
        # Drawn (or read back) by prepare(), before any program starts.
        self.tokens: Tokens | None = None
        self.token: str | None = args.token
        self.client = AdminClient(self.controller_url, token=self.token, timeout_s=10.0)
        self.status_url = f"{self.controller_url}/status"
        self.children: list[Child] = []
        self.stopping = False

    # -- programs -----------------------------------------------------------

    def prepare(self) -> None:
        """The state folder and the tokens every program reads from it."""
        self.state.mkdir(parents=True, exist_ok=True)
        self.tokens = ensure_tokens(self.state, admin=self.args.token)
        self.token = self.tokens.admin
        self.client = AdminClient(self.controller_url, token=self.token, timeout_s=10.0)
        # The read token (it can change nothing) in the fragment: the page sends it as a
        # header, the URL sent to the server never carries it.
        self.status_url = f"{self.controller_url}/status#token={self.tokens.read}"

    def _tokens(self) -> Tokens:
        assert self.tokens is not None, "prepare() first"
        return self.tokens

    def controller(self) -> Child:
        args = [
            "controller",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.controller_port),
            "--database",
            f"sqlite:///{self.state / 'controller.db'}",
        ]
        t = self._tokens()
        args += ["--token-file", str(t.path("admin"))]
        args += ["--agent-token-file", str(t.path("agent"))]
        args += ["--router-token-file", str(t.path("router"))]
        args += ["--read-token-file", str(t.path("read"))]
        args += self.fleet.controller_args
        return Child("controller", args, self.logs / "controller.log")

    def router(self) -> Child:
        controller = {"url": self.controller_url, "token": self._tokens().router}
        cfg: dict[str, Any] = {**self.fleet.router, "controller": controller}
        # Holds the router's token: 0600, like the token files.
        path = self.state / "router.yaml"
        tmp = self.state / "router.yaml.tmp"
        tmp.unlink(missing_ok=True)
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.yaml.encode(cfg))
        tmp.replace(path)
        port = str(self.router_port)
        # One process: `up` runs everything on one machine, and restarts the router
        # by its PID (a supervisor's workers would hold the port while they drain).
        args = ["router", "--config", str(path), "--host", "127.0.0.1", "--port", port]
        args += ["--workers", "1"]
        return Child("router", args, self.logs / "router.log")

    def agents(self) -> list[Child]:
        out = []
        for i, (name, group) in enumerate(self.fleet.node_names()):
            lo = self.args.engine_ports + i * ENGINE_PORTS_PER_NODE
            args = [
                "agent",
                "--controller",
                self.controller_url,
                "--node",
                name,
                "--gpus",
                group.gpus,
                "--fabric",
                group.fabric,
                "--address",
                "127.0.0.1",
                "--port-range",
                f"{lo}-{lo + ENGINE_PORTS_PER_NODE - 1}",
                "--state-dir",
                str(self.state / "agents" / name),
                "--log-dir",
                str(self.logs / "engines" / name),
                # `up` owns the whole machine: when it stops, engines stop too.
                "--stop-engines-on-exit",
            ]
            for k, v in sorted(group.labels.items()):
                args += ["--label", f"{k}={v}"]
            args += ["--token-file", str(self._tokens().path("agent"))]
            args += self.fleet.agent_args
            out.append(Child(f"agent {name}", args, self.logs / f"agent-{name}.log"))
        return out

    # -- controller API (the admin client ctl uses too) ---------------------

    def apply_models(self) -> None:
        specs = self.fleet.models_for_apply()
        if not specs:
            return
        try:
            self.client.apply(specs)
        except AdminUnreachable as exc:
            raise StartFailed(str(exc)) from exc
        except AdminError as exc:
            raise StartFailed(
                f"the controller refused the fleet's models ({exc.status}): {exc.detail}"
            ) from exc

    def write_manifest(self) -> None:
        manifest = {
            "router_url": self.router_url,
            "controller_url": self.controller_url,
            "status_url": self.status_url,
            "pid": os.getpid(),
            "children": {c.name: {"pid": c.pid, "url": c.url} for c in self.children},
        }
        tmp = self.state / "up.json.tmp"
        # 0600: the status URL carries the read token.
        fd = open_nofollow(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(manifest, indent=2))
        tmp.replace(self.state / "up.json")

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Start every program and apply the models; Interrupted on Ctrl-C meanwhile."""
        self.prepare()
        ctl = self.controller()
        self._start(ctl)
        self._start_ready(ctl)
        router = self.router()
        agents = self.agents()
        for c in [router, *agents]:
            self._start(c)
        for c in [router, *agents]:
            self._start_ready(c)
        self.write_manifest()
        self.wait_for_nodes()
        if self.stopping:
            raise Interrupted("models")
        self.apply_models()

    def wait_for_nodes(self, timeout_s: float = NODES_TIMEOUT_S) -> None:
        """Until every node of the fleet has registered (an agent's first heartbeat may
        come after its ready line), so the models are placed on the whole fleet at once:
        placed on the nodes that came first, they can split the whole nodes a multi-node
        model needs. After `timeout_s` the models go to the nodes there are."""
        want = {name for name, _ in self.fleet.node_names()}
        deadline = time.monotonic() + timeout_s
        missing = want
        while not self.stopping:
            try:
                missing = want - {n.name for n in self.client.nodes()}
            except AdminUnreachable:
                pass  # not answering yet: look again
            except AdminError:
                # Refused (a token the controller does not take): the models' apply
                # meets the same refusal and says it in one line; waiting cannot help.
                return
            if not missing:
                return
            if time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        if missing and not self.stopping:
            print(
                f"llmgw up: {len(missing)} node(s) not registered after {timeout_s:.0f} s "
                f"({', '.join(sorted(missing))}); placing the models on the others",
                file=sys.stderr,
                flush=True,
            )

    def _start(self, c: Child) -> None:
        if self.stopping:
            raise Interrupted(c.name)
        c.start()
        self.children.append(c)
        # At once, not when all are ready: an `up` killed while starting leaves the next
        # one the pids to stop (leftovers.py).
        self.write_manifest()

    def _start_ready(self, c: Child) -> None:
        c.wait_ready(60, stopping=lambda: self.stopping)

    def supervise_once(self) -> None:
        now = time.monotonic()
        changed = False
        for c in self.children:
            if c.alive():
                if c.url == "" and c.poll_ready():
                    changed = True
                continue
            if c.restart_after == 0.0:
                code = c.proc.returncode if c.proc else None
                delay = min(30.0, 2.0 ** min(c.restarts, 5))
                print(f"llmgw up: {c.name} exited ({code}); restarting in {delay:.0f}s", flush=True)
                c.restart_after = now + delay
            elif now >= c.restart_after:
                c.restarts += 1
                c.restart_after = 0.0
                c.url = ""
                c.start()
                changed = True
        if changed:
            self.write_manifest()

    def stop(self) -> None:
        # Router first (stop taking requests), then agents (they stop their
        # engines), then the controller, so nothing reacts to a peer vanishing.
        router = [c for c in self.children if c.name == "router"]
        agents = [c for c in self.children if c.name.startswith("agent ")]
        rest = [c for c in self.children if c not in router and c not in agents]
        stop_all(router, grace_s=10)
        stop_all(agents, grace_s=20)
        left = stop_leftover_engines(
            [(name, self.state / "agents" / name) for name, _ in self.fleet.node_names()],
            grace_s=10,
        )
        if left:
            say(f"llmgw up: stopped {left} engine(s) whose agent was gone")
        stop_all(rest, grace_s=10)
        # Suppressed: raised from main's `finally`, it was a traceback (a folder put there).
        with contextlib.suppress(OSError):
            (self.state / "up.json").unlink(missing_ok=True)


def main(argv: list[str]) -> int:
    args = envflags.parse(build_parser(), argv, "up")
    # Taken before any program starts: they must not speak to a supervisor for `up`.
    notifier = Notifier.take()
    why = None if args.token is None else token_problem(args.token)
    if why is not None:
        print(f"llmgw up: --token {why}", file=sys.stderr)
        return 2
    if any(a == "--token" or a.startswith("--token=") for a in argv):
        print(
            "llmgw up: warning: --token on the command line is visible to every local user "
            f"(ps); write it to {args.state_dir / 'tokens' / 'admin'} (mode 0600) instead, "
            "up keeps it",
            file=sys.stderr,
        )
    if args.log_format is not None:
        # Inherited by every program started below (runtime.logs.take_format).
        os.environ["LLMGW_LOG_FORMAT"] = args.log_format
    try:
        fleet = load_fleet(args.fleet)
        check_engines(fleet)
    except FleetError as exc:
        print(f"llmgw up: {exc}", file=sys.stderr)
        return 2
    up = Up(args, fleet)
    try:
        check_engine_ports(up)
    except Refused as exc:
        print(f"llmgw up: {exc}", file=sys.stderr)
        return 2

    def on_signal(_sig: int, _frame: FrameType | None) -> None:
        up.stopping = True

    # SIGHUP too: a closed terminal must stop the fleet. Its programs run in sessions
    # of their own (they never see the hangup), so `up` dying of it would orphan them.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    try:
        # Held until this process exits; checked before anything starts, so a
        # refusal leaves nothing behind.
        lock = lock_state_dir(up.state)
        check_state_entries(up.state)
    except (Refused, OSError) as exc:
        print(f"llmgw up: {exc}", file=sys.stderr)
        return 1
    # A manifest a clean stop would have removed: the last `up` here was killed, and
    # its programs (each in a session of its own) may still run and hold the ports.
    stopped = stop_last_run(up.state, grace_s=10)
    if stopped:
        say(
            f"llmgw up: the last llmgw up here was killed; stopped the {stopped} "
            "program(s) it left running"
        )
    try:
        check_ports(
            "127.0.0.1",
            {
                "router": (up.router_port, "--port"),
                "controller": (up.controller_port, "--controller-port"),
            },
        )
    except (Refused, OSError) as exc:
        # A clean stop removes the manifest, and so does stop_last_run once it stopped
        # every program listed: one still here is unreadable or lists one it could not.
        manifest = up.state / "up.json"
        hint = ""
        if manifest.exists():
            hint = (
                f" (the last llmgw up here did not stop cleanly; its programs may still "
                f"be running: their pids are in {manifest})"
            )
        print(f"llmgw up: {exc}{hint}", file=sys.stderr)
        lock.close()
        return 1
    from llmgw.up.show import print_hints, show_progress

    code = 0
    try:
        up.start()
        if not args.quiet and not up.stopping:
            show_progress(up, timeout_s=args.ready_timeout_s)
        if not up.stopping:
            print_hints(up)
            # The line tests and tools wait for (same as every llmgw program's).
            print(f"{READY_PREFIX} up {up.router_url}", flush=True)
            notifier.ready()
        while not up.stopping:
            up.supervise_once()
            time.sleep(0.5)
    except Interrupted:
        pass
    except (StartFailed, TokenFolderError, OSError) as exc:
        say(f"llmgw up: {exc}", err=True)
        code = 1
    finally:
        notifier.stopping()
        # Whatever happened, nothing this run started outlives it: say() never raises
        # (a reader gone with the Ctrl-C must not skip the stop; say.py).
        if code == 0:
            say("\nllmgw up: stopping…")
        up.stop()
        lock.close()
    if code == 0:
        say("llmgw up: stopped")
    return code
