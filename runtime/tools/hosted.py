"""`HostedPythonTool`: a Python function named in a bundle (`- python: package.module:function`), run by
workers the way a `.pym` is, with what a function outside the sandbox needs instead of `Limits`.

    tools:
      - python: shop_tools:lookup_order       # importable on the worker (or beside the bundle file)
        timeout: 5s                           # a call that takes longer is a `timeout` error value
        concurrency: 4                        # at most 4 calls at once per worker process
        retry: {attempts: 3, backoff: 200ms, exceptions: [ConnectionError, TimeoutError]}

The schema comes from the type hints and the docstring's `Args:`, exactly as for an in-process
`PythonTool` (which does the describing and the argument checks); a signature with no schema mapping is a
load error naming the parameter. An exception is an `execution` error value, never a crash: only the
exception types listed under `retry.exceptions` are retried (transient failures the function cannot tell from
the outside), each after `backoff` seconds doubled per try. A sync function runs in a thread; when it
overruns its timeout the call returns the error at once, but the thread cannot be killed and finishes
in the background: give blocking clients their own timeouts too.

It carries the same settings a `ScriptTool` does for its bundle (limits for the job message, output
model, approval, a content hash of its module's source), so the host and workers treat both alike.
"""

from __future__ import annotations

import hashlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anyio

from runtime.scripts import Limits
from runtime.tools.python import PythonTool
from runtime.tools.tool import Described, ToolContext
from runtime.types import ToolResult

__all__ = ["HostedPythonTool", "RetryPolicy"]


@dataclass(frozen=True)
class RetryPolicy:
    """How many times a call is tried, the first pause, and which exception type names are transient."""

    attempts: int = 1
    backoff_s: float = 0.1
    on: tuple[str, ...] = ()

    def retries(self, error_type: str | None) -> bool:
        return error_type is not None and error_type in self.on


class HostedPythonTool(Described):
    """A bundle's Python tool: `PythonTool` plus a timeout, a concurrency limit and a retry policy."""

    def __init__(self, func: Callable[..., Any], *, ref: str, description: str | None = None,
                 timeout_s: float | None = None, concurrency: int | None = None,
                 retry: RetryPolicy | None = None, limits: Limits | None = None, output_model: Any = None,
                 requires_approval: bool = False) -> None:
        self.ref = ref
        self.func = func
        self.inner = PythonTool(func, name=ref.rpartition(":")[2].rpartition(".")[2], description=description)
        self._schema = self.inner.schema
        self.timeout_s = timeout_s
        self.concurrency = concurrency
        self.retry = retry or RetryPolicy()
        self.limits = limits or Limits.default()
        self.output_model = output_model
        self.requires_approval = requires_approval
        self.description_source = "bundle" if description else "docstring"
        self._slots: anyio.Semaphore | None = None  # made on first use, inside the running event loop

    @property
    def path(self) -> str | None:
        """The file of the function's module (None for a builtin)."""
        try:
            return inspect.getsourcefile(self.func)
        except TypeError:
            return None

    @property
    def content_hash(self) -> str:
        """A hash of the module's source: hosts and workers compare it, as for a script."""
        module = inspect.getmodule(self.func)
        try:
            source = inspect.getsource(module) if module is not None else self.ref
        except (OSError, TypeError):
            source = self.ref
        return hashlib.sha256(f"{self.ref}\n{source}".encode()).hexdigest()[:16]

    def configured(self, **settings: Any) -> HostedPythonTool:
        """The same function under other settings (as `ScriptTool.configured`)."""
        base = {"ref": self.ref, "description": self.inner.schema.description
                if self.description_source == "bundle" else None, "timeout_s": self.timeout_s,
                "concurrency": self.concurrency, "retry": self.retry, "limits": self.limits,
                "output_model": self.output_model, "requires_approval": self.requires_approval}
        return HostedPythonTool(self.func, **{**base, **settings})

    async def execute(self, arguments: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        if self.concurrency is not None and self._slots is None:
            self._slots = anyio.Semaphore(self.concurrency)
        t0 = time.perf_counter()
        pause = self.retry.backoff_s
        result = ToolResult.failure("execution", "not run")
        for attempt in range(1, max(1, self.retry.attempts) + 1):
            result = await self._once(arguments, context)
            error = result.error
            if error is None or error.kind != "execution" or not self.retry.retries(error.detail):
                break
            if attempt < self.retry.attempts:
                await anyio.sleep(pause)
                pause *= 2
        took = round((time.perf_counter() - t0) * 1000, 3)
        return ToolResult(output=result.output, error=result.error, duration_ms=took)

    async def _once(self, arguments: dict[str, Any], context: ToolContext | None) -> ToolResult:
        if self._slots is not None:
            async with self._slots:
                return await self._timed(arguments, context)
        return await self._timed(arguments, context)

    async def _timed(self, arguments: dict[str, Any], context: ToolContext | None) -> ToolResult:
        if self.timeout_s is None:
            return await self.inner.execute(arguments, context)
        with anyio.move_on_after(self.timeout_s) as scope:
            return await self.inner.execute(arguments, context)
        assert scope.cancelled_caught
        return ToolResult.failure("timeout", f"{self.ref} took longer than its timeout of "
                                             f"{self.timeout_s:g} s (the bundle entry's `timeout:`)")

    def __repr__(self) -> str:
        return f"HostedPythonTool({self.name!r}, ref={self.ref!r})"
