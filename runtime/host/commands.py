"""What may be published to `agents.<agent>.tasks`, and how a host reads it.

The task subject carries every command for an agent, so commands travel the same partition (and reach
the same host) as the tasks they refer to, in order, through the same constant set of consumers:

* a **task** — msgpack `events.Task` (what `sa send` publishes), or JSON
  ``{"input": "...", "task_id": "...", "instance": "...", "timeout_s": 60, "metadata": {...}}``
  (``kind`` and ``agent`` may be left out: the subject names the agent), or plain UTF-8 text, taken as the
  task's input (`nats pub agents.demo.tasks "what is 2+2?"`);
* **cancel** — ``{"kind": "cancel", "run_id": "...", "reason": "..."}``;
* **approve** / **deny** — ``{"kind": "approve", "run_id": "...", "call_id": "..."}`` (``deny`` with a
  ``reason``) for a call of a bundle tool marked `requires_approval`.

Publish with ``Nats-Msg-Id`` = the task id so a re-sent task is stored once. An agent may be addressed as
``<bundle>:<instance>`` in the subject or with ``instance`` in the task: each instance is its own actor.
The subject decides the partition, hence the host: `publish_task` and `publish_command` use the actor's own
subject ``agents.<bundle>:<instance>.tasks``, so instances spread over partitions and a run's commands
reach the host serving it. (A command that lands in another partition than its run, say one published on
the bundle's subject for an instance's run, is forwarded by the host that reads it.)

Run ids are derived, never random: `run_id_for(agent, task_id)` hashes the actor and the task id (or, for
a task without an id, the TASKS stream sequence of the message). So a redelivered task maps to the run it
already started, a publisher can compute the run id before any host has seen the task, and a task re-sent
after the dedup window is still recognised as already run.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from typing import Any

from runtime import events as ev
from runtime.nats.subjects import HDR_MSG_ID, check_token, task_subject


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


@dataclass(frozen=True)
class Addressed:
    """A decoded command with the actor it is for."""

    agent: str  # the actor key (`bundle` or `bundle:instance`)
    command: ev.Command


def decode(subject_agent: str, data: bytes) -> Addressed:
    """Decode one message published to `agents.<subject_agent>.tasks`; raise BadCommand saying why."""
    if not data or not data.strip():
        raise BadCommand("empty message: publish a task (msgpack events.Task, a JSON object, or text)")
    head = data.lstrip()[:1]
    try:
        if head == b"{":
            try:
                obj = json.loads(data)
            except ValueError as e:
                raise BadCommand(f"not valid JSON: {e}") from None
            if not isinstance(obj, dict):
                raise BadCommand("a JSON command must be an object")
            obj.setdefault("kind", "task")
            if obj["kind"] == "task":
                obj.setdefault("agent", subject_agent)
            cmd = ev.command_from_json(json.dumps(obj))
        elif data[0] in range(0x80, 0x90) or data[0] in (0xDE, 0xDF):  # a msgpack map
            cmd = ev.decode_command(data)
        else:
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:
                raise BadCommand("neither msgpack, JSON nor UTF-8 text") from None
            cmd = ev.Task(agent=subject_agent, input=text)
    except ev.EventDecodeError as e:
        raise BadCommand(str(e)) from None
    agent = subject_agent
    if isinstance(cmd, ev.Task):
        bundle, instance = split_actor(subject_agent)
        if cmd.agent not in (subject_agent, bundle):
            raise BadCommand(f"the task names agent {cmd.agent!r} but was published for {subject_agent!r}")
        if cmd.instance and instance and cmd.instance != instance:
            raise BadCommand(f"the task names instance {cmd.instance!r} but the subject names {instance!r}")
        try:
            agent = actor_key(bundle, cmd.instance or instance)
        except ValueError as e:
            raise BadCommand(str(e)) from None
        if cmd.timeout_s is not None and cmd.timeout_s <= 0:
            raise BadCommand(f"timeout_s must be positive, got {cmd.timeout_s}")
    return Addressed(agent, cmd)




async def publish_task(js: Any, agent: str, input: str, *, task_id: str | None = None,
                       instance: str | None = None, timeout_s: float | None = None,
                       metadata: dict[str, Any] | None = None,
                       headers: dict[str, str] | None = None) -> str:
    """Publish a task for `agent` (`bundle` or `bundle:instance`); return the run id it becomes. `headers`
    go with the message (a W3C `traceparent` there makes the run's trace part of the caller's).

    A task id is generated when none is given, so the run id is known at once and the publish is
    idempotent (`Nats-Msg-Id` = task id): retrying this call never runs the task twice.
    """
    bundle, inst = split_actor(agent)
    instance = instance or inst
    task_id = task_id or uuid.uuid4().hex
    task = ev.Task(agent=bundle, input=input, instance=instance, task_id=task_id, timeout_s=timeout_s,
                   metadata=dict(metadata or {}))
    actor = actor_key(bundle, instance)
    await js.publish(task_subject(actor), ev.encode_command(task),
                     headers={**(headers or {}), HDR_MSG_ID: task_id})
    return run_id_for(actor, task_id)


async def publish_command(js: Any, agent: str, command: ev.Command) -> None:
    """Publish a cancel / approve / deny for a run of `agent` (the actor: `bundle` or `bundle:instance`)
    on the subject its tasks use, so it reaches the partition, and the host, of the run."""
    await js.publish(task_subject(agent), ev.encode_command(command))


__all__ = ["Addressed", "BadCommand", "actor_key", "decode", "publish_command", "publish_task", "run_id_for",
           "split_actor"]
