"""One contract, two run logs: the JetStream log (`runtime.log.RunLog`, on a real nats-server) and the log in
memory (`runtime.log.memory.MemoryRunLog`) the in-process `Agent` writes to. The one run driver
(`runtime.driver.RunDriver`) relies on exactly these rules, so both logs are held to the same tests, and the
same run driven over each gives the same events."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import msgspec
import pytest

from runtime import events as ev
from runtime import kernel
from runtime import nats as bus
from runtime.driver.local import LocalModel, LocalPorts
from runtime.driver.run import RunDriver
from runtime.jobs import ToolOutcome
from runtime.log import RunLog, Superseded
from runtime.log.memory import MemoryRunLog
from runtime.model import ModelStep
from runtime.model.adapters import get_adapter
from runtime.model.client import ModelClient
from runtime.testing import ScriptedModelServer
from runtime.tools import ScriptTool
from runtime.types import ToolCall, ToolResult, ToolSchema

pytestmark = pytest.mark.anyio
AGENTS = Path(__file__).parents[2] / "agents"


@pytest.fixture(params=["jetstream", "memory"])
async def log(request: pytest.FixtureRequest, js: Any) -> AsyncIterator[Any]:
    """Each log in turn (the server is started for both: ~30 ms, and one fixture serves every test)."""
    if request.param == "memory":
        yield MemoryRunLog()
        return
    await bus.ensure_topology(js, partitions=2)
    yield RunLog(js)


def stamped(event: ev.Event, seq: int, actor: str = "calc") -> ev.Event:
    return ev.stamp(event, seq=seq, ts=1_700_000_000.0 + seq, actor=actor)


def a_run(run_id: str) -> list[ev.Event]:
    call = ToolCall(id=f"{run_id}/1.0", name="add", arguments={"a": 1, "b": 2})
    return [stamped(e, i) for i, e in enumerate([
        ev.RunStarted(run_id=run_id, input="1 + 2"),
        ev.ModelRequested(run_id=run_id, request_id=f"{run_id}/1", turn=1),
        ev.ModelResponded(run_id=run_id, request_id=f"{run_id}/1", turn=1, calls=(call,)),
        ev.ToolCalled(run_id=run_id, call=call),
        ev.ToolCompleted(run_id=run_id, call_id=call.id, tool="add", output=3),
        ev.RunCompleted(run_id=run_id, output=3),
    ])]


async def test_create_appends_the_first_event_once(log: Any) -> None:
    events = a_run("c1")
    first = await log.create(events[0])
    assert first is not None and first > 0
    assert await log.create(events[0]) is None  # a re-sent task finds its run
    assert [e.seq for e in (await log.read("c1")).events] == [0]


async def test_one_writer_appends_in_order_and_a_stale_one_is_superseded(log: Any) -> None:
    events = a_run("c2")
    last = await log.create(events[0])
    for e in events[1:4]:
        after = await log.append(e, expect=last)
        assert after > last
        last = after
    with pytest.raises(Superseded, match="another writer appended first"):
        await log.append(events[4], expect=last - 1)
    last = await log.append(events[4], expect=last)
    last = await log.append(events[5], expect=last)
    history = await log.read("c2")
    assert history.events == events  # what was written, in order, decoded by the schema
    assert history.last_seq == last and len(history.stream_seqs) == len(events)
    assert (await log.last("c2", "calc"))[0] == last


async def test_runs_do_not_share_a_sequence_expectation(log: Any) -> None:
    a, b = a_run("c3a"), a_run("c3b")
    last_a = await log.create(a[0])
    last_b = await log.create(b[0])
    last_a = await log.append(a[1], expect=last_a)  # another run's append in between changes nothing here
    await log.append(b[1], expect=last_b)
    assert [e.seq for e in (await log.read("c3a")).events] == [0, 1]
    assert [e.seq for e in (await log.read("c3b")).events] == [0, 1]


async def test_an_unstamped_event_is_refused_and_nothing_is_written(log: Any) -> None:
    with pytest.raises(ValueError, match="not stamped"):
        await log.append(ev.RunStarted(run_id="c4", input="x"), expect=0)
    assert (await log.read("c4")).events == []
    assert await log.last("c4", "calc") is None


async def test_a_group_is_one_message_stored_or_refused_whole(log: Any) -> None:
    events = a_run("c6")
    last = await log.create(events[0])
    with pytest.raises(Superseded, match="another writer appended first"):
        await log.append_group(events[1:4], expect=last - 1)  # a stale writer's group: none of it lands
    assert [e.seq for e in (await log.read("c6")).events] == [0]
    group = await log.append_group(events[1:4], expect=last)
    assert group is not None and group > last
    assert await log.last("c6", "calc") == (group, "c6/1-3")  # a retried group is known by its id
    last = await log.append(events[4], expect=group)  # what the next append expects: the group's sequence
    last = await log.append_group(events[5:], expect=last)  # a group of one is a plain append
    history = await log.read("c6")
    assert history.events == events
    assert history.stream_seqs[1] == history.stream_seqs[2] == history.stream_seqs[3] == group
    assert len(set(history.stream_seqs)) == 4 and history.last_seq == last
    assert await log.last("c6", "calc") == (last, "c6/5")


async def test_a_group_of_unstamped_or_mixed_runs_is_refused(log: Any) -> None:
    events = a_run("c7")
    last = await log.create(events[0])
    with pytest.raises(ValueError, match="not stamped"):
        await log.append_group([events[1], ev.TurnCompleted(run_id="c7", turn=1)], expect=last)
    with pytest.raises(ValueError, match="the events of one run"):
        await log.append_group([events[1], a_run("other")[2]], expect=last)
    with pytest.raises(ValueError, match=r"run\.started is a message of its own"):  # found by its subject
        await log.append_group(a_run("c8")[:2], expect=0)
    assert [e.seq for e in (await log.read("c7")).events] == [0]


async def test_payloads_give_back_what_they_were_given(log: Any) -> None:
    value = {"rows": ["x" * 100] * 4_000}  # over the threshold: the JetStream log moves it out
    stored = await log.payloads.offload(value, run="c5")
    assert await log.payloads.resolve(stored) == value
    outcome = ToolOutcome(run_id="c5", actor="calc", call_id="c5/1.0", tool="t", result=ToolResult(output=7))
    assert (await log.payloads.resolve_outcome(outcome)).result.output == 7


SUBMIT = ToolSchema("submit_result", "Finish with the answer.",
                    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]})


async def _drive(log: Any, run_id: str) -> tuple[kernel.State, list[ev.Event]]:
    """One run by the one driver with the in-process ports, written to `log`."""
    qwen = get_adapter("qwen3")
    tools = [ScriptTool.from_path(AGENTS / "calculator.pym")]
    config = kernel.KernelConfig(system_prompt="Compute.", tools=(tools[0].schema, SUBMIT),
                                 terminal_tool="submit_result")
    replies = [qwen.format_call("calculator", {"expression": "6 * 7"}),
               qwen.format_call("submit_result", {"answer": "42"})]
    seen: list[ev.Event] = []
    with ScriptedModelServer(replies) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            async with anyio.create_task_group() as group:
                ports = LocalPorts(group, {t.schema.name: t for t in tools}, data=None, approver=None,
                                   answerer=None, clock=lambda: 1_700_000_000.0)
                driver: RunDriver[LocalModel] = RunDriver(
                    log, LocalModel(ModelStep.for_config(qwen, config, None), client), ports, "calc", run_id,
                    state=kernel.initial(config), last_seq=0, on_event=seen.append,
                    clock=lambda: 1_700_000_000.0)
                await driver.append(ev.RunStarted(run_id=run_id, input="6 * 7?"))
                state = await driver.run()
    assert (await log.read(run_id)).events == seen  # the log holds what the driver saw written
    return state, seen


def _comparable(event: ev.Event) -> Any:
    """An event without what differs between two runs of the same thing: when the sandbox and the model
    server took how long, on which process, at which port."""
    data = msgspec.to_builtins(event)
    for key in ("ts", "duration_ms", "latency_ms", "script", "worker", "server"):
        data.pop(key, None)
    return data


async def test_the_same_run_over_either_log_gives_the_same_events(js: Any) -> None:
    await bus.ensure_topology(js, partitions=2)
    memory_state, memory_events = await _drive(MemoryRunLog(), "same1")
    stream_state, stream_events = await _drive(RunLog(js), "same1")
    assert memory_state.status == stream_state.status == "completed"
    assert memory_state.output == stream_state.output == {"answer": "42"}
    assert [_comparable(e) for e in memory_events] == [_comparable(e) for e in stream_events]
