"""Conversations: threads that continue across runs (by reference to the previous run's log, so EVENTS
grows by the new messages only), model output streamed as it is generated on core NATS, and the three
double-texting policies, on a real nats-server with an in-process host, a real Monty worker and the
scripted model over real HTTP."""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest
from host_helpers import kinds, running_fleet, running_host, running_worker, wait_until, write_bundle
from rich.console import Console

from runtime import events as ev
from runtime import history, kernel
from runtime import nats as bus
from runtime.client import Client
from runtime.client.control import Control
from runtime.client.replay import watch
from runtime.client.verify import verify
from runtime.commands import publish_task, run_id_for
from runtime.host import Host
from runtime.log import RunLog
from runtime.log.threads import Conversations, Threads, conversation, conversation_for, fold_run
from runtime.streaming import Delta, subscribe
from runtime.testing import ScriptedModelServer, hermes_call, last_message
from runtime.types import Message, ToolCall
from runtime.worker import Worker
from testbed.scripts import SPIN

# ── the kernel alone (pure) ───────────────────────────────────────────────────────────────────────────

CONFIG = kernel.KernelConfig(system_prompt="sys")


def _started(run: str, text: str, **kw: Any) -> ev.RunStarted:
    return ev.RunStarted(run_id=run, seq=0, ts=1.0, input=text, **kw)


def test_a_thread_run_starts_from_the_conversation_it_names_and_records_only_its_task():
    earlier = kernel.Conversation("r1", 4, (Message("user", "hi"), Message("assistant", "hello")))
    started = _started("r2", "again", thread="t", previous_run="r1", previous_seq=4)
    state = kernel.evolve(kernel.initial(CONFIG, earlier), started)
    assert [m.content for m in state.messages] == ["sys", "hi", "hello", "again"]
    (call,) = kernel.decide(state)
    assert isinstance(call, kernel.CallModel)
    assert [m.content for m in call.messages] == ["sys", "hi", "hello", "again"]
    assert [m.content for m in call.new_messages] == ["again"]  # the history is the previous run's log


def test_folding_a_thread_run_without_its_conversation_or_with_another_is_an_error():
    started = _started("r2", "again", thread="t", previous_run="r1", previous_seq=4)
    with pytest.raises(kernel.EvolveError, match="continues run r1 up to seq 4"):
        kernel.fold(CONFIG, [started])
    with pytest.raises(kernel.EvolveError, match="continues run r1 up to seq 4"):
        kernel.fold(CONFIG, [started], kernel.Conversation("r1", 3))
    with pytest.raises(kernel.EvolveError, match="continues no conversation"):
        kernel.fold(CONFIG, [_started("r3", "x")], kernel.Conversation("r1", 3))


