"""`sa mcp serve`: the fleet's agents as tools of any MCP client (`runtime.mcp`).

    sa mcp serve [--agents A,B] [--nats URL]              stdio: an MCP client starts it
    sa mcp serve --http [--port 8379] [--token-file F]    streamable HTTP on 127.0.0.1, token required
    sa mcp serve --key-file F                             follow the runs an earlier server started

On stdio, stdout is the MCP wire: everything this command says goes to stderr. On HTTP, a request must carry
``Authorization: Bearer <token>``: the token is read from `--token-file` (a new one is written there, readable
by its owner only, when the file does not exist), or made for this run and printed on stderr. The NATS server
and credentials are found like every other command's (`--nats`, NATS_URL, a running `sa up`; NATS_CREDS,
NATS_USER/NATS_PASSWORD, ...); a publisher's are enough (`runtime.mcp.started`).

Each run it starts carries the digest of a key derived from a secret, and it follows and cancels the run by
showing the hosts that key. The secret is made for each process unless `--key-file` names one (read, or
written there, readable by its owner only, when the file does not exist): then a call naming a `task_id`
that an earlier `sa mcp serve` started is followed after a restart too.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Annotated

import typer

from runtime.cli.app import PLAIN, app
from runtime.cli.where import resolve_nats

DEFAULT_PORT = 8379

mcp_app = typer.Typer(help="The fleet as a Model Context Protocol server.", no_args_is_help=True, **PLAIN)
app.add_typer(mcp_app, name="mcp")


def _token(path: Path | None, what: str = "token") -> tuple[str, str]:
    """(the token, where it came from); a `path` that does not exist gets a new token, mode 0600."""
    if path is None:
        return secrets.token_urlsafe(32), "made for this run"
    if path.exists():
        token = path.read_text().strip()
        if not token:
            typer.echo(f"sa mcp serve: the {what} file {path} is empty; write a {what} in it or remove it "
                       "(a new one is then made there)", err=True)
            raise typer.Exit(2)
        return token, f"read from {path}"
    token = secrets.token_urlsafe(32)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, f"written to {path}"


@mcp_app.command("serve")
def serve(
    agents: Annotated[str | None, typer.Option(
        "--agents", help="The agents (bundle names, comma-separated) offered as tools; default: every bundle "
                         "a live host serves, read again at each tools/list.")] = None,
    http: Annotated[bool, typer.Option("--http", help="Serve streamable HTTP on 127.0.0.1 instead of stdio "
                                                      "(a bearer token is required).")] = False,
    port: Annotated[int, typer.Option("--port", "-p", min=0, max=65535,
                                      help="The port of --http (0: any free port).")] = DEFAULT_PORT,
    token_file: Annotated[Path | None, typer.Option(
        "--token-file", help="The bearer token of --http: read from this file, or written to it when it does "
                             "not exist (default: a new token, printed on stderr).")] = None,
    key_file: Annotated[Path | None, typer.Option(
        "--key-file", help="The secret the keys of the runs it starts are derived from: read from this file, "
                           "or written to it when it does not exist (default: a new one per process, so "
                           "only this process follows its runs).")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Serve the fleet's agents as MCP tools: a call is a run, returning its output; runs are resources."""
    import socket

    import anyio

    from runtime.mcp import MCP_PATH, serve_http, serve_stdio

    url = resolve_nats(nats_url, "mcp serve")
    secret = _token(key_file, "key")[0].encode() if key_file is not None else None
    if secret is not None and len(secret) < 16:
        typer.echo(f"sa mcp serve: the key in {key_file} is {len(secret)} bytes; a key needs at least 16 "
                   "(remove the file and a new one is made there)", err=True)
        raise typer.Exit(2)
    chosen = [a.strip() for a in agents.split(",") if a.strip()] if agents else None
    sock: socket.socket | None = None
    token = ""
    if http:
        token, origin = _token(token_file)
        try:
            sock = socket.create_server(("127.0.0.1", port))
        except OSError as e:
            typer.echo(f"sa mcp serve: cannot listen on 127.0.0.1:{port}: {e.strerror or e}; pick another "
                       "--port (or --port 0 for any free one)", err=True)
            raise typer.Exit(2) from None
        bound = sock.getsockname()[1]
        shown = f"the token, {origin}" if token_file else f"token {token} ({origin})"
        typer.echo(f"sa mcp serve: MCP at http://127.0.0.1:{bound}{MCP_PATH} (runs from {url}); send "
                   f"`Authorization: Bearer <token>` with {shown}; Ctrl-C stops it", err=True)
    elif token_file is not None:
        typer.echo("sa mcp serve: --token-file is for --http (stdio needs no token)", err=True)
        raise typer.Exit(2)

    async def main() -> None:
        from runtime.client import Client
        from runtime.mcp import FleetTools

        # a server lives as long as its client wants it: reconnect to NATS for as long as it takes
        client = await Client.connect(url, name="sa-mcp", max_reconnect_attempts=-1)
        try:
            server = FleetTools(client, agents=chosen, secret=secret).server()
            if sock is not None:
                await serve_http(server, sock, token)
            else:
                await serve_stdio(server)
        finally:
            await client.close()

    try:
        anyio.run(main, backend="asyncio")
    except KeyboardInterrupt:
        pass
