"""Questions to a person end to end on a real nats-server: a run whose model calls `ask_human` is parked (no
driver, indexed `waiting for an answer`), an answer folds it back and the run goes on with it, even when the
host that parked it was killed and another host took over; a bad answer is refused with what is wrong and
nothing recorded; a second answer is refused; the timeout gives the bundle's default (or a clear error); a
cancel ends a waiting run at once; the task's deadline ends one that nobody answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from control_helpers import sa
from host_helpers import kinds, running_fleet, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client, ControlError
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.records import WAITING_FOR_ANSWER, parse_active
from runtime.nats.subjects import ACTIVE_BUCKET, SCHEDULES, timer_subject
from runtime.testing import ScriptedModelServer, hermes_call, last_message
from testbed.fleet import SaProcess, start_all

pytestmark = pytest.mark.anyio
YES_NO = {"type": "string", "enum": ["yes", "no"]}


def asker(body: dict[str, Any]) -> str:
    """Asks `Ship it?` (yes or no) once, then answers `got <what ask_human returned>`."""
    last = last_message(body)
    if "<tool_response>" in last:
        return "got " + last.split("<tool_response>")[1].split("</tool_response>")[0].strip()
    return hermes_call("ask_human", {"question": "Ship it?", "answer_schema": YES_NO})


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4)
    return js


def asking_bundle(root: Path, questions: str = "{}", **kw: Any) -> Path:
    """The asker's runs end on the model's reply in text, so its bundle has no terminal tool."""
    return write_bundle(root, "asker", tools=(), extra=f"questions: {questions}\n", terminal=None, **kw)


async def waiting(client: Client, run_id: str, timeout: float = 60.0) -> None:
    """Until the runs index says the run waits for an answer."""
    with anyio.fail_after(timeout):
        while True:
            info = await client.run_info(run_id)
            if info is not None and info.status == WAITING_FOR_ANSWER:
                return
            await anyio.sleep(0.05)


def tool_output(event: ev.Event) -> Any:
    """What the model was told: the JSON after `got ` in the run's answer."""
    assert isinstance(event, ev.RunCompleted)
    return json.loads(event.output.removeprefix("got "))


async def test_a_question_answered_after_the_host_was_killed_continues_the_run(nats_server, topo, tmp_path):
    with ScriptedModelServer(responder=asker) as server:
        bundle = asking_bundle(tmp_path, base_url=server.base_url)
        first, second = (SaProcess(name, ["host", str(bundle), "--task-ack-wait", "3"], nats_server.url,
                                   tmp_path / f"{name}.log", "sa host: serving")
                         for name in ("first", "second"))
        try:
            await anyio.to_thread.run_sync(start_all, [first])
            async with Client(await bus.connect(nats_server.url), owns_connection=True) as client:
                run_id = await publish_task(topo, "asker", "ship the release")
                await waiting(client, run_id)
                [question] = await client.questions("asker")
                assert question.run_id == run_id and question.question == "Ship it?"
                assert question.schema == YES_NO and question.due is None
                handle = client.get(run_id)
                assert [q.call_id for q in await handle.questions()] == [f"{run_id}/1.0"]
                # parked, holding nothing: its `active` entry says only an answer wakes it
                active = await kv_entries(await fleet_kv(topo, ACTIVE_BUCKET))
                [value] = [e.value for key, e in active.items() if key.endswith(run_id)]
                assert parse_active(value) == ("asker", float("inf"))

                await anyio.to_thread.run_sync(first.kill9)  # the host that parked it is gone
                await anyio.to_thread.run_sync(start_all, [second])  # another host takes over

                with pytest.raises(ControlError, match="does not fit the question's schema"):
                    await handle.answer("1.0", "maybe")  # refused before anything is sent
                with pytest.raises(ControlError, match=r"no question .*1\.7 waiting"):
                    await handle.answer("1.7", "yes")
                answered = await handle.answer("1.0", "yes", by="alice")
                assert isinstance(answered, ev.QuestionAnswered) and answered.answer == "yes"
                with anyio.fail_after(60):
                    events = [e async for e in RunLog(topo).follow(run_id)]
                with pytest.raises(ControlError, match="already completed"):
                    await handle.answer("1.0", "no")  # an answer is final
                verified = await handle.verify(bundle)
        finally:
            for host in (first, second):
                await anyio.to_thread.run_sync(host.stop)
    assert verified.ok, verified.problems
    assert kinds(events) == ["run.started", "model.requested", "model.responded", "question.asked",
                             "run.taken", "question.answered", "turn.completed", "model.requested",
                             "model.responded", "turn.completed", "run.completed"]
    assert [e.answer for e in events if isinstance(e, ev.QuestionAnswered)] == ["yes"]  # only the valid one
    assert tool_output(events[-1]) == {"answer": "yes"}
    assert len(server.requests) == 2  # the recorded model call was not made again after the takeover


