"""Errors from Monty as `ToolError`s: the right kind, the user's line, and a message a model can act on.

Monty reports a failed run as an exception, but says which limit was hit only in its text: the exception
type together with a message prefix tells them apart (`MemoryError: memory limit exceeded`,
`TimeoutError: ... time limit exceeded` or `sleep limit exceeded`, `RecursionError: maximum recursion
depth exceeded`, `RuntimeError: suspension limit N exceeded`). A run killed for overrunning its time is a
`MontyCrashedError` with `timed_out`; any other crash means the sandbox worker died and was replaced.

An exception a host external raised reaches the script with the same builtin type (a host-only class
arrives as plain `Exception`); if the script lets it escape, it is reported as kind `external` naming
the host function, matched against what the external wrappers recorded.

Kinds: parse, check, input, external, execution, limit (`detail`: memory | duration | recursion |
suspensions), crashed. Messages quote the failing source line (the loader keeps line numbers, so Monty's
lines are the `.pym` file's) and add what helps: the files that exist, the modules the sandbox has, how to
declare a missing input.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic_monty import (
    Frame,
    MontyConversionError,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontySyntaxError,
    MontyTypingError,
)

from runtime.quantities import human_duration, human_size
from runtime.scripts.check import MODULES
from runtime.scripts.files import READ_ONLY_HINT, ReadOnlyFS
from runtime.scripts.pool import get_pool
from runtime.types import ToolError

if TYPE_CHECKING:
    from runtime.scripts.externals import ExternalFailure
    from runtime.scripts.limits import Limits
    from runtime.scripts.loaded import LoadedScript

__all__ = ["classify", "frames", "lost_worker"]

_SUSPENSION = re.compile(r"suspension limit (\d+) exceeded")


def frames(e: MontyError) -> list[Frame]:
    """The sandbox traceback's frames (innermost last), or [] when Monty has none."""
    try:
        return list(e.traceback()) if hasattr(e, "traceback") else []
    except Exception:  # pragma: no cover - defensive
        return []


def _where(found: list[Frame]) -> tuple[int | None, str]:
    """The failing line and a compact traceback in the script's terms."""
    if not found:
        return None, ""
    last = found[-1]
    shown: list[Frame | None] = [*found] if len(found) <= 6 else [*found[:2], None, *found[-3:]]
    lines = []
    for f in shown:
        if f is None:
            lines.append(f"  ... {len(found) - 5} more frames ...")
            continue
        fn = f.function_name or "<module>"
        src = (f.source_line or "").strip()
        lines.append(f"  line {f.line}, in {fn}: {src}" if src else f"  line {f.line}, in {fn}")
    return last.line, "\n".join(lines)


def _norm(message: str) -> str:
    """Exception text compared across the boundary (KeyError('x') reads 'x' on the host, x in Monty)."""
    return message.strip().strip("'\"")


def lost_worker(script: LoadedScript, e: RuntimeError) -> ToolError | None:
    """A `crashed` error when the sandbox worker vanished between the feed and its answer (Monty then says
    "this checkout has already been finished"), else None: any other RuntimeError is a host bug."""
    if "checkout" not in str(e):
        return None
    get_pool().record_crash(str(e))
    return ToolError(
        "crashed",
        f"the sandbox worker running {script.filename} was lost "
        f"({e}). It has been replaced; retrying once is reasonable.",
    )


def classify(
    e: MontyError,
    script: LoadedScript,
    limits: Limits,
    failures: list[ExternalFailure],
    fs: ReadOnlyFS | None,
) -> ToolError:
    """A Monty exception as a `ToolError` written for the model."""
    if isinstance(e, MontyCrashedError):
        return _crashed(e, script.filename, limits)
    found = frames(e)
    line, trace = _where(found)
    if isinstance(e, MontySyntaxError):
        return ToolError("parse", f"Monty cannot parse the script: {e}", line)
    if isinstance(e, MontyTypingError):
        return ToolError("check", f"type check failed:\n{e.display()}")
    if isinstance(e, MontyConversionError):
        return ToolError("input", f"a value could not be passed into the sandbox: {e}. Use plain JSON data.")
    raised = _Raised.read(e, found, line, trace)
    error = _limit_error(raised, limits)
    if error is None:
        error = _unsupported_error(raised)
    if error is None:
        error = _external_error(raised, failures)
    return error if error is not None else _execution_error(raised, script.filename, fs)


def _crashed(e: MontyCrashedError, file: str, limits: Limits) -> ToolError:
    """The sandbox worker died: killed for overrunning its time (a `limit`), or for any other reason."""
    if e.timed_out:
        return ToolError(
            "limit",
            f"the script ran past its {human_duration(limits.max_duration or 0)} time "
            "limit (max_duration) and its sandbox worker had to be killed. Look for an endless "
            "loop or very deep recursion, or do less work per call.",
            detail="duration",
        )
    get_pool().record_crash(str(e))
    return ToolError(
        "crashed",
        f"the sandbox worker running {file} died ({e}). It has been replaced; the "
        "script may be fine, so retrying once is reasonable. If it happens again, look for "
        "huge allocations or runaway recursion.",
    )


