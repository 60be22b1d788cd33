"""Tools: what a model can call. One protocol, two kinds, and discovery.

    tools, failures = discover_tools(["agents"], limits=Limits.strict())
    tool.schema                                   # ToolSchema(name, description, parameters: JSON Schema)
    await tool.execute({"expression": "1 + 2"}, ToolContext(call_id="r1/0.0"))   # -> ToolResult

- `ScriptTool` wraps a `.pym` script (runs in the Monty sandbox under its `Limits`).
- `PythonTool` wraps a sync or async Python callable (schema from its type hints and docstring).
- A tool's name matches `^[a-z0-9_-]{1,64}$` (a script's is its file stem) and its description is the first
  paragraph of its docstring, 1-200 characters: the model reads it to decide when to call the tool.
- Arguments are validated against the schema before anything runs (unknown argument, missing, wrong type
  -> an `input` error the model can act on). Failures are values (`ToolResult.error`), never exceptions.
- `discover_tools` returns every script that failed to load beside the tools: nothing is skipped silently.
"""

from __future__ import annotations

import asyncio
import functools
import glob
import inspect
import re
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec

from runtime.scripts import (
    Diagnostic,
    EventCallback,
    InputSpec,
    Limits,
    Script,
    ScriptEvent,
    check_arguments,
    first_paragraph,
    load,
    schema_from_type,
    to_plain,
)
from runtime.scripts.loader import docstring_params
from runtime.scripts.run import _to_sandbox
from runtime.scripts.schema import AnnotationError, is_optional
from runtime.scripts.specs import parameters_schema
from runtime.types import ToolError, ToolResult, ToolSchema

__all__ = [
    "TOOL_NAME",
    "LoadFailure",
    "PythonTool",
    "ScriptLoadError",
    "ScriptTool",
    "Tool",
    "ToolContext",
    "discover_tools",
    "schema_from_inputs",
    "script_tool_diagnostics",
    "tool_diagnostics",
]

TOOL_NAME = re.compile(r"^[a-z0-9_-]{1,64}$")
MAX_DESCRIPTION = 200


@dataclass
class ToolContext:
    """What the caller knows about one call: who asks, the data the tool may read, and overrides.

    `files` (virtual path -> str | bytes) and `environ` are what a script sees as its read-only filesystem
    and `os.environ`; `limits` is merged over the tool's own; `externals` adds host functions for scripts
    that declare them; `on_event` receives `ScriptEvent`s (tagged with `call_id`).
    """

    run_id: str = ""
    agent: str = ""
    call_id: str = ""
    files: dict[str, str | bytes] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    limits: Limits | None = None
    externals: dict[str, Callable[..., Any]] | None = None
    on_event: EventCallback | None = None
    metadata: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    """Anything the kernel can call: a schema for the model and an async `execute` that returns a value."""

    @property
    def schema(self) -> ToolSchema: ...

    async def execute(self, arguments: dict[str, Any], context: ToolContext) -> ToolResult: ...


class LoadFailure(msgspec.Struct, frozen=True, omit_defaults=True):
    """A script that could not become a tool, with the first error and every diagnostic."""

    path: str
    error: ToolError
    diagnostics: tuple[Diagnostic, ...] = ()

    def __str__(self) -> str:
        if self.diagnostics:
            return "\n".join(str(d) for d in self.diagnostics)
        line = f":{self.error.line}" if self.error.line else ""
        return f"{self.path}{line}: {self.error.kind} error: {self.error.message}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            **self.error.to_dict(),
            "diagnostics": [d.to_dict() for d in self.diagnostics],
        }


class ScriptLoadError(Exception):
    """Raised by `ScriptTool(...)` for a script that cannot be a tool; carries the `LoadFailure`."""

    def __init__(self, failure: LoadFailure) -> None:
        super().__init__(str(failure))
        self.failure = failure

    @property
    def error(self) -> ToolError:
        return self.failure.error


