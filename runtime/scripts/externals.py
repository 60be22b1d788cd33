"""Host functions a script calls (`@external`): checked against the declarations, wrapped for Monty.

The host must supply exactly the externals a script declares: a missing or an extra one is an `external`
error before the run starts, never a `NameError` halfway through it.

Each implementation is wrapped to match its declaration's form, because Monty is strict about it: awaiting
a sync host function raises `TypeError` in the sandbox, and calling an async one without `await` yields a
coroutine's repr instead of a value. So an `async def` declaration may be implemented by a sync or an async
host function, and so may a plain `def`.

A plain `def` declaration is answered on the caller's event loop (`AnsweredOnLoop`, by the run's driver in
`runtime.scripts.run`), never on Monty's own thread, where Monty would call it: an implementation that
waited there for the loop (an async one, or the runtime's recording of a call) or for the network held
that thread, and Monty's synchronous pool, which the worker's loop uses for inline runs
(`runtime.scripts.inline`), waits for the same threads. Measured on pydantic-monty 1.4: a session given
back on the loop while an external waited for the loop on Monty's thread never returned, and the worker
stopped. A sync implementation runs in a thread of the loop's executor (it may block); an async one, or
what a sync one returns that is awaitable, is awaited on the loop.

Values returned to the sandbox must be plain data: Monty cannot convert a pydantic model, a dataclass or a
msgspec Struct, so `to_sandbox` dumps them first. Every exception an external raises is recorded
(`ExternalFailure`) before it reaches the script, so that if the script does not catch it, the run's error
says which host function failed (kind `external`) instead of blaming the script.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from runtime.types import ToolError

if TYPE_CHECKING:
    from runtime.scripts.loaded import LoadedScript

__all__ = ["AnsweredOnLoop", "ExternalFailure", "prepare_externals", "to_sandbox"]


def to_sandbox(value: Any) -> Any:
    """Host values Monty cannot convert (pydantic models, dataclasses, msgspec Structs) as plain data."""
    if isinstance(value, (str, int, float, bool, type(None), bytes)):
        return value
    if hasattr(value, "model_dump") and callable(value.model_dump):
        return value.model_dump(mode="python")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, msgspec.Struct):
        return msgspec.to_builtins(value)
    if isinstance(value, dict):
        return {k: to_sandbox(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_sandbox(v) for v in value)
    return value


class ExternalFailure(msgspec.Struct):
    """An exception a host external raised during a run: which external, the exception's type and text."""

    name: str
    type: str
    message: str


def prepare_externals(
    script: LoadedScript,
    externals: dict[str, Callable[..., Any]] | None,
    failures: list[ExternalFailure],
) -> dict[str, Callable[..., Any] | AnsweredOnLoop] | ToolError:
    """Host implementations wrapped to match each declaration's sync/async form, or an `external` error."""
    given = dict(externals or {})
    declared = script.externals
    missing = [n for n in declared if n not in given]
    extra = [n for n in given if n not in declared]
    if missing or extra:
        parts = []
        if missing:
            parts.append(
                "no implementation was provided for "
                + ", ".join(f"@external {declared[n].name!r} (line {declared[n].line})" for n in missing)
            )
        if extra:
            parts.append(
                "implementations were given for undeclared externals "
                + ", ".join(map(repr, extra))
                + (f" (declared: {', '.join(declared)})" if declared else " (the script declares none)")
            )
        return ToolError(
            "external",
            "; ".join(parts) + ". The host must supply exactly the declared externals.",
            line=declared[missing[0]].line if missing else None,
        )
    wrapped: dict[str, Callable[..., Any] | AnsweredOnLoop] = {}
    for name, spec in declared.items():
        impl = given[name]
        if not callable(impl):
            return ToolError(
                "external", f"the implementation of external {name!r} is not callable", spec.line
            )
        wrapped[name] = _wrap(name, impl, spec.is_async, failures)
    return wrapped


def _wrap(name: str, impl: Callable[..., Any], declared_async: bool,
          failures: list[ExternalFailure]) -> Callable[..., Any] | AnsweredOnLoop:
    def record(e: BaseException) -> None:
        failures.append(ExternalFailure(name, type(e).__name__, str(e)))

    answered = AnsweredOnLoop(name, impl, record)
    if not declared_async:
        return answered

    async def async_external(*args: Any, **kwargs: Any) -> Any:  # Monty awaits it on the loop
        return await answered.answer(*args, **kwargs)

    async_external.__name__ = name
    return async_external


class AnsweredOnLoop:
    """A plain `def` external, answered on the event loop when the sandbox calls it (see the module
    docstring): Monty is given `placeholder` under its name, and the driver, seeing a call of it,
    awaits `answer` and resumes the sandbox with the value or the exception."""

    def __init__(self, name: str, impl: Callable[..., Any], record: Callable[[BaseException], None]) -> None:
        self.name, self.impl, self.record = name, impl, record
        self.is_coro = inspect.iscoroutinefunction(impl)

    async def answer(self, *args: Any, **kwargs: Any) -> Any:
        try:
            if self.is_coro:
                value = await self.impl(*args, **kwargs)
            else:
                value = await asyncio.to_thread(self.impl, *args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
            return to_sandbox(value)
        except Exception as e:
            self.record(e)
            raise

    def placeholder(self, *args: Any, **kwargs: Any) -> Any:
        """What Monty holds under the name (so `f = name` finds it); never called: the driver answers."""
        raise RuntimeError(f"external {self.name!r} was called on Monty's thread; it is answered on the loop")
