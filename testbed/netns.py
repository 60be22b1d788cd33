"""Machines on one machine: Linux network namespaces joined by a bridge, each with its own address, so a
test can cut one off from the others while every process on it stays alive.

    with Network.create() as net:                  # root and `ip` needed: `unavailable()` says why not
        n0 = net.machine("n0")                      # a namespace, a veth pair into the bridge, an address
        proc = n0.popen(["nats-server", ...], env=...)   # a process that sees only n0's network
        net.cut("n0"); net.heal("n0")               # the link down (TCP times out, no reset) and up again

The test process itself stays in the root namespace and reaches every machine through the bridge's own
address (`Network.gateway`): that is where a test's load driver and scripted model server listen.

Names carry a random suffix (`sa<hex>-<machine>`, bridge `sabr<hex>`) in a random private subnet
10.<a>.<b>.0/24, so two beds on the same box (two CI jobs) do not collide. `close` (also at interpreter
exit, and on the context manager's exit, test failure or not) kills every process a machine started,
deletes the namespaces and the bridge; `sweep()` removes what a bed killed with SIGKILL left behind.
"""

from __future__ import annotations

import atexit
import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PREFIX = "sa"  # every namespace this module makes is named sa<hex6>-<machine>; the bridge sabr<hex6>


def unavailable() -> str | None:
    """Why a bed of namespaces cannot be built here (None: it can)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (run as root, as CI does)"
    if shutil.which("ip") is None:
        return "the `ip` command (iproute2) is not installed"
    probe = f"{PREFIX}probe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


@dataclass
class Machine:
    """One namespace: its name on the bridge, its address, the host side of its veth, its processes."""

    name: str
    netns: str
    address: str
    veth: str  # the end in the root namespace, enslaved to the bridge: down = cut off
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def command(self, argv: Sequence[str]) -> list[str]:
        """`argv` run inside this machine's namespace (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.netns, *argv]

    def popen(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None,
              log: Path | None = None) -> subprocess.Popen[bytes]:
        """Start `argv` on this machine (stdout and stderr appended to `log`); killed by `Network.close`."""
        out = open(log, "ab") if log is not None else subprocess.DEVNULL
        try:
            proc = subprocess.Popen(self.command(argv), env=dict(env) if env is not None else None,
                                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            if not isinstance(out, int):
                out.close()
        self.procs.append(proc)
        return proc


class Network:
    """A bridge and the machines on it (see the module docstring)."""

    def __init__(self, suffix: str, subnet: tuple[int, int]) -> None:
        self.suffix = suffix
        self.bridge = f"{PREFIX}br{suffix}"
        self.base = f"10.{subnet[0]}.{subnet[1]}"
        self.gateway = f"{self.base}.1"  # the bridge's address: the test process, seen from the machines
        self.machines: dict[str, Machine] = {}
        self.closed = False

    @classmethod
    def create(cls) -> Network:
        """A new bridge with its address, in a random private subnet; raises if this box cannot (see
        `unavailable`)."""
        rng = random.Random()
        net = cls(f"{rng.randrange(16**6):06x}", (rng.randrange(100, 250), rng.randrange(1, 250)))
        atexit.register(net.close)
        try:
            _ip("link", "add", net.bridge, "type", "bridge")
            _ip("addr", "add", f"{net.gateway}/24", "dev", net.bridge)
            _ip("link", "set", net.bridge, "up")
        except BaseException:
            net.close()
            raise
        return net

    def machine(self, name: str) -> Machine:
        """A new machine `name` on the bridge, with the next address of the subnet and loopback up."""
        if name in self.machines:
            raise ValueError(f"machine {name} exists")
        index = len(self.machines) + 10
        m = Machine(name, f"{PREFIX}{self.suffix}-{name}", f"{self.base}.{index}", f"sv{self.suffix}{index}")
        self.machines[name] = m
        inner = f"si{self.suffix}{index}"
        _ip("netns", "add", m.netns)
        _ip("link", "add", m.veth, "type", "veth", "peer", "name", inner)
        _ip("link", "set", inner, "netns", m.netns)
        _ip("link", "set", m.veth, "master", self.bridge)
        _ip("link", "set", m.veth, "up")
        for args in (("addr", "add", f"{m.address}/24", "dev", inner), ("link", "set", inner, "up"),
                     ("link", "set", "lo", "up")):
            _ip("-n", m.netns, *args)
        return m

    def __getitem__(self, name: str) -> Machine:
        return self.machines[name]

    # -- faults ------------------------------------------------------------------------------------------

    def cut(self, name: str) -> None:
        """Cut machine `name` off: its link to the bridge goes down (packets vanish; TCP times out)."""
        _ip("link", "set", self.machines[name].veth, "down")

    def heal(self, name: str) -> None:
        """Bring machine `name`'s link back up."""
        _ip("link", "set", self.machines[name].veth, "up")

    def is_cut(self, name: str) -> bool:
        out = _ip("-o", "link", "show", self.machines[name].veth).stdout
        return "state DOWN" in out or ",UP" not in out.split(">")[0]

    # -- clean-up ----------------------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process the machines started (SIGTERM, then SIGKILL after 5 s), delete the namespaces,
        the veths and the bridge. Idempotent; safe after a partial `create`."""
        if self.closed:
            return
        self.closed = True
        procs = [p for m in self.machines.values() for p in m.procs if p.poll() is None]
        for p in procs:
            p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 5.0
        for p in procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for m in self.machines.values():
            _kill_namespace(m.netns)
            _ip("link", "del", m.veth, check=False)
            _ip("netns", "del", m.netns, check=False)
        _ip("link", "del", self.bridge, check=False)

    def __enter__(self) -> Network:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _kill_namespace(netns: str) -> None:
    """SIGKILL whatever still runs in `netns` (a process a test started by other means)."""
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (ProcessLookupError, ValueError):
            pass


def sweep() -> int:
    """Remove every namespace and bridge of a bed that died without `close` (SIGKILLed test run); how many
    namespaces went. Only names this module makes (`sa<hex6>-...`, `sabr<hex6>`)."""
    gone = 0
    for line in _ip("netns", "list", check=False).stdout.splitlines():
        name = line.split()[0] if line.split() else ""
        head, _, _ = name.partition("-")
        if name.startswith(PREFIX) and len(head) == len(PREFIX) + 6 and "-" in name:
            _kill_namespace(name)
            _ip("netns", "del", name, check=False)
            gone += 1
    for line in _ip("-o", "link", "show", "type", "bridge", check=False).stdout.splitlines():
        dev = line.split(":")[1].strip() if ":" in line else ""
        if dev.startswith(f"{PREFIX}br") and len(dev) == len(PREFIX) + 2 + 6:
            _ip("link", "del", dev, check=False)
    return gone


__all__ = ["PREFIX", "Machine", "Network", "sweep", "unavailable"]
