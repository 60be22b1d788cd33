"""`sa ui`: the run inspector in a browser (`runtime.ui`).

    sa ui [--port 8377] [--host 127.0.0.1] [--allow-host NAME ...] [--nats URL]

It serves the runs index, each run's timeline, live following and fork on the given address; the NATS
server is found like every other command's (`runtime.cli.where`). It binds to loopback unless told
otherwise, because anyone who can reach it can read every run and start forks, and it answers only to the
names it was bound to (`--allow-host` adds one, e.g. a proxy's: see `runtime.ui.guard`).
"""

from __future__ import annotations

from typing import Annotated

import typer

from runtime.cli.app import app
from runtime.cli.where import resolve_nats

DEFAULT_PORT = 8377


@app.command()
def ui(
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535,
                                      help="The port to serve on (0: any free port).")] = DEFAULT_PORT,
    host: Annotated[str, typer.Option("--host", help="The address to bind (loopback by default: the "
                                                     "inspector has no login).")] = "127.0.0.1",
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", help="Another name the inspector may be reached by (a proxy, a DNS name); it answers "
                             "only to its bind address (and localhost when on loopback) otherwise. "
                             "Repeatable.")] = None,
) -> None:
    """Serve the run inspector: runs index, run timelines, live following, fork from any event."""
    import socket

    import uvicorn

    from runtime.ui.app import create_app

    url = resolve_nats(nats_url, "ui")
    try:
        inspector = create_app(url, bind=host, allow_hosts=allow_host or ())
    except ValueError as e:
        typer.echo(f"sa ui: {e}", err=True)
        raise typer.Exit(2) from None
    try:
        sock = socket.create_server((host, port))
    except OSError as e:
        typer.echo(f"sa ui: cannot listen on {host}:{port}: {e.strerror or e}; pick another --port "
                   "(or --port 0 for any free one)", err=True)
        raise typer.Exit(2) from None
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    typer.echo(f"sa ui: the inspector is at http://{shown}:{bound}/ (runs from {url}); Ctrl-C stops it",
               err=True)
    config = uvicorn.Config(inspector, log_level="warning", lifespan="on")
    uvicorn.Server(config).run(sockets=[sock])
