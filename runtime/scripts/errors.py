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

from runtime.scripts.check import MODULES
from runtime.scripts.files import READ_ONLY_HINT, ReadOnlyFS
from runtime.scripts.limits import human_duration, human_size
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
    file = script.filename
    if isinstance(e, MontyCrashedError):
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
    found = frames(e)
    line, trace = _where(found)
    if isinstance(e, MontySyntaxError):
        return ToolError("parse", f"Monty cannot parse the script: {e}", line)
    if isinstance(e, MontyTypingError):
        return ToolError("check", f"type check failed:\n{e.display()}")
    if isinstance(e, MontyConversionError):
        return ToolError("input", f"a value could not be passed into the sandbox: {e}. Use plain JSON data.")
    inner = e.exception() if isinstance(e, MontyRuntimeError) else None
    kind_name = type(inner).__name__ if inner is not None else "Error"
    text = str(e)
    message = e.display("msg") if isinstance(e, MontyRuntimeError) else text
    # `line` travels in ToolError.line (for_model shows it); the message quotes the source line itself
    src_line = (found[-1].source_line or "").strip() if found else ""
    # quote the failing line, unless it is the script's own `raise` (its message already says it all)
    src = f" in `{src_line}`" if src_line and not src_line.startswith("raise ") else ""

    if kind_name == "MemoryError" and ("memory limit" in text or "exceeded its memory limit" in text):
        return ToolError(
            "limit",
            f"the script used more than its {human_size(limits.max_memory or 0)} memory "
            f"limit (max_memory){src}. Build smaller data: process items one at a time, avoid "
            "huge lists or strings.",
            line,
            "memory",
        )
    if kind_name == "TimeoutError" and "limit exceeded" in text:
        what = "sleeping" if "sleep limit" in text else "running"
        return ToolError(
            "limit",
            f"the script was stopped after {what} past its "
            f"{human_duration(limits.max_duration or 0)} time limit (max_duration){src}. Look "
            "for an endless loop, or do less work per call.",
            line,
            "duration",
        )
    if kind_name == "RecursionError":
        return ToolError(
            "limit",
            f"maximum recursion depth ({limits.max_recursion}, max_recursion) exceeded"
            f"{src}. Use a loop instead of recursion, or recurse less deeply.",
            line,
            "recursion",
        )
    if kind_name == "RuntimeError" and (m := _SUSPENSION.search(text)):
        return ToolError(
            "limit",
            f"the script made more than {m.group(1)} host calls (externals and file or "
            f"environment operations; max_suspensions){src}. Read fewer files or call "
            "externals fewer times (e.g. read a file once and reuse it).",
            line,
            "suspensions",
        )
    if kind_name == "NotImplementedError" and "syntax parser does not yet support" in text:
        return ToolError(
            "check",
            f"{message}{src}: Monty cannot run this construct; rewrite it "
            "(see the .pym guide in README.md)",
            line,
        )
    if failures:
        last = failures[-1]
        same_type = kind_name in (last.type, "Exception")  # host-only exception classes arrive as Exception
        if same_type and _norm(message) == _norm(last.message):
            what = f"{last.type}: {last.message}" if last.message else last.type
            return ToolError(
                "external",
                f"external function {last.name!r} raised {what}{src}. The host function failed; check "
                "the arguments passed to it, or catch the error in the script.",
                line,
            )

    hint = ""
    if kind_name == "FileNotFoundError" and fs is not None:
        listing = fs.listing()
        hint = (
            ("\nAvailable files: " + ", ".join(listing))
            if listing
            else "\nNo files were provided to this run."
        )
    elif kind_name == "PermissionError" and "Read-only" in text and READ_ONLY_HINT not in text:
        hint = f"\n{READ_ONLY_HINT[0].upper()}{READ_ONLY_HINT[1:]}."
    elif kind_name == "NameError" and (m := re.search(r"name '(\w+)' is not defined", text)):
        hint = (
            f"\nIf {m.group(1)!r} should be an input, declare it: `{m.group(1)}: str = "
            f'Input("{m.group(1)}")`; if it is a host function, declare it with @external.'
        )
    elif kind_name in ("ModuleNotFoundError", "ImportError"):
        hint = f"\nModules available in the sandbox: {', '.join(sorted(MODULES))}."
    deliberate = src_line.startswith("raise ")  # the script's own raise: its message is the point
    trace_text = (
        f"\nTraceback (most recent call last), {file}:\n{trace}" if len(found) > 1 and not deliberate else ""
    )
    return ToolError("execution", f"{kind_name}: {message}{src}{trace_text}{hint}", line)
