"""Agents as tools: a bundle lists another agent (`- agent: helper`), and calling it is a durable child
run, on a real nats-server with in-process hosts and a tool worker: the child's `run.started` names its
parent, the parent completes with the child's output, a parent host killed while its child runs leaves
one child and a parent that still completes, an agent no host serves and a cycle beyond the depth limit
are error values, and cancelling the parent cancels the child."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import events as ev
from runtime import nats as bus
from runtime.bundle import BundleError, load_bundle
from runtime.client.replay import describe
from runtime.commands import (
    DEPTH,
    PARENT_CALL,
    PARENT_RUN,
    child_actor,
    child_run_id,
    publish_command,
    publish_task,
)
from runtime.host.leases import LeaseConfig
from runtime.log import RunLog
from runtime.nats.kv import kv_entries, runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.server import EmbeddedNats
from runtime.nats.subjects import EVENTS
from runtime.testing import Reply, ScriptedModelServer, hermes_call, last_message
from tests.host_helpers import SUBMIT, hosts, running_host, running_worker, wait_until
from tests.nats.test_auth import creds, secured_fleet

pytestmark = pytest.mark.anyio
FAST = LeaseConfig(ttl=2.0, renew=0.5)


def agent_bundle(root: Path, name: str, *, delegates: str | None = None, max_depth: int | None = None,
                 base_url: str = "http://127.0.0.1:9/v1") -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "submit.pym").write_text(SUBMIT)
    entries = "  - submit.pym\n"
    if delegates:
        entries += f"  - agent: {delegates}\n    description: Ask {delegates} to find something out.\n"
        if max_depth:
            entries += f"    max_depth: {max_depth}\n"
    (folder / "bundle.yaml").write_text(
        f"name: {name}\nsystem_prompt: You are {name}.\n"
        f"model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}\n"
        f"tools:\n{entries}termination: {{terminal_tool: submit, max_turns: 4}}\n")
    return folder / "bundle.yaml"


def responder(helper_delay: float = 0.0, *, boss_calls: str = "helper"):
    """`boss` delegates to `boss_calls`, then submits what it heard; `helper` answers after a delay."""

    def respond(body: dict[str, Any]) -> Reply:
        system = body["messages"][0]["content"]
        last = last_message(body)
        if "<tool_response>" in last:
            return Reply.of_text(hermes_call("submit", {"answer": "heard: " + last[-160:]}))
        if "You are helper" in system:
            return Reply.of_text(hermes_call("submit", {"answer": "Paris"}), delay=helper_delay)
        callee = "ghost" if "You are lonely" in system else boss_calls
        return Reply.of_text(hermes_call(callee, {"task": "what is the capital of France?"}))

    return respond


async def started_runs(js: Any) -> list[ev.RunStarted]:
    """Every `run.started` in EVENTS, read through the run log's decoder."""
    info = await js.stream_info(EVENTS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(EVENTS, seq)
        except Exception:
            continue
        out += [e for e in ev.decode_all(msg.data) if isinstance(e, ev.RunStarted)]
    return out


async def follow(js: Any, run_id: str, timeout: float = 60.0) -> list[ev.Event]:
    out: list[ev.Event] = []
    with anyio.fail_after(timeout):
        async for e in RunLog(js).follow(run_id, resolve=True):
            out.append(e)
    return out


def test_agent_tool_entries_are_checked_at_load_time(tmp_path: Path) -> None:
    b = load_bundle(agent_bundle(tmp_path, "boss", delegates="helper"))
    tool = b.tools["helper"]
    assert tool.schema.parameters["required"] == ["task"]
    assert tool.schema.description == "Ask helper to find something out."
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "bundle.yaml").write_text(
        "name: bad\ntools:\n  - agent: Not An Agent\n  - {agent: x, python: m:f}\n"
        "  - agent: y\n    max_depth: 0\n")
    with pytest.raises(BundleError) as info:
        load_bundle(tmp_path / "bad")
    text = str(info.value)
    assert "tools[0].agent:" in text and "tools[1]: a tool entry has one of" in text
    assert "tools[2].max_depth: must be at least 1" in text


