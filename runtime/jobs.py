"""The two wire messages between an agent host and the tool workers: `ToolJob` and `ToolOutcome`.

The host publishes a `ToolJob` to `tools.<tool>` (stream TOOLS) with `Nats-Msg-Id = job.msg_id`, so a
re-published job (host crash and recovery) is stored once. A worker runs it and publishes a
`ToolOutcome` to `results.<partition>.<agent>.<run>` (stream RESULTS) with the same Msg-Id, so a job run
twice (worker crash after publishing, before acking) yields one outcome. The host turns an outcome into
events with `ToolOutcome.events()`: the worker never appends to EVENTS, so the host stays the single
writer of each run and a run's sequence stays contiguous: one writer per run is what lets appends use an
expected sequence.

Both are msgspec Structs in msgpack, versioned like the events: new fields get defaults. Version 2 named
the actor key (`bundle` or `bundle:instance`) `actor` where version 1 said `agent`; a version-1 message
still in a stream during an upgrade is read with its `agent` as the actor.
"""

from __future__ import annotations

import time
from typing import Any

import msgspec

from runtime import events as ev
from runtime.nats.subjects import job_msg_id, result_subject, tool_subject
from runtime.types import ScriptNote, ToolResult

JOB_VERSION = 2


class JobDecodeError(ValueError):
    """Bytes on TOOLS or RESULTS that are not a job/outcome of this schema (the message says why)."""


class _V1(msgspec.Struct):
    """What version 1 called the actor key."""

    agent: str = ""


