"""Sandboxed `.pym` scripts: a grail-compatible layer over pydantic-monty 1.4.0.

    from runtime.scripts import load, Limits

    script = load("agents/calculator.pym")      # never raises for script problems: see script.diagnostics
    result = await script.run({"expression": "2 * (3 + 4)"}, limits=Limits.strict())
    result.output or result.error               # plain data, or ToolError(kind, message, line, detail)

Modules: `loader` (parse, declarations, line-preserving transform), `check` (what Monty cannot run),
`schema` (annotations -> JSON Schema), `validate` (JSON Schema checks), `limits`, `files` (read-only
virtual filesystem), `pool` (the process-wide AsyncMonty pool), `run` (a run, its events and errors).
"""

from runtime.scripts.limits import PRESETS, Limits, LimitsError, parse_duration, parse_size
from runtime.scripts.loader import Script, first_paragraph, load, loads
from runtime.scripts.pool import SandboxPool, configure_pool, get_pool, shutdown, shutdown_sync
from runtime.scripts.run import (
    EventCallback,
    ScriptEvent,
    check_arguments,
    probe,
    run_script,
    to_plain,
    typecheck,
)
from runtime.scripts.schema import AnnotationError, schema_from_annotation, schema_from_type
from runtime.scripts.specs import MISSING, Diagnostic, ExternalSpec, InputSpec, ParamSpec

__all__ = [
    "MISSING",
    "PRESETS",
    "AnnotationError",
    "Diagnostic",
    "EventCallback",
    "ExternalSpec",
    "InputSpec",
    "Limits",
    "LimitsError",
    "ParamSpec",
    "SandboxPool",
    "Script",
    "ScriptEvent",
    "check",
    "check_arguments",
    "configure_pool",
    "first_paragraph",
    "get_pool",
    "load",
    "loads",
    "parse_duration",
    "parse_size",
    "probe",
    "run_script",
    "schema_from_annotation",
    "schema_from_type",
    "shutdown",
    "shutdown_sync",
    "to_plain",
    "typecheck",
]

# grail's name for a loaded script
GrailScript = Script


async def check(script: Script, *, use_monty: bool = True, types: bool = False) -> list[Diagnostic]:
    """All diagnostics for `script`: the static check's, plus (with `use_monty`) anything Monty's own
    parser rejects (`probe`), plus (with `types`) Monty's type check against the declarations' stubs."""
    found = list(script.diagnostics)
    if use_monty and script.ok:
        found += await probe(script)
    if types and not found:
        found += await typecheck(script)
    return found
