"""`sa up`: everything on this machine in one command, stopped together with Ctrl-C.

    sa up [BUNDLES...] [--workers N]      embedded NATS (unless NATS_URL), the local model if a bundle uses
                                          it, a host (in this process) and N worker processes
    sa up --store DIR                     JetStream kept in DIR (default: in the user data dir)
    sa up --secure                        the embedded NATS with authentication: fresh credentials per role

Start-up prints one line per process (nats, model, workers, state, host) and then `ready:`; a host's
per-partition log lines start once it is ready (all of them with --verbose). While it runs, the state file
(`runtime.running.state_file`) holds the NATS and model URLs, so the other commands find them.

One live `sa up` per store: an `sa up` claims its store folder for its life (`runtime.running.claim_store`),
and a second one on the same store is refused, naming the one running (two nats-servers on one store fight
over its files). On another store (`--store DIR`) it runs; the state file stays the first one's (this one's
URL is printed, for NATS_URL), and neither removes a state file it did not write.

Exit codes: 0 stopped by Ctrl-C / SIGTERM; 1 a bundle needs the `model` extra that is not installed, or
another `sa up` runs on the store; 2 bad usage (an invalid bundle, --secure with NATS_URL set). The host,
workers and agents are the same as `sa host` and `sa worker` run (`runtime.cli.serving`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runtime.cli import serving
from runtime.cli.app import app
from runtime.cli.observe_cmds import LogFormatOption, MetricsAddrOption, MetricsPortOption
from runtime.cli.serving import VERBOSE_HELP, EventsMaxAge, EventsMaxBytes, PayloadsMaxAge, PayloadsMaxBytes
from runtime.cli.where import bundle_paths
from runtime.observe.logs import LogFormat
from runtime.running import (
    StoreClaim,
    StoreTaken,
    claim_store,
    describe,
    new_state,
    remove_state,
    state_file,
    write_state,
)

if TYPE_CHECKING:
    from rich.console import Console

    from runtime.modelserver.launch import ServerProcess
    from runtime.nats.server import EmbeddedNats


@app.command()
def up(
    bundles: Annotated[list[Path], typer.Argument(help="bundle.yaml files, bundle folders or folders of "
                                                       "them (default: bundles/demo)")] = [],  # noqa: B006
    workers: Annotated[int, typer.Option("--workers", "-w", min=0, help="Tool worker processes.")] = 1,
    concurrency: Annotated[int, typer.Option(help="Jobs per worker process.")] = 8,
    store: Annotated[Path | None, typer.Option(help="JetStream store folder (default: the user data "
                                                    "dir, kept across restarts).")] = None,
    partitions: Annotated[int, typer.Option(help="Task partitions (fixed when the streams are first "
                                                 "created).")] = 16,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help=VERBOSE_HELP)] = False,
    events_max_age: EventsMaxAge = None,
    events_max_bytes: EventsMaxBytes = None,
    payloads_max_age: PayloadsMaxAge = None,
    payloads_max_bytes: PayloadsMaxBytes = None,
    metrics_port: MetricsPortOption = None,
    metrics_addr: MetricsAddrOption = "127.0.0.1",
    log_format: LogFormatOption = LogFormat.text,
    secure: Annotated[bool, typer.Option(
        "--secure", help="Start the embedded NATS with authentication: fresh credentials for each role "
                         "(publisher, operator, host, worker, admin) in 0600 files whose paths are printed; "
                         "the host and workers run as their roles.")] = False,
) -> None:
    """Start everything on this machine: NATS, the local model (if needed), a host and N workers.

    Retention: EVENTS and the payload store keep 90 days by default, with no size bound (see the
    --events-*/--payloads-* options); `sa runs purge` deletes finished runs.
    """
    from rich.console import Console

    from runtime import nats as bus
    from runtime.nats.server import default_store_dir

    bounds = serving.retention(events_max_age, events_max_bytes, payloads_max_age, payloads_max_bytes)
    paths = bundle_paths(bundles)
    serving.setup_logging(verbose, log_format)
    metrics = serving.host_metrics(metrics_port, metrics_addr)
    local_model = _needs_local_model(paths)
    if secure and bus.servers_from_env():
        typer.echo("error: --secure starts the embedded NATS with its own credentials, but NATS_URL names a "
                   "server: unset NATS_URL, or secure that server with deploy/nats/auth.conf", err=True)
        raise typer.Exit(2)
    console = Console(stderr=True, soft_wrap=True)  # one line per process, whatever the width
    state = new_state()
    claim = None if bus.servers_from_env() else _claim(store or default_store_dir(), state)
    fleet = _Local(console, state, claim)
    try:
        url = fleet.start_nats(secure)
        model_url = fleet.start_model() if local_model else None
        # this fleet's host owns the topology: made before the workers start, which wait for it
        import anyio

        anyio.run(serving.apply_retention, url, bounds, partitions, backend="asyncio")
        fleet.start_workers(workers, concurrency, paths, url, log_format)
        fleet.write_state(url, model_url, paths)
        agents = serving.load_agents(paths, model_url)
        _serve(console, url, agents, partitions, bounds, metrics, verbose)
    finally:
        fleet.stop()


def _needs_local_model(paths: list[Path]) -> bool:
    """Load the bundles (exit 2 on an invalid one); True if one runs on the local model, which needs the
    `model` extra: a lean install says how to get it (exit 1) before anything starts."""
    from runtime.bundle import BundleError, load_bundle

    loaded = []
    for p in paths:
        try:
            loaded.append(load_bundle(p))
        except BundleError as e:
            if e.outside():  # the host leaves it out and serves the others (`runtime.host.load_agents`)
                continue
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2) from None
    if not any(b.uses_local_model for b in loaded):
        return False
    from runtime.extras import MissingExtra, require

    try:
        require("model", "sa up with a bundle on the local model")
    except MissingExtra as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    return True


def _claim(store: Path, state: dict[str, Any]) -> StoreClaim:
    """This `sa up`'s claim on its store; exit 1 naming the `sa up` that holds it, and how to go on."""
    try:
        return claim_store(store, state)
    except StoreTaken as e:
        url = e.holder.get("nats_url")
        typer.echo(f"error: {e}.\n  Use it (`sa send ...` finds it{f'; NATS_URL={url}' if url else ''}), "
                   f"stop it (kill {e.holder.get('pid', '<its pid>')}, or Ctrl-C where it runs), or start "
                   "another sa up on a store of its own: sa up --store DIR", err=True)
        raise typer.Exit(1) from None


