"""A fleet on machines of its own: a 3-node NATS cluster (R3 streams), `sa host`s and `sa worker`s, each on
its own network namespace (`testbed.netns`), so a test can cut one off while it stays alive.

    bed = Bed(tmp_path, responder=StepModel(), hosts=2, workers=2, partitions=8)
    await bed.astart()                 # machines, cluster, topology, scripted model, hosts, workers
    js = bed.js                        # the load driver's connection (the test process, on the bridge)
    bed.cut("h0"); bed.heal("h0")      # a machine's link down / up: its processes live on
    await bed.aclose()                 # every process, namespace, veth and the bridge, failure or not

The real processes and configs: every NATS node runs `deploy/nats/nats.conf` with the environment compose
sets (`runtime.nats.cluster.CONFIG_ENV`), on its machine's address with the standard ports (4222 clients,
6222 routes, 8222 monitoring); hosts and workers are `sa host` / `sa worker` processes given every node's
URL, as a deployment would. The test process is the load driver and serves the scripted model on the
bridge's address, so a host cut off from the cluster is cut off from the model as well.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio

from runtime.nats.cluster import CLUSTER_NAME, CONFIG_TEMPLATE
from runtime.nats.connection import close, connect
from runtime.nats.retry import retrying, wait_until
from runtime.nats.server import find_nats_server, monitor_get
from runtime.nats.topology import ensure_topology
from runtime.testing import Responder, ScriptedModelServer
from testbed.fleet import SaProcess
from testbed.netns import Machine, Network

CLIENT, ROUTE, MONITOR, METRICS = 4222, 6222, 8222, 9464


class Bed:
    """Machines `n0..n2` (NATS), `h0..` (hosts), `w0..` (workers) on one bridge; see the module docstring."""

    def __init__(self, root: Path, *, responder: Responder, hosts: int = 2, workers: int = 2,
                 partitions: int = 8, nodes: int = 3, lease_ttl: float = 2.0, tool_ack_wait: float = 3.0,
                 task_ack_wait: float = 3.0, worker_concurrency: int = 2, bundle: str = "") -> None:
        self.root = root
        self.responder = responder
        self.counts = (nodes, hosts, workers)
        self.partitions, self.lease_ttl = partitions, lease_ttl
        self.tool_ack_wait, self.task_ack_wait = tool_ack_wait, task_ack_wait
        self.worker_concurrency = worker_concurrency
        self.bundle_text = bundle  # bundle.yaml with `{base_url}` for the model; see `write_bundle`
        self.net: Network | None = None
        self.model: ScriptedModelServer | None = None
        self.nodes: list[Machine] = []
        self.nats: dict[str, subprocess.Popen[bytes]] = {}
        self.hosts: list[SaProcess] = []
        self.workers: list[SaProcess] = []
        self.nc: Any = None
        self.js: Any = None

    # -- addresses ---------------------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        return [f"nats://{m.address}:{CLIENT}" for m in self.nodes]

    @property
    def url(self) -> str:
        return ",".join(self.urls)

    def machine_of(self, name: str) -> Machine:
        assert self.net is not None
        return self.net[name]

    def monitor(self, node: int, path: str) -> dict[str, Any] | None:
        return monitor_get(f"http://{self.nodes[node].address}:{MONITOR}{path}")

    # -- lifecycle ---------------------------------------------------------------------------------------

    async def astart(self, timeout: float = 120.0, *, later: tuple[str, ...] = ()) -> Bed:
        """Build everything (blocking parts in a thread); on any failure everything built is torn down. The
        `sa` processes named in `later` (machine names, e.g. ``("h1",)``) are left for `start`."""
        try:
            await anyio.to_thread.run_sync(self._start_network)
            await anyio.to_thread.run_sync(self.wait_cluster, 60.0)
            self.nc = await connect(self.urls, name="netbed-driver")
            self.js = self.nc.jetstream()
            js = self.js  # a cluster just up may answer its first stream creates late (seen on a loaded
            # CI box: a 5 s request timeout): the topology is idempotent, so it is made again until it stands
            await retrying(lambda: ensure_topology(js, replicas=len(self.nodes), partitions=self.partitions,
                                                   tool_ack_wait=self.tool_ack_wait),
                           what="making the bed's topology", give_up=60.0, level=logging.INFO)
            assert self.net is not None
            self.model = ScriptedModelServer(responder=self.responder, host=self.net.gateway).start()
            bundle = self.write_bundle(self.model.base_url)
            self.hosts = [self._sa(f"h{i}", ["host", str(bundle), "--lease-ttl", f"{self.lease_ttl:g}",
                                             "--task-ack-wait", f"{self.task_ack_wait:g}",
                                             "--metrics-port", str(METRICS), "--verbose"], "sa host: serving")
                          for i in range(self.counts[1])]
            self.workers = [self._sa(f"w{i}", ["worker", "--bundle", str(bundle), "--concurrency",
                                               str(self.worker_concurrency), "--ack-wait",
                                               f"{self.tool_ack_wait:g}"], "serving")
                            for i in range(self.counts[2])]
            now = [p for p in self.hosts + self.workers if p.name not in later]
            for p in now:
                p.start()
            for p in now:
                await anyio.to_thread.run_sync(p.wait_ready, timeout)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await self.aclose()
            raise
        return self

    async def start(self, name: str, timeout: float = 120.0) -> None:
        """Start (or restart) the `sa` process of machine `name` and wait for its ready line."""
        proc = next(p for p in self.hosts + self.workers if p.name == name)
        proc.start()
        await anyio.to_thread.run_sync(proc.wait_ready, timeout)

    def _start_network(self) -> None:
        self.net = net = Network.create()
        nodes, hosts, workers = self.counts
        self.nodes = [net.machine(f"n{i}") for i in range(nodes)]
        for i in range(hosts):
            net.machine(f"h{i}")
        for i in range(workers):
            net.machine(f"w{i}")
        for i in range(nodes):
            self.start_node(i)

    def start_node(self, i: int) -> None:
        """Start (or restart: same store) NATS node `i` on its machine, from the deploy config."""
        m = self.nodes[i]
        store = self.root / "nats" / m.name
        store.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "NATS_SERVER_NAME": m.name, "NATS_CLUSTER_NAME": CLUSTER_NAME,
               "NATS_LISTEN": f"0.0.0.0:{CLIENT}", "NATS_HTTP": f"0.0.0.0:{MONITOR}",
               "NATS_CLUSTER_LISTEN": f"0.0.0.0:{ROUTE}",
               "NATS_ROUTES": "[" + ", ".join(f"nats-route://{n.address}:{ROUTE}" for n in self.nodes) + "]",
               "NATS_STORE_DIR": str(store)}
        self.nats[m.name] = m.popen([str(find_nats_server()), "-c", str(CONFIG_TEMPLATE)], env=env,
                                    log=self.root / f"{m.name}.log")

    def wait_cluster(self, timeout: float) -> str:
        """Until every node answers /healthz and one names a JetStream meta leader; its name."""
        def leader() -> str | None:
            for name, proc in self.nats.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"nats-server {name} exited: see {self.root / (name + '.log')}")
            if all(self.monitor(i, "/healthz") is not None for i in range(len(self.nodes))):
                return self.meta_leader()
            return None
        return wait_until(leader, timeout=timeout, every=0.1, what="a JetStream meta leader on the bed")

    def meta_leader(self) -> str | None:
        for i in range(len(self.nodes)):
            jsz = self.monitor(i, "/jsz")
            leader = ((jsz or {}).get("meta_cluster") or {}).get("leader")
            if leader:
                return str(leader)
        return None

    def write_bundle(self, base_url: str) -> Path:
        folder = self.root / "bundle"
        (folder / "tools").mkdir(parents=True, exist_ok=True)
        from testbed.scripts import APPEND_LINE, SUBMIT

        (folder / "tools" / "step.pym").write_text(APPEND_LINE)
        (folder / "tools" / "submit.pym").write_text(SUBMIT)
        text = self.bundle_text or (
            "name: net\nsystem_prompt: You append lines with tools.\n"
            "model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}\n"
            "constraint: {{strategy: ebnf}}\ntools:\n  - tools/step.pym\n  - tools/submit.pym\n"
            "termination: {{terminal_tool: submit, max_turns: 8}}\n"
            "limits: {{max_duration: 120s}}\ndata_provider: workspace\nworkspace: wsnet\n")
        (folder / "bundle.yaml").write_text(text.format(base_url=base_url))
        return folder / "bundle.yaml"

    def _sa(self, machine: str, args: list[str], ready: str) -> SaProcess:
        m = self.machine_of(machine)
        return SaProcess(machine, args, self.url, self.root / f"{machine}.log", ready,
                         prefix=["ip", "netns", "exec", m.netns])

    async def aclose(self) -> None:
        """Stop the driver's connection, every `sa` process, the model server, the machines."""
        with anyio.CancelScope(shield=True):
            if self.nc is not None:
                with anyio.move_on_after(5):
                    await close(self.nc)
                self.nc = None
            await anyio.to_thread.run_sync(self.close)

    def close(self) -> None:
        for p in self.hosts + self.workers:
            try:
                p.stop()
            except Exception:  # a process that would not stop is killed with its namespace below
                pass
        if self.model is not None:
            self.model.close()
        if self.net is not None:
            self.net.close()

    # -- faults ------------------------------------------------------------------------------------------

    def cut(self, machine: str) -> float:
        """Cut `machine`'s link; the time it happened."""
        assert self.net is not None
        self.net.cut(machine)
        return time.time()

    def heal(self, machine: str) -> float:
        assert self.net is not None
        self.net.heal(machine)
        return time.time()

    def host(self, name: str) -> SaProcess:
        return next(h for h in self.hosts if h.name == name)

    def metrics(self, machine: str) -> dict[str, float]:
        """A host's Prometheus gauges and counters, read on its own machine's loopback (works while it is
        cut off): name{labels} -> value."""
        code = ("import urllib.request,sys;sys.stdout.write(urllib.request.urlopen("
                f"'http://127.0.0.1:{METRICS}/metrics',timeout=2).read().decode())")
        m = self.machine_of(machine)
        done = subprocess.run(m.command([sys.executable, "-c", code]), capture_output=True, text=True,
                              timeout=20)
        out: dict[str, float] = {}
        for line in done.stdout.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                try:
                    out[key] = float(value)
                except ValueError:
                    pass
        return out


__all__ = ["CLIENT", "METRICS", "MONITOR", "ROUTE", "Bed"]
