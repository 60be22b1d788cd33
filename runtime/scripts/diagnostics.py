"""What is wrong with a script before it runs, asked of Monty itself: `probe`, `typecheck`, `diagnose`.

The loader's static check (`runtime.scripts.check`) knows the Python subset Monty runs, but Monty's own
parser is the final word, and Monty ships a type checker (ty). Both need a sandbox session, so these are
async and cost a checkout each; `sa tools check` and bundle validation use them, a run never does.

Monty has no check-only mode. `probe` therefore feeds the code nested under `if False:` (parsed, never
executed: a probe has no side effects and cannot loop), and `typecheck` feeds it with type checking on
and no inputs, so a clean check stops at the first unbound input, which is expected and ignored.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic_monty import MontyError, MontyRuntimeError, MontySyntaxError, MontyTypingError

from runtime.scripts.errors import frames
from runtime.scripts.limits import Limits
from runtime.scripts.pool import get_pool
from runtime.scripts.specs import Diagnostic

if TYPE_CHECKING:
    from runtime.scripts.loaded import LoadedScript

__all__ = ["diagnose", "probe", "typecheck"]


async def diagnose(script: LoadedScript, *, use_monty: bool = True, types: bool = False) -> list[Diagnostic]:
    """All diagnostics for `script`: the static check's, plus (with `use_monty`) anything Monty's own
    parser rejects (`probe`), plus (with `types`) Monty's type check against the declarations' stubs."""
    found = list(script.diagnostics)
    if use_monty and script.ok:
        found += await probe(script)
    if types and not found:
        found += await typecheck(script)
    return found


async def probe(script: LoadedScript) -> list[Diagnostic]:
    """Feed the code to Monty's parser without running it (inside `if False:`): Diagnostics for anything
    Monty's parser rejects that the static check did not already report."""
    if not script.ok or not script.code.strip():
        return []
    body = "".join(" " + line if line.strip() else line for line in script.code.splitlines(keepends=True))
    code = "if False:\n" + body + ("\n" if not body.endswith("\n") else "") + " pass\n"
    limits = Limits.strict().to_monty()
    try:
        async with get_pool().session(script_name="probe.py", limits=limits) as s:
            await s.feed_run(code, print_callback=lambda _s, _t: None)
    except (MontySyntaxError, MontyRuntimeError) as e:
        found = frames(e)
        line = found[-1].line - 1 if found and found[-1].line > 1 else None
        text = str(e)
        if isinstance(e, MontySyntaxError):
            return [Diagnostic("parse", f"Monty cannot parse this: {text}", line, script.filename)]
        if "syntax parser does not yet support" in text:
            return [
                Diagnostic(
                    "check", f"{e.display('msg')}: Monty cannot run this construct", line, script.filename
                )
            ]
    except MontyError:
        return []
    return []


# Names Monty's bundled checker (ty) does not know although the sandbox has them.
_TYPECHECK_PRELUDE = (
    'from typing import Any\ndef open(file: str, mode: str = "r", encoding: str | None = None) -> Any: ...\n'
)
_TYPED = re.compile(r"^(?P<file>[^:\n]+):(?P<line>\d+):(?P<col>\d+): (?P<msg>.+)$", re.MULTILINE)
_typecheck_cache: dict[str, list[Diagnostic]] = {}


async def typecheck(script: LoadedScript) -> list[Diagnostic]:
    """Monty's own type check (ty) against stubs generated from the declarations; cached per content hash.

    The code is fed with type checking on, no inputs, no externals and no files under strict limits.
    Costs ~25-60 ms per new script version.
    """
    if not script.ok:
        return []
    cached = _typecheck_cache.get(script.content_hash)
    if cached is not None:
        return list(cached)
    found: list[Diagnostic] = []
    name = script.filename.rsplit("/", 1)[-1]
    try:
        async with get_pool().session(
            script_name=name,
            limits=Limits.strict().to_monty(),
            type_check=True,
            type_check_stubs=_TYPECHECK_PRELUDE + script.stubs(),
            type_check_format="concise",
        ) as s:
            await s.feed_run(script.code, print_callback=lambda _s, _t: None)
    except MontyTypingError as e:
        for m in _TYPED.finditer(e.display()):
            found.append(
                Diagnostic(
                    "check",
                    f"type check: {m.group('msg')}",
                    int(m.group("line")),
                    script.filename,
                    int(m.group("col")),
                )
            )
        if not found:
            found.append(
                Diagnostic("check", f"type check failed: {e.display().strip()}", None, script.filename)
            )
    except MontyError:
        pass  # the check passed; the run then stopped (unbound inputs): expected
    _typecheck_cache[script.content_hash] = found
    return list(found)
