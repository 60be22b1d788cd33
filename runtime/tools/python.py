"""`PythonTool`: a sync or async Python callable as a tool, described from its signature and docstring.

For tools that need the host (a database client, an HTTP session) rather than the sandbox. The schema comes
from the type hints by the same table as a `.pym`'s inputs, so both kinds of tool look alike to a model,
and arguments are checked by the same code (`runtime.scripts.check_arguments`) before the function runs.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from runtime.externals.context import ExecutionContext
from runtime.scripts import (
    AnnotationError,
    check_arguments,
    coerce,
    docstring_params,
    first_paragraph,
    is_optional,
    schema_from_type,
    to_plain,
    to_sandbox,
)
from runtime.tools.schemas import tool_diagnostics
from runtime.tools.tool import Described, ToolContext
from runtime.types import ToolError, ToolResult, ToolSchema

__all__ = ["PythonTool"]


class PythonTool(Described):
    """A sync or async Python callable as a tool.

    Parameters become the schema (type hints -> JSON Schema by the same table as `.pym` inputs; a
    parameter with a default or an Optional type is not required); the docstring's first paragraph is
    the description and its `Args:` section the parameter descriptions. A parameter annotated
    `ToolContext` receives the call's context, one annotated `ExecutionContext` the call as externals see
    it (run, call, attempt, deadline, idempotency keys); neither is shown to the model. Sync callables
    run in a worker thread. Raises `TypeError`/`ValueError` at construction for a signature that cannot
    be described.
    """

    def __init__(
        self, func: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> None:
        self.func = func
        self.is_async = inspect.iscoroutinefunction(func)
        tool_name = name or str(getattr(func, "__name__", "tool"))
        doc = inspect.getdoc(func)
        text = description if description is not None else first_paragraph(doc)
        problems = tool_diagnostics(tool_name, text, file=getattr(func, "__qualname__", tool_name))
        if problems:
            raise ValueError("; ".join(d.message for d in problems))
        try:
            hints = typing.get_type_hints(func, include_extras=True)
        except Exception as e:
            raise TypeError(f"tool {tool_name!r}: cannot read type hints: {e}") from None
        arg_docs = docstring_params(doc)
        properties: dict[str, Any] = {}
        required: list[str] = []
        self._context_param: str | None = None
        self._execution_param: str | None = None
        for pname, param in inspect.signature(func).parameters.items():
            hint = hints.get(pname, inspect.Parameter.empty)
            if hint is ToolContext or ToolContext in typing.get_args(hint):
                self._context_param = pname
                continue
            if hint is ExecutionContext or ExecutionContext in typing.get_args(hint):
                self._execution_param = pname
                continue
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise TypeError(
                    f"tool {tool_name!r}: *{pname} cannot be described to a model; use named parameters"
                )
            if param.kind is param.POSITIONAL_ONLY:
                raise TypeError(
                    f"tool {tool_name!r}: positional-only parameter {pname!r} cannot be passed by name"
                )
            if hint is inspect.Parameter.empty:
                raise TypeError(f"tool {tool_name!r}: parameter {pname!r} has no type annotation")
            try:
                prop = schema_from_type(hint)
            except AnnotationError as e:
                raise TypeError(f"tool {tool_name!r}: parameter {pname!r}: {e}") from None
            if arg_docs.get(pname):
                prop["description"] = arg_docs[pname]
            if param.default is not inspect.Parameter.empty:
                try:
                    msgspec.json.encode(param.default)
                    prop["default"] = param.default
                except (TypeError, msgspec.EncodeError):
                    pass
            elif not is_optional(prop):
                required.append(pname)
            properties[pname] = prop
        self._optional_none = {
            p
            for p in properties
            if p not in required and inspect.signature(func).parameters[p].default is inspect.Parameter.empty
        }
        parameters = {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
        self._schema = ToolSchema(tool_name, text, parameters)

    async def execute(self, arguments: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        t0 = time.perf_counter()
        error = check_arguments(self.name, self._schema.parameters, arguments)
        if error is not None:
            return ToolResult(error=error)
        props = self._schema.parameters["properties"]
        kwargs = {k: coerce(v, props[k]) for k, v in arguments.items()}
        for pname in self._optional_none:
            kwargs.setdefault(pname, None)
        if self._context_param:
            kwargs[self._context_param] = context or ToolContext()
        if self._execution_param:
            ctx = context or ToolContext()
            kwargs[self._execution_param] = ctx.execution or ExecutionContext.of(
                agent=ctx.agent, run_id=ctx.run_id, call_id=ctx.call_id, tool=self.name,
                metadata=ctx.metadata, environ=ctx.environ)
        try:
            if self.is_async:
                value = await self.func(**kwargs)
            else:
                value = await asyncio.to_thread(functools.partial(self.func, **kwargs))
            output = to_plain(to_sandbox(value))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return ToolResult(
                error=ToolError("execution", f"{type(e).__name__}: {e}", detail=type(e).__name__),
                duration_ms=round((time.perf_counter() - t0) * 1000, 3),
            )
        return ToolResult(output=output, duration_ms=round((time.perf_counter() - t0) * 1000, 3))

    def __repr__(self) -> str:
        return f"PythonTool({self.name!r})"