def _line(console: Console, name: str, text: str) -> None:
    """One start-up line: the process's name in bold, then what it is (escaped: paths and URLs are data)."""
    from rich.markup import escape

    console.print(f"[bold]{name:<8}[/] {escape(text)}", highlight=False)


@dataclass
class _Local:
    """What `sa up` started, so that everything is stopped, in order, however it ends."""

    console: Console
    state: dict[str, Any]  # what the state file says of this `sa up` (`runtime.running.new_state`)
    claim: StoreClaim | None  # its store, claimed (None: NATS_URL names the server, no store here)
    server: EmbeddedNats | None = None
    model: ServerProcess | None = None
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    worker_env: dict[str, str] = field(default_factory=dict)
    wrote_state: bool = False

    def start_nats(self, secure: bool) -> str:
        """NATS_URL's servers, else an embedded server on the claimed store (with authentication if
        `secure`); its URL."""
        from runtime import nats as bus

        if self.claim is None:
            url = ",".join(bus.servers_from_env() or [])
            _line(self.console, "nats", f"{url} (NATS_URL)")
            return url
        extra: list[str] = []
        if secure:
            self.worker_env = _secure_setup(self.console, self.claim.store, extra)
        self.server = bus.EmbeddedNats(self.claim.store, extra_args=extra).start()  # sync_interval: always
        from runtime.nats.durability import MONITOR_ENV

        os.environ.setdefault(MONITOR_ENV, self.server.monitor_url)  # where the host asks how it syncs
        self.state.update(nats_url=self.server.url, store=str(self.claim.store))
        self.claim.record(self.state)  # a refused `sa up` on this store names this one
        _line(self.console, "nats", f"{self.server.url}  (embedded, store {self.server.store_dir}"
                                    f"{', authentication on' if secure else ''})")
        return self.server.url

    def start_model(self) -> str:
        """The embedded model server as a child process (the first start converts the weights: minutes)."""
        from runtime.modelserver import start_model_server

        with self.console.status("starting the local model server (the first start converts the SmolLM2 "
                                 "weights; this can take a few minutes)…"):
            self.model = start_model_server(timeout=900.0)
        _line(self.console, "model", f"{self.model.base_url}/v1  (local SmolLM2)")
        return self.model.base_url

    def start_workers(self, n: int, concurrency: int, paths: list[Path], url: str,
                      log_format: LogFormat) -> None:
        for _ in range(n):
            cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker",
                   "--concurrency", str(concurrency), "--log-format", log_format.value]
            for p in paths:
                cmd += ["--bundle", str(p)]
            self.procs.append(subprocess.Popen(cmd, env={**os.environ, **self.worker_env, "NATS_URL": url},
                                               stdin=subprocess.DEVNULL))
        _line(self.console, "workers", f"{n} process(es): {', '.join(str(p.pid) for p in self.procs) or '-'}")

    def stop(self) -> None:
        self.console.print("stopping…")
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.model is not None:
            self.model.stop()
        if self.server is not None:
            self.server.stop()
        if self.wrote_state:
            with contextlib.suppress(OSError):
                remove_state(self.state["token"])  # only if it is still this one's
        if self.claim is not None:
            self.claim.release()
        self.console.print("stopped")

    def write_state(self, url: str, model_url: str | None, paths: list[Path]) -> None:
        """The state file the other commands read to find this `sa up` (removed when it stops), unless
        another live `sa up` holds it: then it stays that one's, and this one says how to reach it."""
        self.state.update(nats_url=url, model_url=model_url, bundles=[str(p.resolve()) for p in paths])
        other = write_state(self.state)
        if other is None:
            self.wrote_state = True
            _line(self.console, "state", str(state_file()))
            return
        _line(self.console, "state", f"{state_file()} is kept for {describe(other)}: commands find that "
                                     f"one by themselves; reach this one with NATS_URL={url}")


