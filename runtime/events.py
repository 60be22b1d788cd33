"""The wire schema: every event a run appends and every command a publisher sends.

Events are the truth: a run's state is `fold(kernel.evolve, events)`, so this module is the contract
between the kernel, the effect runners, the run log (`runtime.log`), `sa replay` and any future writer.
Everything here is a frozen msgspec Struct in one tagged union; the tag field `kind` holds a dotted
name (`run.started`, `tool.completed`, ...) that doubles as the last token of the NATS subject. It is one
file, longer than the rest, on purpose: the union is the schema, read and versioned as a whole.

Wire rules, chosen so that the schema can evolve while old logs stay readable:

* msgpack on the wire (`encode`/`decode`), JSON only for humans (`to_json`/`from_json`).
* Every event carries `v`, the schema version of its writer. It is always encoded (the base sets
  `omit_defaults=False`): a reader must be able to tell an old event from a new one.
* A field added later must have a default; old readers ignore fields they do not know (msgspec's
  default), new readers fill the default for events written before the field existed.
* A kind the reader does not know is an `EventDecodeError` that names the kind, never a silent skip:
  folding a run while skipping an event would produce a state the writer never had.
* A change that is not additive bumps `SCHEMA_VERSION` and comes with an upcaster in `decode`, so a
  log written by an older version folds unchanged. Version 2 renamed the envelope's `agent` (which held
  the actor key `bundle` or `bundle:instance`, not the bundle) to `actor`.

Who fills what: the kernel and the effect runners build events with the run's facts; the run log
(`runtime.log`) stamps `seq`, `ts` (when the builder left it unset) and `actor` as it appends. An
unstamped event has `seq == -1`, and the kernel refuses to fold one: every folded event went through
the log (or through `stamp`, for in-process runs and tests).

Events stay small, so a run's history grows linearly with its work: `model.requested` carries only
the messages added to the conversation since the previous request, never the whole prompt again. An
event that still outgrows a NATS message (a long task input, a reply with megabytes of tool-call
arguments, a big tool output) is stored whole in the object store and the log keeps a stub with its big
fields shrunk and a `PayloadRef` in `ref` (`PAYLOAD_FIELDS`, `externalize`); `internalize` gives the
whole event back. The run log does both, so no writer or reader handles payloads by hand.

A call's sandbox run travels inside its outcome (`ScriptRun` on `tool.completed`/`tool.failed`), not as
`script.*` events of its own: a tool turn is then five appends, not seven. Logs written before hold the
`script.*` events as entries; `expand` gives a reader the same stream from either shape.

This module is over 500 lines because it is one concept, the wire schema: the event and command types,
their encoding, their versions and their stubs must be read (and changed) together.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Annotated, Any, TypeAlias, cast, get_args

import msgspec

from runtime.types import Message, ScriptNote, ToolCall, ToolError, ToolResult, Usage

SCHEMA_VERSION = 2


class EventDecodeError(ValueError):
    """Bytes that are not a valid event or command of this schema; the message says which kind and why."""


class PayloadRef(msgspec.Struct, frozen=True):
    """Where an event's big field lives when it was too large to travel inline (object store entry)."""

    object_name: str
    size: int
    digest: str


UNSTAMPED = -1  # the `seq` of an event not yet appended to a log

# A task's priority at the model endpoint's queue (`runtime.model.limits`): 0 (lowest) to 9 (most urgent); a
# waiting model call of a higher priority is served first, fleet-wide. A task without one takes its bundle's
# `priority:`, else the default.
MIN_PRIORITY, MAX_PRIORITY, DEFAULT_PRIORITY = 0, 9, 5
Priority = Annotated[int, msgspec.Meta(ge=MIN_PRIORITY, le=MAX_PRIORITY)]
PRIORITY_RULE = (f"priority must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY}: {MAX_PRIORITY} is the "
                 f"most urgent (served first), {MIN_PRIORITY} the least; left out, the agent's bundle's "
                 f"`priority:`, else {DEFAULT_PRIORITY}")


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    """Fields every event carries. `seq` is per run, 0-based and contiguous; `ts` (float seconds since
    the epoch) is stamped by the runner — the kernel never reads a clock, it compares these. `actor` is
    the actor key that owns the run: the bundle's name, or `bundle:instance` for an instance."""

    run_id: str
    seq: int = UNSTAMPED
    ts: float = 0.0
    actor: str = ""
    v: int = SCHEMA_VERSION
    ref: PayloadRef | None = None  # set when the event's big fields live in the object store


# ── run lifecycle ─────────────────────────────────────────────────────────────────────────────────────


class RegressionOf(msgspec.Struct, frozen=True, kw_only=True):
    """What marks a regression run (`runtime.regress`): the recorded run it drives again from its task, the
    named set it belongs to and the candidate bundle it runs on. Such a run is a run (replay, diff, fork and
    purge read it), but never production: hosts do not index or resume it, and budgets do not count it."""

    source_run: str
    set: str = ""
    candidate: str = ""  # the candidate's id: its bundle digest, with a hash of its overrides


