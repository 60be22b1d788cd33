"""Sandboxed `.pym` scripts: a grail-compatible layer over pydantic-monty 1.4.0.

    from runtime.scripts import load, Limits

    script = load("agents/calculator.pym")      # never raises for script problems: see script.diagnostics
    result = await script.run({"expression": "2 * (3 + 4)"}, limits=Limits.strict())
    result.output or result.error               # plain data, or ToolError(kind, message, line, detail)

Loading: `loader` (find the declarations, blank their lines), `declarations` (read one `Input` or
`@external`), `check` (what Monty cannot run), `schema` (annotations -> JSON Schema), `specs` (what a
script declares), `loaded` (`LoadedScript`: the loaded script as plain data), `script` (`Script`: a
`LoadedScript` with `run`). Running: `run` (one run, in order), `inputs` (arguments checked and coerced),
`externals` (host functions wrapped for Monty), `files` (the read-only virtual filesystem), `limits`,
`pool` (the process-wide Monty pool), `inline` (short runs fed from the caller's thread), `output`
(results as plain JSON, checked), `errors` (Monty's exceptions as `ToolError`s), `notes` (what observers
see of a run). Asking Monty before a run: `diagnostics` (`diagnose`, `probe`, `typecheck`). Values are
checked against JSON Schema by `runtime.validate`, which is pure and lives below this package.

Everything a caller needs is re-exported here; the modules' other names are implementation details.
"""

from runtime.scripts.declarations import docstring_params
from runtime.scripts.diagnostics import diagnose, probe, typecheck
from runtime.scripts.externals import to_sandbox
from runtime.scripts.inputs import check_arguments, coerce
from runtime.scripts.limits import PRESETS, Limits, LimitsError
from runtime.scripts.loaded import LoadedScript, first_paragraph
from runtime.scripts.loader import load, loads
from runtime.scripts.notes import NoteCallback
from runtime.scripts.output import to_plain
from runtime.scripts.pool import SandboxPool, configure_pool, get_pool, shutdown, shutdown_sync
from runtime.scripts.run import run_script
from runtime.scripts.schema import AnnotationError, is_optional, schema_from_annotation, schema_from_type
from runtime.scripts.script import Script
from runtime.scripts.specs import MISSING, Diagnostic, ExternalSpec, InputSpec, ParamSpec, parameters_schema
from runtime.types import ScriptNote

__all__ = [
    "MISSING",
    "PRESETS",
    "AnnotationError",
    "Diagnostic",
    "ExternalSpec",
    "GrailScript",
    "InputSpec",
    "Limits",
    "LimitsError",
    "LoadedScript",
    "NoteCallback",
    "ParamSpec",
    "SandboxPool",
    "Script",
    "ScriptNote",
    "check_arguments",
    "coerce",
    "configure_pool",
    "diagnose",
    "docstring_params",
    "first_paragraph",
    "get_pool",
    "is_optional",
    "load",
    "loads",
    "parameters_schema",
    "probe",
    "run_script",
    "schema_from_annotation",
    "schema_from_type",
    "shutdown",
    "shutdown_sync",
    "to_plain",
    "to_sandbox",
    "typecheck",
]

# grail's name for a loaded script
GrailScript = Script
