"""The client for code that is not async: a script, a notebook cell, a Django view.

    with SyncClient.connect("nats://localhost:4222") as client:
        handle = client.start("calc", "17 * 23 + 4")
        print(handle.result(timeout=60))
        for event in handle.events():
            print(event.seq, type(event).__name__)

Why a facade and not a second client: the async `Client` runs in an event loop of its own on a background
thread (anyio's blocking portal), and each call here waits for the same call there, so both behave alike
by construction. Async iterators become ordinary iterators, pulled one item at a time through the portal.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from runtime import events as ev
from runtime.client.client import Client, RunInfo
from runtime.client.control import Pending, Question
from runtime.client.handle import RunHandle
from runtime.streaming import Delta

T = TypeVar("T")


def _iterate(portal: BlockingPortal, agen: AsyncIterator[T]) -> Iterator[T]:
    """An async iterator as a blocking one; closed in the loop when the caller stops early."""
    try:
        while True:
            try:
                yield portal.call(agen.__anext__)
            except StopAsyncIteration:
                return
    finally:
        aclose: Callable[[], Any] | None = getattr(agen, "aclose", None)
        if aclose is not None:
            portal.call(aclose)


class SyncRunHandle:
    """`RunHandle`'s operations, blocking (each method documents itself on `RunHandle`)."""

    def __init__(self, portal: BlockingPortal, handle: RunHandle) -> None:
        self._portal = portal
        self.handle = handle
        self.run_id = handle.run_id

    def __repr__(self) -> str:
        return f"SyncRunHandle({self.run_id!r})"

    def result(self, timeout: float | None = None) -> Any:
        return self._portal.call(self.handle.result, timeout)

    def ending(self, timeout: float | None = None) -> ev.Event:
        return self._portal.call(self.handle.ending, timeout)

    def events(self, *, from_seq: int = 0, follow: bool = True) -> Iterator[ev.Event]:
        return _iterate(self._portal, self.handle.events(from_seq=from_seq, follow=follow))

    def tokens(self) -> Iterator[Delta]:
        return _iterate(self._portal, self.handle.tokens())

    def replay(self) -> list[ev.Event]:
        return self._portal.call(self.handle.replay)

    def status(self) -> str | None:
        return self._portal.call(self.handle.status)

    def cancel(self, reason: str = "") -> ev.Event:
        return self._portal.call(lambda: self.handle.cancel(reason))

    def approvals(self) -> list[Pending]:
        return self._portal.call(self.handle.approvals)

    def approve(self, call_id: str, *, arguments: dict[str, Any] | None = None,
                note: str = "") -> ev.ApprovalGranted | ev.ApprovalDenied:
        return self._portal.call(lambda: self.handle.approve(call_id, arguments=arguments, note=note))

    def deny(self, call_id: str, reason: str) -> ev.ApprovalGranted | ev.ApprovalDenied:
        return self._portal.call(self.handle.deny, call_id, reason)

    def questions(self) -> list[Question]:
        return self._portal.call(self.handle.questions)

    def answer(self, call_id: str, answer: Any) -> ev.QuestionAnswered | ev.ToolFailed:
        return self._portal.call(self.handle.answer, call_id, answer)

    def fork(self, at: int, edit: Any = None) -> SyncRunHandle:
        return SyncRunHandle(self._portal, self._portal.call(self.handle.fork, at, edit))

    def verify(self, bundle: Any = None) -> Any:
        return self._portal.call(self.handle.verify, bundle)


class SyncClient:
    """`Client`, blocking (see the module docstring). Close it, or use it in a `with` block."""

    def __init__(self, portal_cm: AbstractContextManager[BlockingPortal], portal: BlockingPortal,
                 client: Client) -> None:
        self._portal_cm = portal_cm
        self._portal = portal
        self.client = client

    @classmethod
    def connect(cls, servers: str | list[str] | None = None, **options: Any) -> SyncClient:
        """`Client.connect(servers, **options)` in a background event loop."""
        portal_cm = start_blocking_portal(backend="asyncio")
        portal = portal_cm.__enter__()
        try:
            client = portal.call(lambda: Client.connect(servers, **options))
        except BaseException:
            portal_cm.__exit__(None, None, None)
            raise
        return cls(portal_cm, portal, client)

    def close(self) -> None:
        try:
            self._portal.call(self.client.close)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def __enter__(self) -> SyncClient:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def start(self, agent: str, input: str, **options: Any) -> SyncRunHandle:
        handle = self._portal.call(lambda: self.client.start(agent, input, **options))
        return SyncRunHandle(self._portal, handle)

    def run(self, agent: str, input: str, *, result_timeout: float | None = None, **options: Any) -> Any:
        return self.start(agent, input, **options).result(result_timeout)

    def get(self, run_id: str, actor: str | None = None) -> SyncRunHandle:
        return SyncRunHandle(self._portal, self.client.get(run_id, actor))

    def runs(self, agent: str | None = None, *, limit: int | None = None) -> list[RunInfo]:
        return self._portal.call(lambda: self.client.runs(agent, limit=limit))

    def approvals(self, agent: str | None = None) -> list[Pending]:
        return self._portal.call(self.client.approvals, agent)

    def questions(self, agent: str | None = None) -> list[Question]:
        return self._portal.call(self.client.questions, agent)

    def answer(self, run_id: str, call_id: str, answer: Any) -> ev.QuestionAnswered | ev.ToolFailed:
        return self._portal.call(self.client.answer, run_id, call_id, answer)

    def status(self) -> dict[str, Any]:
        return self._portal.call(self.client.status)


__all__ = ["SyncClient", "SyncRunHandle"]