class RunStarted(_Event, frozen=True, kw_only=True, tag="run.started"):
    """A task was accepted and this run owns it. Carries the task so the log alone can rebuild the run."""

    input: str
    task_id: str | None = None
    instance: str | None = None
    timeout_s: float | None = None  # the deadline is `ts + timeout_s` of this event
    metadata: dict[str, Any] = {}
    bundle_digest: str = ""
    # A run in a thread continues the conversation its thread's previous run ended with, by reference
    # (never a copy, so a long thread does not re-store its history): the messages folded from the events
    # of `previous_run` with seq < `previous_seq` (`runtime.log.threads`).
    thread: str | None = None
    previous_run: str | None = None
    previous_seq: int | None = None
    # A long thread goes on from a summary: its first `summarised` earlier messages are replaced by this
    # text (made by the model when the run started, so recorded here: a replay cannot make it again).
    summary: str | None = None
    summarised: int = 0
    priority: Priority | None = None  # the run's model calls queue at this priority (None: the default)
    regression: RegressionOf | None = None  # set: a regression run, never production (`RegressionOf`)


# What a fork changes at its fork point. Each is recorded in the fork's first event; `output` and `reply`
# are also written as the events they stand for (the call's `tool.completed`, the turn's `model.responded`),
# so folding a fork needs nothing but its own log.


class OutputEdit(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="output"):
    """The call `call_id` (an id of the fork) returned `output`: recorded instead of running the tool."""

    call_id: str
    output: Any = None


class EditedCall(msgspec.Struct, frozen=True):
    """One tool call of an edited model reply (the fork gives it the kernel's id for its turn)."""

    name: str
    arguments: dict[str, Any] = {}


class ReplyEdit(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="reply"):
    """The model answered the pending request with this text and these calls instead."""

    content: str = ""
    calls: tuple[EditedCall, ...] = ()


class BundleEdit(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="bundle"):
    """The fork goes on with another version of the agent's bundle (its digest; `path` where it was read)."""

    digest: str
    path: str = ""


