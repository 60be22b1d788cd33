"""One run as an outside process holds it: await its result, follow it, steer it, fork it, check it.

    handle = await client.start("planner", "summarise the inbox")
    async for event in handle.events():          # every event, live, from any seq
        ...
    output = await handle.result(timeout=60)     # or RunFailedError (a cancel: RunCancelledError), and why

A handle is a run id and a client, nothing more: it holds no subscription between calls, so handles are
free to make (`client.get(run_id)`) and a handle made in another process, or after a crash, works the same.
Everything it answers is read from the run's log (`runtime.log`), the one truth; everything it changes
goes through the commands a host applies (`runtime.client.control`), so a result is what was recorded,
never what this process believes.

Every read of the live log is closed before the call returns (`aclosing`), however it ends: a follow left
suspended would be finalised later, after its connection closed, and die there as a task exception that
nobody retrieves.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import anyio
import msgspec
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg

from runtime import events as ev
from runtime.client.control import Control, Pending, Question
from runtime.log import TERMINAL_KINDS, RunHistory, RunLog
from runtime.nats.jetstream import JetStream
from runtime.nats.subjects import script_subject, stream_filter, stream_subject
from runtime.streaming import Delta, ScriptRunning, subscribe

if TYPE_CHECKING:
    from runtime.bundle import Bundle
    from runtime.client.fork import ForkEdit
    from runtime.client.verify import Verification


Item = ev.Event | Delta | ScriptRunning  # what a live reader yields (`RunHandle.live`)


class Fleet(Protocol):
    """What a handle uses of its client: the connection, the run log, run control, the runs index. A
    protocol rather than the `Client` class so that the client's module imports this one and not back."""

    nc: NATS
    js: JetStream
    log: RunLog
    control: Control

    async def run_info(self, run_id: str) -> Any: ...

    async def fork(self, run_id: str, at: int, edit: Any = None, *, bundle: Any = None) -> Any: ...


CANCELLED = "cancelled"  # `RunFailedError.reason` of a cancelled run


class RunFailedError(Exception):
    """A run that ended without an output: it failed, or was cancelled (`RunCancelledError`, a subclass),
    so one `except RunFailedError as e` catches every run that did not complete.

    `reason` is the kind of ending, a word a program can branch on: the failure kind the kernel recorded
    (`max_turns`, `deadline`, `model_failed`, `bad_task`, ...) or `cancelled`; `detail` is what the log says
    about it (for a cancel, the reason the operator gave); `ending` is the terminal event itself."""

    def __init__(self, run_id: str, ending: ev.RunFailed | ev.RunCancelled,
                 message: str | None = None) -> None:
        if isinstance(ending, ev.RunFailed):
            reason, detail = ending.reason, ending.detail
        else:
            reason, detail = CANCELLED, ending.reason
        super().__init__(message or f"run {run_id} failed ({reason}){f': {detail}' if detail else ''}")
        self.run_id = run_id
        self.ending = ending
        self.reason = reason
        self.detail = detail


RunError = RunFailedError  # its former name, when a cancel was not a failure: for code that catches it


class RunCancelledError(RunFailedError):
    """The run was cancelled: `reason` is `cancelled`, `detail` the reason the operator gave, `by` the
    operator the host recorded."""

    def __init__(self, run_id: str, ending: ev.RunCancelled) -> None:
        said = f": {ending.reason}" if ending.reason else ""
        by = f" by {ending.by}" if ending.by else ""
        super().__init__(run_id, ending, f"run {run_id} was cancelled{by}{said}")
        self.by = ending.by


def outcome(run_id: str, ending: ev.Event) -> Any:
    """A terminal event as a result: the output of `run.completed`, else the typed error, raised."""
    if isinstance(ending, ev.RunCompleted):
        return ending.output
    if isinstance(ending, ev.RunFailed):
        raise RunFailedError(run_id, ending)
    if isinstance(ending, ev.RunCancelled):
        raise RunCancelledError(run_id, ending)
    raise ValueError(f"{ev.kind_of(ending)} is not a run's ending")


