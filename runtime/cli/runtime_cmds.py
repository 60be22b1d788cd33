"""Commands registered on the `sa` app (see runtime/cli/__init__.py): the NATS runtime.

`sa worker` is here now; `sa up`, `sa send`, `sa runs`, `sa replay`, `sa host` join it with the host.
"""

from __future__ import annotations

from typing import Annotated

import typer

from runtime.cli.app import app


@app.command()
def worker(
    concurrency: Annotated[int, typer.Option("--concurrency", "-c", min=1,
                                             help="Jobs run at once by this process.")] = 8,
    tools: Annotated[list[str], typer.Option("--tools", "-t",
                                             help="Glob of .pym tool scripts to serve (repeatable).")] = [],  # noqa: B006
    bundle: Annotated[list[str], typer.Option("--bundle", "-b",
                                              help="bundle.yaml (or its folder) whose tools to serve "
                                                   "(repeatable).")] = [],  # noqa: B006
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL",
                                                 help="NATS server URL(s), comma-separated.")] = None,
) -> None:
    """Run sandboxed tool jobs from the shared `workers` consumer until Ctrl-C / SIGTERM.

    Start as many as you like, on any machine that reaches NATS: jobs spread across them, and a job a
    killed worker held is redelivered to another one.
    """
    import logging
    import signal

    import anyio

    from runtime.bundle import BundleError
    from runtime.worker import build_registry, serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if not nats_url:
        typer.echo("sa worker: no NATS server; set NATS_URL or pass --nats nats://host:4222", err=True)
        raise typer.Exit(2)
    if not tools and not bundle:
        typer.echo("sa worker: nothing to serve; pass --tools 'agents/*.pym' and/or --bundle PATH", err=True)
        raise typer.Exit(2)
    try:
        registry = build_registry(bundles=bundle, tool_globs=tools)
    except (BundleError, FileNotFoundError, ValueError) as e:
        typer.echo(f"sa worker: {e}", err=True)
        raise typer.Exit(2) from None

    async def main() -> None:
        stop = anyio.Event()

        async def on_signal() -> None:
            with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for _ in signals:
                    stop.set()
                    return

        def ready(w: object) -> None:
            names = ", ".join(sorted(registry.tools))
            typer.echo(f"sa worker {getattr(w, 'name', '')}: serving {names} (concurrency {concurrency})",
                       err=True)

        async with anyio.create_task_group() as tg:
            tg.start_soon(on_signal)
            stats = await serve(nats_url, registry, concurrency=concurrency, stop=stop, on_ready=ready)
            tg.cancel_scope.cancel()
        typer.echo(f"sa worker: stopped after {stats.completed} job(s) ({stats.failed} failed)", err=True)

    anyio.run(main, backend="asyncio")