async def test_the_parent_completes_with_the_child_output_and_the_child_names_its_parent(
        js, nats_server, tmp_path: Path) -> None:
    await bus.ensure_topology(js)
    with ScriptedModelServer(responder=responder()) as server:
        boss, helper = agent_bundle(tmp_path, "boss", delegates="helper"), agent_bundle(tmp_path, "helper")
        async with running_host(nats_server.url, [boss, helper], server), \
                running_worker(nats_server.url, [boss, helper]):
            parent = await publish_task(js, "boss", "find the capital")
            events = await follow(js, parent)
    assert isinstance(events[-1], ev.RunCompleted), events[-1]
    assert "Paris" in events[-1].output["answer"]
    done = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "helper")
    assert done.output == {"answer": "Paris"}
    (child,) = [s for s in await started_runs(js) if s.metadata.get(PARENT_RUN) == parent]
    assert child.metadata[PARENT_CALL] == done.call_id and child.metadata[DEPTH] == 1
    assert child.input == "what is the capital of France?"
    assert child.actor == child_actor("helper", parent, done.call_id)
    assert child.run_id == child_run_id("helper", parent, done.call_id)
    assert f"sub-run of {parent} (call {done.call_id})" in describe(child)  # `sa replay` links them
    # and the inspector's run pages: the parent lists its child, the child names its parent
    from runtime.log import RunLog
    from runtime.ui.views import subruns

    entries = await kv_entries(await runs_kv(js))
    index = {key: RunIndex.decode(e.value) for key, e in entries.items() if e.value}
    assert subruns(parent, events, index)["children"] == [
        {"run_id": child.run_id, "call_id": done.call_id.rsplit("/", 1)[-1], "agent": "helper",
         "status": index[child.run_id].status}]
    child_events = (await RunLog(js).read(child.run_id)).events
    assert subruns(child.run_id, child_events, index) == {
        "parent": {"run_id": parent, "call_id": done.call_id}, "children": []}


async def test_a_waiting_parent_holds_no_worker_slot(js, nats_server, tmp_path: Path) -> None:
    """One worker slot: the child's own tool job must run while the parent's call waits for the child,
    which it can only because the parent's agent-tool job was handed over and acked, not held."""
    await bus.ensure_topology(js)
    with ScriptedModelServer(responder=responder()) as server:
        boss, helper = agent_bundle(tmp_path, "boss", delegates="helper"), agent_bundle(tmp_path, "helper")
        async with running_host(nats_server.url, [boss, helper], server), \
                running_worker(nats_server.url, [boss, helper], concurrency=1) as worker:
            parent = await publish_task(js, "boss", "find the capital")
            events = await follow(js, parent, timeout=60)
            delegated = worker.stats.delegated
    assert isinstance(events[-1], ev.RunCompleted), [ev.kind_of(e) for e in events]
    assert "Paris" in events[-1].output["answer"] and delegated == 1


