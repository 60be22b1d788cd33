"""What a person's terminal is shown of a run: its text with control characters made visible, on a console
as wide as the text needs when it is not a terminal.

Why: a run holds text nobody controls (a task, a model's reply, a tool's output). Printed raw, an escape
sequence in it reaches the operator's terminal as a command: `sa replay` of a task holding
`ESC ] 0 ; … BEL` retitled the window, `ESC [ 31 m` recoloured everything after it, and a C1 `CSI` (0x9b)
does the same on terminals that read 8-bit controls. So every human-readable view of run content (the
timeline, the live view, tables of runs, threads, questions, approvals) shows its data through `printable`
(or `shown`, its rich `Text`): newlines and tabs stay (a reply's lines are its lines), every other control
character is written as its escape, `\\x1b`, `\\x00`, `\\x9b`, so it is seen, not obeyed. The `--json` outputs
need nothing: JSON escapes control characters itself.

And never markup: rich reads square brackets in a plain string as markup, so a task `again [/oops]` or a
reply holding `[/INST]` once made `sa send -f` and `sa replay` die with a MarkupError after the run had
completed, and `[run:x1]` silently vanished from tables. `shown` gives rich a `Text`, whose characters are
only characters; markup is kept for the words `sa` itself writes.

A console that prints into a pipe or a file is as wide as its longest line (`PIPE_WIDTH`, unless COLUMNS
says otherwise): `sa runs | grep` and `make demo > log` keep each line whole, instead of wrapping at rich's
default 80 columns and cutting `sa replay RUN` in two.
"""

from __future__ import annotations

import os
import sys
import unicodedata
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.text import Text

PIPE_WIDTH = 4096  # columns of a console that prints into a pipe: wider than any line a table makes
KEPT = "\n\t"  # the control characters shown as themselves


def _escaped(char: str) -> str:
    if char in KEPT or unicodedata.category(char) != "Cc":
        return char
    return f"\\x{ord(char):02x}"


def printable(text: str) -> str:
    """`text` with every control character but newline and tab written as its escape (`\\x1b`)."""
    if text.isprintable():  # the common case: nothing to look at twice
        return text
    return "".join(_escaped(c) for c in text)


def shown(value: Any, style: str = "") -> Text:
    """`value` as rich shows it exactly: `printable`, and never parsed as markup (`[/INST]` is text)."""
    from rich.text import Text

    return Text(printable("" if value is None else str(value)), style=style)


def console(*, stderr: bool = False) -> Console:
    """A console on stdout (or stderr): the terminal's width, or `PIPE_WIDTH` when it is not one."""
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() or os.environ.get("COLUMNS") else PIPE_WIDTH
    return Console(stderr=stderr, width=width)


__all__ = ["PIPE_WIDTH", "console", "printable", "shown"]
