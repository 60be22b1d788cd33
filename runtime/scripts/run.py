"""Running a loaded script in the sandbox: inputs in, plain data out, every failure a `ToolError` value.

    result = await script.run({"path": "a.txt"}, files={"/a.txt": "..."}, limits="strict")
    result.output            # plain JSON-able data, or
    result.error             # ToolError(kind, message, line, detail)

The order: load diagnostics -> inputs (missing, extra, wrong type: `inputs`) -> externals (missing, extra:
`externals`) -> one fresh session of the process pool under the run's `Limits` (fed from this thread for a
script without externals, `inline`) -> Monty (its exceptions classified by `errors`) -> the result converted
to plain data, `max_output`, `output_model` (`output`). Observers get the run's `ScriptNote`s in order
(`notes`). Nothing here raises for a script problem: a run that fails anywhere returns a result whose error
says what went wrong, where (the `.pym` line), and how to fix it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
from pydantic_monty import AsyncFunctionSnapshot, AsyncMontySession, MontyComplete, MontyError

from runtime.scripts.errors import classify, lost_worker
from runtime.scripts.externals import AnsweredOnLoop, ExternalFailure, prepare_externals
from runtime.scripts.files import make_fs
from runtime.scripts.inputs import prepare_inputs
from runtime.scripts.limits import Limits
from runtime.scripts.notes import NoteCallback, NoteEmitter
from runtime.scripts.output import finish
from runtime.scripts.pool import get_pool
from runtime.types import ToolError, ToolResult

if TYPE_CHECKING:
    from runtime.scripts.loaded import LoadedScript

__all__ = ["run_script"]

log = logging.getLogger(__name__)


async def run_script(
    script: LoadedScript,
    inputs: dict[str, Any] | None = None,
    *,
    externals: dict[str, Callable[..., Any]] | None = None,
    files: dict[str, str | bytes] | None = None,
    environ: dict[str, str] | None = None,
    limits: Limits | str | dict[str, Any] | None = None,
    output_model: Any = None,
    on_event: NoteCallback | None = None,
) -> ToolResult:
    """Run `script` once in a fresh sandbox session. Never raises for script problems.

    `limits` is resolved with `Limits.resolve` (None -> default) and completed from the default preset;
    an invalid limits spec is a host bug and raises `LimitsError`. `on_event` receives the run's
    `ScriptNote`s: `started`, any `printed`, then `completed` or `failed`.
    """
    t0 = time.perf_counter()
    effective = Limits.resolve(limits).effective()
    notes = NoteEmitter(on_event, script.name, t0, inputs=len(inputs or {}), externals=len(externals or {}))
    try:
        result = await _run(script, inputs, externals, files, environ, effective, output_model, notes)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a bug on the host side: still a value, never an exception into the caller
        log.exception("script runner failed on %s", script.filename)
        result = ToolResult(error=ToolError("crashed", f"the script runner failed: {type(e).__name__}: {e}"))
    duration = round((time.perf_counter() - t0) * 1000, 3)
    result = ToolResult(output=result.output, error=result.error, duration_ms=duration)
    notes.start()  # a run that failed before reaching the sandbox still reports its start
    await notes.flush()
    if result.error is not None:
        notes.emit("failed", error=result.error)
    else:
        notes.emit("completed", output_bytes=len(msgspec.json.encode(result.output)))
    await notes.flush()
    return result


async def _run(
    script: LoadedScript,
    inputs: dict[str, Any] | None,
    externals: dict[str, Callable[..., Any]] | None,
    files: dict[str, str | bytes] | None,
    environ: dict[str, str] | None,
    limits: Limits,
    output_model: Any,
    notes: NoteEmitter,
) -> ToolResult:
    failure = script.error()
    if failure is not None:
        return failure
    prepared = prepare_inputs(script, inputs)
    if isinstance(prepared, ToolError):
        return ToolResult(error=prepared)
    failures: list[ExternalFailure] = []
    lookup = prepare_externals(script, externals, failures)
    if isinstance(lookup, ToolError):
        return ToolResult(error=lookup)
    try:
        fs = make_fs(files, environ)
    except ValueError as e:
        return ToolResult(error=ToolError("input", f"the virtual files are invalid: {e}"))

    pool, name = get_pool(), script.filename.rsplit("/", 1)[-1]
    key = f"{name}:{script.content_hash}"
    try:
        ran = None
        if pool.inline.eligible(key, bool(lookup)):
            ran = pool.inline.attempt(key, script_name=name, limits=limits.to_monty(), code=script.code,
                                      inputs=prepared, os_handler=fs)
        if ran is not None:  # fed from this thread, within a slice (`runtime.scripts.inline`)
            notes.start(ran.began, worker_pid=ran.pid)
            for stream, text in ran.printed:
                notes.print_callback(stream, text)
            if ran.error is not None:
                raise ran.error
            output = ran.output
        else:
            async with pool.session(script_name=name, limits=limits.to_monty()) as s:
                notes.start(worker_pid=s.worker_pid)
                output = await _feed(s, script.code, prepared, lookup, notes.print_callback, fs)
    except MontyError as e:
        return ToolResult(error=classify(e, script, limits, failures, fs))
    except RuntimeError as e:
        lost = lost_worker(script, e)
        if lost is None:
            raise
        return ToolResult(error=lost)
    return finish(output, limits, output_model)


async def _feed(session: AsyncMontySession, code: str, inputs: dict[str, Any], lookup: dict[str, Any],
                print_callback: Callable[[Any, str], None], fs: Any) -> Any:
    """Run `code` in `session` to its end. A script whose plain `def` externals must be answered on this
    loop (`AnsweredOnLoop`, see `runtime.scripts.externals`) is driven call by call: Monty stops at each
    call of one, the answer is awaited here, and the sandbox resumes with it (or with its exception, which
    the sandbox may catch); everything else Monty answers itself, as `feed_run` does."""
    on_loop = {n: f for n, f in lookup.items() if isinstance(f, AnsweredOnLoop)}
    if not on_loop:
        return await session.feed_run(code, inputs=inputs, external_lookup=lookup,
                                      print_callback=print_callback, os=fs)
    given = {n: f.placeholder if isinstance(f, AnsweredOnLoop) else f for n, f in lookup.items()}
    snap: Any = await session.feed_start(code, inputs=inputs, external_lookup=given,
                                         print_callback=print_callback, os=fs)
    while not isinstance(snap, MontyComplete):
        called = (on_loop.get(snap.function_name) if isinstance(snap, AsyncFunctionSnapshot)
                  and not snap.is_os_function and snap.object_id is None else None)
        if called is None:
            snap = await snap.resume_auto()
            continue
        try:
            value = await called.answer(*snap.args, **snap.kwargs)
        except Exception as e:
            snap = await snap.resume({"exception": e})
        else:
            snap = await snap.resume({"return_value": value})
    return snap.output