async def test_kill_the_parents_host_while_its_child_runs_one_child_and_the_parent_completes(
        js, nats_server, tmp_path: Path) -> None:
    await bus.ensure_topology(js, partitions=5, tool_ack_wait=2.0)
    with ScriptedModelServer(responder=responder(helper_delay=2.0)) as server:
        boss, helper = agent_bundle(tmp_path, "boss", delegates="helper"), agent_bundle(tmp_path, "helper")
        async with hosts(nats_server.url, [boss, helper], server, 2, lease=FAST) as (a, b), \
                running_worker(nats_server.url, [boss, helper]):
            await wait_until(lambda: len(a.host.slots) + len(b.host.slots) == 2 * 5)  # 2 bundles x 5
            parent = await publish_task(js, "boss", "find the capital")
            owner = None

            def child_running() -> bool:
                nonlocal owner
                drivers = {**a.host.drivers, **b.host.drivers}
                owner = a if parent in a.host.drivers else b if parent in b.host.drivers else None
                return owner is not None and any(r != parent for r in drivers)

            await wait_until(child_running, timeout=30)
            assert owner is not None
            await owner.crash()  # the parent's host dies while the child waits for its model
            events = await follow(js, parent, timeout=90)
    assert isinstance(events[-1], ev.RunCompleted), [ev.kind_of(e) for e in events]
    assert "Paris" in events[-1].output["answer"]
    children = [s for s in await started_runs(js) if s.metadata.get(PARENT_RUN) == parent]
    assert len(children) == 1, children  # recovery re-attached to the same child, never a second one
    assert sum(isinstance(e, ev.RunStarted) for e in events) == 1


async def test_unserved_agents_and_cycles_beyond_the_depth_limit_are_error_values(
        js, nats_server, tmp_path: Path) -> None:
    await bus.ensure_topology(js)
    with ScriptedModelServer(responder=responder(boss_calls="boss")) as server:
        # boss calls itself: each child is a boss that delegates again, until the depth limit says no
        boss = agent_bundle(tmp_path, "boss", delegates="boss", max_depth=2)
        lonely = agent_bundle(tmp_path, "lonely", delegates="ghost")
        async with running_host(nats_server.url, [boss, lonely], server), \
                running_worker(nats_server.url, [boss, lonely], concurrency=4):
            parent = await publish_task(js, "boss", "recurse")
            events = await follow(js, parent, timeout=90)
            alone = await publish_task(js, "lonely", "ask the ghost")
            lonely_events = await follow(js, alone)
    nested = [s for s in await started_runs(js) if s.metadata.get(PARENT_RUN)]
    assert sorted(s.metadata[DEPTH] for s in nested) == [1, 2]  # depth 3 was refused
    assert isinstance(events[-1], ev.RunCompleted)
    refusals = [e for e in await all_events(js) if isinstance(e, ev.ToolFailed) and e.error.kind == "policy"]
    assert len(refusals) == 1 and "nest sub-runs 3 deep, over the limit of 2" in refusals[0].error.message
    failed = next(e for e in lonely_events if isinstance(e, ev.ToolFailed))
    assert failed.error.kind == "input" and "no host serves agent 'ghost'" in failed.error.message


async def test_cancelling_the_parent_cancels_its_child(js, nats_server, tmp_path: Path) -> None:
    await bus.ensure_topology(js)
    with ScriptedModelServer(responder=responder(helper_delay=30.0)) as server:
        boss, helper = agent_bundle(tmp_path, "boss", delegates="helper"), agent_bundle(tmp_path, "helper")
        async with running_host(nats_server.url, [boss, helper], server), \
                running_worker(nats_server.url, [boss, helper]):
            parent = await publish_task(js, "boss", "find the capital")
            child: list[ev.RunStarted] = []

            async def child_started() -> None:
                while not child:
                    child.extend(s for s in await started_runs(js) if s.metadata.get(PARENT_RUN) == parent)
                    await anyio.sleep(0.05)

            with anyio.fail_after(30):
                await child_started()
            await publish_command(js, "boss", ev.Cancel(run_id=parent, reason="changed my mind"))
            parent_events = await follow(js, parent)
            child_events = await follow(js, child[0].run_id)
    assert isinstance(parent_events[-1], ev.RunCancelled)
    assert isinstance(child_events[-1], ev.RunCancelled)
    assert f"its parent run {parent} was cancelled" in child_events[-1].reason


async def all_events(js: Any) -> list[ev.Event]:
    info = await js.stream_info(EVENTS)
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            out += ev.decode_all((await js.get_msg(EVENTS, seq)).data)
        except Exception:
            continue
    return out




