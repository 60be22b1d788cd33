"""The vocabulary every layer shares: tool schemas, tool calls, tool results, tool errors, script notes.

These live in their own pure module (msgspec only) because three parties must agree on them without
importing each other: the sandbox layer (`runtime.scripts`, `runtime.tools`) produces them, the pure
kernel (`runtime.kernel`) folds them, and the wire schema (`runtime.events`) embeds them in events.
The kernel must never import the sandbox, so the shared types cannot live beside it.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, get_args

import msgspec

ErrorKind = Literal[
    "parse",  # the .pym does not parse
    "check",  # the static check at load found a problem (bad declaration, unsupported construct)
    "input",  # arguments missing, extra or of the wrong type
    "external",  # a host external raised, or externals were missing/extra
    "execution",  # the script raised at run time
    "limit",  # a Limits bound was hit; `detail` says which
    "output",  # the result failed the tool's output model, or could not be converted
    "crashed",  # the sandbox worker died or a job exhausted its deliveries
    "policy",  # a ToolPolicy denied the call
    "timeout",  # the call's deadline passed before a result arrived
    "cancelled",  # the run was cancelled while the call ran: its sandbox run was stopped
    "in_doubt",  # a call that may not be repeated was redelivered: it may or may not have happened
]
ERROR_KINDS: tuple[str, ...] = get_args(ErrorKind)

LimitKind = Literal["memory", "duration", "recursion", "suspensions", "output"]


class ToolError(msgspec.Struct, frozen=True, omit_defaults=True):
    """A tool failure as a value: the model reads `message`, the event stream keeps the structure."""

    kind: ErrorKind
    message: str
    line: int | None = None
    detail: str | None = None

    def for_model(self) -> str:
        """The text a model reads when its call failed: kind, where, what, and how to fix it."""
        where = f" (line {self.line})" if self.line is not None else ""
        return f"Error [{self.kind}{'/' + self.detail if self.detail else ''}]{where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "line": self.line, "detail": self.detail}


NoteKind = Literal["started", "printed", "completed", "failed"]


class ScriptNote(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One thing that happened during a script run, in order: it started, printed, completed or failed.

    The one record of a run's lifecycle from the sandbox to the log: the sandbox emits it while a run goes
    (`Script.run(on_event=...)`, `ToolContext.on_event`), a tool worker ships it unchanged inside its
    `ToolOutcome`, and `runtime.events.outcome_events` folds a run's notes into the `ScriptRun` its call's
    outcome event carries (`events.expand` reads them back as `script.*` events).

    `ts` is wall-clock time (seconds since the epoch) and `duration_ms` the time since the run began.
    `printed` carries `stream` and `text`; `started` the sandbox `worker_pid` and how many `inputs` and
    `externals` were given; `completed` the `output_bytes` of the JSON result; `failed` the `error`.
    `call_id` is set when the run serves a tool call. Every field after `ts` has a default, so a note
    written by an older worker (kind, ts, text, duration_ms, error) still decodes.
    """

    kind: NoteKind
    ts: float
    text: str = ""
    duration_ms: float = 0.0
    error: ToolError | None = None
    script: str = ""
    stream: str | None = None
    output_bytes: int | None = None
    worker_pid: int | None = None
    inputs: int | None = None
    externals: int | None = None
    call_id: str | None = None


class ToolSchema(msgspec.Struct, frozen=True):
    """What a model is told about a tool: a name, a one-paragraph description and JSON Schema parameters."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI `tools=[...]` entry for this tool."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @property
    def digest(self) -> str:
        """A stable content hash, used to cache compiled grammars per tool set."""
        return digest_of(self.to_openai())


class ToolCall(msgspec.Struct, frozen=True):
    """One call the model asked for. `id` is deterministic: `<run>/<turn>.<index>` (see kernel)."""

    id: str
    name: str
    arguments: dict[str, Any]


class ToolResult(msgspec.Struct, frozen=True, omit_defaults=True):
    """The outcome of one tool execution: an output (plain JSON-able data) or a `ToolError`, never both."""

    output: Any = None
    error: ToolError | None = None
    duration_ms: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None

    @classmethod
    def failure(cls, kind: ErrorKind, message: str, *, line: int | None = None,
                detail: str | None = None, duration_ms: float = 0.0) -> ToolResult:
        return cls(error=ToolError(kind, message, line, detail), duration_ms=duration_ms)

    def for_model(self) -> str:
        """The tool message content the model reads next turn."""
        if self.error is not None:
            return self.error.for_model()
        if isinstance(self.output, str):
            return self.output
        return json.dumps(self.output, ensure_ascii=False, default=str)


def digest_of(value: Any) -> str:
    """sha256 (hex, first 16 chars) of a canonical JSON rendering: stable across processes and runs."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


Role = Literal["system", "user", "assistant", "tool"]


class Message(msgspec.Struct, frozen=True, omit_defaults=True):
    """One conversation message in a model-family-neutral form.

    The kernel keeps history as these; a `ModelAdapter` renders them into what its model family expects
    (text-embedded `<tool_call>` blocks for hermes/qwen3, native `tool_calls` for openai, ...).
    """

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()  # role == "assistant": the calls it made
    tool_call_id: str | None = None  # role == "tool": which call this answers
    name: str | None = None  # role == "tool": the tool's name


class Usage(msgspec.Struct, frozen=True, omit_defaults=True):
    """Token counts reported by the model server."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
