"""Giving the fleet a task so that it is stored exactly once, or saying why it was not.

Why a module of its own: publishing a task is the one write an outside process makes, and the two ways it
can go wrong look alike on the wire. No TASKS stream (no host has made the topology yet) and a stream
that does not answer (a leader election, a refused permission) both end in a JetStream error or a
timeout; the first is fixed by starting a host, the second by waiting or by fixing credentials. So
`submit` tells them apart, retries the second under one task id (`Nats-Msg-Id`, so an attempt that was
stored after all is not stored twice), never creates a stream (the hosts own the topology: a stream
made here could have the wrong partition count), and raises `NotSent` with what to do.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import anyio
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.errors import NoStreamResponseError, NotFoundError

from runtime.commands import publish_task
from runtime.nats.subjects import TASKS

NO_STREAM = ("no host has created the TASKS stream yet: start `sa host` or `sa up` (or wait for one); "
             "the task was not sent")
RETRY_UNANSWERED_S = 10.0  # how long an existing stream that does not answer (a leader election) is retried


class NotSent(Exception):
    """The task is not stored in TASKS (the message says why and what to do)."""


async def submit(js: Any, agent: str, input: str, *, task_id: str | None = None, instance: str | None = None,
                 timeout_s: float | None = None, thread: str | None = None,
                 metadata: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                 wait: float = 0.0, on_waiting: Callable[[str], None] | None = None,
                 priority: int | None = None) -> tuple[str, str]:
    """Publish a task and return (run id, task id) once JetStream confirms it is stored.

    No TASKS stream: wait up to `wait` seconds for a host to create it (`on_waiting` is told once). A
    stream that exists but does not answer is retried for `RETRY_UNANSWERED_S` (or `wait`, if longer).
    Raises `NotSent` when the task is not stored, `ValueError` for a task that can never be (a bad agent,
    instance or thread name)."""
    task_id = task_id or uuid.uuid4().hex
    start = anyio.current_time()
    told = False
    while True:
        try:
            run_id = await publish_task(js, agent, input, task_id=task_id, instance=instance,
                                        timeout_s=timeout_s, thread=thread, metadata=metadata,
                                        headers=headers, priority=priority)
            return run_id, task_id
        except (NoStreamResponseError, NatsTimeoutError) as e:
            missing = isinstance(e, NoStreamResponseError) and not await _tasks_stream_exists(js)
            waited = anyio.current_time() - start
            if missing and waited >= wait:
                raise NotSent(NO_STREAM) from None
            if not missing and waited >= max(wait, RETRY_UNANSWERED_S):
                raise NotSent(f"the task was not confirmed stored ({type(e).__name__}: {e}); send it again "
                              f"with task id {task_id}: a task id runs once") from None
            if missing and not told and on_waiting is not None:
                on_waiting(f"no host has created the TASKS stream yet; waiting up to {wait:g} s for one")
                told = True
            await anyio.sleep(0.25)


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
