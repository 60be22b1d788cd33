"""Shared pieces of the inspector's tests (tests/ui/test_ui_api.py, tests/ui/test_ui_browser.py): a scripted
model that can also answer with parallel calls, with a reply full of HTML, or hold a run open until told;
the app served by a real uvicorn on loopback; and, for the browser tests, the whole fleet running on a
background event loop so that the test itself can drive Playwright's synchronous API."""

from __future__ import annotations

import asyncio
import concurrent.futures
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import uvicorn
from host_helpers import calc_responder, running_fleet, write_bundle

from runtime import nats as bus
from runtime.client import Client
from runtime.nats.server import EmbeddedNats
from runtime.nats.topology import ensure_topology
from runtime.testing import Reply, hermes_call, last_message
from runtime.ui.app import create_app

T = TypeVar("T")

# A DNS name the browser tests resolve to 127.0.0.1: the inspector is told it is its own (a proxy's, say)
OTHER_NAME = "inspector.test"

# What a model reply may hold that a page must never run: shown as text, or the page is broken.
HOSTILE = "<script>window.__pwned = 1</script><img src=x onerror='window.__pwned = 2'><b>bold?</b>"


ASKED = "Ship it? " + HOSTILE  # a question is shown as text too

TRANSFER = '''"""Send money to an account."""
from grail import Input

amount: int = Input("amount", description="how much")

{"sent": amount}
'''


def write_ui_bundle(root: Path) -> Path:
    """`write_bundle`'s calc agent plus `transfer`, which waits for an operator above 100, and `ask_human`
    (`questions:`)."""
    path = write_bundle(root)
    (path.parent / "tools" / "transfer.pym").write_text(TRANSFER)
    entry = ("  - path: tools/transfer.pym\n"
             "    approval: {when: {arg: amount, op: '>', value: 100}, role: finance}\n")
    text = path.read_text().replace("termination:", entry + "termination:", 1) + "questions: {}\n"
    path.write_text(text)
    return path


class Gate:
    """Holds every `hold:` task's second model call until `release()` (a run that stays running)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def release(self) -> None:
        self.event.set()

    def reset(self) -> None:
        self.event.clear()


def ui_responder(gate: Gate) -> Callable[[dict[str, Any]], Reply | str]:
    """`calc_responder`, plus: `pair: A | B` makes two calculator calls in one reply (parallel lanes);
    `hostile:` submits `HOSTILE`; `empty:` submits an empty answer in a reply that counts no tokens (a run
    the inspector flags); `hold: EXPR` calls the calculator, then waits for the gate to submit; `pay: N`
    calls `transfer` (over 100 it waits for approval), then submits what the tool said; `ask:` asks a person
    `ASKED` (yes or no), then submits what the answer was."""

    def respond(body: dict[str, Any]) -> Reply | str:
        task = next((m["content"] for m in body["messages"] if m["role"] == "user"), "")
        answered = "<tool_response>" in last_message(body)
        if task.startswith("pair:"):
            if answered:
                return hermes_call("submit", {"answer": "pair done"})
            left, right = task.split(":", 1)[1].split("|")
            return (hermes_call("calculator", {"expression": left.strip()}) + "\n" +
                    hermes_call("calculator", {"expression": right.strip()}))
        if task.startswith("pay:"):
            if answered:
                return hermes_call("submit", {"answer": last_message(body)[-120:]})
            return hermes_call("transfer", {"amount": int(task.split(":", 1)[1])})
        if task.startswith("ask:"):
            if answered:
                return hermes_call("submit", {"answer": last_message(body)[-120:]})
            return hermes_call("ask_human", {"question": ASKED, "answer_schema": {"enum": ["yes", "no"]}})
        if task.startswith("hostile:"):
            return hermes_call("submit", {"answer": HOSTILE})
        if task.startswith("empty:"):  # what a broken model stub does: nothing said, no token counted
            return Reply.of_text(hermes_call("submit", {"answer": ""}), prompt_tokens=0, completion_tokens=0)
        if task.startswith("hold:"):
            if answered:
                gate.event.wait(60)
                return hermes_call("submit", {"answer": "released"})
            return hermes_call("calculator", {"expression": task.split(":", 1)[1].strip()})
        return calc_responder(body)

    return respond


def free_socket() -> socket.socket:
    return socket.create_server(("127.0.0.1", 0))


@asynccontextmanager
async def serving(app: Any) -> AsyncIterator[str]:
    """`app` served by uvicorn on a free loopback port for the block; yields its base URL."""
    sock = free_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    task = asyncio.ensure_future(server.serve(sockets=[sock]))
    try:
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()


class Stack:
    """NATS, a host, a worker, the scripted model and the inspector on a background thread's event loop.

    Playwright's synchronous API refuses to run inside an event loop, so the fleet gets a loop of its own
    and the test calls into it with `call(coroutine)`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.gate = Gate()
        self.nats = EmbeddedNats().start()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="ui-stack", daemon=True)
        self.ready: concurrent.futures.Future[str] = concurrent.futures.Future()
        self.stop_event: asyncio.Event | None = None
        self.js: Any = None
        self.client: Any = None
        self.env: Any = None
        self.base = ""

    def start(self) -> Stack:
        self.thread.start()
        self.main = asyncio.run_coroutine_threadsafe(self._main(), self.loop)
        try:
            self.base = self.ready.result(timeout=90)
        except BaseException:
            if self.main.done():
                self.main.result()
            raise
        return self

    async def _main(self) -> None:
        self.stop_event = asyncio.Event()
        nc = await bus.connect(self.nats.url, name="ui-test")
        try:
            self.client = Client(nc)
            self.js = self.client.js
            await ensure_topology(self.js, partitions=2, tool_ack_wait=2.0)
            bundle = write_ui_bundle(self.root)
            responder = ui_responder(self.gate)
            async with running_fleet(self.nats.url, self.js, bundle, responder=responder) as env:
                self.env = env
                async with serving(create_app(client=self.client, allow_hosts=[OTHER_NAME])) as base:
                    self.ready.set_result(base)
                    await self.stop_event.wait()
        except BaseException as e:
            if not self.ready.done():
                self.ready.set_exception(e)
            raise
        finally:
            await bus.close(nc)

    def call(self, coro: Awaitable[T], timeout: float = 90) -> T:
        async def run() -> T:
            return await coro
        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout)

    def close(self) -> None:
        self.gate.release()
        if self.stop_event is not None:
            self.loop.call_soon_threadsafe(self.stop_event.set)
        try:
            self.main.result(timeout=60)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=10)
            self.nats.stop()