class RunHandle:
    """A run of the fleet, by id (see the module docstring). `actor` (`bundle` or `bundle:instance`) is
    optional: reads find the run without it, it only narrows what is read."""

    def __init__(self, client: Fleet, run_id: str, actor: str | None = None) -> None:
        self.client = client
        self.run_id = run_id
        self.actor = actor

    def __repr__(self) -> str:
        return f"RunHandle({self.run_id!r}, actor={self.actor!r})"

    # -- waiting ---------------------------------------------------------------------------------------

    async def ending(self, timeout: float | None = None) -> ev.Event:
        """The run's terminal event (`run.completed`, `run.failed` or `run.cancelled`), waiting for it up
        to `timeout` seconds (None: as long as it takes; `TimeoutError` after)."""
        with anyio.fail_after(timeout) if timeout is not None else nullcontext():
            last: ev.Event | None = None
            async with aclosing(_follow(self.client, self.run_id, self.actor)) as events:
                async for event in events:
                    last = event
            if last is None or ev.kind_of(last) not in TERMINAL_KINDS:  # follow returns after the end
                raise RuntimeError(f"the log of run {self.run_id} ended without a terminal event")
            return await self.client.log.resolve(last)

    async def result(self, timeout: float | None = None) -> Any:
        """The run's output once it completes; `RunFailedError` (`RunCancelledError` for a cancel), with the
        reason and detail the log recorded, if it ends otherwise; `TimeoutError` if it has not ended within
        `timeout` seconds."""
        return outcome(self.run_id, await self.ending(timeout))

    # -- reading ---------------------------------------------------------------------------------------

    async def history(self) -> RunHistory:
        """Every event recorded so far, big payloads resolved (empty if the run has no events yet)."""
        history = await self.client.log.read(self.run_id, self.actor)
        if history.events and self.actor is None:
            self.actor = history.actor
        return history

    async def replay(self) -> list[ev.Event]:
        """The run's events, in order, as recorded (what `sa replay` shows)."""
        return list((await self.history()).events)

    async def events(self, *, from_seq: int = 0, follow: bool = True) -> AsyncGenerator[ev.Event, None]:
        """The run's events from `from_seq` on: with `follow`, live until its terminal event (waiting for
        the run to start if it has not); without, those recorded now."""
        if not follow:
            for event in (await self.history()).events:
                if event.seq >= from_seq:
                    yield event
            return
        async with aclosing(_follow(self.client, self.run_id, self.actor, resolve=True)) as events:
            async for event in events:
                if event.seq >= from_seq:
                    yield event

    async def tokens(self) -> AsyncIterator[Delta]:
        """The model's output as it is generated (`runtime.streaming`), live, until the run ends. At most
        once and never stored: what was missed is in the log's `model.responded`."""
        sub, deltas = await subscribe(self.client.nc, self.run_id, self.actor)
        send, receive = anyio.create_memory_object_stream[Delta | None](max_buffer_size=100_000)
        try:
            async with anyio.create_task_group() as tg:
                async def pump() -> None:
                    async with deltas:
                        async for delta in deltas:
                            await send.send(delta)

                async def until_end() -> None:
                    async with aclosing(_follow(self.client, self.run_id, self.actor)) as events:
                        async for _ in events:
                            pass
                    await send.send(None)

                tg.start_soon(pump)
                tg.start_soon(until_end)
                async with receive:
                    async for item in receive:
                        if item is None:
                            break
                        yield item
                tg.cancel_scope.cancel()
        finally:
            await sub.unsubscribe()

    # -- as stored: what a timeline or an index shows (the inspector) --------------------------------------

    async def stored(self) -> RunHistory:
        """Every event recorded so far as the log keeps it: an event whose big fields were moved to the
        object store stays a stub naming them (`event.ref`). Nothing is fetched, so a page listing a run of
        large tool outputs costs one read; `whole(event)` fetches one event's fields when someone opens it."""
        history = await self.client.log.read(self.run_id, self.actor, resolve=False)
        if history.events and self.actor is None:
            self.actor = history.actor
        return history

    async def whole(self, event: ev.Event) -> ev.Event:
        """`event` (one of `stored`'s) whole: a stub's fields fetched from the object store and checked
        against their digest; an event that is not a stub as it is."""
        return await self.client.log.resolve(event)

    async def watch(self) -> AsyncGenerator[ev.Event | Delta | ScriptRunning, None]:
        """The run as a live page shows it: every event from the first as stored (see `stored`; stubs stay
        stubs), the model's output as it is generated and the tool jobs still running, in reading order
        (`live`), ending after the terminal event. Close the iterator when the page goes (e.g.
        `contextlib.aclosing`)."""
        async with aclosing(self.live(resolve=False)) as items:
            async for item in items:
                yield item

    async def live(self, *, tokens: bool = True, scripts: bool = True,
                   resolve: bool = True) -> AsyncGenerator[ev.Event | Delta | ScriptRunning, None]:
        """The run's events from the first, live, until its terminal event; with `tokens`, the model's
        output as it is generated (`Delta`s) among them; with `scripts`, a `ScriptRunning` for each tool
        job still running a moment after it began (`runtime.streaming`: the log has nothing between a
        call's `tool.called` and its outcome); all in the order a person reads a run:

        * a request's fragments come after its `model.requested` and before its `model.responded`: the
          host publishes the fragments on core NATS as the model writes them and appends the events to
          the log, so they reach this process by two paths, and a fragment can overtake the request it
          answers; it is held until that request has been yielded;
        * fragments of a request the log has already answered are dropped (the recorded reply holds
          them all), and so are those still held when the run ends;
        * a request's last message is a `Delta` with `done` (unless it was lost: the stream is at most
          once);
        * a job's notice comes after its call's `tool.called` and before its outcome, once per delivery of
          the job (a worker repeats it for followers that join later); one whose outcome is read already
          is dropped.

        Why the fragments cannot come after their reply: the host publishes all of them before it
        appends `model.responded`, one connection delivers in order, and they are handed over here
        from the subscription's callback, before the log's path (a consumer, then a reader) hands
        over the reply."""
        if not tokens and not scripts:
            async with aclosing(_follow(self.client, self.run_id, self.actor, resolve=resolve)) as events:
                async for event in events:
                    yield event
            return
        send, receive = anyio.create_memory_object_stream[Item | None](max_buffer_size=100_000)

        def receiver(kind: type[Delta] | type[ScriptRunning]) -> Callable[[Msg], Awaitable[None]]:
            async def on_msg(msg: Msg) -> None:
                try:
                    send.send_nowait(kind.decode(msg.data))
                except (msgspec.DecodeError, anyio.WouldBlock):
                    pass  # not one of ours, or a reader far behind: the log has the truth
            return on_msg

        subs = []  # subscribed before the log is read: nothing published meanwhile is missed
        if tokens:
            subject = stream_subject(self.actor, self.run_id) if self.actor else stream_filter(self.run_id)
            subs.append(await self.client.nc.subscribe(subject, cb=receiver(Delta)))
        if scripts:
            subs.append(await self.client.nc.subscribe(script_subject(self.actor, self.run_id),
                                                       cb=receiver(ScriptRunning)))
        try:
            async with anyio.create_task_group() as tg:
                async def from_log() -> None:
                    follow = _follow(self.client, self.run_id, self.actor, resolve=resolve)
                    async with aclosing(follow) as events:
                        async for event in events:
                            await send.send(event)
                    await send.send(None)

                tg.start_soon(from_log)
                async with receive, aclosing(_in_reading_order(receive)) as ordered:
                    async for item in ordered:
                        yield item
                tg.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):  # also when the caller was cancelled (a page gone)
                for sub in subs:
                    await sub.unsubscribe()

    async def status(self) -> str | None:
        """What the runs index says of the run now (`running`, `waiting for approval`, `completed`, ...),
        or None if it has no entry (not started yet, or purged)."""
        info = await self.client.run_info(self.run_id)
        return info.status if info is not None else None

    # -- steering --------------------------------------------------------------------------------------

    async def cancel(self, reason: str = "", *, by: str | None = None) -> ev.Event:
        """End the run (its running tool is stopped too); returns its ending as recorded, which is another
        ending if the run ended first. `ControlError` if it had already ended."""
        return await self.client.control.cancel(self.run_id, reason=reason, by=by)

    async def approvals(self) -> list[Pending]:
        """The calls of this run waiting for a person."""
        from runtime.client.control import pending_in

        history = await self.history()
        return pending_in(self.run_id, history.actor, history.events)

    async def approve(self, call_id: str, *, arguments: dict[str, Any] | None = None, note: str = "",
                      by: str | None = None) -> ev.ApprovalGranted | ev.ApprovalDenied:
        """Let a waiting call run (with `arguments` instead of the model's, checked against the tool's
        schema first); returns the verdict the host recorded."""
        return await self.client.control.approve(self.run_id, call_id, arguments=arguments, note=note, by=by)

    async def deny(self, call_id: str, reason: str, *,
                   by: str | None = None) -> ev.ApprovalGranted | ev.ApprovalDenied:
        """Refuse a waiting call; the model reads `reason` as the tool's error."""
        return await self.client.control.deny(self.run_id, call_id, reason=reason, by=by)

    async def questions(self) -> list[Question]:
        """The questions this run asks a person (`ask_human`) that wait for an answer."""
        from runtime.client.control import questions_in

        history = await self.history()
        return questions_in(self.run_id, history.actor, history.events)

    async def answer(self, call_id: str, answer: Any, *,
                     by: str | None = None) -> ev.QuestionAnswered | ev.ToolFailed:
        """Answer one of this run's questions (checked against its schema first: `ControlError` says what
        does not fit, nothing sent); returns what the host recorded (this answer, or what closed the
        question first: its timeout). A question answered already is refused: an answer is final."""
        return await self.client.control.answer(self.run_id, call_id, answer, by=by)

    async def fork(self, at: int, edit: ForkEdit | None = None, *,
                   bundle: Bundle | None = None) -> RunHandle:
        """A new run that keeps this run's events before seq `at` (with `edit` applied there) and goes on
        from that point without re-calling the model for what it kept; its handle."""
        forked = await self.client.fork(self.run_id, at, edit, bundle=bundle)
        return RunHandle(self.client, forked.run_id, forked.actor)

    async def verify(self, bundle: Bundle | str | Path | None = None) -> Verification:
        """Re-fold the run with the kernel and check it reproduces every recorded effect. `bundle` is the
        run's bundle (loaded, or its path); by default the one the runs index names."""
        from runtime.bundle import load_bundle
        from runtime.client.verify import verify
        from runtime.log.threads import conversation_for

        history = await self.history()
        if not history.events:
            raise LookupError(f"run {self.run_id} has no events (see `sa runs`)")
        if bundle is None:
            info = await self.client.run_info(self.run_id)
            if info is None or not info.bundle:
                raise LookupError(f"the bundle of run {self.run_id} is unknown: pass it")
            bundle = info.bundle
        loaded = bundle if not isinstance(bundle, str | Path) else load_bundle(bundle)
        config = loaded.kernel_config()
        conversation = await conversation_for(self.client.log, config, history.events)
        return verify(config, history.events, conversation)


