"""Running a loaded script in the sandbox: inputs in, plain data out, every failure a `ToolError` value.

    result = await script.run({"path": "a.txt"}, files={"/a.txt": "..."}, limits="strict")
    result.output            # plain JSON-able data, or
    result.error             # ToolError(kind, message, line, detail)

The order: load diagnostics -> inputs (missing, extra, wrong type) -> externals (missing, extra) ->
one fresh checkout of the process pool under the run's `Limits` -> Monty -> result converted to plain data
-> `max_output` -> `output_model`. Kinds: parse, check, input, external, execution, limit (`detail`:
memory | duration | recursion | suspensions | output), output, crashed. Messages are written for the
model that reads them: what went wrong, where (the `.pym` line), and how to fix it.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime
import decimal
import inspect
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from functools import lru_cache
from pathlib import PurePath
from typing import Any, Literal

import msgspec
from pydantic_monty import (
    MontyClassProxy,
    MontyClassTypeProxy,
    MontyConversionError,
    MontyCrashedError,
    MontyError,
    MontyRuntimeError,
    MontyStdTypeProxy,
    MontySyntaxError,
    MontyTypingError,
)

from runtime.scripts.files import READ_ONLY_HINT, ReadOnlyFS, make_fs
from runtime.scripts.limits import Limits, _human_duration, _human_size
from runtime.scripts.loader import Script
from runtime.scripts.pool import get_pool
from runtime.scripts.specs import Diagnostic
from runtime.scripts.validate import describe_value, unsupported_keywords, validate
from runtime.types import ToolError, ToolResult

__all__ = ["EventCallback", "ScriptEvent", "probe", "run_script", "to_plain", "typecheck"]

log = logging.getLogger(__name__)

_MAX_PRINT_BYTES = 1 << 20  # print output forwarded as events per run; the rest is counted, not sent
_INT64 = (-(1 << 63), (1 << 64) - 1)


class ScriptEvent(msgspec.Struct, frozen=True, omit_defaults=True):
    """What happens during a run, for observers: start, print, complete, error.

    `duration_ms` is the time since the run began. `print` events carry `stream` and `text`; `complete`
    carries `output_bytes`; `error` carries the `ToolError`.
    """

    kind: Literal["start", "print", "complete", "error"]
    script: str
    duration_ms: float = 0.0
    at: float = 0.0  # wall-clock time (time.time())
    stream: str | None = None
    text: str | None = None
    error: ToolError | None = None
    output_bytes: int | None = None
    worker_pid: int | None = None
    inputs: int | None = None
    externals: int | None = None
    call_id: str | None = None


EventCallback = Callable[[ScriptEvent], Any]


class _Emitter:
    """Delivers events on the event loop, in order; tolerates callbacks that fail or are coroutines."""

    def __init__(self, on_event: EventCallback | None, script: str, t0: float, **start: Any) -> None:
        self.on_event = on_event
        self.start_fields = start
        self.started = False
        self.script = script
        self.t0 = t0
        self.loop = asyncio.get_running_loop()
        self.loop_thread = threading.get_ident()
        self.pending: set[asyncio.Task[Any]] = set()
        self.printed = 0

    def ms(self) -> float:
        return round((time.perf_counter() - self.t0) * 1000, 3)

    def emit(self, kind: str, **fields: Any) -> None:
        if self.on_event is None:
            return
        event = ScriptEvent(kind, self.script, self.ms(), time.time(), **fields)  # type: ignore[arg-type]
        if threading.get_ident() == self.loop_thread:
            self._deliver(event)
        else:  # Monty calls print callbacks from its own thread: marshal to the loop
            self.loop.call_soon_threadsafe(self._deliver, event)

    def start(self, **fields: Any) -> None:
        if not self.started:
            self.started = True
            self.emit("start", **self.start_fields, **fields)

    def _deliver(self, event: ScriptEvent) -> None:
        try:
            result = self.on_event(event)  # type: ignore[misc]
            if inspect.isawaitable(result):
                task = asyncio.ensure_future(result)
                self.pending.add(task)
                task.add_done_callback(self.pending.discard)
        except Exception:
            log.exception("on_event callback failed for %s event of %s", event.kind, self.script)

    def print_callback(self, stream: str, text: str) -> None:
        if self.on_event is None:
            return
        self.printed += len(text)
        if self.printed <= _MAX_PRINT_BYTES:
            self.emit("print", stream=stream, text=text)
        elif self.printed - len(text) <= _MAX_PRINT_BYTES:
            self.emit("print", stream="stderr", text="\n[further print output dropped: over 1 MB]\n")

    async def flush(self) -> None:
        await asyncio.sleep(0)  # let call_soon_threadsafe'd prints run before complete/error
        if self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=True)


# ---- inputs ----------------------------------------------------------------------------------------


def _did_you_mean(name: str, options: list[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, options, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


_NO_COERCE = (int, str, bool, type(None))


def _coerce(value: Any, schema: dict[str, Any]) -> Any:
    """After validation: integral floats given for integers become ints (JSON `5.0` for `int`)."""
    kind = schema.get("type")
    kinds = kind if isinstance(kind, list) else [kind]
    if isinstance(value, float) and "integer" in kinds and "number" not in kinds and value.is_integer():
        return int(value)
    if isinstance(value, list):
        if isinstance(schema.get("items"), dict):
            if all(type(v) in _NO_COERCE for v in value):  # nothing to change (the common case)
                return value
            return [_coerce(v, schema["items"]) for v in value]
        if schema.get("prefixItems"):
            return [_coerce(v, s) for v, s in zip(value, schema["prefixItems"], strict=False)] + value[
                len(schema["prefixItems"]) :
            ]
    if isinstance(value, dict) and isinstance(schema.get("additionalProperties"), dict):
        return {k: _coerce(v, schema["additionalProperties"]) for k, v in value.items()}
    return value


def check_arguments(script_name: str, parameters: dict[str, Any], arguments: Any) -> ToolError | None:
    """Arguments against a tool's parameter schema: an `input` error naming every problem, or None."""
    if not isinstance(arguments, dict):
        return ToolError(
            "input", f"arguments must be a JSON object of named inputs, got {describe_value(arguments)}"
        )
    props: dict[str, Any] = parameters.get("properties", {})
    allowed = list(props)
    problems: list[str] = []
    for name in parameters.get("required", []):
        if name not in arguments:
            problems.append(f"missing required input {name!r} ({_type_hint(props.get(name, {}))})")
    for name in arguments:
        if name not in props:
            accepted = ", ".join(allowed) if allowed else "no inputs"
            problems.append(
                f"unknown input {name!r}{_did_you_mean(str(name), allowed)}; {script_name} accepts {accepted}"
            )
    for name, value in arguments.items():
        if name in props:
            for p in validate(value, props[name], path=str(name), max_errors=3):
                problems.append(f"input {p}")
    if not problems:
        return None
    head = "the arguments do not match the tool's inputs" if len(problems) > 1 else "invalid arguments"
    return ToolError(
        "input", f"{head}: " + "; ".join(problems) + ". Call the tool again with corrected arguments."
    )


