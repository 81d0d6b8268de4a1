"""Several hosts on one machine: network namespaces joined by a bridge.

    with Net(["ctl", "router", "gpu-a", "gpu-b"]) as net:
        c = net["ctl"].start(["controller", "--host", net["ctl"].addr, ...])
        net.cut("gpu-a")       # its link goes down: nobody reaches it, it reaches nobody
        net.restore("gpu-a")
        net.silence("gpu-a")   # its link stays up but drops every packet: calls hang
        net.restore("gpu-a")
        net.silence_between("router", "ctl")   # only these two lose each other
        net.heal_between("router", "ctl")

Layout: a namespace of its own holds the bridge (the "switch"); every host is
a namespace with one veth whose peer is a port of that bridge, and an address
in the net's `subnet`, a /24 of 10.213.0.0/16 that exists only inside these
namespaces. The test process itself joins the switch as one more port
(`client_addr`, .254), so pytest and the real `openai` client can talk to the
hosts; its route covers that /24 only, nothing else is ever sent anywhere.
Each net claims its /24 for its lifetime (`claim_subnet`: a lock the kernel
drops when the process dies), so nets made at once by tests running side by
side (scripts/test runs several pytest processes) never share an address.

Cutting a host takes its switch port down: the host keeps its address and
loopback (its agent still sees its own engines) but no packet leaves or arrives.

Everything is torn down on exit, even after a failure: the processes started
here are stopped by PID, then anything still running inside a host's namespace
(an agent's engines, which outlive the agent by design) by its PID, and
deleting the switch namespace deletes every veth pair with it. Namespace names
carry a random suffix, so runs never collide.
Needs root and `ip netns`; `unavailable()` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import random
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from llmgw.testing import Program, start_program, wait_until

# Every net's /24 is one of 10.213.0.0/16's (claim_subnet).
SUBNETS = "10.213"
# A locally administered MAC no port has (silence_between).
NOWHERE_MAC = "02:00:5e:00:00:fe"


def claim_subnet() -> tuple[str, int]:
    """A /24 no other net of this machine holds ("10.213.N"), and the descriptor whose
    lock holds it: closing it, or the process ending, lets it go."""
    folder = Path(tempfile.gettempdir()) / "llmgw-test-subnets"
    folder.mkdir(mode=0o700, exist_ok=True)
    for n in random.sample(range(256), 256):
        fd = os.open(folder / f"{SUBNETS}.{n}", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return f"{SUBNETS}.{n}", fd
    raise RuntimeError(f"every /24 of {SUBNETS}.0.0/16 is held by another test net")


def _pids_in(ns: str) -> list[int]:
    done = subprocess.run(
        ["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10, check=False
    )
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=10)


def _pin(ns: str, addr: str, mac: str) -> None:
    """A permanent neighbour entry: the kernel never asks ARP for `addr` again."""
    _ip("-n", ns, "neigh", "replace", addr, "lladdr", mac, "dev", "eth0", "nud", "permanent")


@functools.cache
def unavailable() -> str | None:
    """Why namespaces cannot be made here (for pytest.skip), or None."""
    if os.geteuid() != 0:
        return "multi-host tests need root (network namespaces)"
    if shutil.which("ip") is None:
        return "multi-host tests need iproute2's `ip`"
    probe = f"llmgwprobe{uuid.uuid4().hex[:6]}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Host:
    """One namespace: a name, an address, and the programs started in it."""

    def __init__(self, net: Net, name: str, ns: str, addr: str, port: str) -> None:
        self.net = net
        self.name = name
        self.ns = ns
        self.addr = addr
        self.port = port  # the bridge-side veth in the switch namespace
        self.programs: list[Program] = []

    def start(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        log_dir: Path | None = None,
        ready_timeout_s: float = 30.0,
        wait: bool = True,
    ) -> Program:
        """`llmgw <args>` inside this host's namespace (stopped with the net)."""
        prog = start_program(
            args,
            env=env,
            log_dir=log_dir or self.net.log_dir / self.name,
            ready_timeout_s=ready_timeout_s,
            wait=wait,
            prefix=["ip", "netns", "exec", self.ns],
        )
        self.programs.append(prog)
        return prog

    def run(self, *argv: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
        """A plain command inside the namespace (waited for)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.ns, *argv],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )

    def popen(self, argv: Sequence[str], **kw: object) -> subprocess.Popen[bytes]:
        """A long-running plain command inside the namespace; the caller stops it."""
        return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
            ["ip", "netns", "exec", self.ns, *argv], start_new_session=True, **kw
        )


class Net:
    """N hosts on one bridge; a context manager that always cleans up."""

    def __init__(self, names: Sequence[str], *, log_dir: Path) -> None:
        if len(names) > 250:
            raise ValueError("at most 250 hosts on the test subnet")
        self.tag = uuid.uuid4().hex[:6]
        self.switch = f"llmgw-{self.tag}-sw"
        self.log_dir = log_dir
        self.hosts: dict[str, Host] = {}
        self._names = list(names)
        self._client_if = f"lg{self.tag}c"
        self.subnet = ""  # "10.213.N", claimed on entry
        self.client_addr = ""  # the test process's address on the switch
        self._claim: int | None = None

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def __enter__(self) -> Net:
        try:
            self._build()
        except BaseException:
            self._teardown()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._teardown()

    def _build(self) -> None:
        self.subnet, self._claim = claim_subnet()
        self.client_addr = f"{self.subnet}.254"
        sw = self.switch
        _ip("netns", "add", sw)
        _ip("-n", sw, "link", "add", "br0", "type", "bridge")
        _ip("-n", sw, "link", "set", "br0", "up")
        for i, name in enumerate(self._names, start=1):
            ns = f"llmgw-{self.tag}-h{i}"
            port = f"p{i}"
            addr = f"{self.subnet}.{i}"
            _ip("netns", "add", ns)
            self.hosts[name] = Host(self, name, ns, addr, port)
            # Made in the switch namespace, one end moved into the host and renamed.
            _ip("-n", sw, "link", "add", port, "type", "veth", "peer", "name", f"h{i}")
            _ip("-n", sw, "link", "set", f"h{i}", "netns", ns)
            _ip("-n", ns, "link", "set", f"h{i}", "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip("-n", sw, "link", "set", port, "master", "br0")
            _ip("-n", sw, "link", "set", port, "up")
        # The test process's own port on the switch: root namespace side carries
        # client_addr/24, so only the net's subnet is routed through it.
        _ip("link", "add", self._client_if, "type", "veth", "peer", "name", "pc", "netns", sw)
        _ip("-n", sw, "link", "set", "pc", "master", "br0")
        _ip("-n", sw, "link", "set", "pc", "up")
        _ip("addr", "add", f"{self.client_addr}/24", "dev", self._client_if)
        _ip("link", "set", self._client_if, "up")

    @staticmethod
    def _end_leftovers(ns: str) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            pids = _pids_in(ns)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            # Still there after 3 s: the next signal is harder.
            with contextlib.suppress(AssertionError):
                wait_until(lambda: not _pids_in(ns), timeout_s=3.0, what=f"{ns} emptied")

    def cut(self, name: str) -> None:
        """Take the host's switch port down: no packet to or from it."""
        _ip("-n", self.switch, "link", "set", self.hosts[name].port, "down")

    def silence(self, name: str) -> None:
        """Drop every packet to or from the host while every link stays up.

        A cut port takes the host's carrier down, and a peer whose neighbour
        entry expired is told "no route to host" within seconds; a firewall
        DROP or a lossy path answers nothing at all, so a connection hangs.
        That is what this makes: every neighbour entry to and from the host is
        pinned (no ARP is ever needed), then its port leaves the bridge, so
        frames still go out on an up link and nothing comes back.
        """
        host = self.hosts[name]
        macs = {h.name: self._mac(h) for h in self.hosts.values()}
        for other in self.hosts.values():
            if other is host:
                continue
            _pin(other.ns, host.addr, macs[name])
            _pin(host.ns, other.addr, macs[other.name])
        _pin(host.ns, self.client_addr, self._client_mac())
        _ip("neigh", "replace", host.addr, "lladdr", macs[name], "dev", self._client_if,
            "nud", "permanent")  # fmt: skip
        _ip("-n", self.switch, "link", "set", host.port, "nomaster")

    def silence_between(self, a: str, b: str) -> None:
        """Drop every packet between two hosts only; each still reaches the rest.

        Each side's neighbour entry for the other is pinned to an address no
        port has: the bridge floods such frames and every host ignores them.
        """
        ha, hb = self.hosts[a], self.hosts[b]
        _pin(ha.ns, hb.addr, NOWHERE_MAC)
        _pin(hb.ns, ha.addr, NOWHERE_MAC)

    def heal_between(self, a: str, b: str) -> None:
        """Undo `silence_between`: the neighbour entries are learned again by ARP."""
        ha, hb = self.hosts[a], self.hosts[b]
        _ip("-n", ha.ns, "neigh", "del", hb.addr, "dev", "eth0", check=False)
        _ip("-n", hb.ns, "neigh", "del", ha.addr, "dev", "eth0", check=False)

    def restore(self, name: str) -> None:
        """Undo `cut` or `silence`."""
        port = self.hosts[name].port
        _ip("-n", self.switch, "link", "set", port, "master", "br0")
        _ip("-n", self.switch, "link", "set", port, "up")

    @staticmethod
    def _mac(host: Host) -> str:
        return _ip("-n", host.ns, "-br", "link", "show", "eth0").stdout.split()[2]

    def _client_mac(self) -> str:
        return _ip("-br", "link", "show", self._client_if).stdout.split()[2]

    def _teardown(self) -> None:
        for host in self.hosts.values():
            for prog in host.programs:
                with contextlib.suppress(Exception):
                    prog.stop(grace_s=3)
        # Whatever those programs started in their own sessions (an agent's engines,
        # which outlive it by design) still runs inside the namespace: every process
        # there descends from one started here, so end each by its PID.
        for host in self.hosts.values():
            self._end_leftovers(host.ns)
        # Deleting a namespace deletes its veths and their peers; the client
        # veth's peer lives in the switch, so it goes with it.
        with contextlib.suppress(Exception):
            _ip("link", "del", self._client_if, check=False)
        for host in self.hosts.values():
            _ip("netns", "del", host.ns, check=False)
        _ip("netns", "del", self.switch, check=False)
        if self._claim is not None:
            os.close(self._claim)
            self._claim = None


@contextlib.contextmanager
def hosts(names: Sequence[str], *, log_dir: Path) -> Iterator[Net]:
    with Net(names, log_dir=log_dir) as net:
        yield net
