"""A real 3-node NATS JetStream cluster on loopback, from the same config file production uses.

    with LocalCluster(n=3) as cluster:            # or `await cluster.astart()` from async code
        nc = await connect(cluster.urls)
        await ensure_topology(nc.jetstream(), replicas=3)
        cluster.kill(cluster.index_of("n1"))      # SIGKILL one node; its store survives
        cluster.restart(1)

Why it exists: the deploy files (deploy/compose.yaml, deploy/k8s/) cannot run on the dev machine
(no Docker engine, no Kubernetes), so what can run here is run here: three `nats-server` processes
configured by `deploy/nats/nats.conf` itself. That file takes every per-node value from the
environment (`$NATS_SERVER_NAME`, `$NATS_ROUTES`, ...), which nats-server substitutes at start, so
compose and this class fill the same names and a drift between them breaks a test, not a deployment.

Ports come from binding port 0 (three per node, chosen before start because every node must know
every route). Readiness is "/healthz answers 200 on every node and /jsz names a meta leader" (measured:
about 0.5 s, occasionally 5 s). Failover of a stream leader takes 4–6 s; clients connect to all URLs and
reconnect forever (`runtime.nats.connection.connect`). Each node is a `ServerProcess`, supervised like the
embedded server (`runtime.nats.server`).
"""

from __future__ import annotations

import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path

from runtime.nats.retry import wait_until
from runtime.nats.server import ServerProcess, monitor_get, release, supervise

CONFIG_TEMPLATE = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "nats.conf"
CLUSTER_NAME = "sa"

# What deploy/nats/nats.conf reads from the environment (compose sets the same names).
CONFIG_ENV = ("NATS_SERVER_NAME", "NATS_CLUSTER_NAME", "NATS_LISTEN", "NATS_HTTP", "NATS_CLUSTER_LISTEN",
              "NATS_ROUTES", "NATS_STORE_DIR")


def free_ports(n: int) -> list[int]:
    """`n` distinct free loopback ports (bind to port 0, read, release). All sockets are held until
    every port is picked, so the list has no duplicates; another process could still take one before
    the server binds it, which on loopback in tests has not been seen."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


@dataclass
class Node:
    """One server of the cluster: its name, ports, store and process."""

    name: str
    client_port: int
    http_port: int
    route_port: int
    store_dir: Path
    log_file: Path
    process: ServerProcess | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    @property
    def monitor_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def route_url(self) -> str:
        return f"nats-route://127.0.0.1:{self.route_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running


class LocalCluster:
    """`n` nats-server processes forming one JetStream cluster on 127.0.0.1 (see module docstring)."""

    def __init__(self, n: int = 3, *, root: str | Path | None = None, config: str | Path = CONFIG_TEMPLATE,
                 cluster_name: str = CLUSTER_NAME) -> None:
        if n < 1:
            raise ValueError("a cluster needs at least one node")
        self.config = Path(config)
        if not self.config.is_file():
            raise FileNotFoundError(f"{self.config}: LocalCluster runs the deploy config; it ships with the "
                                    "source tree, not the wheel")
        self._owned_root = root is None
        self.root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="sa-cluster-"))
        self.cluster_name = cluster_name
        ports = free_ports(3 * n)
        self.nodes = [Node(name=f"n{i}", client_port=ports[3 * i], http_port=ports[3 * i + 1],
                           route_port=ports[3 * i + 2], store_dir=self.root / f"n{i}",
                           log_file=self.root / f"n{i}.log") for i in range(n)]

    # -- addresses ---------------------------------------------------------------------------------------

    @property
    def urls(self) -> list[str]:
        """Every node's client URL: give them all to the client so it can fail over."""
        return [node.url for node in self.nodes]

    @property
    def url(self) -> str:
        """The URLs comma-separated, as `NATS_URL` takes them."""
        return ",".join(self.urls)

    def index_of(self, server_name: str) -> int:
        return next(i for i, node in enumerate(self.nodes) if node.name == server_name)

    def env(self, i: int) -> dict[str, str]:
        """The environment deploy/nats/nats.conf reads, for node `i` (what compose sets per service)."""
        node = self.nodes[i]
        return {
            "NATS_SERVER_NAME": node.name,
            "NATS_CLUSTER_NAME": self.cluster_name,
            "NATS_LISTEN": f"127.0.0.1:{node.client_port}",
            "NATS_HTTP": f"127.0.0.1:{node.http_port}",
            "NATS_CLUSTER_LISTEN": f"127.0.0.1:{node.route_port}",
            "NATS_ROUTES": "[" + ", ".join(n.route_url for n in self.nodes) + "]",
            "NATS_STORE_DIR": str(node.store_dir),
        }

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> LocalCluster:
        """Start every node and wait until the cluster has a JetStream meta leader (blocking)."""
        supervise(self, grace=2.0)
        try:
            for i in range(len(self.nodes)):
                self._spawn(i)
            self.wait_ready(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    async def astart(self, timeout: float = 30.0) -> LocalCluster:
        """`start` in a thread: a blocked event loop stalls every NATS connection of the process."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.start, timeout)

    def _spawn(self, i: int) -> None:
        node = self.nodes[i]
        node.store_dir.mkdir(parents=True, exist_ok=True)
        node.process = ServerProcess(["-c", str(self.config)], env=self.env(i), log_file=node.log_file)

    def wait_ready(self, timeout: float = 30.0) -> str:
        """Until every running node is healthy and one of them reports a meta leader; returns its name."""

        def leader() -> str | None:
            for node in self.nodes:
                code = node.process.returncode if node.process is not None else None
                if code is not None:
                    tail = node.log_file.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"nats-server {node.name} exited with {code}:\n{tail}")
            running = [n for n in self.nodes if n.running]
            if running and all(monitor_get(f"{n.monitor_url}/healthz") is not None for n in running):
                return self.meta_leader()
            return None

        return wait_until(leader, timeout=timeout, every=0.05,
                          what=f"a JetStream meta leader (logs in {self.root})")

    def meta_leader(self) -> str | None:
        """The server name of the JetStream meta leader, as any running node sees it."""
        for node in self.nodes:
            if node.running:
                jsz = monitor_get(f"{node.monitor_url}/jsz")
                leader = ((jsz or {}).get("meta_cluster") or {}).get("leader")
                if leader:
                    return str(leader)
        return None

    def kill(self, i: int) -> None:
        """SIGKILL node `i` (a crash: no clean shutdown); its store stays for `restart`."""
        node = self.nodes[i]
        if node.process is not None:
            node.process.kill()
            node.process = None

    def restart(self, i: int, timeout: float = 30.0) -> None:
        """Start node `i` again on the same ports and store, and wait until it is healthy."""
        if self.nodes[i].running:
            return
        self._spawn(i)
        node = self.nodes[i]
        wait_until(lambda: monitor_get(f"{node.monitor_url}/healthz"), timeout=timeout, every=0.05,
                   what=f"{node.name} to be healthy")

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every node (a clean JetStream shutdown), SIGKILL any that lingers; remove a temp root."""
        release(self)
        for node in self.nodes:
            if node.process is not None:
                node.process.terminate()  # every node first: they shut down together
        for node in self.nodes:
            if node.process is not None:
                node.process.wait(timeout)
                node.process = None
        if self._owned_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


__all__ = ["CLUSTER_NAME", "CONFIG_ENV", "CONFIG_TEMPLATE", "LocalCluster", "Node", "free_ports"]