async def test_a_second_answer_is_refused_and_sa_answer_says_why(nats_server, topo, tmp_path):
    async with running_fleet(nats_server.url, topo, asking_bundle(tmp_path), responder=asker,
                             worker=False) as env:
        client = Client(env.host.nc)
        run_id = await publish_task(topo, "asker", "ship the release")
        await waiting(client, run_id)
        assert run_id not in env.host.drivers  # parked
        listed = await sa(nats_server.url, "questions", "asker")
        assert listed.code == 0 and "Ship it?" in listed.out, listed.out + listed.err
        runs = await sa(nats_server.url, "runs", "asker")
        assert WAITING_FOR_ANSWER in runs.out, runs.out
        bad = await sa(nats_server.url, "answer", run_id, "1.0", "maybe")  # not JSON
        assert bad.code == 1 and "not valid JSON" in bad.err
        wrong = await sa(nats_server.url, "answer", run_id, "1.0", '"maybe"')
        assert wrong.code == 1 and "does not fit the question's schema" in wrong.err and "yes" in wrong.err
        ok = await sa(nats_server.url, "answer", run_id, "1.0", "--text", "no")
        assert ok.code == 0 and "answered" in ok.out, ok.out + ok.err
        again = await sa(nats_server.url, "answer", run_id, "1.0", '"yes"')
        assert again.code == 1 and ("already answered" in again.err or "already completed" in again.err)
        events = await env.wait_run(run_id)
    assert tool_output(events[-1]) == {"answer": "no"}
    assert [e.answer for e in events if isinstance(e, ev.QuestionAnswered)] == ["no"]


@pytest.mark.parametrize(("questions", "told"), [
    ('{timeout: 1s, default: "no"}', {"answer": "no", "note": "nobody answered within 1 s: this is the "
                                                              "default answer"}),
    ("{timeout: 1s}", None),
])
async def test_the_timeout_gives_the_default_or_a_clear_error(nats_server, topo, tmp_path, questions, told):
    async with running_fleet(nats_server.url, topo, asking_bundle(tmp_path, questions), responder=asker,
                             worker=False) as env:
        run_id = await publish_task(topo, "asker", "ship the release")
        events = await env.wait_run(run_id)  # woken by the cluster's clock at the timeout
        verified = await Client(env.host.nc).get(run_id).verify()
        assert await _stored(topo, timer_subject(f"{run_id}/1.0")) == 0  # its wake-up is gone
    assert verified.ok, verified.problems
    assert kinds(events)[3] == "question.asked" and kinds(events)[-1] == "run.completed"
    asked = events[3]
    if told is not None:
        answered = next(e for e in events if isinstance(e, ev.QuestionAnswered))
        assert answered.by == "timeout" and answered.ts >= asked.due
        assert tool_output(events[-1]) == told
    else:
        failed = next(e for e in events if isinstance(e, ev.ToolFailed))
        assert failed.error.kind == "timeout" and "no default answer" in failed.error.message
        assert "nobody answered within 1 s" in events[-1].output


async def test_cancel_ends_a_waiting_run_at_once(nats_server, topo, tmp_path):
    async with running_fleet(nats_server.url, topo, asking_bundle(tmp_path, "{timeout: 1h, default: 'no'}"),
                             responder=asker, worker=False) as env:
        client = Client(env.host.nc)
        run_id = await publish_task(topo, "asker", "ship the release")
        await waiting(client, run_id)
        assert await _stored(topo, timer_subject(f"{run_id}/1.0")) == 1  # its timeout's wake-up, in an hour
        ending = await client.control.cancel(run_id, reason="not needed", by="ops")
        assert isinstance(ending, ev.RunCancelled)
        events = (await RunLog(topo).read(run_id)).events
        assert kinds(events)[-3:] == ["question.asked", "run.taken", "run.cancelled"]  # folded back, fenced
        assert await _stored(topo, timer_subject(f"{run_id}/1.0")) == 0
        assert await client.questions() == []
        with pytest.raises(ControlError, match="already cancelled"):
            await client.answer(run_id, "1.0", "yes")


async def test_the_tasks_deadline_ends_a_run_waiting_for_an_answer(nats_server, topo, tmp_path):
    async with running_fleet(nats_server.url, topo, asking_bundle(tmp_path), responder=asker,
                             worker=False) as env:
        run_id = await publish_task(topo, "asker", "ship the release", timeout_s=2)
        events = await env.wait_run(run_id)  # parked with no timeout: the deadline's wake-up ends it
        verified = await Client(env.host.nc).get(run_id).verify()
    assert verified.ok, verified.problems
    assert kinds(events)[-4:] == ["question.asked", "run.taken", "tool.failed", "run.failed"]
    assert events[-2].error.kind == "timeout" and "before the task's deadline" in events[-2].error.message
    assert events[-1].reason == "deadline" and events[-2].ts >= events[0].ts + 2


async def _stored(js: Any, subject: str) -> int:
    return dict((await js.stream_info(SCHEDULES, subjects_filter="schedules.>")).state.subjects or {}).get(
        subject, 0)