async def test_on_a_secured_server_the_worker_starts_the_child_as_the_worker_role(
        secured: EmbeddedNats, tmp_path: Path) -> None:
    admin = await bus.connect(secured.url, **creds("admin").connect_options())
    try:
        await bus.ensure_topology(admin.jetstream())
    finally:
        await admin.close()
    with ScriptedModelServer(responder=responder(boss_calls="boss")) as server:
        boss = agent_bundle(tmp_path, "boss", delegates="boss", max_depth=1)
        async with secured_fleet(secured.url, boss, server):
            reader = await bus.connect(secured.url, **creds("admin").connect_options())
            try:
                js = reader.jetstream()
                pub = await bus.connect(secured.url, **creds("publisher").connect_options())
                parent = await publish_task(pub.jetstream(), "boss", "recurse once")
                await pub.close()
                events = await follow(js, parent)
                children = [s for s in await started_runs(js) if s.metadata.get(PARENT_RUN) == parent]
            finally:
                await reader.close()
    assert isinstance(events[-1], ev.RunCompleted), [ev.kind_of(e) for e in events]
    assert len(children) == 1 and children[0].metadata[DEPTH] == 1


async def test_kill_9_of_the_parents_host_process_while_its_child_runs(js, nats_server,
                                                                       tmp_path: Path) -> None:
    """The same with a real `sa host` process killed with SIGKILL (it drives both runs) and a second one
    started after: one child, and the parent completes with its output."""
    from tests.host.test_host_faults import kill9, process

    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    with ScriptedModelServer(responder=responder(helper_delay=3.0)) as server:
        boss = agent_bundle(tmp_path, "boss", delegates="helper", base_url=server.base_url)
        helper = agent_bundle(tmp_path, "helper", base_url=server.base_url)
        args = ["host", str(boss), str(helper), "--task-ack-wait", "2"]
        async with running_worker(nats_server.url, [boss, helper]):
            parent = await publish_task(js, "boss", "find the capital")
            with process(args, nats_server.url, tmp_path / "host1.log", "sa host: serving") as host1:
                with anyio.fail_after(60):  # the child has started and waits for its model
                    while not [s for s in await started_runs(js) if s.metadata.get(PARENT_RUN) == parent]:
                        await anyio.sleep(0.05)
                kill9(host1)
            with process(args, nats_server.url, tmp_path / "host2.log", "sa host: serving"):
                events = await follow(js, parent, timeout=90)
    assert isinstance(events[-1], ev.RunCompleted), [ev.kind_of(e) for e in events]
    assert "Paris" in events[-1].output["answer"]
    children = [s for s in await started_runs(js) if s.metadata.get(PARENT_RUN) == parent]
    assert len(children) == 1
    assert sum(isinstance(e, ev.RunStarted) for e in events) == 1


async def test_the_sub_run_subject_takes_only_tasks_that_name_their_parent(js, nats_server, tmp_path: Path
                                                                            ) -> None:
    """`agents.<agent>.subtasks` is what workers may publish on to start a child: a task there that names
    no parent run is refused by the host (no run), one that does runs as usual."""
    await bus.ensure_topology(js)
    with ScriptedModelServer(responder=responder()) as server:
        helper = agent_bundle(tmp_path, "helper")
        async with running_host(nats_server.url, [helper], server) as host, \
                running_worker(nats_server.url, [helper]):
            stray = await publish_task(js, "helper", "no parent", task_id="stray", subrun=True)
            await wait_until(lambda: host.stats.rejected >= 1, what="the parentless sub-run task refused")
            child = await publish_task(js, "helper", "what is the capital of France?", task_id="kid",
                                       metadata={PARENT_RUN: "rparent", PARENT_CALL: "rparent/1.0"},
                                       subrun=True)
            events = await follow(js, child)
    assert isinstance(events[-1], ev.RunCompleted)
    assert host.stats.rejected == 1 and (await RunLog(js).read(stray)).events == []