@dataclass(frozen=True)
class _Raised:
    """What a script raised while it ran, read once from Monty's exception for the functions below."""

    kind: str  # the exception's type name in the sandbox ("Error" when Monty gives none)
    text: str  # Monty's whole text, which is where a limit says its name
    message: str  # the exception's own message
    line: int | None  # the failing line of the `.pym`
    trace: str  # a compact traceback (`_where`)
    depth: int  # how many frames the traceback has
    source: str  # the failing source line, stripped

    @classmethod
    def read(cls, e: MontyError, found: list[Frame], line: int | None, trace: str) -> _Raised:
        inner = e.exception() if isinstance(e, MontyRuntimeError) else None
        text = str(e)
        return cls(
            kind=type(inner).__name__ if inner is not None else "Error",
            text=text,
            message=e.display("msg") if isinstance(e, MontyRuntimeError) else text,
            line=line,
            trace=trace,
            depth=len(found),
            source=(found[-1].source_line or "").strip() if found else "",
        )

    @property
    def deliberate(self) -> bool:
        """The script's own `raise`: its message is the point, and already says it all."""
        return self.source.startswith("raise ")

    @property
    def quoted(self) -> str:
        """` in `<the failing line>`` for a message (`line` travels in ToolError.line, which for_model
        shows), or "" when there is no line or it is the script's own `raise`."""
        return f" in `{self.source}`" if self.source and not self.deliberate else ""


def _limit_error(raised: _Raised, limits: Limits) -> ToolError | None:
    """A `limit` error when the run hit one of its limits (memory, time, recursion, host calls), else None."""
    kind, text, src, line = raised.kind, raised.text, raised.quoted, raised.line
    if kind == "MemoryError" and ("memory limit" in text or "exceeded its memory limit" in text):
        return ToolError(
            "limit",
            f"the script used more than its {human_size(limits.max_memory or 0)} memory "
            f"limit (max_memory){src}. Build smaller data: process items one at a time, avoid "
            "huge lists or strings.",
            line,
            "memory",
        )
    if kind == "TimeoutError" and "limit exceeded" in text:
        what = "sleeping" if "sleep limit" in text else "running"
        return ToolError(
            "limit",
            f"the script was stopped after {what} past its "
            f"{human_duration(limits.max_duration or 0)} time limit (max_duration){src}. Look "
            "for an endless loop, or do less work per call.",
            line,
            "duration",
        )
    if kind == "RecursionError":
        return ToolError(
            "limit",
            f"maximum recursion depth ({limits.max_recursion}, max_recursion) exceeded"
            f"{src}. Use a loop instead of recursion, or recurse less deeply.",
            line,
            "recursion",
        )
    if kind == "RuntimeError" and (m := _SUSPENSION.search(text)):
        return ToolError(
            "limit",
            f"the script made more than {m.group(1)} host calls (externals and file or "
            f"environment operations; max_suspensions){src}. Read fewer files or call "
            "externals fewer times (e.g. read a file once and reuse it).",
            line,
            "suspensions",
        )
    return None


def _unsupported_error(raised: _Raised) -> ToolError | None:
    """A `check` error when Monty met a construct it cannot run (found only when it ran), else None."""
    if raised.kind == "NotImplementedError" and "syntax parser does not yet support" in raised.text:
        return ToolError(
            "check",
            f"{raised.message}{raised.quoted}: Monty cannot run this construct; rewrite it "
            "(see the .pym guide in README.md)",
            raised.line,
        )
    return None


def _external_error(raised: _Raised, failures: list[ExternalFailure]) -> ToolError | None:
    """An `external` error when what escaped is the exception the last failed host function raised."""
    if not failures:
        return None
    last = failures[-1]
    same_type = raised.kind in (last.type, "Exception")  # host-only exception classes arrive as Exception
    if not (same_type and _norm(raised.message) == _norm(last.message)):
        return None
    what = f"{last.type}: {last.message}" if last.message else last.type
    return ToolError(
        "external",
        f"external function {last.name!r} raised {what}{raised.quoted}. The host function failed; check "
        "the arguments passed to it, or catch the error in the script.",
        raised.line,
    )


def _execution_error(raised: _Raised, file: str, fs: ReadOnlyFS | None) -> ToolError:
    """Any other exception the script let escape: its type and message, the traceback, and a hint."""
    trace_text = (
        f"\nTraceback (most recent call last), {file}:\n{raised.trace}"
        if raised.depth > 1 and not raised.deliberate
        else ""
    )
    return ToolError(
        "execution",
        f"{raised.kind}: {raised.message}{raised.quoted}{trace_text}{_hint(raised, fs)}",
        raised.line,
    )


def _hint(raised: _Raised, fs: ReadOnlyFS | None) -> str:
    """What helps with an exception of this type ("" when nothing does): the files that exist, how to
    declare a missing name, the modules the sandbox has."""
    kind, text = raised.kind, raised.text
    if kind == "FileNotFoundError" and fs is not None:
        listing = fs.listing()
        if not listing:
            return "\nNo files were provided to this run."
        return "\nAvailable files: " + ", ".join(listing)
    if kind == "PermissionError" and "Read-only" in text and READ_ONLY_HINT not in text:
        return f"\n{READ_ONLY_HINT[0].upper()}{READ_ONLY_HINT[1:]}."
    if kind == "NameError" and (m := re.search(r"name '(\w+)' is not defined", text)):
        return (
            f"\nIf {m.group(1)!r} should be an input, declare it: `{m.group(1)}: str = "
            f'Input("{m.group(1)}")`; if it is a host function, declare it with @external.'
        )
    if kind in ("ModuleNotFoundError", "ImportError"):
        return f"\nModules available in the sandbox: {', '.join(sorted(MODULES))}."
    return ""
