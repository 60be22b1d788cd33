"""What may be published for an agent, and how a host reads it: tasks, and commands from operators.

Two subjects, both stored by the TASKS stream in the agent's partition (`runtime.nats.subjects`), so a
run's commands travel the same partition (and reach the same host) as its task, in order, through the same
constant set of consumers:

* ``agents.<agent>.tasks`` carries **tasks** only — msgpack `events.Task` (what `sa send` publishes), or
  JSON ``{"input": "...", "task_id": "...", "instance": "...", "timeout_s": 60, "thread": "...",
  "metadata": {...}}``
  (``kind`` and ``agent`` may be left out: the subject names the agent; any other key is refused, naming
  the keys a task has, so `thred` is not silently ignored), or plain UTF-8 text, taken as the task's input
  (`nats pub agents.demo.tasks "what is 2+2?"`; newlines and tabs allowed, other control characters
  refused; a body that parses as JSON but is not an object, `[1, 2, 3]`, is refused, while text that only
  starts like JSON, `[urgent] ...`, is text). A command here is refused: whoever may publish tasks may not,
  by that alone, cancel or approve anything. A refused message is recorded by the host as a run that
  fails at once with `bad_task` and the reason (`refused_task`), under the run id it would have had.
* ``ops.<agent>.<operator>`` carries **commands** only — ``{"kind": "cancel", "run_id": "...",
  "reason": "..."}``, ``approve`` / ``deny`` with ``call_id`` (``deny`` with a ``reason``) for a call of a
  tool that needs approval, ``answer`` with ``call_id`` and ``answer`` for a question a run asks
  (`runtime.questions`). The operator token is the command's author: the host records it as ``by``
  whatever the message says, and a secured server lets each operator publish only on its own token
  (`runtime.nats.auth`), so the name in `approval.granted` or `run.cancelled` is the authenticated one.

Publish a task with ``Nats-Msg-Id`` = the task id so a re-sent task is stored once. An agent may be addressed
as ``<bundle>:<instance>`` in the subject or with ``instance`` in the task: each instance is its own actor.
The subject decides the partition, hence the host: `publish_task` and `publish_command` use the actor's own
subject, so instances spread over partitions and a run's commands reach the host serving it. A task with
``instance`` in its body published on the bundle's subject is moved by the host that reads it to the
instance's subject (same run id, stored once: `runtime.host.routing`), so it runs where the same task
published on the instance's subject would. (A command that lands in another partition than its run, say
one published for the bundle of a run of ``bundle:instance``, is forwarded by the host that reads it,
keeping its operator.)

Run ids are derived, never random: `run_id_for(agent, task_id)` hashes the actor and the task id (a task
without one takes its message's ``Nats-Msg-Id``, and only a task with neither uses the TASKS stream
sequence of the message). So a redelivered task maps to the run it already started, a publisher can
compute the run id before any host has seen the task (the formula is in the README, for clients in any
language), and a task re-sent after the dedup window is still recognised as already run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import unicodedata
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime import events as ev
from runtime.nats.subjects import (
    ANONYMOUS,
    HDR_MSG_ID,
    SCHEDULE_OPERATOR,
    check_token,
    command_subject,
    subtask_subject,
    task_subject,
)

log = logging.getLogger("runtime.commands")


# The task metadata a sub-run's task names its parent with (`runtime.worker.subruns` writes it; the router
# takes a task on the sub-run subject only with `PARENT_RUN`): here, beside the task format, so both read it.
PARENT_RUN, PARENT_CALL, DEPTH = "sa.parent_run", "sa.parent_call", "sa.depth"
PARENT_ACTOR, PARENT_PARTITION, PARENT_TOOL = "sa.parent_actor", "sa.parent_partition", "sa.parent_tool"


MAX_THREAD_NAME = 200
TEXT_CONTROLS = "\n\r\t"  # the control characters a text task may hold
REFUSED_SHOWN = 2000  # characters of a refused message its failed run shows as its input
# the instance prefix of a sub-run's actor (`child_actor`): a host tells a child run's actor by it
SUB_PREFIX = "sub-"


class BadCommand(ValueError):
    """A message on a task subject that is not a command (the message says what is wrong)."""


def actor_key(bundle: str, instance: str | None) -> str:
    """The actor (and event-subject agent token) of one bundle instance: `bundle` or `bundle:instance`."""
    if instance:
        check_token(instance, "instance")
        return f"{bundle}:{instance}"
    return bundle


def split_actor(agent: str) -> tuple[str, str | None]:
    """`bundle:instance` -> (bundle, instance); `bundle` -> (bundle, None)."""
    bundle, sep, instance = agent.partition(":")
    return bundle, (instance if sep else None)


def run_id_for(agent: str, task_id: str | None = None, *, stream_seq: int | None = None) -> str:
    """The run a task becomes: deterministic from the actor and the task id (or the stream sequence)."""
    if task_id is None and stream_seq is None:
        raise ValueError("a run id needs a task id or the task's stream sequence")
    key = f"{agent}\x00id:{task_id}" if task_id is not None else f"{agent}\x00seq:{stream_seq}"
    return "r" + hashlib.blake2b(key.encode(), digest_size=8).hexdigest()


def check_thread(name: str) -> str:
    """Return `name` if it can name a thread; raise ValueError saying what is wrong otherwise."""
    if not name or not name.strip():
        raise ValueError("a thread name must not be empty")
    if len(name) > MAX_THREAD_NAME:
        raise ValueError(f"a thread name has at most {MAX_THREAD_NAME} characters, got {len(name)}")
    if any(ord(c) < 32 for c in name):
        raise ValueError(f"thread name {name!r} contains a control character")
    return name


def child_task_id(parent_run: str, call_id: str) -> str:
    """The task id of the child a call starts: the same on every delivery and after every recovery."""
    return SUB_PREFIX + hashlib.blake2b(f"{parent_run}\x00{call_id}".encode(), digest_size=10).hexdigest()


def child_actor(agent: str, parent_run: str, call_id: str) -> str:
    """The actor the child runs as: an instance of `agent` of its own."""
    return actor_key(agent, child_task_id(parent_run, call_id))


def child_run_id(agent: str, parent_run: str, call_id: str) -> str:
    return run_id_for(child_actor(agent, parent_run, call_id), child_task_id(parent_run, call_id))


@dataclass(frozen=True)
class Addressed:
    """A decoded command with the actor it is for."""

    agent: str  # the actor key (`bundle` or `bundle:instance`)
    command: ev.Command


def decode(subject_agent: str, data: bytes, operator: str | None = None, *,
           msg_id: str | None = None) -> Addressed:
    """Decode one message published to `agents.<subject_agent>.tasks` (`operator` None) or to
    `ops.<subject_agent>.<operator>`; raise BadCommand saying why. A command's `by` becomes `operator`. A
    task without a task id takes `msg_id` (the message's Nats-Msg-Id), so a publisher that set only the
    header (`nats pub`) can compute its run id."""
    addressed = _decode(subject_agent, data)
    cmd = addressed.command
    if operator is None:
        if not isinstance(cmd, ev.Task):
            raise BadCommand(f"a {_kind(cmd)} is not accepted on a task subject: operators publish commands "
                             f"on ops.{subject_agent}.<operator> (sa cancel / sa approve / sa deny do)")
        if cmd.task_id is None and msg_id:
            return Addressed(addressed.agent, msgspec.structs.replace(cmd, task_id=msg_id))
        return addressed
    if isinstance(cmd, ev.Task):
        raise BadCommand(f"a task is not accepted on a command subject: publish it on "
                         f"agents.{subject_agent}.tasks")
    if isinstance(cmd, ev.Wake) and operator != SCHEDULE_OPERATOR:
        raise BadCommand(f"a wake comes from the cluster's clock only, on ops.{subject_agent}."
                         f"{SCHEDULE_OPERATOR} (a host publishes it when a timer's wake-up fires)")
    if isinstance(cmd, ev.Resume | ev.Wake):  # name no operator: they ask a host to drive a run that exists
        return addressed
    if operator == ANONYMOUS:  # no authenticated name to go by (a server without auth): keep the message's
        return Addressed(addressed.agent, msgspec.structs.replace(cmd, by=cmd.by or ANONYMOUS))
    if cmd.by and cmd.by != operator:
        log.warning("%s for run %s says by=%r but came from operator %r: recorded as %r", _kind(cmd),
                    cmd.run_id, cmd.by, operator, operator)
    return Addressed(addressed.agent, msgspec.structs.replace(cmd, by=operator))


def _kind(cmd: ev.Command) -> str:
    return str(cmd.__struct_config__.tag)


def _decode(subject_agent: str, data: bytes) -> Addressed:
    try:
        cmd = _parse(subject_agent, data)
    except ev.EventDecodeError as e:
        raise BadCommand(str(e)) from None
    return _addressed(subject_agent, cmd) if isinstance(cmd, ev.Task) else Addressed(subject_agent, cmd)


def _parse(subject_agent: str, data: bytes) -> ev.Command:
    """The command a message holds, by its form: a JSON object, a msgpack map, or text (a task's input)."""
    if not data or not data.strip():
        raise BadCommand("empty message: publish a task (msgpack events.Task, a JSON object, or text)")
    head = data.lstrip()[:1]
    if head == b"{":
        return _from_json(subject_agent, data)
    if data[0] in range(0x80, 0x90) or data[0] in (0xDE, 0xDF):  # a msgpack map
        return ev.decode_command(data)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadCommand("neither msgpack, JSON nor UTF-8 text") from None
    if head in (b"[", b'"'):  # JSON, but not an object; text that only starts so ("[urgent] ...") is text
        try:
            value = json.loads(text)
        except ValueError:
            pass
        else:
            what = "array" if isinstance(value, list) else "string"
            raise BadCommand(f"a JSON task must be an object ({{\"input\": \"...\"}}), not a JSON {what}")
    bad = next((i for i, c in enumerate(text) if c not in TEXT_CONTROLS and unicodedata.category(c) == "Cc"),
               None)
    if bad is not None:
        raise BadCommand(f"a text task holds control character {ord(text[bad]):#04x} at character {bad}: a "
                         "text task is printable text (newlines and tabs allowed); send other data inside "
                         "a JSON object's input")
    return ev.Task(agent=subject_agent, input=text)


def _from_json(subject_agent: str, data: bytes) -> ev.Command:
    """A JSON command (`kind` may be left out for a task, `agent` for a task of the subject's agent);
    a key the command does not have is refused, naming the ones it has (`thred` is not `thread`)."""
    try:
        obj = json.loads(data)
    except ValueError as e:
        raise BadCommand(f"not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise BadCommand("a JSON command must be an object")
    obj.setdefault("kind", "task")
    kind = ev.COMMAND_KINDS.get(obj["kind"]) if isinstance(obj["kind"], str) else None
    if kind is not None:
        allowed = {"kind", *(f.name for f in msgspec.structs.fields(kind))}
        unknown = sorted(set(obj) - allowed)
        if unknown:
            raise BadCommand(f"unknown key {unknown[0]!r} in a {obj['kind']} (a {obj['kind']} has: "
                             f"{', '.join(sorted(allowed))})")
    if obj["kind"] == "task":
        obj.setdefault("agent", subject_agent)
    return ev.command_from_json(json.dumps(obj))


def _addressed(subject_agent: str, cmd: ev.Task) -> Addressed:
    """A task checked against the subject it came on, with the actor it is for."""
    bundle, instance = split_actor(subject_agent)
    if cmd.agent not in (subject_agent, bundle):
        raise BadCommand(f"the task names agent {cmd.agent!r} but was published for {subject_agent!r}")
    if cmd.instance and instance and cmd.instance != instance:
        raise BadCommand(f"the task names instance {cmd.instance!r} but the subject names {instance!r}")
    try:
        agent = actor_key(bundle, cmd.instance or instance)
        if cmd.thread is not None:
            check_thread(cmd.thread)
        check_input(cmd.input)
    except ValueError as e:
        raise BadCommand(str(e)) from None
    if cmd.timeout_s is not None and cmd.timeout_s <= 0:
        raise BadCommand(f"timeout_s must be positive, got {cmd.timeout_s}")
    return Addressed(agent, cmd)


def check_input(text: str) -> None:
    """ValueError if a task's input holds NUL. Any other character is the publisher's text (an escape
    sequence is shown escaped, never obeyed: `runtime.client.terminal`), but NUL is not text: model servers,
    C libraries and terminals cut a string there, so the run would act on less than was sent. A text task
    refuses every control character but newline, tab and CR (`TEXT_CONTROLS`); a JSON or msgpack task, and
    `sa send`, refuse NUL the same way."""
    at = text.find("\x00")
    if at >= 0:
        raise ValueError(f"the task's input holds a NUL character (0x00) at character {at}: a task is text; "
                         "send binary data encoded (base64) or as a file a tool reads")


def refused_task(subject_agent: str, data: bytes, msg_id: str | None) -> ev.Task:
    """What a message refused on a task subject is recorded as: a task whose input is the message as
    text (cut to `REFUSED_SHOWN` characters), with its Nats-Msg-Id as task id. The host records it as a
    run that fails at once with `bad_task` and the reason, so the publisher finds why under the run id
    it can compute, as for any task."""
    text = data.decode("utf-8", errors="replace")
    if len(text) > REFUSED_SHOWN:
        text = f"{text[:REFUSED_SHOWN]}… ({len(data):,} bytes)"
    bundle, instance = split_actor(subject_agent)
    return ev.Task(agent=bundle, instance=instance, input=text, task_id=msg_id or None)


async def publish_task(js: Any, agent: str, input: str, *, task_id: str | None = None,
                       instance: str | None = None, timeout_s: float | None = None,
                       metadata: dict[str, Any] | None = None,
                       headers: dict[str, str] | None = None, thread: str | None = None,
                       subrun: bool = False, input_ref: ev.PayloadRef | None = None,
                       priority: int | None = None) -> str:
    """Publish a task for `agent` (`bundle` or `bundle:instance`); return the run id it becomes. `headers`
    go with the message (a W3C `traceparent` there makes the run's trace part of the caller's).

    A task id is generated when none is given, so the run id is known at once and the publish is
    idempotent (`Nats-Msg-Id` = task id): retrying this call never runs the task twice. A `thread` makes
    the run continue that conversation of the actor (`runtime.log.threads`). `subrun`: the task of a child
    run, on the sub-run subject only tool workers may use (`subtask_subject`). `input_ref`: the input was
    stored in the payload object store (`input` is then empty; `runtime.client.submit` does this).
    `priority` (0..9, higher first) orders the run's model calls at a busy endpoint (None: the bundle's).
    """
    if thread is not None:
        check_thread(thread)
    if priority is not None and not ev.MIN_PRIORITY <= priority <= ev.MAX_PRIORITY:
        raise ValueError(f"{ev.PRIORITY_RULE}; got {priority}")
    bundle, inst = split_actor(agent)
    instance = instance or inst
    task_id = task_id or uuid.uuid4().hex
    task = ev.Task(agent=bundle, input=input, instance=instance, task_id=task_id, timeout_s=timeout_s,
                   metadata=dict(metadata or {}), thread=thread, input_ref=input_ref, priority=priority)
    actor = actor_key(bundle, instance)
    await js.publish((subtask_subject if subrun else task_subject)(actor), ev.encode_command(task),
                     headers={**(headers or {}), HDR_MSG_ID: task_id})
    return run_id_for(actor, task_id)


async def publish_command(js: Any, agent: str, command: ev.Command, *, operator: str | None = None) -> None:
    """Publish a cancel / approve / deny / answer for a run of `agent` (the actor: `bundle` or
    `bundle:instance`) on `ops.<agent>.<operator>`, which lands in the partition, and reaches the host, of
    the run.

    `operator` defaults to the identity this process connects as (`runtime.nats.credentials.identity`): on
    a secured server that is the only operator token it may publish on, and the host records it as `by`."""
    if operator is None:
        from runtime.nats.credentials import identity

        operator = identity()
    await js.publish(command_subject(agent, operator), ev.encode_command(command))


__all__ = ["DEPTH", "PARENT_ACTOR", "PARENT_CALL", "PARENT_PARTITION", "PARENT_RUN", "PARENT_TOOL",
           "Addressed", "BadCommand", "actor_key", "check_input", "decode", "publish_command", "publish_task",
           "refused_task", "run_id_for", "split_actor"]
