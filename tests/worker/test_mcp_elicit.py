"""An MCP server asking the user for input in the middle of a call (`elicitation/create`) on a fleet: a real
nats-server, an in-process host and worker, the scripted model, and a server written with the official SDK.

On the 2026 protocol the server does not hold the call open while it waits: it answers with an
input-required result (its question, the schema the answer must fit, and a sealed `request_state`). The
worker makes that the run's durable question (`question.asked`, the requested schema as its schema), the
run parks holding nothing, `sa answer` answers it like any question, and the call goes out again carrying
the answer, which the server uses to finish (`runtime.worker.mcp_clients`, `runtime.questions.resumed`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from control_helpers import sa
from host_helpers import SUBMIT, running_fleet
from mcp_helpers import PYTHON, asker_server, calls

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.testing import hermes_call, last_message

pytestmark = pytest.mark.anyio


def bundle(root: Path) -> tuple[Path, Path]:
    script, count = asker_server(root)
    folder = root / "booker"
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    path = folder / "bundle.yaml"
    path.write_text("name: booker\nsystem_prompt: You book places.\n"
                    "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
                    "tools: [tools/submit.pym]\ntermination: {terminal_tool: submit, max_turns: 4}\n"
                    f"mcp:\n  asker:\n    command: {PYTHON}\n    args: [{script}]\n"
                    f"    env: {{COUNT_FILE: '{count}'}}\n")
    return path, count


def responder(body: dict[str, Any]) -> str:
    last = last_message(body)
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-200:]})
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    tool = "asker_reserve" if task.startswith("reserve") else "asker_book"
    return hermes_call(tool, {"place": "the blue room"})


async def asked_next(js: Any, run_id: str, after: int) -> ev.QuestionAsked:
    """The run's first `question.asked` after seq `after`."""
    with anyio.fail_after(60):
        async for e in RunLog(js).follow(run_id):
            if isinstance(e, ev.QuestionAsked) and e.seq > after:
                return e
            assert not isinstance(e, ev.RunCompleted | ev.RunFailed), ev.to_json(e)
    raise AssertionError("the run's log ended")


async def test_a_servers_request_for_input_is_the_runs_question_and_the_answer_goes_back(
        nats_server, js, tmp_path: Path) -> None:
    await bus.ensure_topology(js)
    path, count = bundle(tmp_path)
    async with running_fleet(nats_server.url, js, path, responder=responder):
        run_id = await publish_task(js, "booker", "book the blue room")
        before: list[ev.Event] = []
        with anyio.fail_after(60):
            async for e in RunLog(js).follow(run_id):
                before.append(e)
                if isinstance(e, ev.QuestionAsked):
                    break
        asked = before[-1]
        assert isinstance(asked, ev.QuestionAsked), [ev.to_json(e)[:200] for e in before[-3:]]
        assert asked.question == "asker/book asks: Who is booking the blue room?"
        assert asked.schema is not None and asked.schema["required"] == ["name", "sure"]
        assert asked.schema["properties"]["sure"]["type"] == "boolean"  # the server's requested schema
        assert calls(count) == ["asked"]  # the server asked, and finished nothing
        wrong = await sa(nats_server.url, "answer", run_id, asked.call_id, json.dumps({"name": "Ann"}))
        assert wrong.code != 0 and "sure" in wrong.err  # checked against the requested schema first
        given = await sa(nats_server.url, "answer", run_id, asked.call_id,
                         json.dumps({"name": "Ann", "sure": True}))
        assert given.code == 0, given.err
        events: list[ev.Event] = []
        with anyio.fail_after(60):
            async for e in RunLog(js).follow(run_id):
                events.append(e)
    done = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "asker_book")
    assert "booked the blue room for Ann (sure)" in json.dumps(done.output)
    assert isinstance(events[-1], ev.RunCompleted)
    assert calls(count)[-1] == "booked" and calls(count).count("booked") == 1
    called = [e for e in events if isinstance(e, ev.ToolCalled)]
    assert [e.call.name for e in called].count("asker_book") == 1  # one call, in two rounds
    replayed = await sa(nats_server.url, "replay", run_id, "--verify", "--bundle", str(path))
    assert replayed.code == 0, replayed.err
    assert calls(count).count("booked") == 1  # replay and verify called nothing


async def test_a_server_asking_twice_asks_two_questions_and_each_answer_is_the_one_returned(
        nats_server, js, tmp_path: Path) -> None:
    """`reserve` asks who, then (with that answer) how many seats: two rounds, two questions on one call. The
    client's `answer` returns the answer recorded for this round's question, not the earlier round's."""
    await bus.ensure_topology(js)
    path, _ = bundle(tmp_path)
    async with running_fleet(nats_server.url, js, path, responder=responder) as env:
        client = Client(env.host.nc)
        run_id = await publish_task(js, "booker", "reserve the blue room")
        first = await asked_next(js, run_id, -1)
        assert first.round == 0 and "Who is booking" in first.question
        one = await client.answer(run_id, first.call_id, {"name": "Bo", "sure": False})
        assert isinstance(one, ev.QuestionAnswered) and one.answer == {"name": "Bo", "sure": False}
        second = await asked_next(js, run_id, first.seq)
        assert second.call_id == first.call_id and second.round == 1
        assert second.question == "asker/reserve asks: How many seats for Bo?"
        assert second.schema is not None and second.schema["properties"]["seats"]["type"] == "integer"
        two = await client.answer(run_id, second.call_id, {"seats": 3})
        assert isinstance(two, ev.QuestionAnswered) and two.answer == {"seats": 3} and two.seq > second.seq
        events = await env.wait_run(run_id)
    done = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "asker_reserve")
    assert "reserved 3 at the blue room for Bo" in json.dumps(done.output)
    assert isinstance(events[-1], ev.RunCompleted)
