"""The wire schema: every event a run appends and every command a publisher sends.

Events are the truth (DESIGN rule 1): a run's state is `fold(kernel.evolve, events)`, so this module is
the contract between the kernel, the effect runners, the NATS host, `sa replay` and any future writer.
Everything here is a frozen msgspec Struct in one tagged union; the tag field `kind` holds a dotted
name (`run.started`, `tool.completed`, ...) that doubles as the last token of the NATS subject.

Wire rules, chosen for schema evolution (research/nats.md §8):

* msgpack on the wire (`encode`/`decode`), JSON only for humans (`to_json`/`from_json`).
* Every event carries `v`, the schema version of its writer. It is always encoded (the base sets
  `omit_defaults=False`): a reader must be able to tell an old event from a new one.
* A field added later must have a default; old readers ignore fields they do not know (msgspec's
  default), new readers fill the default for events written before the field existed.
* A kind the reader does not know is an `EventDecodeError` that names the kind, never a silent skip:
  folding a run while skipping an event would produce a state the writer never had.

Events stay small (DESIGN rule 5): `model.requested` carries only the messages added to the
conversation since the previous request, never the whole prompt again. Events whose one big field can
outgrow a NATS message (task input, raw model text, tool output, final output, new messages) name that
field in `PAYLOAD_FIELDS`; `externalize` moves its value out (the caller stores `payload_bytes(ev)` in
the object store) and leaves a `PayloadRef` in `ref`; `internalize` puts it back before folding.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec

from runtime.types import Message, ScriptNote, ToolCall, ToolError, ToolResult, Usage

SCHEMA_VERSION = 1


class EventDecodeError(ValueError):
    """Bytes that are not a valid event or command of this schema; the message says which kind and why."""


class PayloadRef(msgspec.Struct, frozen=True):
    """Where an event's big field lives when it was too large to travel inline (object store entry)."""

    object_name: str
    size: int
    digest: str


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Fields every event carries. `seq` is per run, 0-based and contiguous; `ts` (float seconds since
    the epoch) is stamped by the effect runner — the kernel never reads a clock, it compares these."""

    run_id: str
    seq: int
    ts: float
    agent: str = ""
    v: int = SCHEMA_VERSION


# ── run lifecycle ─────────────────────────────────────────────────────────────────────────────────────


class RunStarted(_Event, kw_only=True, tag="run.started"):
    """A task was accepted and this run owns it. Carries the task so the log alone can rebuild the run."""

    input: str
    task_id: str | None = None
    instance: str | None = None
    timeout_s: float | None = None  # the deadline is `ts + timeout_s` of this event
    metadata: dict[str, Any] = {}
    bundle_digest: str = ""
    ref: PayloadRef | None = None


class RunCompleted(_Event, kw_only=True, tag="run.completed"):
    output: Any = None
    ref: PayloadRef | None = None


class RunFailed(_Event, kw_only=True, tag="run.failed"):
    reason: str
    detail: str = ""


class RunCancelled(_Event, kw_only=True, tag="run.cancelled"):
    reason: str = ""
    by: str = ""


class TurnCompleted(_Event, kw_only=True, tag="turn.completed"):
    """A model reply and every call it made are resolved; the tool results now join the conversation."""

    turn: int
    calls_ok: int = 0
    calls_failed: int = 0


# ── model ─────────────────────────────────────────────────────────────────────────────────────────────


class ModelRequested(_Event, kw_only=True, tag="model.requested"):
    """A model call is about to be made. `messages` holds only what was appended to the conversation since
    the previous request; the prompt sent is `pinned + conversation[context_start:]` (see kernel)."""

    request_id: str
    turn: int
    attempt: int = 0
    messages: tuple[Message, ...] = ()
    context_start: int = 0
    constraint_digest: str = ""
    sampling: dict[str, Any] = {}
    tools: tuple[str, ...] = ()  # names offered when fewer than all the agent's tools (a forced last turn)
    ref: PayloadRef | None = None


class ModelResponded(_Event, kw_only=True, tag="model.responded"):
    """The model answered. `calls` carry the kernel's deterministic ids (`<run>/<turn>.<i>`). A reply
    the adapter could not parse keeps its raw text and sets `parse_error`; the model is told and retries."""

    request_id: str
    turn: int
    text: str = ""
    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    finish_reason: str = ""
    latency_ms: float = 0.0
    parse_error: str | None = None
    ref: PayloadRef | None = None


class ModelFailed(_Event, kw_only=True, tag="model.failed"):
    """The model call produced no reply (after the client's own retries): timeout, HTTP error, ..."""

    request_id: str
    turn: int
    error: str
    error_kind: str = "error"


# ── tools ─────────────────────────────────────────────────────────────────────────────────────────────


class ToolCalled(_Event, kw_only=True, tag="tool.called"):
    """A call was dispatched for execution (allowed by every policy, approved if it needed approval)."""

    call: ToolCall


class ToolCompleted(_Event, kw_only=True, tag="tool.completed"):
    call_id: str
    tool: str
    output: Any = None
    duration_ms: float = 0.0
    ref: PayloadRef | None = None

    @property
    def result(self) -> ToolResult:
        return ToolResult(output=self.output, duration_ms=self.duration_ms)


class ToolFailed(_Event, kw_only=True, tag="tool.failed"):
    """A call ended in an error value: from the tool, a denying policy or approver, or an unknown tool."""

    call_id: str
    tool: str
    error: ToolError
    duration_ms: float = 0.0

    @property
    def result(self) -> ToolResult:
        return ToolResult(error=self.error, duration_ms=self.duration_ms)


# Script events come from the worker running a .pym tool; they explain a call, the kernel ignores them.


class ScriptStarted(_Event, kw_only=True, tag="script.started"):
    call_id: str
    tool: str
    worker: str = ""


class ScriptPrinted(_Event, kw_only=True, tag="script.printed"):
    call_id: str
    tool: str
    text: str


class ScriptCompleted(_Event, kw_only=True, tag="script.completed"):
    call_id: str
    tool: str
    duration_ms: float = 0.0


class ScriptFailed(_Event, kw_only=True, tag="script.failed"):
    call_id: str
    tool: str
    error: ToolError
    duration_ms: float = 0.0


# ── approvals ─────────────────────────────────────────────────────────────────────────────────────────


class ApprovalRequested(_Event, kw_only=True, tag="approval.requested"):
    call: ToolCall


class ApprovalGranted(_Event, kw_only=True, tag="approval.granted"):
    call_id: str
    by: str = ""


class ApprovalDenied(_Event, kw_only=True, tag="approval.denied"):
    call_id: str
    reason: str = ""
    by: str = ""


Event: TypeAlias = (
    RunStarted
    | ModelRequested
    | ModelResponded
    | ModelFailed
    | ToolCalled
    | ScriptStarted
    | ScriptPrinted
    | ScriptCompleted
    | ScriptFailed
    | ToolCompleted
    | ToolFailed
    | ApprovalRequested
    | ApprovalGranted
    | ApprovalDenied
    | TurnCompleted
    | RunCompleted
    | RunFailed
    | RunCancelled
)
EVENT_TYPES: tuple[type[_Event], ...] = Event.__args__  # type: ignore[attr-defined]
EVENT_KINDS: dict[str, type[_Event]] = {cls.__struct_config__.tag: cls for cls in EVENT_TYPES}


def kind_of(ev: Event) -> str:
    """The dotted kind of an event (its tag), e.g. for the subject `events.<agent>.<run>.<kind>`."""
    return type(ev).__struct_config__.tag  # type: ignore[return-value]


def tool_outcome(call_id: str, tool: str, result: ToolResult) -> tuple[type[Event], dict[str, Any]]:
    """The event recording a tool's result and its fields (less the run's ids): `tool.completed` with the
    output, or `tool.failed` with the error. One mapping, so every runner records results alike."""
    fields: dict[str, Any] = {"call_id": call_id, "tool": tool, "duration_ms": result.duration_ms}
    if result.error is None:
        return ToolCompleted, {**fields, "output": result.output}
    return ToolFailed, {**fields, "error": result.error}


def script_event(
    note: ScriptNote, call_id: str, tool: str, *, worker: str = ""
) -> tuple[type[Event], dict[str, Any]]:
    """The `script.*` event recording one sandbox note and its fields (less the run's ids, `seq` and `ts`):
    `script.started` (on `worker`, else the sandbox pid), `script.printed`, `script.completed` or
    `script.failed`. The one note -> event mapping, so a tool worker's notes and an in-process run's read
    alike in the log."""
    fields: dict[str, Any] = {"call_id": call_id, "tool": tool}
    if note.kind == "started":
        pid = str(note.worker_pid) if note.worker_pid else ""
        return ScriptStarted, {**fields, "worker": worker or pid}
    if note.kind == "printed":
        return ScriptPrinted, {**fields, "text": note.text}
    if note.kind == "completed":
        return ScriptCompleted, {**fields, "duration_ms": note.duration_ms}
    error = note.error or ToolError("execution", note.text or "script failed")
    return ScriptFailed, {**fields, "error": error, "duration_ms": note.duration_ms}


# ── commands ──────────────────────────────────────────────────────────────────────────────────────────


class _Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    v: int = SCHEMA_VERSION


class Task(_Command, kw_only=True, tag="task"):
    """Run `input` on `agent`. `task_id` becomes the Nats-Msg-Id, so a re-sent task is dropped, not re-run.

    `timeout_s` is relative: seconds after the run starts (the run.started `ts`). Relative beats an
    absolute timestamp because the publisher's clock need not agree with the host's, and the absolute
    deadline is still fixed once, in the log, when the run starts.
    """

    agent: str
    input: str
    instance: str | None = None
    task_id: str | None = None
    timeout_s: float | None = None
    metadata: dict[str, Any] = {}


class Cancel(_Command, kw_only=True, tag="cancel"):
    run_id: str
    reason: str = ""
    by: str = ""


class Approve(_Command, kw_only=True, tag="approve"):
    run_id: str
    call_id: str
    by: str = ""


class Deny(_Command, kw_only=True, tag="deny"):
    run_id: str
    call_id: str
    reason: str = ""
    by: str = ""


Command: TypeAlias = Task | Cancel | Approve | Deny
COMMAND_TYPES: tuple[type[_Command], ...] = Command.__args__  # type: ignore[attr-defined]
COMMAND_KINDS: dict[str, type[_Command]] = {cls.__struct_config__.tag: cls for cls in COMMAND_TYPES}


# ── encoding ──────────────────────────────────────────────────────────────────────────────────────────

_msgpack = msgspec.msgpack.Encoder()
_event_msgpack = msgspec.msgpack.Decoder(Event)
_event_json = msgspec.json.Decoder(Event)
_command_msgpack = msgspec.msgpack.Decoder(Command)
_command_json = msgspec.json.Decoder(Command)


class _Peek(msgspec.Struct):
    """Just enough of any message to explain why it failed to decode."""

    kind: Any = None
    v: Any = None


def _decode(data: bytes | str, decoder: Any, peek: Any, known: dict[str, Any], what: str) -> Any:
    try:
        return decoder.decode(data)
    except msgspec.DecodeError as exc:  # ValidationError is a subclass: look at the kind first
        try:
            head = peek(data)
        except msgspec.DecodeError:
            raise EventDecodeError(f"not a valid {what}: {exc}") from exc
        if head.kind not in known:
            newer = (
                f" (written by schema v{head.v}, this reader is v{SCHEMA_VERSION})"
                if (isinstance(head.v, int) and head.v > SCHEMA_VERSION)
                else ""
            )
            raise EventDecodeError(
                f"unknown {what} kind {head.kind!r}{newer}; known kinds: {', '.join(sorted(known))}"
            ) from exc
        raise EventDecodeError(f"invalid {what} {head.kind!r}: {exc}") from exc


def encode(ev: Event | Command) -> bytes:
    """msgpack bytes for the wire (events and commands alike)."""
    return _msgpack.encode(ev)


def decode(data: bytes) -> Event:
    """One event from msgpack bytes; `EventDecodeError` names an unknown kind or the invalid field."""
    return _decode(
        data, _event_msgpack, lambda d: msgspec.msgpack.decode(d, type=_Peek), EVENT_KINDS, "event"
    )


def to_json(ev: Event | Command, *, indent: int = 0) -> str:
    """JSON for humans (`sa replay --json`, logs); `indent > 0` pretty-prints."""
    text = msgspec.json.encode(ev)
    return (msgspec.json.format(text, indent=indent) if indent else text).decode()


def from_json(data: str | bytes) -> Event:
    return _decode(data, _event_json, lambda d: msgspec.json.decode(d, type=_Peek), EVENT_KINDS, "event")


def encode_command(cmd: Command) -> bytes:
    return _msgpack.encode(cmd)


def decode_command(data: bytes) -> Command:
    """One command from msgpack bytes; `EventDecodeError` for an unknown kind or an invalid field."""
    return _decode(
        data, _command_msgpack, lambda d: msgspec.msgpack.decode(d, type=_Peek), COMMAND_KINDS, "command"
    )


def command_from_json(data: str | bytes) -> Command:
    return _decode(
        data, _command_json, lambda d: msgspec.json.decode(d, type=_Peek), COMMAND_KINDS, "command"
    )


# ── big payloads ──────────────────────────────────────────────────────────────────────────────────────

# The one field per event kind that may be moved to the object store, and its empty value.
PAYLOAD_FIELDS: dict[type[_Event], str] = {
    RunStarted: "input",
    ModelRequested: "messages",
    ModelResponded: "text",
    ToolCompleted: "output",
    RunCompleted: "output",
}
_EMPTY: dict[str, Any] = {"input": "", "messages": (), "text": "", "output": None}


def payload_bytes(ev: Event) -> bytes:
    """The msgpack encoding of the event's big field: what goes to the object store."""
    return _msgpack.encode(getattr(ev, PAYLOAD_FIELDS[type(ev)]))


def externalize(ev: Event, ref: PayloadRef) -> Event:
    """The event with its big field emptied and `ref` pointing at where `payload_bytes(ev)` was stored."""
    return msgspec.structs.replace(
        ev, **{PAYLOAD_FIELDS[type(ev)]: _EMPTY[PAYLOAD_FIELDS[type(ev)]]}, ref=ref
    )


def internalize(ev: Event, data: bytes) -> Event:
    """The inverse of `externalize`: put the fetched payload back, typed, and drop the ref."""
    name = PAYLOAD_FIELDS[type(ev)]
    field_type = next(f.type for f in msgspec.structs.fields(type(ev)) if f.name == name)
    return msgspec.structs.replace(ev, **{name: msgspec.msgpack.decode(data, type=field_type)}, ref=None)


__all__ = [
    "COMMAND_KINDS",
    "EVENT_KINDS",
    "PAYLOAD_FIELDS",
    "SCHEMA_VERSION",
    "ApprovalDenied",
    "ApprovalGranted",
    "ApprovalRequested",
    "Approve",
    "Cancel",
    "Command",
    "Deny",
    "Event",
    "EventDecodeError",
    "ModelFailed",
    "ModelRequested",
    "ModelResponded",
    "PayloadRef",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunStarted",
    "ScriptCompleted",
    "ScriptFailed",
    "ScriptPrinted",
    "ScriptStarted",
    "Task",
    "ToolCalled",
    "ToolCompleted",
    "ToolFailed",
    "TurnCompleted",
    "command_from_json",
    "decode",
    "decode_command",
    "encode",
    "encode_command",
    "externalize",
    "from_json",
    "internalize",
    "kind_of",
    "payload_bytes",
    "script_event",
    "to_json",
    "tool_outcome",
]