class SystemEdit(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind", tag="system"):
    """The fork goes on with this system prompt in place of the bundle's (the conversation's first one)."""

    system_prompt: str


ForkEdit: TypeAlias = OutputEdit | ReplyEdit | BundleEdit | SystemEdit


class RunForked(RunStarted, frozen=True, kw_only=True, tag="run.forked"):
    """The first event of a fork: a `run.started` (the source's task, re-addressed) that also says where the
    run came from. The fork's events before `source_seq` are the source's, with every id re-derived for
    this run; the source's recorded model replies and tool results are reused, never made again. Its `ts`
    is when the fork was made, so its deadline (`timeout_s`) counts from then."""

    source_run: str
    source_seq: int  # the fork kept the source's events with seq < source_seq
    edit: ForkEdit | None = None
    # the system prompt the run uses instead of its bundle's: set by a system edit, kept by forks of a fork
    system_prompt: str | None = None


class RunCompleted(_Event, frozen=True, kw_only=True, tag="run.completed"):
    output: Any = None


class RunFailed(_Event, frozen=True, kw_only=True, tag="run.failed"):
    reason: str
    detail: str = ""


class RunCancelled(_Event, frozen=True, kw_only=True, tag="run.cancelled"):
    reason: str = ""
    by: str = ""


class TurnCompleted(_Event, frozen=True, kw_only=True, tag="turn.completed"):
    """A model reply and every call it made are resolved; the tool results now join the conversation."""

    turn: int
    calls_ok: int = 0
    calls_failed: int = 0


# ── model ─────────────────────────────────────────────────────────────────────────────────────────────


class ModelRequested(_Event, frozen=True, kw_only=True, tag="model.requested"):
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
    provider: str = ""  # who serves the model (`gen_ai.provider.name`: vllm, openai, ...)
    server: str = ""  # the model server's host:port (`server.address`, `server.port`)
    dialect: str = ""  # the request dialect spoken (`runtime.model.dialects`: vllm, sglang, ...; "": older)
    unconstrained: bool = False  # the request carried no decoding constraint (`constraint: {strategy: none}`)


class ModelResponded(_Event, frozen=True, kw_only=True, tag="model.responded"):
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
    model: str = ""  # the model that answered, as the server named it (traces: `gen_ai.response.model`)
    response_id: str = ""  # the server's id for the completion (traces: `gen_ai.response.id`)
    queued_ms: float = 0.0  # of `latency_ms`, the time spent waiting for the endpoint's limits and budgets


class ModelThrottled(_Event, frozen=True, kw_only=True, tag="model.throttled"):
    """The model call `request_id` was held back and waits `wait_s` before its next attempt: the server
    answered `status` 429 or 503 (its `Retry-After` in `retry_after`, None without one; the wait is that,
    bounded, plus jitter), or (`status` 0) a budget holds it until it has room again (`reason` names it).
    It explains a wait and is an input to replay: the same call goes on, the kernel ignores this event, and
    it is never counted as a model call of its own."""

    request_id: str
    turn: int
    status: int = 0
    wait_s: float = 0.0
    retry_after: float | None = None
    attempt: int = 1  # the attempt that was refused (1: the call's first request)
    reason: str = ""


class ModelFailed(_Event, frozen=True, kw_only=True, tag="model.failed"):
    """The model call produced no reply (after the client's own retries): timeout, HTTP error, ..."""

    request_id: str
    turn: int
    error: str
    error_kind: str = "error"


# ── tools ─────────────────────────────────────────────────────────────────────────────────────────────


class ToolCalled(_Event, frozen=True, kw_only=True, tag="tool.called"):
    """A call was dispatched for execution (allowed by every policy, approved if it needed approval)."""

    call: ToolCall


class PrintedLine(msgspec.Struct, frozen=True, array_like=True):
    """One chunk a script printed, and when (what a `script.printed` event records)."""

    ts: float
    text: str


class ScriptRun(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """The sandbox run behind a call, carried by the call's `tool.completed` / `tool.failed` (`script`).

    Why inside the outcome and not events of its own: the facts of a script run (when it started, on which
    worker, what it printed, how long the sandbox took, how it ended) arrive all at once, with the call's
    result, and the kernel ignores them. As separate `script.*` events they cost a tool turn two or more
    log appends (each one message and one round trip) for nothing the run's state needs; carried here, a
    tool turn is five appends. Readers that show the detail get the `script.*` events back from
    `expand` (exactly those an older writer appended), so logs of either shape read alike.

    `started`, `ended` (None: the run never reported an end, say it was cut off by a deadline) and each
    line's `ts` are the sandbox's own wall-clock times; `duration_ms` is its own measure of the run.
    `worker` is the tool worker's name, else the sandbox's pid. `failed`: the run ended in `script.failed`,
    whose error is the outcome's own unless `error` says otherwise (a script that completed can still end
    in `tool.failed`, say when its writes could not be persisted: then `failed` is False)."""

    started: float
    worker: str = ""
    printed: tuple[PrintedLine, ...] = ()
    ended: float | None = None
    duration_ms: float = 0.0
    failed: bool = False
    error: ToolError | None = None


class ToolCompleted(_Event, frozen=True, kw_only=True, tag="tool.completed"):
    """A call returned `output`; `script` is the sandbox run that made it (None for a tool that is no
    script, and in logs written before it was carried here: those have `script.*` events)."""

    call_id: str
    tool: str
    output: Any = None
    duration_ms: float = 0.0
    script: ScriptRun | None = None


class ToolFailed(_Event, frozen=True, kw_only=True, tag="tool.failed"):
    """A call ended in an error value: from the tool, a denying policy or approver, or an unknown tool.
    `script` is the sandbox run behind it, as on `tool.completed`."""

    call_id: str
    tool: str
    error: ToolError
    duration_ms: float = 0.0
    script: ScriptRun | None = None


# Script events explain a call and the kernel ignores them. Logs written before the `script` field of a
# call's outcome hold them as entries of their own; newer logs carry them in the outcome (`ScriptRun`), and
# `expand` gives them back as virtual events, so every reader sees the same stream.


class ScriptStarted(_Event, frozen=True, kw_only=True, tag="script.started"):
    call_id: str
    tool: str
    worker: str = ""


class ScriptPrinted(_Event, frozen=True, kw_only=True, tag="script.printed"):
    call_id: str
    tool: str
    text: str


class ScriptCompleted(_Event, frozen=True, kw_only=True, tag="script.completed"):
    call_id: str
    tool: str
    duration_ms: float = 0.0


class ScriptFailed(_Event, frozen=True, kw_only=True, tag="script.failed"):
    call_id: str
    tool: str
    error: ToolError
    duration_ms: float = 0.0


class ToolRedelivered(_Event, frozen=True, kw_only=True, tag="tool.redelivered"):
    """The outcome that follows came from delivery `attempt` (> 1) of the call's tool job, on `worker`:
    the earlier deliveries ended without an outcome, and `earlier` says why, one line each (a worker that
    stopped heartbeating: killed, cut off from NATS or stalled; or one that gave the job back after NATS
    trouble). Stamped at the time that delivery began, so it explains the gap before it in a timeline.
    It explains a call; the kernel ignores it."""

    call_id: str
    tool: str
    attempt: int
    worker: str = ""
    earlier: tuple[str, ...] = ()


class RunTaken(_Event, frozen=True, kw_only=True, tag="run.taken"):
    """Host `host` took the run over, holding the lease of its partition at revision `lease`, and fences
    whoever drove it before: appended before the new owner drives the run (at the takeover of its
    partition, or when it folds back a run nothing drove), so the previous owner's next append, which
    expects the run's last stream sequence as that owner knew it, is refused by the log itself even if
    the new owner has not yet done a step (a paused or slow host woken up cannot add a stale event).
    It records who drives the run from here; the kernel ignores it."""

    host: str
    lease: int = 0


# ── approvals ─────────────────────────────────────────────────────────────────────────────────────────


class ApprovalRequested(_Event, frozen=True, kw_only=True, tag="approval.requested"):
    """A call waits for a person (its tool's approval rule applies, `runtime.approval_policy`). The rest
    is what an operator needs, from the log alone: which `condition` made it wait, the tool's argument
    schema (`parameters`, what edited arguments are checked against), who may decide (`role`), and, with
    `timeout_s`, the verdict that applies once `ts + timeout_s` passes without a decision (`on_timeout`:
    the kernel decides it from event timestamps, as it does the run's deadline)."""

    call: ToolCall
    condition: str = ""
    parameters: dict[str, Any] = {}
    role: str = ""
    timeout_s: float | None = None
    on_timeout: str = "deny"


class ApprovalGranted(_Event, frozen=True, kw_only=True, tag="approval.granted"):
    """The call may run; with `arguments`, it runs with these (an operator's edit, checked against the
    tool's schema) instead of the model's. `by` is the deciding operator, or `timeout`."""

    call_id: str
    by: str = ""
    arguments: dict[str, Any] | None = None
    note: str = ""


class ApprovalDenied(_Event, frozen=True, kw_only=True, tag="approval.denied"):
    call_id: str
    reason: str = ""
    by: str = ""


# ── timers ────────────────────────────────────────────────────────────────────────────────────────


class TimerStarted(_Event, frozen=True, kw_only=True, tag="timer.started"):
    """A call of a timer tool (`runtime.timers`: `sleep`, `wait_until`) waits until `due` (unix seconds).
    The kernel decides it (the due time follows from the call's arguments and the `ts` of the event before
    it), so a replay reproduces it; the call then waits for `timer.fired` as a call waits for its result,
    and a host parks the run meanwhile (`runtime.schedules` holds its wake-up)."""

    call_id: str
    tool: str
    due: float


class TimerFired(_Event, frozen=True, kw_only=True, tag="timer.fired"):
    """The timer of call `call_id` fired: the call now has its result (when it was due, when it woke). `by`
    says what woke it: `schedule` (the cluster's scheduled wake-up) or `host` (a host found it due)."""

    call_id: str
    by: str = ""


# ── questions ─────────────────────────────────────────────────────────────────────────────────────


class QuestionAsked(_Event, frozen=True, kw_only=True, tag="question.asked"):
    """A call of `ask_human` (`runtime.questions`), or a running call that needs a person (`resume`), waits
    for a person's answer to `question`, which must fit
    `schema` (a JSON schema; None: any JSON value). The kernel decides it (its timeout `due` follows from
    the `ts` of the event before it), so a replay reproduces it; the call then waits for
    `question.answered` as a call waits for its result, and a host parks the run meanwhile. At `due`
    (None: never) the call gets `default` if `has_default` (a default may be null), else a `timeout` error."""

    call_id: str
    question: str
    schema: dict[str, Any] | None = None
    due: float | None = None
    timeout_s: float | None = None
    default: Any = None
    has_default: bool = False
    # set when a running tool call (not `ask_human`) put the question: what the call needs to go on once
    # answered, `runtime.questions.resumed` (an in-doubt call's "re-call or fail?", an MCP server's request
    # for input); `round` is the call's round it came from (each answer sends the call out again, one up)
    resume: dict[str, Any] | None = None
    round: int = 0


class QuestionAnswered(_Event, frozen=True, kw_only=True, tag="question.answered"):
    """The question of call `call_id` has its answer (checked against its schema before it was recorded):
    the call's result is `{"answer": answer}`. `by` is the operator who answered, or `timeout` when the
    bundle's default answered it."""

    call_id: str
    answer: Any = None
    by: str = ""


Event: TypeAlias = (
    RunStarted
    | RunForked
    | ModelRequested
    | ModelResponded
    | ModelFailed
    | ModelThrottled
    | ToolCalled
    | ScriptStarted
    | ScriptPrinted
    | ScriptCompleted
    | ScriptFailed
    | ToolRedelivered
    | RunTaken
    | ToolCompleted
    | ToolFailed
    | ApprovalRequested
    | ApprovalGranted
    | ApprovalDenied
    | TimerStarted
    | TimerFired
    | QuestionAsked
    | QuestionAnswered
    | TurnCompleted
    | RunCompleted
    | RunFailed
    | RunCancelled
)
EVENT_TYPES: tuple[type[_Event], ...] = get_args(Event)


def _tag(cls: type[msgspec.Struct]) -> str:
    """The tag of one of this module's Structs (always a string here; msgspec also allows int tags)."""
    return cast(str, cls.__struct_config__.tag)


EVENT_KINDS: dict[str, type[_Event]] = {_tag(cls): cls for cls in EVENT_TYPES}


def kind_of(ev: Event) -> str:
    """The dotted kind of an event (its tag), e.g. for the subject `events.<agent>.<run>.<kind>`."""
    return _tag(type(ev))


def stamp(ev: Event, *, seq: int, ts: float | None = None, actor: str | None = None) -> Event:
    """`ev` as appended: its place in the run (`seq`), a time when the builder set none (`ts`; an event
    that carries its own time, like a worker's `tool.completed`, keeps it) and the actor key. Written by the
    current schema version, whatever version it was read from."""
    changes: dict[str, Any] = {"seq": seq, "v": SCHEMA_VERSION}
    if ts is not None and not ev.ts:
        changes["ts"] = ts
    if actor is not None:
        changes["actor"] = actor
    return msgspec.structs.replace(ev, **changes)


def same_fact(a: Event, b: Event) -> bool:
    """True when two events record the same fact: equal but for where and when they were appended
    (`seq`, `ts`, `actor`, `v`). How `sa replay --verify` compares what the kernel decides with the log."""
    if type(a) is not type(b):
        return False
    envelope = {"seq", "ts", "actor", "v"}
    return all(getattr(a, f) == getattr(b, f) for f in a.__struct_fields__ if f not in envelope)


def tool_outcome(run_id: str, call_id: str, tool: str, result: ToolResult) -> ToolCompleted | ToolFailed:
    """The event recording a tool's result: `tool.completed` with the output, or `tool.failed` with the
    error (unstamped). One mapping, so every runner records results alike."""
    if result.error is None:
        return ToolCompleted(run_id=run_id, call_id=call_id, tool=tool, output=result.output,
                             duration_ms=result.duration_ms)
    return ToolFailed(run_id=run_id, call_id=call_id, tool=tool, error=result.error,
                      duration_ms=result.duration_ms)


def tool_result(ev: ToolCompleted | ToolFailed) -> ToolResult:
    """The tool result an outcome event records: the inverse of `tool_outcome`."""
    if isinstance(ev, ToolCompleted):
        return ToolResult(output=ev.output, duration_ms=ev.duration_ms)
    return ToolResult(error=ev.error, duration_ms=ev.duration_ms)


def script_event(note: ScriptNote, run_id: str, call_id: str, tool: str, *, worker: str = "") -> Event:
    """The `script.*` event recording one sandbox note (unstamped, at the note's own time):
    `script.started` (on `worker`, else the sandbox pid), `script.printed`, `script.completed` or
    `script.failed`. How notes that do not fit one `ScriptRun` are still recorded (`outcome_events`)."""
    ids: dict[str, Any] = {"run_id": run_id, "ts": note.ts, "call_id": call_id, "tool": tool}
    if note.kind == "started":
        return ScriptStarted(**ids, worker=_worker(note, worker))
    if note.kind == "printed":
        return ScriptPrinted(**ids, text=note.text)
    if note.kind == "completed":
        return ScriptCompleted(**ids, duration_ms=note.duration_ms)
    return ScriptFailed(**ids, error=_note_error(note), duration_ms=note.duration_ms)


def _worker(note: ScriptNote, worker: str) -> str:
    return worker or (str(note.worker_pid) if note.worker_pid else "")


def _note_error(note: ScriptNote) -> ToolError:
    return note.error or ToolError("execution", note.text or "script failed")


def script_run(notes: Sequence[ScriptNote], *, worker: str = "",
               error: ToolError | None = None) -> ScriptRun | None:
    """The notes of one sandbox run as the `ScriptRun` its call's outcome carries, or None when they are not
    one run's shape (`started`, any `printed`, at most one `completed`/`failed`, in that order). `error` is
    the outcome's own error: a `failed` note with the same one does not store it twice."""
    if not notes or notes[0].kind != "started":
        return None
    first, body, last = notes[0], list(notes[1:]), None
    if body and body[-1].kind in ("completed", "failed"):
        last = body.pop()
    if any(n.kind != "printed" for n in body):
        return None
    fields: dict[str, Any] = {"started": first.ts, "worker": _worker(first, worker),
                              "printed": tuple(PrintedLine(n.ts, n.text) for n in body)}
    if last is not None:
        fields.update(ended=last.ts, duration_ms=last.duration_ms)
        if last.kind == "failed":
            failed = _note_error(last)
            fields.update(failed=True, error=None if failed == error else failed)
    return ScriptRun(**fields)


def outcome_events(run_id: str, call_id: str, tool: str, result: ToolResult,
                   notes: Sequence[ScriptNote] = (), *, worker: str = "") -> list[Event]:
    """The events recording a call's result and the sandbox notes that explain it (unstamped): one
    `tool.completed`/`tool.failed` carrying the notes as its `script`. Notes that are not one run's shape
    (this runtime's sandbox never makes them; a worker of another version might) are kept whole instead,
    as separate `script.*` events before the outcome, the way older versions recorded every run: nothing a
    worker reported is dropped. How a tool worker's outcome and an in-process call are recorded alike."""
    outcome = tool_outcome(run_id, call_id, tool, result)
    if not notes:
        return [outcome]
    run = script_run(notes, worker=worker, error=result.error)
    if run is None:
        return [*(script_event(n, run_id, call_id, tool, worker=worker) for n in notes), outcome]
    return [msgspec.structs.replace(outcome, script=run)]


def expand(event: Event) -> list[Event]:
    """`event` as the detailed view reads it: a call's outcome carrying a `ScriptRun` becomes the
    `script.started`, `script.printed`…, `script.completed`/`script.failed` events an older writer appended
    for it (same kinds, times and fields), then the outcome itself without `script`; any other event is
    itself. So `sa replay`, the inspector, traces and describe show a run the same whichever shape its log
    has, and an old log (separate `script.*` entries) passes through unchanged.

    The virtual events are not log entries: they carry the `seq` (and `actor`, `v`) of the entry that
    holds them. So everything that counts, forks, follows or links by seq counts log entries only, and a
    virtual event names the entry to open, fork before or fetch."""
    if not isinstance(event, ToolCompleted | ToolFailed) or event.script is None:
        return [event]
    run = event.script
    ids: dict[str, Any] = {"run_id": event.run_id, "seq": event.seq, "actor": event.actor, "v": event.v,
                           "call_id": event.call_id, "tool": event.tool}
    out: list[Event] = [ScriptStarted(**ids, ts=run.started, worker=run.worker)]
    out.extend(ScriptPrinted(**ids, ts=line.ts, text=line.text) for line in run.printed)
    if run.ended is not None and run.failed:
        error = run.error or (event.error if isinstance(event, ToolFailed) else
                              ToolError("execution", "script failed"))
        out.append(ScriptFailed(**ids, ts=run.ended, error=error, duration_ms=run.duration_ms))
    elif run.ended is not None:
        out.append(ScriptCompleted(**ids, ts=run.ended, duration_ms=run.duration_ms))
    out.append(msgspec.structs.replace(event, script=None))
    return out


def expand_all(events: Iterable[Event]) -> list[Event]:
    """Every event of a log as the detailed view reads it (`expand`), in order."""
    return [part for event in events for part in expand(event)]


# ── commands ──────────────────────────────────────────────────────────────────────────────────────────


class _Command(msgspec.Struct, frozen=True, kw_only=True, tag_field="kind"):
    v: int = SCHEMA_VERSION


class Task(_Command, frozen=True, kw_only=True, tag="task"):
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
    thread: str | None = None  # a conversation: the run continues where the thread's previous run ended
    # an input too big for one message: stored in the payload object store (msgpack of the text), `input`
    # left empty; the host reads it back when it starts the run (`runtime.client.submit` writes it)
    input_ref: PayloadRef | None = None
    priority: Priority | None = None  # 0..9: higher overtakes lower at the model endpoint (None: bundle)


class Cancel(_Command, frozen=True, kw_only=True, tag="cancel"):
    run_id: str
    reason: str = ""
    by: str = ""


class Approve(_Command, frozen=True, kw_only=True, tag="approve"):
    """Let a waiting call run; with `arguments`, with these instead of the model's (`runtime.client.control`).
    """

    run_id: str
    call_id: str
    by: str = ""
    arguments: dict[str, Any] | None = None
    note: str = ""


class Deny(_Command, frozen=True, kw_only=True, tag="deny"):
    run_id: str
    call_id: str
    reason: str = ""
    by: str = ""


class Resume(_Command, frozen=True, kw_only=True, tag="resume"):
    """Drive the existing run `run_id` now: sent to the host serving the run's partition after a run was
    written by someone else than a host (a fork), so it need not wait for the next takeover."""

    run_id: str


class Wake(_Command, frozen=True, kw_only=True, tag="wake"):
    """The timer of call `call_id` of run `run_id` is due: the cluster's clock (a scheduled message,
    `runtime.schedules`) sends it, through any host, to the host serving the run's partition, which folds
    the parked run and records `timer.fired`. A wake for a timer that already fired changes nothing."""

    run_id: str
    call_id: str


class Answer(_Command, frozen=True, kw_only=True, tag="answer"):
    """Answer the question call `call_id` of run `run_id` asks (`ask_human`): `answer` must fit the question's
    schema (`runtime.client.control` checks it, the host again); a second answer changes nothing."""

    run_id: str
    call_id: str
    answer: Any = None
    by: str = ""


Command: TypeAlias = Task | Cancel | Approve | Deny | Resume | Wake | Answer
COMMAND_TYPES: tuple[type[_Command], ...] = get_args(Command)
COMMAND_KINDS: dict[str, type[_Command]] = {_tag(cls): cls for cls in COMMAND_TYPES}


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


# What a field's value must be, said in words where msgspec's own message (`Expected int <= 9`) does not
# say what the number means.
_FIELD_RULES = {"priority": PRIORITY_RULE}


def _field_value(data: bytes | str, name: str) -> Any:
    """The value a message gives field `name` (JSON or msgpack), to show it in an error; None if unread."""
    try:
        if isinstance(data, str) or data.lstrip()[:1] == b"{":
            obj = msgspec.json.decode(data)
        else:
            obj = msgspec.msgpack.decode(data)
    except msgspec.DecodeError:
        return None
    return obj.get(name) if isinstance(obj, dict) else None


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
        field = next((name for name in _FIELD_RULES if str(exc).endswith(f"- at `$.{name}`")), None)
        if field is not None:
            got = _field_value(data, field)
            raise EventDecodeError(f"invalid {what} {head.kind!r}: {_FIELD_RULES[field]}; got {got!r}"
                                   ) from exc
        raise EventDecodeError(f"invalid {what} {head.kind!r}: {exc}") from exc


def encode(ev: Event | Command) -> bytes:
    """msgpack bytes for the wire (events and commands alike)."""
    return _msgpack.encode(ev)


class _V1Envelope(msgspec.Struct):
    """What version 1 called the actor key."""

    agent: str = ""


def _upcast(ev: Event, envelope: Callable[[], _V1Envelope]) -> Event:
    """An event of an older schema version in the current shape (the one place old logs are adapted).

    v1 -> v2: the envelope field `agent` (the actor key) became `actor`. A v2 reader ignores the unknown
    `agent` key, so `envelope` reads it again from the same bytes, only for v1 events (new logs pay
    nothing)."""
    if ev.v >= SCHEMA_VERSION:
        return ev
    old = envelope()
    return msgspec.structs.replace(ev, actor=old.agent) if old.agent else ev


def decode(data: bytes) -> Event:
    """One event from msgpack bytes; `EventDecodeError` names an unknown kind or the invalid field.
    Events written by an older schema version come back upcast to the current one."""
    event = _decode(
        data, _event_msgpack, lambda d: msgspec.msgpack.decode(d, type=_Peek), EVENT_KINDS, "event"
    )
    if event.v >= SCHEMA_VERSION:
        return event
    return _upcast(event, lambda: msgspec.msgpack.decode(data, type=_V1Envelope))


_raw_list = msgspec.msgpack.Decoder(list[msgspec.Raw])


def encode_group(encoded: Sequence[bytes]) -> bytes:
    """Several events, each already encoded (`encode`, or a stub's), as one message of the log: a msgpack
    array of them. Why: the writer of a run often has a few events ready at once (an outcome, the turn's
    end, the next model request), and one message is one round trip and one disk sync where one message
    each is several, in a row (each append expects the previous one's position). The array also lands or
    fails as a whole. An event alone stays a message of its own (a msgpack map), so a log written before
    groups existed reads as it always did."""
    return _msgpack.encode([msgspec.Raw(data) for data in encoded])


def is_group(data: bytes) -> bool:
    """Whether a stored message holds several events (`encode_group`: an array) rather than one (a map)."""
    return bool(data) and (0x90 <= data[0] <= 0x9F or data[0] in (0xDC, 0xDD))


def check_stamped(event: Event) -> None:
    """An unstamped event is a bug of its writer: every run log refuses it (`stamp` it first)."""
    if event.seq < 0 or not event.actor:
        raise ValueError(f"{kind_of(event)} of run {event.run_id} is not stamped: use events.stamp")


# each a message of its own, never in a group: readers find a run's start and its fences by their subjects
ALONE = (RunStarted, RunTaken)


def check_group(events: Sequence[Event]) -> None:
    """What every run log refuses in a group (`encode_group`): unstamped, another run's, an `ALONE` event."""
    for event in events:
        check_stamped(event)
        if event.run_id != events[0].run_id:
            raise ValueError(f"a group holds the events of one run: {event.run_id} is not {events[0].run_id}")
        if isinstance(event, ALONE):
            raise ValueError(f"{kind_of(event)} is a message of its own, never in a group")


def decode_all(data: bytes) -> list[Event]:
    """The events of one stored message, in order: one for a message of its own, several for a group
    (`encode_group`). `EventDecodeError` as `decode` raises it."""
    if not is_group(data):
        return [decode(data)]
    try:
        parts = _raw_list.decode(data)
    except msgspec.DecodeError as exc:
        raise EventDecodeError(f"not a valid group of events: {exc}") from exc
    if not parts:
        raise EventDecodeError("an empty group of events: a writer stores at least one")
    return [decode(bytes(part)) for part in parts]


def to_json(ev: Event | Command, *, indent: int = 0) -> str:
    """JSON for humans (`sa replay --json`, logs); `indent > 0` pretty-prints. The C1 control characters
    (U+0080-U+009F) are escaped too, though JSON allows them raw: a model's or a tool's text printed to a
    terminal must not carry a CSI or an OSC that the terminal would act on. Outside strings JSON has no
    such characters, so the escape cannot change what the text decodes to."""
    text = msgspec.json.encode(ev)
    out = (msgspec.json.format(text, indent=indent) if indent else text).decode()
    return _C1.sub(lambda m: f"\\u{ord(m.group()):04x}", out)


_C1 = re.compile("[\u0080-\u009f]")


def from_json(data: str | bytes) -> Event:
    event = _decode(data, _event_json, lambda d: msgspec.json.decode(d, type=_Peek), EVENT_KINDS, "event")
    if event.v >= SCHEMA_VERSION:
        return event
    return _upcast(event, lambda: msgspec.json.decode(data, type=_V1Envelope))


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

# The fields of each kind that can outgrow one NATS message. An event whose encoding is over the payload
# threshold has these fields stored in the object store; the log keeps a stub: the same event with them
# shrunk (ids, names and error kinds kept, so a stub still says what happened) and `ref` pointing at them.
# A kind with one such field stores its value alone, so a tool output a worker already stored (the same
# bytes, the same content address) is not stored twice.
PAYLOAD_FIELDS: dict[type[_Event], tuple[str, ...]] = {
    RunStarted: ("input", "metadata"),
    RunForked: ("input", "metadata", "edit"),
    ModelRequested: ("messages",),
    ModelResponded: ("text", "content", "calls"),
    ModelFailed: ("error",),
    ToolCalled: ("call",),
    # A call's `script` stays in the stub: the worker caps what a run printed (`runtime.log.payloads`) so
    # its whole outcome fits one message, and a kind with one big field stores its value alone (above).
    ToolCompleted: ("output",),
    ToolFailed: ("error",),
    ScriptPrinted: ("text",),  # a log from before `ScriptRun` has these as entries of their own
    ScriptFailed: ("error",),
    ApprovalRequested: ("call",),
    ApprovalGranted: ("arguments",),
    ApprovalDenied: ("reason",),
    RunCompleted: ("output",),
    RunFailed: ("detail",),
    RunCancelled: ("reason",),
}
# Version 1 offloaded one field of fewer kinds; its stubs are still read (RunStarted's was `input` alone).
_V1_PAYLOAD_FIELDS: dict[type[_Event], tuple[str, ...]] = {
    RunStarted: ("input",), ModelRequested: ("messages",), ModelResponded: ("text",),
    ToolCompleted: ("output",), RunCompleted: ("output",),
}
_FIELD_TYPES: dict[tuple[type[_Event], str], Any] = {
    (cls, f.name): f.type for cls in PAYLOAD_FIELDS for f in msgspec.structs.fields(cls)
}


def _shrunk(value: Any) -> Any:
    """A field's stand-in in a stub: empty, but a call keeps its id and name, an error its kind."""
    if isinstance(value, str):
        return ""
    if isinstance(value, ToolCall):
        return ToolCall(value.id, value.name, {})
    if isinstance(value, ToolError):
        return ToolError(value.kind, "", value.line, value.detail)
    if isinstance(value, tuple):
        return tuple(_shrunk(v) for v in value if isinstance(v, ToolCall))
    if isinstance(value, dict):
        return {}
    return None


def can_offload(ev: Event) -> bool:
    """True if a stub of this kind is smaller than the event (it has fields that can be big)."""
    return type(ev) in PAYLOAD_FIELDS


def payload_bytes(ev: Event) -> bytes:
    """What goes to the object store for a big event: its big fields in msgpack (one field: its value)."""
    fields = PAYLOAD_FIELDS[type(ev)]
    if len(fields) == 1:
        return _msgpack.encode(getattr(ev, fields[0]))
    return _msgpack.encode({name: getattr(ev, name) for name in fields})


def externalize(ev: Event, ref: PayloadRef) -> Event:
    """The stub the log keeps for a big event whose `payload_bytes` are stored at `ref`."""
    cls = type(ev)
    shrunk = {name: None if _FIELD_TYPES[cls, name] is Any else _shrunk(getattr(ev, name))
              for name in PAYLOAD_FIELDS[cls]}
    return msgspec.structs.replace(ev, **shrunk, ref=ref)


def internalize(stub: Event, data: bytes) -> Event:
    """The inverse of `externalize`: the stub with its big fields put back from the stored bytes, typed."""
    cls = type(stub)
    fields = (_V1_PAYLOAD_FIELDS if stub.v < 2 else PAYLOAD_FIELDS)[cls]
    try:
        if len(fields) == 1:
            values = {fields[0]: msgspec.msgpack.decode(data, type=_FIELD_TYPES[cls, fields[0]])}
        else:
            raw = msgspec.msgpack.decode(data, type=dict[str, Any])
            values = {name: msgspec.convert(raw[name], type=_FIELD_TYPES[cls, name]) for name in fields}
    except (msgspec.DecodeError, KeyError) as exc:
        raise EventDecodeError(f"the stored payload of {kind_of(stub)} seq {stub.seq} of run {stub.run_id} "
                               f"does not hold its fields {', '.join(fields)}: {exc}") from exc
    return msgspec.structs.replace(stub, **values, ref=None)


__all__ = [
    "ALONE",
    "COMMAND_KINDS",
    "DEFAULT_PRIORITY",
    "EVENT_KINDS",
    "MAX_PRIORITY",
    "MIN_PRIORITY",
    "PAYLOAD_FIELDS",
    "PRIORITY_RULE",
    "SCHEMA_VERSION",
    "UNSTAMPED",
    "Answer",
    "ApprovalDenied",
    "ApprovalGranted",
    "ApprovalRequested",
    "Approve",
    "BundleEdit",
    "Cancel",
    "Command",
    "Deny",
    "EditedCall",
    "Event",
    "EventDecodeError",
    "ForkEdit",
    "ModelFailed",
    "ModelRequested",
    "ModelResponded",
    "ModelThrottled",
    "OutputEdit",
    "PayloadRef",
    "PrintedLine",
    "Priority",
    "QuestionAnswered",
    "QuestionAsked",
    "RegressionOf",
    "ReplyEdit",
    "Resume",
    "RunCancelled",
    "RunCompleted",
    "RunFailed",
    "RunForked",
    "RunStarted",
    "RunTaken",
    "ScriptCompleted",
    "ScriptFailed",
    "ScriptPrinted",
    "ScriptRun",
    "ScriptStarted",
    "SystemEdit",
    "Task",
    "TimerFired",
    "TimerStarted",
    "ToolCalled",
    "ToolCompleted",
    "ToolFailed",
    "ToolRedelivered",
    "TurnCompleted",
    "Wake",
    "can_offload",
    "check_group",
    "check_stamped",
    "command_from_json",
    "decode",
    "decode_all",
    "decode_command",
    "encode",
    "encode_command",
    "encode_group",
    "expand",
    "expand_all",
    "externalize",
    "from_json",
    "internalize",
    "is_group",
    "kind_of",
    "outcome_events",
    "payload_bytes",
    "same_fact",
    "script_event",
    "script_run",
    "stamp",
    "to_json",
    "tool_outcome",
    "tool_result",
]