def test_a_summary_replaces_the_older_messages_and_stays_pinned():
    msgs = tuple(Message("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(10))
    earlier = kernel.Conversation("r1", 20, msgs)
    started = _started("r2", "next", thread="t", previous_run="r1", previous_seq=20, summary="they said hi",
                       summarised=6)
    state = kernel.fold(kernel.KernelConfig(system_prompt="sys", history_window=2), [started], earlier)
    assert state.messages[1] == history.summary_message("they said hi")
    assert [m.content for m in state.messages[2:]] == ["m6", "m7", "m8", "m9", "next"]
    (call,) = kernel.decide(state)
    assert isinstance(call, kernel.CallModel)  # the window keeps the summary (pinned) and the newest two
    assert [m.content for m in call.messages] == ["sys", history.SUMMARY_HEAD + "they said hi", "m9", "next"]


def test_the_conversations_a_host_remembers_are_bounded_by_count_and_by_bytes():
    """Least recently used first: by count, and by what their messages weigh (a few idle threads with
    long conversations must not hold the host's memory); a later conversation of a run replaces its
    earlier one and its weight; an entry heavier than the whole budget is not kept."""
    def conv(run: str, seq: int, size: int) -> kernel.Conversation:
        return kernel.Conversation(run, seq, (Message(role="user", content="x" * size),))

    cache = Conversations(size=3, max_bytes=10_000)
    for run in ("a", "b", "c"):
        cache.put(conv(run, 1, 100))
    assert cache.get("a") is not None  # `a` is now the most recently used: b, c, a
    cache.put(conv("d", 1, 100))  # one too many: `b`, the least recently used, goes
    assert [r for r in "abcd" if r in cache] == ["a", "c", "d"]
    cache.put(conv("c", 2, 4_000))  # replaces c@1 and its weight: a, d, c
    assert cache.get("c", 1) is None and cache.get("c", 2) is not None and len(cache) == 3
    cache.put(conv("e", 1, 5_900))  # past 10,000 bytes: `a` goes (the count), then `d` (the bytes)
    assert [r for r in "acde" if r in cache] == ["c", "e"]
    assert cache.bytes == sum(len(msgspec.msgpack.encode(held.messages))
                              for held in (cache.get("c"), cache.get("e")) if held is not None) <= 10_000
    cache.put(conv("huge", 1, 20_000))
    assert "huge" not in cache and len(cache) == 0 and cache.bytes == 0


def test_an_unfinished_exchange_is_closed_for_the_next_run():
    call = ToolCall("r1/1.0", "spin", {})
    msgs = (Message("system", "sys"), Message("user", "spin"), Message("assistant", "", tool_calls=(call,)))
    out = history.continued(msgs)
    assert [m.role for m in out] == ["user", "assistant", "tool"]
    assert out[-1].tool_call_id == "r1/1.0" and "did not finish" in out[-1].content
    assert history.summary_cut((Message("user", "a"), Message("assistant", "", tool_calls=(call,)),
                                Message("tool", "x", tool_call_id="r1/1.0")), keep=1) == 1


# ── on NATS ───────────────────────────────────────────────────────────────────────────────────────────

@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


def _task(body: dict[str, Any]) -> str:
    """The newest task of the conversation (a user message that is not a tool's response)."""
    users = [m["content"] for m in body["messages"] if m["role"] == "user"]
    return next(u for u in reversed(users) if "<tool_response>" not in u)


def chat_model(body: dict[str, Any]) -> str:
    """A plain answer naming the task and how many user messages the prompt carried (so each run's
    reply shows how much of the thread it saw)."""
    users = [m for m in body["messages"] if m["role"] == "user"]
    return f"answer to {_task(body)[:12]!r} seeing {len(users)} user message(s), as the thread asked"


async def _stream_bytes(js: Any) -> int:
    return int((await js.stream_info("EVENTS")).state.bytes)


async def _ended(js: Any, run_id: str, timeout: float = 60.0) -> list[ev.Event]:
    with anyio.fail_after(timeout):
        async for e in RunLog(js).follow(run_id):
            if ev.kind_of(e) in ("run.completed", "run.failed", "run.cancelled"):
                break
    return (await RunLog(js).read(run_id)).events


@pytest.mark.anyio
async def test_a_three_run_thread_continues_its_conversation_and_stores_it_once(nats_server, topo,
                                                                                tmp_path: Path):
    bundle = write_bundle(tmp_path, "chat", tools=(), terminal=None)  # a chat: runs end on text
    big = "alpha " * 4000  # 24 KB: if a later run re-stored the history, EVENTS would grow by this again
    async with running_fleet(nats_server.url, topo, bundle, responder=chat_model, worker=False) as env:
        js = env.js
        grew, runs = [], []
        for i, text in enumerate([f"first: {big}", "second question", "third question"]):
            before = await _stream_bytes(js)
            run_id = await publish_task(js, "chat", text, task_id=f"th-{i}", thread="support-1")
            events = await _ended(js, run_id)
            assert kinds(events)[-1] == "run.completed", kinds(events)
            grew.append(await _stream_bytes(js) - before)
            runs.append((run_id, events))
        requests = env.server.requests
    # the second and third runs' first requests carry the earlier conversation
    contents = [[m["content"] for m in r["messages"]] for r in requests]
    assert len(requests) == 3
    assert contents[1][1].startswith("first: alpha") and contents[1][-1] == "second question"
    assert "answer to 'first: alpha' seeing 1 user message(s)" in contents[1][2]
    assert contents[2][1].startswith("first: alpha") and contents[2][3] == "second question"
    assert contents[2][-1] == "third question" and len(contents[2]) == 6  # system + 2 exchanges + task
    # ... stored once: each later run records only its own task, and EVENTS grows by its new messages
    for (_, events), prev in zip(runs[1:], runs, strict=False):
        started = events[0]
        assert isinstance(started, ev.RunStarted) and started.thread == "support-1"
        assert started.previous_run == prev[0] and started.previous_seq == len(prev[1])
        requested = next(e for e in events if isinstance(e, ev.ModelRequested))
        assert [m.content for m in requested.messages] == [started.input]
    assert grew[0] > len(big)
    assert grew[1] < 4000 and grew[2] < 4000, grew  # the 24 KB task is not stored again
    assert abs(grew[2] - grew[1]) < 400, grew  # a longer history costs the log nothing more
    # the log alone (plus the bundle) rebuilds and verifies the third run, by reference to the others
    runlog = RunLog(js)
    config = env.host.agents["chat"].config
    last_events = runs[2][1]
    conv = await conversation_for(runlog, config, last_events)
    assert conv is not None and conv.run_id == runs[1][0]
    report = verify(config, last_events, conv)
    assert report.ok, report.problems
    state = await fold_run(runlog, config, last_events)
    assert [m.content for m in state.messages][-2:] == ["third question", last_events[-1].output]
    whole = await conversation(runlog, config, runs[2][0])
    assert [m.role for m in whole.messages] == ["user", "assistant"] * 3
    record, _ = await Threads(js).get("chat", "support-1")
    assert record is not None and record.runs == [r for r, _ in runs]
    assert [r.thread for r in await Threads(js).all("chat")] == ["support-1"]
    # the inspector's run page shows the thread as its runs in order
    from runtime.ui.app import Inspector

    view = await Inspector(js).run(runs[1][0])
    assert view["thread"]["thread"] == "support-1"
    assert [r["run_id"] for r in view["thread"]["runs"]] == [r for r, _ in runs]


def streaming_model(body: dict[str, Any]) -> str:
    """A first reply with words and a calculator call, then (after the tool's response) a long answer."""
    if "<tool_response>" in last_message(body):
        return "The result is in. " * 12 + "Done."
    return "Let me compute that carefully. " + hermes_call("calculator", {"expression": "6 * 7"})


@pytest.mark.anyio
async def test_a_follower_receives_deltas_whose_concatenation_is_the_recorded_reply(nats_server, topo,
                                                                                    tmp_path: Path):
    bundle = write_bundle(tmp_path, "calc", terminal=None)  # the run ends on text
    async with running_fleet(nats_server.url, topo, bundle, responder=streaming_model) as env:
        js = env.js
        run_id = run_id_for("calc", "stream-1")
        nc = await bus.connect(nats_server.url, name="follower")
        sub, received = await subscribe(nc, run_id)
        console = io.StringIO()
        try:
            async with anyio.create_task_group() as tg:
                watched: list[ev.Event | None] = []

                async def follow() -> None:
                    handle = Client(nc).get(run_id)
                    watched.append(await watch(handle, Console(file=console, width=200), tokens=True))

                tg.start_soon(follow)
                await publish_task(js, "calc", "compute: 6 * 7", task_id="stream-1")
                events = await _ended(js, run_id)
            deltas: list[Delta] = []
            with anyio.move_on_after(5):
                async for d in received:
                    deltas.append(d)
                    if d.done and sum(x.done for x in deltas) == 2:
                        break
        finally:
            await sub.unsubscribe()
            await bus.close(nc)
    replies = [e for e in events if isinstance(e, ev.ModelResponded)]
    assert len(replies) == 2 and kinds(events)[-1] == "run.completed"
    for reply in replies:
        mine = [d for d in deltas if d.request_id == reply.request_id]
        assert [d.n for d in mine] == list(range(len(mine)))  # none lost, in order
        assert mine[-1].done and len(mine) > 3  # fragments, not one message
        assert "".join(d.text for d in mine) == reply.text
    assert replies[1].text.startswith("The result is in.")
    # `sa send --follow` (watch) printed the tokens live, then the recorded events
    shown = console.getvalue()
    assert watched and isinstance(watched[0], ev.RunCompleted)
    assert "The result is in. The result is in." in shown and "run.completed" in shown
    assert shown.index("The result is in.") < shown.index("model.responded", shown.index("turn 2"))


# ── double-texting ────────────────────────────────────────────────────────────────────────────────────



def _dt_bundle(root: Path, mode: str) -> Path:
    path = write_bundle(root, "desk", tools=(), extra=f"conversation: {{double_texting: {mode}}}\n")
    (path.parent / "tools" / "spin.pym").write_text(SPIN)
    text = path.read_text().replace("  - tools/submit.pym", "  - tools/submit.pym\n  - path: tools/spin.pym\n"
                                                            "    limits: {max_duration: 60s}")
    path.write_text(text)
    return path


def desk_model(body: dict[str, Any]) -> str:
    """`spin ...` -> a spin call (runs until stopped); after a tool's response, or for any other task,
    submit an answer that lists the user messages of the prompt (so the context is visible)."""
    task = _task(body)
    if "<tool_response>" not in last_message(body) and task.startswith("spin"):
        return hermes_call("spin", {"label": task})
    users = [m["content"][:20] for m in body["messages"] if m["role"] == "user"]
    return hermes_call("submit", {"answer": json.dumps(users)})


@asynccontextmanager
async def desk(url: str, js: Any, root: Path, mode: str) -> AsyncIterator[tuple[Host, Worker, Any]]:
    """Agent `desk` with `double_texting: mode`: a host, one tool worker (one sandbox slot) and the
    scripted `desk_model`."""
    with ScriptedModelServer(responder=desk_model) as server:
        bundle = _dt_bundle(root, mode)
        async with running_host(url, [bundle], server) as host, \
                running_worker(url, [bundle], concurrency=1) as worker:
            yield host, worker, server


async def _spinning(js: Any, worker: Worker, task_id: str) -> str:
    """Start a run whose tool loops in the sandbox until stopped; its id once the loop runs."""
    run_id = await publish_task(js, "desk", f"spin {task_id}", task_id=task_id, thread="q")
    await wait_until(lambda: run_id in worker.running_runs, timeout=30)
    return run_id


def ending(events: list[ev.Event]) -> str:
    """How a run ended (its terminal event's kind; a stopped job's report may follow it in the log)."""
    return next(k for k in kinds(events) if k in ("run.completed", "run.failed", "run.cancelled"))


async def _until(js: Any, run_id: str, kind: str, timeout: float = 30.0) -> list[ev.Event]:
    events: list[ev.Event] = []
    with anyio.move_on_after(timeout):
        while True:
            events = (await RunLog(js).read(run_id)).events
            if kind in kinds(events):
                return events
            await anyio.sleep(0.05)
    raise AssertionError(f"run {run_id} has no {kind}: {[ev.to_json(e) for e in events]}")


@pytest.mark.anyio
async def test_enqueue_runs_both_tasks_in_order(nats_server, topo, tmp_path: Path):
    async with desk(nats_server.url, topo, tmp_path, "enqueue") as (_, worker, _server):
        js = topo
        first = await _spinning(js, worker, "e-1")
        second = await publish_task(js, "desk", "what now?", task_id="e-2", thread="q")
        # the second waits behind the spinning first (enqueue): end the first as an operator would
        await Control(js).cancel(first, reason="test ends it", by="tester")
        a = await _ended(js, first)
        b = await _ended(js, second)
    assert ending(a) == "run.cancelled" and ending(b) == "run.completed"
    a_end = next(e for e in a if isinstance(e, ev.RunCancelled))
    assert b[0].ts >= a_end.ts  # the second started only after the first ended (it waited, in order)
    assert b[0].previous_run == first  # and continued its conversation


@pytest.mark.anyio
async def test_reject_fails_the_second_task_at_once_with_its_reason(nats_server, topo, tmp_path: Path):
    async with desk(nats_server.url, topo, tmp_path, "reject") as (host, worker, _server):
        js = topo
        first = await _spinning(js, worker, "r-1")
        second = await publish_task(js, "desk", "hello?", task_id="r-2", thread="q")
        b = await _ended(js, second)
        # per thread: a task of another thread is not refused; it waits for the actor (one task at a time)
        other = await publish_task(js, "desk", "other thread", task_id="r-3", thread="elsewhere")
        a_running = (await RunLog(js).read(first)).events
        await Control(js).cancel(first, reason="test ends it", by="tester")
        a = await _ended(js, first)
        assert ending(await _ended(js, other)) == "run.completed"
        assert host.stats.tasks_rejected_busy == 1
    assert kinds(b) == ["run.started", "run.failed"]
    failed = b[-1]
    assert isinstance(failed, ev.RunFailed) and failed.reason == "double_texting"
    assert first in failed.detail and "reject" in failed.detail and "thread 'q'" in failed.detail
    assert "run.failed" not in kinds(a_running) and ending(a) == "run.cancelled"


@pytest.mark.anyio
async def test_interrupt_cancels_the_active_run_and_the_new_one_continues_its_conversation(
        nats_server, topo, tmp_path: Path):
    async with desk(nats_server.url, topo, tmp_path, "interrupt") as (_, worker, server):
        js = topo
        first = await _spinning(js, worker, "i-1")
        second = await publish_task(js, "desk", "never mind, summarise", task_id="i-2", thread="q")
        a = await _ended(js, first)
        b = await _ended(js, second)
        a = await _until(js, first, "tool.failed")  # the sandbox really stopped, and said so
        requests = server.requests
        assert worker.stats.cancelled == 1 and worker.running_runs == frozenset()
    assert ending(a) == "run.cancelled"
    cancelled = next(e for e in a if isinstance(e, ev.RunCancelled))
    assert cancelled.by == "double_texting" and second in cancelled.reason
    stopped = next(e for e in a if isinstance(e, ev.ToolFailed))
    assert stopped.error.kind == "cancelled" and "spin stopped while it ran" in stopped.error.message
    assert ending(b) == "run.completed", kinds(b)
    assert b[0].previous_run == first
    answer = json.loads(b[-1].output["answer"])
    assert answer[0] == "spin i-1" and answer[-1].startswith("never mind")
    assert any(re.search("did not finish", str(m.get("content"))) for m in requests[-1]["messages"])
    assert msgspec.json.encode(b)  # the events encode (no stray types)


@pytest.mark.anyio
async def test_a_fork_of_a_thread_run_continues_the_same_conversation(nats_server, topo, tmp_path: Path):
    from runtime.client.fork import fork

    bundle = write_bundle(tmp_path, "chat", tools=(), terminal=None)  # a chat: runs end on text
    async with running_fleet(nats_server.url, topo, bundle, responder=chat_model, worker=False) as env:
        js = env.js
        first = await publish_task(js, "chat", "name a colour", task_id="f-1", thread="fk")
        await _ended(js, first)
        second = await publish_task(js, "chat", "and another", task_id="f-2", thread="fk")
        await _ended(js, second)
        forked = await fork(js, second, 1, bundle=env.host.agents["chat"].bundle)
        events = await _ended(js, forked.run_id)
        prompt = [m["content"] for m in env.server.requests[-1]["messages"]]
        config = env.host.agents["chat"].config
        report = verify(config, events, await conversation_for(RunLog(js), config, events))
    assert ending(events) == "run.completed"
    assert events[0].previous_run == first and prompt[1] == "name a colour" and prompt[-1] == "and another"
    assert report.ok, report.problems


SUMMARY_PROMPT = "SUMMARISE-NOW"


@pytest.mark.anyio
async def test_a_long_thread_starts_from_the_models_summary_and_a_failed_summary_costs_nothing(
        nats_server, topo, tmp_path: Path):
    """With `summarise: {after: 4, keep: 2}` a thread's fourth run (its conversation at 6 messages) starts
    from the bundle model's summary of all but the newest 2, recorded in `run.started` and sent in place of
    the older messages; when the summary call fails, the run simply continues the whole conversation."""
    from runtime.testing import Reply

    fail = {"summaries": False}
    asked: list[str] = []

    def model(body: dict[str, Any]) -> Any:
        last = str(body["messages"][-1]["content"])
        if last.endswith(SUMMARY_PROMPT):
            asked.append(last)
            if fail["summaries"]:
                return Reply.error(500, "summariser down")
            return "gist: the user asked " + ", ".join(re.findall(r"^user: (\w+)", last, re.M))
        return chat_model(body)

    extra = f"conversation: {{summarise: {{after: 4, keep: 2, prompt: {SUMMARY_PROMPT}}}}}\n"
    bundle = write_bundle(tmp_path, "chat", tools=(), extra=extra, terminal=None)
    async with running_fleet(nats_server.url, topo, bundle, responder=model, worker=False) as env:
        js = env.js
        runs = []
        for i, word in enumerate(["alpha", "bravo", "charlie", "delta"]):
            run_id = await publish_task(js, "chat", word, task_id=f"sum-{i}", thread="long")
            runs.append(await _ended(js, run_id))
        fail["summaries"] = True
        run_id = await publish_task(js, "chat", "echo", task_id="sum-fail", thread="other")
        await _ended(js, run_id)
        for i, word in enumerate(["foxtrot", "golf", "hotel", "india"]):
            run_id = await publish_task(js, "chat", word, task_id=f"sum-f{i}", thread="other")
            failed_thread = await _ended(js, run_id)
        requests = env.server.requests

    assert [kinds(r)[-1] for r in runs] == ["run.completed"] * 4
    starts = [r[0] for r in runs]
    assert all(isinstance(s, ev.RunStarted) for s in starts)
    assert [s.summary for s in starts[:3]] == [None, None, None]  # 0, 2, 4 messages: none due
    fourth = starts[3]
    assert fourth.summary == "gist: the user asked alpha, bravo" and fourth.summarised == 4
    assert "user: alpha" in asked[0] and "user: bravo" in asked[0] and "charlie" not in asked[0]
    # the fourth run's request: the summary (pinned, first), the kept exchange, the new task; not the rest
    request = next(r for r in requests if r["messages"][-1]["content"] == "delta")
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert users[0] == history.SUMMARY_HEAD + fourth.summary
    assert users[1:] == ["charlie", "delta"]
    assert not any("alpha" in str(m["content"]) or "bravo" in str(m["content"])
                   for m in request["messages"][1:] if m["content"] != users[0])
    # a failed summary: the run starts without one and its request carries the whole conversation
    last_start = failed_thread[0]
    assert kinds(failed_thread)[-1] == "run.completed"
    assert isinstance(last_start, ev.RunStarted) and last_start.summary is None and last_start.summarised == 0
    request = next(r for r in requests if r["messages"][-1]["content"] == "india")
    users = [m["content"] for m in request["messages"] if m["role"] == "user"]
    assert users == ["echo", "foxtrot", "golf", "hotel", "india"]
    assert len(asked) > 1  # the failing thread did ask for summaries
