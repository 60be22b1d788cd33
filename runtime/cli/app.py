"""The `sa` Typer application object, shared by the command modules that register on it.

Command modules import heavy dependencies (torch, xgrammar, nats) inside their command functions so
that `sa run` on a script starts in a fraction of a second.
"""

import typer

app = typer.Typer(
    name="sa",
    help="structured-agents: run sandboxed .pym tools and event-sourced LLM agents on NATS.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="The embedded CPU model server (vLLM's request format).", no_args_is_help=True)
app.add_typer(model_app, name="model")