def tool_diagnostics(
    name: str, description: str, *, file: str | None = None, docstring_line: int | None = 1
) -> list[Diagnostic]:
    """The tool rules (seed 002): name `^[a-z0-9_-]{1,64}$`, description 1-200 characters."""
    found: list[Diagnostic] = []
    if not TOOL_NAME.match(name):
        suggestion = re.sub(r"[^a-z0-9_-]+", "_", name.lower()).strip("_")[:64] or "my_tool"
        found.append(
            Diagnostic(
                "check",
                f"tool name {name!r} is invalid: names must match ^[a-z0-9_-]{{1,64}}$ "
                f"(lowercase letters, digits, _ and -); rename the file, e.g. to "
                f"{suggestion}.pym",
                None,
                file,
            )
        )
    if not description:
        found.append(
            Diagnostic(
                "check",
                "the script has no docstring: start it with a docstring whose first "
                "paragraph says what the tool does (1-200 characters); the model reads "
                "it to decide when to call the tool",
                docstring_line,
                file,
            )
        )
    elif len(description) > MAX_DESCRIPTION:
        found.append(
            Diagnostic(
                "check",
                f"the description (the docstring's first paragraph) is {len(description)} "
                f"characters; shorten it to at most {MAX_DESCRIPTION} and move details "
                "to a later paragraph",
                docstring_line,
                file,
            )
        )
    return found


def script_tool_diagnostics(script: Script) -> list[Diagnostic]:
    """Everything that keeps `script` from being a tool: its load diagnostics, then the tool rules (the
    description rule only when the script parsed, since an unparsed script's docstring is unknown)."""
    rules = tool_diagnostics(script.name, script.description, file=script.filename)
    if not script.parsed:
        rules = [d for d in rules if d.line is None]
    return list(script.diagnostics) + rules


def schema_from_inputs(inputs: Mapping[str, InputSpec] | Iterable[InputSpec]) -> dict[str, Any]:
    """The JSON Schema `parameters` object for a script's `Input()` declarations."""
    return parameters_schema(inputs.values() if isinstance(inputs, Mapping) else inputs)


def _tagged(on_event: EventCallback | None, call_id: str) -> EventCallback | None:
    if on_event is None or not call_id:
        return on_event

    def tag(event: ScriptEvent) -> Any:
        return on_event(msgspec.structs.replace(event, call_id=call_id))

    return tag


class _Described:
    """What both tool kinds share: the schema the model is shown, built once, and the name it calls."""

    _schema: ToolSchema

    @property
    def schema(self) -> ToolSchema:
        return self._schema

    @property
    def name(self) -> str:
        return self._schema.name


class ScriptTool(_Described):
    """A `.pym` script as a tool. Raises `ScriptLoadError` if the script has diagnostics or breaks the
    tool rules; use `discover_tools` to collect such failures instead."""

    def __init__(
        self,
        script: Script,
        *,
        limits: Limits | str | dict[str, Any] | None = None,
        output_model: Any = None,
        externals: dict[str, Callable[..., Any]] | None = None,
    ) -> None:
        problems = script_tool_diagnostics(script)
        if problems:
            raise ScriptLoadError(LoadFailure(script.filename, problems[0].to_error(), tuple(problems)))
        self.script = script
        self.limits = Limits.resolve(limits)
        self.output_model = output_model
        self.externals = dict(externals or {})
        self._schema = ToolSchema(script.name, script.description, script.parameters)

    @classmethod
    def from_path(cls, path: str | Path, **kwargs: Any) -> ScriptTool:
        return cls(load(path), **kwargs)

    @property
    def path(self) -> str | None:
        return self.script.path

    @property
    def content_hash(self) -> str:
        return self.script.content_hash

    async def execute(self, arguments: dict[str, Any], context: ToolContext | None = None) -> ToolResult:
        ctx = context or ToolContext()
        externals = {**self.externals, **(ctx.externals or {})}
        return await self.script.run(
            arguments,
            externals=externals or None,
            files=ctx.files,
            environ=ctx.environ,
            limits=self.limits.merge(ctx.limits),
            output_model=self.output_model,
            on_event=_tagged(ctx.on_event, ctx.call_id),
        )

    def __repr__(self) -> str:
        return f"ScriptTool({self.name!r}, path={self.path!r}, limits={self.limits.describe()!r})"