def _follow(client: Fleet, run_id: str, actor: str | None, *,
            resolve: bool = False) -> AsyncGenerator[ev.Event, None]:
    """The run log's live read of a run, typed as the generator it is (so it can be closed)."""
    return cast(AsyncGenerator[ev.Event, None], client.log.follow(run_id, actor, resolve=resolve))


async def _in_reading_order(items: AsyncIterator[Item | None]) -> AsyncGenerator[Item, None]:
    """`RunHandle.live`'s ordering of events, fragments and script notices as they arrived (None: the log
    ended)."""
    requested: set[str] = set()  # model requests yielded
    answered: set[str] = set()  # ... and answered (their reply or failure yielded)
    held: dict[str, list[Delta]] = {}  # fragments that came before their request
    calls = _Calls()
    async for item in items:
        if item is None:
            return
        if isinstance(item, ScriptRunning):
            if calls.shows(item):
                yield item
            continue
        if isinstance(item, Delta):
            if item.request_id in answered:
                continue
            if item.request_id not in requested:
                held.setdefault(item.request_id, []).append(item)
                continue
            yield item
            continue
        released = calls.saw(item)
        yield item
        for notice in released:  # a job's notice that came before its call's `tool.called`
            yield notice
        if isinstance(item, ev.ModelRequested):  # a new attempt of a failed request streams again
            requested.add(item.request_id)
            answered.discard(item.request_id)
            for delta in held.pop(item.request_id, []):
                yield delta
        elif isinstance(item, ev.ModelResponded | ev.ModelFailed):
            answered.add(item.request_id)
            held.pop(item.request_id, None)


