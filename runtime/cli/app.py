"""The `sa` Typer application object, shared by the command modules that register on it.

Help is rendered plainly (`rich_markup_mode=None`): click's own layout, one line per option with its
flags, value type and help, with no boxes; rich markup would render every flag as `--help <bool>`.
Command modules import heavy dependencies (torch, xgrammar, nats) inside their command functions so
that `sa run` on a script starts in a fraction of a second.
"""

from typing import Any

import typer

PLAIN: dict[str, Any] = {"rich_markup_mode": None, "add_completion": False}

app = typer.Typer(
    name="sa",
    help="structured-agents: run sandboxed .pym tools and event-sourced LLM agents on NATS.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"max_content_width": 110},  # lines up to 110 columns when the terminal is that wide
    **PLAIN,
)
model_app = typer.Typer(help="The embedded CPU model server (vLLM's request format).", no_args_is_help=True,
                        **PLAIN)
app.add_typer(model_app, name="model")
