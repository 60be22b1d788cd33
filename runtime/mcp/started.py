"""The runs `sa mcp serve` started, followed and cancelled through the hosts: a publisher's rights suffice.

    runs = StartedRuns(nc, secret)
    metadata = runs.metadata(run_id)                    # in the task: the digest of the run's key
    async for event in runs.events("calc", run_id): ...  # live, to its terminal event
    await runs.cancel("calc", run_id, "cancelled by the MCP client")

Why not `runtime.client.RunHandle`: a handle reads the run log and sends commands, which are an operator's
rights, and the face that hands a stranger's work to the fleet should hold a publisher's only. So it asks
the hosts (`runtime.nats.starter`, answered by `runtime.host.starters`), proving with each run's key that it
started the run. The key of a run is derived from this server's secret and the run id: a server given the
same secret (`sa mcp serve --key-file`) follows the runs an earlier one started, and one with another
secret is told the run is not its own.

Reading through the hosts is a stream of events on this connection's own inbox, one per message, in order.
Core NATS may drop a message to a slow reader and a host may die mid-answer, so a gap in the seqs, or no
answer for a while, is met by asking again from the last event held; a request no host answers (none is
running yet) is asked again after a pause. Nothing here holds state the hosts need.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from typing import Any

import anyio
from nats.aio.client import Client as NATS
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

from runtime import events as ev
from runtime.log import TERMINAL_KINDS
from runtime.nats.connection import refused_publish
from runtime.nats.starter import (
    START_KEY_META,
    StarterReply,
    StarterRequest,
    decode_reply,
    key_digest,
    start_key,
    starter_subject,
)

log = logging.getLogger("runtime.mcp")

WINDOW_S = 20.0  # how long one follow request is answered for before it is asked again
GRACE_S = 10.0  # more silence than this after a window's end: its host died, ask again
NO_HOST_PAUSE_S = 1.0  # a request no host answered is asked again after this
REQUEST_TIMEOUT_S = 10.0  # a cancel's answer


class StarterRefused(Exception):
    """A host refused the request (the message says why): the run is not this server's, or its end is too
    big to send."""


class NotAllowed(Exception):
    """The NATS server refused these credentials the starters' subjects (the message names the refusal)."""


class NotStarted(Exception):
    """The run has no event yet: its task waits for a host."""


class StartedRuns:
    """Follows and cancels the runs started with keys derived from `secret` (see the module docstring)."""

    def __init__(self, nc: NATS, secret: bytes) -> None:
        if len(secret) < 16:
            raise ValueError("a starter's secret needs at least 16 bytes")
        self.nc = nc
        self.secret = secret
        self.actors: dict[str, str] = {}  # the runs this process started, and their actors, newest last
        self.unanswered = False  # said once: no host answered a request

    def key(self, run_id: str) -> str:
        return start_key(self.secret, run_id)

    def metadata(self, run_id: str) -> dict[str, Any]:
        """The task metadata that makes this server the run's starter."""
        return {START_KEY_META: key_digest(self.key(run_id))}

    def remember(self, actor: str, run_id: str, *, most: int = 1000) -> None:
        self.actors.pop(run_id, None)
        self.actors[run_id] = actor
        while len(self.actors) > most:
            del self.actors[next(iter(self.actors))]

    async def events(self, actor: str, run_id: str, *, follow: bool = True) -> AsyncGenerator[ev.Event, None]:
        """The run's events in order: live to its terminal event (`follow`), or those its log holds now.
        `StarterRefused` if a host refuses (not this server's run); with `follow` False, `NotStarted` when
        the run has no event yet."""
        after = -1
        while True:
            wait = WINDOW_S if follow else 0.0
            request = StarterRequest(run_id=run_id, key=self.key(run_id), after=after, wait_s=wait)
            sub = await self.nc.subscribe(inbox := self.nc.new_inbox())
            try:
                await self.nc.publish(starter_subject(actor, "follow"), request.encode(), reply=inbox)
                await self.nc.flush()  # a refusal of the publish comes back before the flush's answer
                _check_allowed(starter_subject(actor, "follow"))
                while True:
                    try:
                        msg = await sub.next_msg(timeout=wait + GRACE_S)
                    except NatsTimeoutError:  # its host died mid-answer, or the request was refused
                        _check_allowed(starter_subject(actor, "follow"))
                        break
                    if (msg.headers or {}).get("Status") == "503":  # no host answers (yet)
                        self._no_host(actor)
                        await anyio.sleep(NO_HOST_PAUSE_S)
                        break
                    reply = decode_reply(msg.data)
                    if reply.error is not None:
                        if not reply.retry:
                            raise StarterRefused(reply.error)
                        await anyio.sleep(NO_HOST_PAUSE_S)
                        break
                    if reply.event is not None:
                        event = ev.decode(reply.event)
                        if event.seq != after + 1:  # a message lost on the way: ask again from `after`
                            log.debug("run %s: event %d after %d: asking again", run_id, event.seq, after)
                            break
                        after = event.seq
                        yield event
                        if ev.kind_of(event) in TERMINAL_KINDS:
                            return
                    if reply.done:
                        if not follow:
                            if not reply.started:
                                raise NotStarted(f"run {run_id} has no event yet")
                            return
                        break
            finally:
                await sub.unsubscribe()

    async def cancel(self, actor: str, run_id: str, reason: str) -> None:
        """Ask a host to cancel the run. `NotStarted` when it has no event yet (no host has its task: ask
        again later); `StarterRefused` when it is not this server's run."""
        request = StarterRequest(run_id=run_id, key=self.key(run_id), reason=reason)
        while True:
            try:
                msg = await self.nc.request(starter_subject(actor, "cancel"), request.encode(),
                                            timeout=REQUEST_TIMEOUT_S)
            except (NoRespondersError, NatsTimeoutError):
                _check_allowed(starter_subject(actor, "cancel"))
                self._no_host(actor)
                await anyio.sleep(NO_HOST_PAUSE_S)
                continue
            reply: StarterReply = decode_reply(msg.data)
            if reply.error is not None and reply.retry:
                await anyio.sleep(NO_HOST_PAUSE_S)
                continue
            if reply.error is not None:
                raise StarterRefused(reply.error)
            if not reply.started:
                raise NotStarted(f"run {run_id} has no event yet")
            return


    def _no_host(self, actor: str) -> None:
        if not self.unanswered:
            self.unanswered = True
            log.warning("no host answers the requests about runs of %s (%s): none runs yet, or the hosts "
                        "are of a version without them; asking again until one does", actor,
                        starter_subject(actor, "follow"))


def _check_allowed(subject: str) -> None:
    """Raise `NotAllowed` if the server refused this process a publish to `subject` (a refused publish is
    only reported apart: the request itself just goes unanswered)."""
    refused = refused_publish(subject)
    if refused is not None:
        raise NotAllowed(f"NATS refused asking the hosts about the run ({refused}): these credentials may "
                         f"not publish on {subject}; a publisher's may, from an auth config generated by "
                         "this version (sa auth config)")


__all__ = ["NotAllowed", "NotStarted", "StartedRuns", "StarterRefused"]