class _Calls:
    """Which tool calls a live reader has seen called and ended, to place each job's `ScriptRunning`
    between its call's `tool.called` and its outcome, once per delivery."""

    def __init__(self) -> None:
        self.called: set[str] = set()
        self.ended: set[str] = set()
        self.shown: set[tuple[str, int]] = set()  # (call, attempt) told already
        self.held: dict[str, ScriptRunning] = {}  # notices that came before their call's `tool.called`

    def shows(self, notice: ScriptRunning) -> bool:
        """True if `notice` is to be yielded now (else it is held for its call, or dropped)."""
        key = (notice.call_id, notice.attempt)
        if notice.call_id in self.ended or key in self.shown:
            return False
        if notice.call_id not in self.called:
            self.held[notice.call_id] = notice
            return False
        self.shown.add(key)
        return True

    def saw(self, event: ev.Event) -> list[ScriptRunning]:
        """Note `event` (about to be yielded); the notices it releases, to yield after it."""
        if isinstance(event, ev.ToolCalled):
            self.called.add(event.call.id)
            notice = self.held.pop(event.call.id, None)
            return [notice] if notice is not None and self.shows(notice) else []
        if isinstance(event, ev.ToolCompleted | ev.ToolFailed):
            self.ended.add(event.call_id)
            self.held.pop(event.call_id, None)
        return []


__all__ = ["RunCancelledError", "RunError", "RunFailedError", "RunHandle", "outcome"]