class _Message(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """What a job and its outcome share: the run, the actor that owns it, the call, the version, and
    the Msg-Id that makes a re-sent one a duplicate."""

    run_id: str
    actor: str = ""
    call_id: str
    tool: str
    v: int = JOB_VERSION
    round: int = 0  # > 0: the call sent out again after a person answered the question it put

    @property
    def msg_id(self) -> str:
        """`<run>/<call>`, and `#<round>` after it for a later round (a new message, not a duplicate)."""
        base = job_msg_id(self.run_id, self.call_id)
        return f"{base}#{self.round}" if self.round else base

    def headers(self) -> dict[str, str]:
        return {"Nats-Msg-Id": self.msg_id}

    def encode(self) -> bytes:
        return _enc.encode(self)


def _decoded(data: bytes, decoder: msgspec.msgpack.Decoder[Any], what: str) -> Any:
    try:
        message = decoder.decode(data)
        if message.v < 2:  # now in the current shape
            old = msgspec.msgpack.decode(data, type=_V1).agent
            message = msgspec.structs.replace(message, actor=old or message.actor, v=JOB_VERSION)
        return message
    except msgspec.DecodeError as e:
        raise JobDecodeError(f"not a {what}: {e}") from None


class ToolJob(_Message, frozen=True, kw_only=True, omit_defaults=True):
    """One tool call to execute. Everything a worker needs travels with it: no lookup in the run's log.

    `limits` is the resolved per-tool `Limits.to_dict()` (bundle global merged with the tool's own), so a
    worker applies exactly what the host decided even if its local bundle copy differs. `deadline` is
    unix time: a job picked up after it is answered with a `timeout` failure without running.
    `partition` routes the outcome back to the host that owns the run. `tool_digest` is the version of the
    tool the host resolved from its bundle (the tool's content hash; the actor names the bundle): a worker
    runs exactly that version, and one that lacks it leaves the job to a worker that has it or fails it
    naming the version (`runtime.worker.handoff`); "" (older hosts) means any version of the name.
    Arguments too big for one message (a model can write megabytes of them) travel in the object store:
    `arguments` is then empty and `arguments_ref` says where they are; the worker resolves them before
    running the tool.
    """

    arguments: dict[str, Any] = {}
    arguments_ref: ev.PayloadRef | None = None
    partition: int = 0
    limits: dict[str, Any] = {}
    workspace: str | None = None
    deadline: float | None = None
    tool_digest: str = ""  # the version the run's host resolved (content hash): exactly what a worker runs
    # a later round's instructions (`runtime.questions.resumed`): re-call a call in doubt, or give an MCP
    # server the answer to its request for input
    resume: dict[str, Any] | None = None

    @property
    def subject(self) -> str:
        return tool_subject(self.tool)

    @classmethod
    def decode(cls, data: bytes) -> ToolJob:
        result: ToolJob = _decoded(data, _job_dec, "tool job")
        return result


class Ask(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A question a running call puts to a person (`runtime.questions`): what to ask, the schema the answer
    must fit, and how the call goes on once answered."""

    question: str
    schema: dict[str, Any] | None = None
    resume: dict[str, Any] = {}


class ToolOutcome(_Message, frozen=True, kw_only=True, omit_defaults=True):
    """What became of one `ToolJob`: the final result plus the script notes that explain it (the
    `ScriptNote`s exactly as the sandbox emitted them; the host folds them into the outcome's event)."""

    partition: int = 0
    result: ToolResult
    notes: tuple[ScriptNote, ...] = ()
    worker: str = ""
    attempt: int = 1  # the delivery that produced it (> 1: a redelivery after a crash or timeout)
    earlier: tuple[str, ...] = ()  # why each earlier delivery ended without an outcome
    started: float = 0.0  # unix time the worker began this delivery
    writes: int = 0  # workspace writes the ResultHandler applied for it
    finished: float = 0.0  # unix time the worker finished
    # a big output lives in the object store (runtime.log.payloads): `result.output` is None, this says where
    ref: ev.PayloadRef | None = None
    # the call cannot go on without a person: recorded as this `question.asked` instead of a result (a host
    # that does not know the field records `result`, a failure saying the same)
    ask: Ask | None = None

    @property
    def subject(self) -> str:
        return result_subject(self.partition, self.actor, self.run_id)

    @classmethod
    def decode(cls, data: bytes) -> ToolOutcome:
        result: ToolOutcome = _decoded(data, _outcome_dec, "tool outcome")
        return result

    @classmethod
    def for_job(cls, job: ToolJob, result: ToolResult, **fields: Any) -> ToolOutcome:
        fields.setdefault("finished", time.time())
        return cls(run_id=job.run_id, actor=job.actor, call_id=job.call_id, tool=job.tool,
                   partition=job.partition, round=job.round, result=result, **fields)

    def events(self) -> list[ev.Event]:
        """The events the host appends for this outcome: `tool.redelivered` first when a redelivery ran
        (which delivery, on which worker, why the earlier ones ended: `earlier`), then `tool.completed` or
        `tool.failed` carrying the script run the notes record (`events.outcome_events`: one append, not
        one per note; unstamped: the run log numbers them). Timestamps are the worker's (when it
        happened). A big output must be resolved first (`Payloads.resolve_outcome`): the event holds the
        value, and the run log decides how it is stored."""
        if self.ref is not None:
            raise ValueError(f"outcome of {self.call_id}: its output is in the object store; "
                             "resolve it first")
        out: list[ev.Event] = []
        if self.ask is not None:  # a question instead of a result: the call goes on once it is answered
            asked = ev.QuestionAsked(run_id=self.run_id, call_id=self.call_id, question=self.ask.question,
                                     schema=self.ask.schema, resume=self.ask.resume, round=self.round)
            return [msgspec.structs.replace(asked, ts=self.finished or time.time())]
        if self.attempt > 1 and self.earlier:  # a dead-lettered job's `crashed` failure says it all itself
            began = self.started or (self.notes[0].ts if self.notes else self.finished)
            out.append(ev.ToolRedelivered(run_id=self.run_id, ts=began, call_id=self.call_id, tool=self.tool,
                                          attempt=self.attempt, worker=self.worker, earlier=self.earlier))
        recorded = ev.outcome_events(self.run_id, self.call_id, self.tool, self.result, self.notes,
                                     worker=self.worker)  # the one mapping
        out.extend(recorded[:-1])  # script.* only for notes that are not one run's shape
        out.append(msgspec.structs.replace(recorded[-1], ts=self.finished or time.time()))
        return out


_enc = msgspec.msgpack.Encoder()
_job_dec = msgspec.msgpack.Decoder(ToolJob)
_outcome_dec = msgspec.msgpack.Decoder(ToolOutcome)

__all__ = ["Ask", "JobDecodeError", "ScriptNote", "ToolJob", "ToolOutcome"]
