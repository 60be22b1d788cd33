"""How `sa` prints what it read: data is never markup, and output into a pipe keeps every character.

Why: a run holds text nobody controls (a task, a model's reply, a tool's output), and rich reads square
brackets in a plain string as markup: a task `again [/oops]` or a reply holding `[/INST]` made `sa send -f`
and `sa replay` die with a MarkupError after the run had completed, and `[run:x1]` silently vanished
from tables. So every value read from NATS reaches rich as a `Text` (`cell`), whose characters are only
characters, and markup is kept for the words `sa` itself writes.

A table printed into a pipe or a file (`sa runs | grep`, `sa replay RUN > out.txt`) is laid out for a
console as wide as its longest line (unless COLUMNS says otherwise), so no run id is cut to fit 80 columns.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

PIPE_WIDTH = 4096  # columns of a console that prints into a pipe: wider than any line a table makes


def console(*, stderr: bool = False) -> Console:
    """The console a command prints on: the terminal's width, or `PIPE_WIDTH` when it is not one."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, width=width)


def cell(value: Any, style: str = "") -> Text:
    """`value` as text that rich shows exactly (never parsed as markup), in `style`."""
    from rich.text import Text

    return Text("" if value is None else str(value), style=style)


__all__ = ["PIPE_WIDTH", "cell", "console"]