def _serve(console: Console, url: str, agents: Any, partitions: int, bounds: Any, metrics: Any,
           verbose: bool) -> None:
    """The host, in this process, until Ctrl-C / SIGTERM."""
    import logging

    import anyio

    from runtime.host import serve

    # the host's start-up line on syncing is said on its `host` line instead (`Host._check_storage`)
    logging.getLogger("runtime.host").getChild("storage").setLevel(logging.ERROR)

    def ready(h: Any) -> None:
        if metrics is not None:
            metrics.watch_host(h)
        names = ", ".join(f"agents.{n}.tasks" for n in sorted(agents))
        storage = h.storage.short()  # one line per process: the host's own storage warning is folded in
        _line(console, "host", f"serving {names} on {serving.served_partitions(h)}; resumed "
                               f"{h.stats.runs_recovered} run(s){'; ' + storage if storage else ''}")
        console.print(f"[green]ready[/]: sa send {sorted(agents)[0]} \"...\" --follow   "
                      "(Ctrl-C stops everything)", highlight=False)
        serving.started()

    async def main() -> None:
        stop = anyio.Event()
        await serving.apply_retention(url, bounds, partitions)
        async with anyio.create_task_group() as tg:
            tg.start_soon(serving.stop_on_signal, stop, verbose)
            if metrics is not None:
                tg.start_soon(serving.poll_queues, url, metrics, stop)
            await serve(url, agents, stop=stop, on_ready=ready, partitions=partitions,
                        on_event=metrics.observe if metrics is not None else None)
            tg.cancel_scope.cancel()

    serving.run_refusing_unsynced(main)


def secure_dir(store: Path) -> Path:
    """Where `sa up --secure` writes the server's users and each role's credentials: in the store it
    claimed, so an `sa up` on another store never rewrites the credentials of the one running."""
    return store / "secure"


def _secure_setup(console: Console, store: Path, server_args: list[str]) -> dict[str, str]:
    """Fresh credentials for every role (`runtime.nats.auth.write_secure_dir`); the server is told to use
    them (`server_args`), this process becomes the host, and the workers' environment is returned."""
    from runtime.nats.auth import read_env_file, write_secure_dir

    folder = secure_dir(store)
    files = write_secure_dir(folder)
    server_args += ["-c", str(folder / "auth.conf")]
    os.environ.update(read_env_file(files["host"]))  # the in-process host (and its lease thread)
    _line(console, "secure", f"credentials (0600) in {folder}: "
                             + ", ".join(f"{name} {path.name}" for name, path in files.items()))
    console.print(f"           use one with:  set -a; . {files['operator']}; set +a", highlight=False,
                  markup=False)
    return read_env_file(files["worker"])


__all__ = ["secure_dir", "up"]
