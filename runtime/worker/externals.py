"""A job's externals: what a script's `@external` functions are bound to when a worker runs it, and the
secrets kept out of what the worker sends back.

The functions come from the bundle's grants (built-ins such as `ask_llm`, `http_request`, `secret`), the
bundle's `externals:` factory or the worker's own (`sa worker --externals package.module:factory`), built
per job with an `ExecutionContext` (`runtime.externals.provide`, which this module calls with what the
worker knows: the setup the tool's bundle gave it, the worker's factory and secrets, the record bucket).
Each answered external call is recorded in the `externals` KV bucket before the script goes on, so a
redelivered job replays answered calls instead of making them again (`runtime.externals.record` states the
guarantee); a worker opens that bucket only when a script first needs it (`ExternalRecords`). The task's
metadata reaches the context only for a tool that can see it (`task_metadata`), so other jobs pay no read.
Secret values a tool was granted are scrubbed from its outcome (`scrubbed`), output, errors and printed
text alike.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import msgspec
from nats.js import JetStreamContext

from runtime.externals import ExecutionContext, ExternalsFactory, Secrets
from runtime.externals.builtins import redact_value
from runtime.externals.provide import Provided, ToolSetup, provide
from runtime.externals.record import externals_kv
from runtime.jobs import ToolJob
from runtime.log import RunLog
from runtime.tools import ScriptTool
from runtime.tools.agent_tool import AgentTool
from runtime.types import ScriptNote, ToolError, ToolResult
from runtime.worker.registry import WorkerTool

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

log = logging.getLogger("runtime.worker")


class ExternalRecords:
    """The `externals` KV bucket, opened on the first call (a worker whose scripts never record an external
    call never opens it) and kept; a failed open is tried again on the next call."""

    def __init__(self, js: JetStreamContext) -> None:
        self.js = js
        self._kv: KeyValue | None = None

    async def __call__(self) -> KeyValue:
        if self._kv is None:
            self._kv = await externals_kv(self.js)
        return self._kv


async def task_metadata(js: JetStreamContext, job: ToolJob, tool: WorkerTool, *,
                        worker: str) -> dict[str, Any]:
    """The task's metadata for an `ExecutionContext`, read from the run's `run.started` only for a tool
    that can see it (a script with externals, a Python tool): other jobs pay no read."""
    if isinstance(tool, AgentTool) or (isinstance(tool, ScriptTool) and not tool.script.externals):
        return {}
    try:
        started = await RunLog(js).started(job.run_id, job.actor)
    except Exception as e:  # the context lacks the metadata; the call itself can still run
        log.debug("worker %s: cannot read run.started of %s: %s", worker, job.run_id, e)
        return {}
    return dict(started.metadata) if started is not None else {}


async def provide_externals(tool: WorkerTool, execution: ExecutionContext, notes: list[ScriptNote], *,
                            setup: ToolSetup | None, factory: ExternalsFactory | None,
                            records: ExternalRecords, secrets: Secrets) -> Provided | ToolResult:
    """The job's externals (those its script declares), or the `external` failure naming what is
    missing. `setup` is what the tool's bundle grants it (`Served.setup`: None for a glob's script).
    What an external prints goes to `notes`, as the sandbox's own output does."""
    if not isinstance(tool, ScriptTool):
        return Provided({})

    def printed(text: str) -> None:
        notes.append(ScriptNote(kind="printed", ts=time.time(), text=text, stream="external",
                                script=tool.name, call_id=execution.call_id))

    provided = await provide(tool.script, tool.name, setup, factory,
                             execution, records, secrets, printed)
    return ToolResult(error=provided) if isinstance(provided, ToolError) else provided


def scrubbed(result: ToolResult, notes: list[ScriptNote],
             secrets: list[str]) -> tuple[ToolResult, list[ScriptNote]]:
    """The result and notes with every granted secret's value replaced: nothing the worker sends back
    (and so nothing in the run's events) carries a secret, even one a script printed or returned."""
    error = result.error
    if error is not None:
        error = msgspec.structs.replace(error, message=redact_value(error.message, secrets))
    clean = ToolResult(output=redact_value(result.output, secrets), error=error,
                       duration_ms=result.duration_ms)
    out = []
    for n in notes:
        err = n.error
        if err is not None:
            err = msgspec.structs.replace(err, message=redact_value(err.message, secrets))
        out.append(msgspec.structs.replace(n, text=redact_value(n.text, secrets), error=err))
    return clean, out