class PythonTool(_Described):
    """A sync or async Python callable as a tool.

    Parameters become the schema (type hints -> JSON Schema by the same table as `.pym` inputs; a
    parameter with a default or an Optional type is not required); the docstring's first paragraph is
    the description and its `Args:` section the parameter descriptions. A parameter annotated
    `ToolContext` receives the call's context and is not shown to the model. Sync callables run in a
    worker thread. Raises `TypeError`/`ValueError` at construction for a signature that cannot be described.
    """

    def __init__(
        self, func: Callable[..., Any], *, name: str | None = None, description: str | None = None
    ) -> None:
        self.func = func
        self.is_async = inspect.iscoroutinefunction(func)
        tool_name = name or getattr(func, "__name__", "tool")
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
        for pname, param in inspect.signature(func).parameters.items():
            hint = hints.get(pname, inspect.Parameter.empty)
            if hint is ToolContext or ToolContext in typing.get_args(hint):
                self._context_param = pname
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
        import time

        t0 = time.perf_counter()
        error = check_arguments(self.name, self._schema.parameters, arguments)
        if error is not None:
            return ToolResult(error=error)
        from runtime.scripts.run import _coerce

        props = self._schema.parameters["properties"]
        kwargs = {k: _coerce(v, props[k]) for k, v in arguments.items()}
        for pname in self._optional_none:
            kwargs.setdefault(pname, None)
        if self._context_param:
            kwargs[self._context_param] = context or ToolContext()
        try:
            if self.is_async:
                value = await self.func(**kwargs)
            else:
                value = await asyncio.to_thread(functools.partial(self.func, **kwargs))
            output = to_plain(_to_sandbox(value))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            return ToolResult(
                error=ToolError("execution", f"{type(e).__name__}: {e}"),
                duration_ms=round((time.perf_counter() - t0) * 1000, 3),
            )
        return ToolResult(output=output, duration_ms=round((time.perf_counter() - t0) * 1000, 3))

    def __repr__(self) -> str:
        return f"PythonTool({self.name!r})"


def expand_paths(paths: Iterable[str | Path] | str | Path) -> tuple[list[Path], list[LoadFailure]]:
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    failures: list[LoadFailure] = []
    for item in paths:
        text = str(item)
        if any(ch in text for ch in "*?["):
            matches = sorted(Path(p) for p in glob.glob(text, recursive=True) if p.endswith(".pym"))
            if not matches:
                failures.append(LoadFailure(text, ToolError("check", f"no .pym files match {text!r}")))
            files += matches
            continue
        p = Path(text)
        if p.is_dir():
            found = sorted(p.rglob("*.pym"))
            if not found:
                failures.append(LoadFailure(text, ToolError("check", f"no .pym files in directory {text!r}")))
            files += found
        elif p.is_file():
            files.append(p)
        else:
            failures.append(LoadFailure(text, ToolError("check", f"no such file or directory: {text!r}")))
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, failures


def discover_tools(
    paths: Iterable[str | Path] | str | Path,
    limits: Limits | str | dict[str, Any] | None = None,
    *,
    output_models: Mapping[str, Any] | None = None,
    externals: Mapping[str, Callable[..., Any]] | None = None,
) -> tuple[list[ScriptTool], list[LoadFailure]]:
    """Load every `.pym` under `paths` (files, directories searched recursively, or globs).

    Returns the tools (sorted by path) and, separately, a `LoadFailure` for every script that could not
    become a tool (parse/check errors, tool-rule violations, duplicate names, unreadable files, paths that
    match nothing). `output_models` maps tool names to output models; `externals` offers host functions
    by name (each tool receives the ones it declares).
    """
    files, failures = expand_paths(paths)
    resolved = Limits.resolve(limits)
    tools: list[ScriptTool] = []
    by_name: dict[str, str] = {}
    for f in files:
        try:
            script = load(f)
        except (OSError, UnicodeDecodeError) as e:
            failures.append(LoadFailure(str(f), ToolError("check", f"cannot read the script: {e}")))
            continue
        declared = {n: externals[n] for n in script.externals if externals and n in externals}
        try:
            tool = ScriptTool(
                script,
                limits=resolved,
                output_model=(output_models or {}).get(script.name),
                externals=declared,
            )
        except ScriptLoadError as e:
            failures.append(e.failure)
            continue
        if tool.name in by_name:
            failures.append(
                LoadFailure(
                    str(f),
                    ToolError(
                        "check",
                        f"tool name {tool.name!r} is already used by "
                        f"{by_name[tool.name]}; tool names must be unique",
                    ),
                )
            )
            continue
        by_name[tool.name] = str(f)
        tools.append(tool)
    return tools, failures