def _type_hint(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        return " or ".join(kind)
    if kind:
        return str(kind)
    if "enum" in schema:
        return "one of " + ", ".join(json.dumps(v) for v in schema["enum"])
    return "any value"


def prepare_inputs(script: Script, inputs: dict[str, Any] | None) -> dict[str, Any] | ToolError:
    """Validated inputs with defaults filled, or an `input` error."""
    inputs = {} if inputs is None else inputs
    error = check_arguments(script.name, script.parameters, inputs)
    if error is not None:
        return error
    prepared: dict[str, Any] = {}
    for name, spec in script.inputs.items():
        value = inputs[name] if name in inputs else spec.default
        prepared[name] = _coerce(value, spec.schema)
    return prepared


# ---- externals -------------------------------------------------------------------------------------


def _to_sandbox(value: Any) -> Any:
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
        return {k: _to_sandbox(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_sandbox(v) for v in value)
    return value


class _ExternalFailure(msgspec.Struct):
    name: str
    type: str
    message: str


def prepare_externals(
    script: Script,
    externals: dict[str, Any] | None,
    failures: list[_ExternalFailure],
    loop: asyncio.AbstractEventLoop,
) -> dict[str, Any] | ToolError:
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
    wrapped: dict[str, Any] = {}
    for name, spec in declared.items():
        impl = given[name]
        if not callable(impl):
            return ToolError(
                "external", f"the implementation of external {name!r} is not callable", spec.line
            )
        wrapped[name] = _wrap(name, impl, spec.is_async, failures, loop)
    return wrapped


def _wrap(
    name: str,
    impl: Callable[..., Any],
    declared_async: bool,
    failures: list[_ExternalFailure],
    loop: asyncio.AbstractEventLoop,
) -> Callable[..., Any]:
    def record(e: BaseException) -> None:
        failures.append(_ExternalFailure(name, type(e).__name__, str(e)))

    if declared_async:

        async def async_external(*args: Any, **kwargs: Any) -> Any:
            try:
                value = impl(*args, **kwargs)
                if inspect.isawaitable(value):
                    value = await value
                return _to_sandbox(value)
            except Exception as e:
                record(e)
                raise

        async_external.__name__ = name
        return async_external

    is_coro = inspect.iscoroutinefunction(impl)

    def sync_external(*args: Any, **kwargs: Any) -> Any:
        # Monty calls sync externals on its own thread; a coroutine implementation runs on the loop.
        try:
            value = impl(*args, **kwargs)
            if is_coro or inspect.isawaitable(value):
                if threading.get_ident() == getattr(loop, "_thread_id", None):
                    raise RuntimeError(f"external {name!r} is declared sync but its implementation is async")
                value = asyncio.run_coroutine_threadsafe(value, loop).result()
            return _to_sandbox(value)
        except Exception as e:
            record(e)
            raise

    sync_external.__name__ = name
    return sync_external


# ---- output ----------------------------------------------------------------------------------------


class _Unconvertible(Exception):
    pass


def to_plain(value: Any, _depth: int = 0) -> Any:
    """A sandbox result as plain JSON-able data.

    tuple/set -> list (sets sorted when possible), Decimal -> str (exact), date/datetime/time -> ISO
    string, Path -> str, bytes -> str (UTF-8, else "base64:..."), complex -> str, a sandbox class
    instance (`MontyClassProxy`) -> its attributes, ints beyond 64 bits -> str, non-string dict keys ->
    their JSON text.
    """
    if _depth > 100:
        raise _Unconvertible("the result is nested more than 100 levels deep")
    if value is None or isinstance(value, (bool, str, float)):
        return value
    if isinstance(value, int):
        return value if _INT64[0] <= value <= _INT64[1] else str(value)
    if isinstance(value, dict):
        return {_key(k): to_plain(v, _depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_plain(v, _depth + 1) for v in value]
    if isinstance(value, (set, frozenset)):
        items = [to_plain(v, _depth + 1) for v in value]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(value, MontyClassProxy):
        return to_plain(dict(value.attributes), _depth + 1)
    if isinstance(value, MontyClassTypeProxy):
        return value.name
    if isinstance(value, MontyStdTypeProxy):
        return f"<{value.kind} {value.name}>"
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (datetime.date, datetime.time)):  # datetime is a date
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            return "base64:" + base64.b64encode(value).decode()
    if isinstance(value, complex):
        return str(value)
    return str(value)


def _key(key: Any) -> str:
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, (bool, int, float)):
        return json.dumps(key)
    return json.dumps(to_plain(key), ensure_ascii=False, separators=(",", ":"))


@lru_cache(maxsize=256)
def _adapter(model: Any) -> Any:
    from pydantic import TypeAdapter

    return TypeAdapter(model)


def _check_output(output: Any, output_model: Any) -> tuple[Any, ToolError | None]:
    if output_model is None:
        return output, None
    if isinstance(output_model, dict):
        bad = unsupported_keywords(output_model)
        if bad:
            return None, ToolError(
                "output",
                "the tool's output schema uses keywords this runtime cannot check ("
                + ", ".join(bad[:5])
                + "); fix the host's output schema",
            )
        problems = validate(output, output_model, path="result")
        if problems:
            return None, ToolError(
                "output",
                "the script's result does not match the tool's output schema: "
                + "; ".join(problems)
                + ". Return a value of the declared shape.",
            )
        return output, None
    from pydantic import ValidationError

    try:
        adapter = _adapter(output_model)
    except TypeError:
        adapter = None  # unhashable: build uncached
    if adapter is None:
        from pydantic import TypeAdapter

        adapter = TypeAdapter(output_model)
    try:
        validated = adapter.validate_python(output)
    except ValidationError as e:
        problems = []
        for err in e.errors()[:10]:
            loc = ".".join(str(p) for p in err["loc"]) or "result"
            problems.append(
                f"{'result.' + loc if loc != 'result' else loc}: {err['msg']}"
                f" (got {describe_value(err.get('input'))})"
            )
        name = getattr(output_model, "__name__", str(output_model))
        return None, ToolError(
            "output",
            f"the script's result does not match {name}: "
            + "; ".join(problems)
            + ". Return a value of the declared shape.",
        )
    return adapter.dump_python(validated, mode="json"), None


# ---- errors from Monty -------------------------------------------------------------------------------


def _frames(e: MontyError) -> list[Any]:
    try:
        return list(e.traceback()) if hasattr(e, "traceback") else []
    except Exception:  # pragma: no cover - defensive
        return []


def _where(frames: list[Any]) -> tuple[int | None, str]:
    """The failing line and a compact traceback in the script's terms."""
    if not frames:
        return None, ""
    last = frames[-1]
    shown = frames if len(frames) <= 6 else [*frames[:2], None, *frames[-3:]]
    lines = []
    for f in shown:
        if f is None:
            lines.append(f"  ... {len(frames) - 5} more frames ...")
            continue
        fn = f.function_name or "<module>"
        src = (f.source_line or "").strip()
        lines.append(f"  line {f.line}, in {fn}: {src}" if src else f"  line {f.line}, in {fn}")
    return last.line, "\n".join(lines)


def _norm(message: str) -> str:
    """Exception text compared across the boundary (KeyError('x') reads 'x' on the host, x in Monty)."""
    return message.strip().strip("'\"")


_SUSPENSION = re.compile(r"suspension limit (\d+) exceeded")


def classify(
    e: MontyError, script: Script, limits: Limits, failures: list[_ExternalFailure], fs: ReadOnlyFS | None
) -> ToolError:
    """A Monty exception as a `ToolError` written for the model."""
    file = script.filename
    if isinstance(e, MontyCrashedError):
        if e.timed_out:
            return ToolError(
                "limit",
                f"the script ran past its {_human_duration(limits.max_duration or 0)} time "
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
    frames = _frames(e)
    line, trace = _where(frames)
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
    at = ""
    src_line = (frames[-1].source_line or "").strip() if frames else ""
    # quote the failing line, unless it is the script's own `raise` (its message already says it all)
    src = f" in `{src_line}`" if src_line and not src_line.startswith("raise ") else ""

    if kind_name == "MemoryError" and ("memory limit" in text or "exceeded its memory limit" in text):
        return ToolError(
            "limit",
            f"the script used more than its {_human_size(limits.max_memory or 0)} memory "
            f"limit (max_memory){at}{src}. Build smaller data: process items one at a time, avoid "
            "huge lists or strings.",
            line,
            "memory",
        )
    if kind_name == "TimeoutError" and "limit exceeded" in text:
        what = "sleeping" if "sleep limit" in text else "running"
        return ToolError(
            "limit",
            f"the script was stopped after {what} past its "
            f"{_human_duration(limits.max_duration or 0)} time limit (max_duration){at}{src}. Look "
            "for an endless loop, or do less work per call.",
            line,
            "duration",
        )
    if kind_name == "RecursionError":
        return ToolError(
            "limit",
            f"maximum recursion depth ({limits.max_recursion}, max_recursion) exceeded"
            f"{at}{src}. Use a loop instead of recursion, or recurse less deeply.",
            line,
            "recursion",
        )
    if kind_name == "RuntimeError" and (m := _SUSPENSION.search(text)):
        return ToolError(
            "limit",
            f"the script made more than {m.group(1)} host calls (externals and file or "
            f"environment operations; max_suspensions){at}{src}. Read fewer files or call "
            "externals fewer times (e.g. read a file once and reuse it).",
            line,
            "suspensions",
        )
    if kind_name == "NotImplementedError" and "syntax parser does not yet support" in text:
        return ToolError(
            "check",
            f"{message}{at}{src}: Monty cannot run this construct; rewrite it "
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
                f"external function {last.name!r} raised {what}{at}{src}. The host function failed; check "
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
        from runtime.scripts.check import MODULES

        hint = f"\nModules available in the sandbox: {', '.join(sorted(MODULES))}."
    deliberate = src_line.startswith("raise ")  # the script's own raise: its message is the point
    trace_text = (
        f"\nTraceback (most recent call last), {file}:\n{trace}" if len(frames) > 1 and not deliberate else ""
    )
    return ToolError("execution", f"{kind_name}: {message}{at}{src}{trace_text}{hint}", line)


# ---- the run -----------------------------------------------------------------------------------------


async def run_script(
    script: Script,
    inputs: dict[str, Any] | None = None,
    *,
    externals: dict[str, Any] | None = None,
    files: dict[str, str | bytes] | None = None,
    environ: dict[str, str] | None = None,
    limits: Limits | str | dict[str, Any] | None = None,
    output_model: Any = None,
    on_event: EventCallback | None = None,
) -> ToolResult:
    """Run `script` once in a fresh sandbox session. Never raises for script problems.

    `limits` is resolved with `Limits.resolve` (None -> default) and completed from the default preset;
    an invalid limits spec is a host bug and raises `LimitsError`.
    """
    t0 = time.perf_counter()
    effective = Limits.resolve(limits).effective()
    emitter = _Emitter(on_event, script.name, t0, inputs=len(inputs or {}), externals=len(externals or {}))
    try:
        result = await _run(script, inputs, externals, files, environ, effective, output_model, emitter)
    except asyncio.CancelledError:
        raise
    except Exception as e:  # a bug on the host side: still a value, never an exception into the caller
        log.exception("script runner failed on %s", script.filename)
        result = ToolResult(error=ToolError("crashed", f"the script runner failed: {type(e).__name__}: {e}"))
    duration = round((time.perf_counter() - t0) * 1000, 3)
    result = ToolResult(output=result.output, error=result.error, duration_ms=duration)
    emitter.start()  # a run that failed before reaching the sandbox still reports its start
    await emitter.flush()
    if result.error is not None:
        emitter.emit("error", error=result.error)
    else:
        emitter.emit("complete", output_bytes=len(msgspec.json.encode(result.output)))
    await emitter.flush()
    return result


async def _run(
    script: Script,
    inputs: dict[str, Any] | None,
    externals: dict[str, Any] | None,
    files: dict[str, str | bytes] | None,
    environ: dict[str, str] | None,
    limits: Limits,
    output_model: Any,
    emitter: _Emitter,
) -> ToolResult:
    failure = script.error()
    if failure is not None:
        return failure
    prepared = prepare_inputs(script, inputs)
    if isinstance(prepared, ToolError):
        return ToolResult(error=prepared)
    failures: list[_ExternalFailure] = []
    lookup = prepare_externals(script, externals, failures, emitter.loop)
    if isinstance(lookup, ToolError):
        return ToolResult(error=lookup)
    try:
        fs = make_fs(files, environ)
    except ValueError as e:
        return ToolResult(error=ToolError("input", f"the virtual files are invalid: {e}"))

    pool = get_pool()
    try:
        async with pool.session(
            script_name=script.filename.rsplit("/", 1)[-1], limits=limits.to_monty()
        ) as s:
            emitter.start(worker_pid=s.worker_pid)
            output = await s.feed_run(
                script.code,
                inputs=prepared,
                external_lookup=lookup,
                print_callback=emitter.print_callback,
                os=fs,
            )
    except MontyError as e:
        return ToolResult(error=classify(e, script, limits, failures, fs))
    except RuntimeError as e:
        # e.g. "this checkout has already been finished" when the worker died between feed and return
        if "checkout" in str(e):
            get_pool().record_crash(str(e))
            return ToolResult(
                error=ToolError(
                    "crashed",
                    f"the sandbox worker running {script.filename} was lost "
                    f"({e}). It has been replaced; retrying once is reasonable.",
                )
            )
        raise

    try:
        plain = to_plain(output)
    except _Unconvertible as e:
        return ToolResult(error=ToolError("output", f"the script's result cannot be converted to JSON: {e}"))
    size = len(msgspec.json.encode(plain))
    if limits.max_output is not None and size > limits.max_output:
        return ToolResult(
            error=ToolError(
                "limit",
                f"the script's result is {_human_size(size)} of JSON, over its "
                f"{_human_size(limits.max_output)} "
                "limit (max_output). Return less: summarise, select the fields needed, or paginate.",
                detail="output",
            )
        )
    checked, error = _check_output(plain, output_model)
    if error is not None:
        return ToolResult(error=error)
    return ToolResult(output=checked)


async def probe(script: Script) -> list[Diagnostic]:
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
        frames = _frames(e)
        line = frames[-1].line - 1 if frames and frames[-1].line > 1 else None
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


async def typecheck(script: Script) -> list[Diagnostic]:
    """Monty's own type check (ty) against stubs generated from the declarations; cached per content hash.

    Monty has no check-only mode, so the code is fed with type checking on, no inputs, no externals and no
    files under strict limits: a clean check then stops at the first unbound input (harmless, ignored).
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
