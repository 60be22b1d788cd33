"""Giving the fleet a task so that it is stored exactly once, or saying why it was not.

Why a module of its own: publishing a task is the one write an outside process makes, and the ways it can
go wrong look alike on the wire. No TASKS stream (no host has made the topology yet), a stream that does
not answer (a leader election) and a publish the server's permissions refuse all end in a JetStream error
or a timeout; the first is fixed by starting a host, the second by waiting, the third only by other
credentials. So `submit` tells them apart: it retries the second under one task id (`Nats-Msg-Id`, so an
attempt that was stored after all is not stored twice), stops at once on the third (the server said why:
`runtime.nats.connection.refused_publish`), never creates a stream (the hosts own the topology: a stream
made here could have the wrong partition count), and raises `NotSent` with what to do.

An input too big for one message (over the payload threshold, `runtime.log.payloads`, which is below the
server's max_payload) is stored in the payload object store under the run's id, the way the run log stores
a big event, and the task carries a `PayloadRef` (`Task.input_ref`) that the host reads back when it
starts the run; purging the run deletes the object with it.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, Literal

import anyio
import msgspec
from nats.errors import MaxPayloadError
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError, NotFoundError

from runtime import events as ev
from runtime.commands import actor_key, check_input, publish_task, run_id_for, split_actor
from runtime.log.payloads import Payloads
from runtime.nats.connection import explain_refusal, refused_publish
from runtime.nats.subjects import TASKS, task_subject

NO_STREAM = ("no host has created the TASKS stream yet: start `sa host` or `sa up` (or wait for one); "
             "the task was not sent")
RETRY_UNANSWERED_S = 10.0  # how long an existing stream that does not answer (a leader election) is retried

Reason = Literal["no_stream", "unanswered", "refused", "too_big"]


class NotSent(Exception):
    """The task is not stored in TASKS (the message says why and what to do). `reason`: `no_stream` (no
    host has made the streams yet), `unanswered` (no confirmation in time: send it again under the same task
    id), `refused` (the server's permissions refused it), `too_big` (the task could not be made to fit)."""

    def __init__(self, message: str, reason: Reason = "unanswered") -> None:
        super().__init__(message)
        self.reason: Reason = reason


async def submit(js: Any, agent: str, input: str, *, task_id: str | None = None, instance: str | None = None,
                 timeout_s: float | None = None, thread: str | None = None,
                 metadata: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                 wait: float = 0.0, on_waiting: Callable[[str], None] | None = None,
                 payloads: Payloads | None = None, priority: int | None = None) -> tuple[str, str]:
    """Publish a task and return (run id, task id) once JetStream confirms it is stored.

    No TASKS stream: wait up to `wait` seconds for a host to create it (`on_waiting` is told once). A
    stream that exists but does not answer is retried for `RETRY_UNANSWERED_S` (or `wait`, if longer).
    Raises `NotSent` when the task is not stored, `ValueError` for a task that can never be (a bad agent,
    instance or thread name, an input holding NUL)."""
    check_input(input)
    task_id = task_id or uuid.uuid4().hex
    bundle, named = split_actor(agent)
    actor = actor_key(bundle, instance or named)
    task = ev.Task(agent=bundle, input=input, instance=instance or named, task_id=task_id,
                   timeout_s=timeout_s, metadata=dict(metadata or {}), thread=thread, priority=priority)
    input_ref = await _big_input(payloads or Payloads(js), task, run_id_for(actor, task_id))
    start = anyio.current_time()
    told = False
    while True:
        try:
            run_id = await publish_task(js, agent, "" if input_ref else input, task_id=task_id,
                                        instance=instance, timeout_s=timeout_s, thread=thread,
                                        metadata=metadata, headers=headers, input_ref=input_ref,
                                        priority=priority)
            return run_id, task_id
        except MaxPayloadError:
            limit = int(getattr(js._nc, "max_payload", 0) or 0)
            raise NotSent(f"the task does not fit in one NATS message (the server takes at most {limit:,} "
                          "bytes): its metadata or headers are too big (a big input is stored apart, not "
                          "these); the task was not sent", "too_big") from None
        except (NoStreamResponseError, NatsTimeoutError) as e:
            refused = refused_publish(task_subject(actor))
            if refused is not None:
                raise NotSent(f"NATS refused to store the task ({refused}): these credentials may not "
                              f"publish tasks for {actor}; use a publisher's or an admin's. The task was not "
                              "sent", "refused") from None
            missing = isinstance(e, NoStreamResponseError) and not await _tasks_stream_exists(js)
            waited = anyio.current_time() - start
            if missing and waited >= wait:
                raise NotSent(NO_STREAM, "no_stream") from None
            if not missing and waited >= max(wait, RETRY_UNANSWERED_S):
                raise NotSent(f"the task was not confirmed stored ({type(e).__name__}: {e}); send it again "
                              f"with task id {task_id}: a task id runs once", "unanswered") from None
            if missing and not told and on_waiting is not None:
                on_waiting(f"no host has created the TASKS stream yet; waiting up to {wait:g} s for one")
                told = True
            await anyio.sleep(0.25)


async def _big_input(payloads: Payloads, task: ev.Task, run_id: str) -> ev.PayloadRef | None:
    """None when the task fits in one message; else its input stored for `run_id` in the payload object
    store, and the ref to it. `NotSent` if it cannot be stored (these credentials may not write there)."""
    size = len(ev.encode_command(task))
    if size <= payloads.threshold:
        return None
    try:
        return await payloads.put_bytes(msgspec.msgpack.encode(task.input), run=run_id)
    except Exception as e:
        why = explain_refusal(e) or f"{type(e).__name__}: {e}"
        raise NotSent(f"the task is {size:,} bytes, more than one message carries here "
                      f"({payloads.threshold:,} bytes), so its input goes to the payload object store, "
                      f"and storing it failed: {why}. Send it with credentials that may write the payload "
                      "store (an admin's), or make it smaller; the task was not sent", "too_big") from None


async def _tasks_stream_exists(js: Any) -> bool:
    """False only when the server says TASKS does not exist (any other answer: assume it does)."""
    try:
        await js.stream_info(TASKS)
    except NotFoundError:
        return False
    except Exception:  # the server did not answer: the stream may well be there
        return True
    return True


__all__ = ["NO_STREAM", "RETRY_UNANSWERED_S", "NotSent", "submit"]
