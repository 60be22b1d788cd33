"""The hosts' answers to a run's starter: its events, followed live, and its cancel, for the run's key.

    desk = StarterDesk(nc, js, log)
    await desk.run(stop)             # in the host's task group: answers starter.<actor>.follow / .cancel

Why the host answers (the request format and the key are `runtime.nats.starter`): a publisher may start a run
but not read the log or send commands, and a host may do both. So a host reads the run's log for the starter
and publishes the cancel under the operator token `starter`, after checking that the key the request
carries is the one whose digest the run recorded at its start. It holds nothing about the request: every
host of the fleet answers in one queue group, any of them may answer the next request, and a reader whose
answering host died asks again from the last event it holds. Reading goes through the run log, like every
reader's (`runtime.log`), and never touches a run's driver: following a run costs its turns nothing.

A host answers at most `MAX_ANSWERING` requests at once; one more is refused with a reason (the reader
asks again), so a flood of requests cannot hold a host's memory or its connection.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import cast

import anyio
import anyio.abc
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.errors import MaxPayloadError
from nats.js import JetStreamContext

from runtime import events as ev
from runtime.commands import publish_command
from runtime.log import TERMINAL_KINDS, RunLog
from runtime.nats.starter import (
    MAX_WAIT_S,
    START_KEY_META,
    STARTER_OPERATOR,
    STARTER_PREFIX,
    STARTER_QUEUE,
    StarterReply,
    StarterRequest,
    decode_request,
    proves,
)

log = logging.getLogger("runtime.host.starters")

MAX_ANSWERING = 256  # requests one host answers at once


def not_proved(run_id: str) -> str:
    return (f"run {run_id} was not started with this key: only its starter may follow or cancel it this way "
            f"(an operator reads and cancels any run: sa replay {run_id}, sa cancel {run_id})")


class StarterDesk:
    """Answers the requests of runs' starters (see the module docstring) until stopped."""

    def __init__(self, nc: NATS, js: JetStreamContext, run_log: RunLog) -> None:
        self.nc = nc
        self.js = js
        self.log = run_log
        self.answering = 0

    async def run(self, stop: anyio.Event) -> None:
        async with anyio.create_task_group() as tg:
            async def on_msg(msg: Msg) -> None:
                if not msg.reply:
                    return
                if self.answering >= MAX_ANSWERING:
                    await self._send(msg.reply, StarterReply(error=f"this host answers {MAX_ANSWERING} "
                                                                   "requests already: ask again shortly",
                                                             retry=True))
                    return
                self.answering += 1
                tg.start_soon(self._answer, msg)

            subs = [await self.nc.subscribe(f"{STARTER_PREFIX}.*.{op}", queue=STARTER_QUEUE, cb=on_msg)
                    for op in ("follow", "cancel")]
            try:
                await stop.wait()
            finally:
                with anyio.CancelScope(shield=True):
                    for sub in subs:  # the connection may be closed already: a host stopping, or dying
                        with contextlib.suppress(Exception):
                            await sub.unsubscribe()
                tg.cancel_scope.cancel()

    async def _answer(self, msg: Msg) -> None:
        reply = msg.reply
        try:
            _, actor, op = msg.subject.split(".", 2)
            try:
                request = decode_request(msg.data)
            except Exception as e:
                await self._send(reply, StarterReply(error=f"not a starter request ({e}): send a msgpack "
                                                           "runtime.nats.starter.StarterRequest"))
                return
            if op == "cancel":
                await self._cancel(reply, actor, request)
            else:
                await self._follow(reply, actor, request)
        except Exception as e:  # the log or NATS failed: the reader is told, and asks again
            log.warning("a starter's %s request (%s) failed: %s", msg.subject, len(msg.data), e)
            await self._send(reply, StarterReply(error=f"the host could not answer: {type(e).__name__}: {e}",
                                                 retry=True))
        finally:
            self.answering -= 1

    async def _follow(self, reply: str, actor: str, request: StarterRequest) -> None:
        """The run's events above `request.after`, then `done`: those in the log now (`wait_s` 0), or live
        until it ends or `wait_s` (at most `MAX_WAIT_S`) passes; refused unless the run started with the
        key."""
        wait = min(max(request.wait_s, 0.0), MAX_WAIT_S)
        if wait == 0:
            history = await self.log.read(request.run_id, actor, resolve=False)
            if not history.events:
                await self._send(reply, StarterReply(done=True, started=False))
                return
            for event in history.events:
                if not await self._pass(reply, request, event):
                    return
            await self._send(reply, StarterReply(done=True))
            return
        started = False
        with anyio.move_on_after(wait):
            following = cast(AsyncGenerator[ev.Event, None], self.log.follow(request.run_id, actor))
            async with aclosing(following) as events:
                async for event in events:
                    started = True
                    if not await self._pass(reply, request, event):
                        return
        await self._send(reply, StarterReply(done=True, started=started))

    async def _pass(self, reply: str, request: StarterRequest, event: ev.Event) -> bool:
        """Send `event` if the reader wants it (its seq is above `after`); False when nothing more may be
        sent: the run's first event does not prove the key, or the run ended."""
        if event.seq == 0:
            first = await self.log.resolve(event)
            recorded = first.metadata.get(START_KEY_META) if isinstance(first, ev.RunStarted) else None
            if not proves(request.key, recorded):
                await self._send(reply, StarterReply(error=not_proved(request.run_id)))
                return False
        terminal = ev.kind_of(event) in TERMINAL_KINDS
        if event.seq > request.after:
            if terminal:  # the output: resolved here, since a publisher may not read the payload store
                event = await self.log.resolve(event)
            if not await self._send(reply, StarterReply(event=ev.encode(event))):
                why = (f"run {request.run_id} ended with an event too big for one NATS message: read it with "
                       f"an operator's credentials (sa replay {request.run_id})")
                await self._send(reply, StarterReply(error=why))
                return False
        if terminal:
            await self._send(reply, StarterReply(done=True))
            return False
        return True

    async def _cancel(self, reply: str, actor: str, request: StarterRequest) -> None:
        """Publish the run's cancel as the operator `starter`, if the run started with the key."""
        started = await self.log.started(request.run_id, actor)
        if started is None:
            last = await self.log.last(request.run_id, actor)
            if last is None:  # its task still queued: the reader asks again once the run has started
                await self._send(reply, StarterReply(done=True, started=False))
            else:  # a fork (no run.started): no starter's key
                await self._send(reply, StarterReply(error=not_proved(request.run_id)))
            return
        if not proves(request.key, started.metadata.get(START_KEY_META)):
            await self._send(reply, StarterReply(error=not_proved(request.run_id)))
            return
        cancel = ev.Cancel(run_id=request.run_id, reason=request.reason, by=STARTER_OPERATOR)
        await publish_command(self.js, actor, cancel, operator=STARTER_OPERATOR)
        log.info("run %s: cancel sent for its starter (%s)", request.run_id, request.reason or "no reason")
        await self._send(reply, StarterReply(done=True))

    async def _send(self, reply: str, answer: StarterReply) -> bool:
        """Publish one reply; False when it is too big for one message."""
        try:
            await self.nc.publish(reply, answer.encode())
        except MaxPayloadError:
            return False
        return True


__all__ = ["MAX_ANSWERING", "StarterDesk", "not_proved"]
