"""bus.py against a real nats-server: embedded lifecycle, topology, partitions, dedup, OCC, consumers."""

from __future__ import annotations

import os
import signal

import msgspec
import pytest
from nats.js.errors import BadRequestError

from runtime import bus

pytestmark = pytest.mark.anyio


def test_tokens_and_subjects() -> None:
    assert bus.task_subject("planner") == "agents.planner.tasks"
    assert bus.event_subject("a", "r1", "tool.completed") == "events.a.r1.tool.completed"
    assert bus.run_events_filter("a", "r1") == "events.a.r1.>"
    assert bus.result_subject(3, "a", "r1") == "results.3.a.r1"
    assert bus.job_msg_id("r1", "r1/2.0") == "r1/2.0"
    assert bus.job_msg_id("r1", "c7") == "r1/c7"
    assert bus.agent_of_task_subject("tasks.3.planner") == "planner"
    assert bus.agent_of_task_subject("agents.planner.tasks") == "planner"
    with pytest.raises(ValueError, match=r"agent 'a\.b' contains '\.'"):
        bus.task_subject("a.b")
    with pytest.raises(ValueError, match="must not be empty"):
        bus.tool_subject("")
    with pytest.raises(ValueError, match="workspace"):
        bus.workspace_bucket("a/b")
    assert bus.servers_from_env({"NATS_URL": "nats://a:1, nats://b:2"}) == ["nats://a:1", "nats://b:2"]
    assert bus.servers_from_env({}) is None


def test_embedded_server_restart_keeps_store(tmp_path) -> None:
    server = bus.EmbeddedNats(tmp_path / "store").start()
    pid = server.proc.pid
    assert server.running and server.url.startswith("nats://127.0.0.1:")
    server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert (tmp_path / "store" / "js").is_dir()


async def test_embedded_server_async_and_durable_store(tmp_path) -> None:
    async with bus.EmbeddedNats(tmp_path) as server:
        nc = await bus.connect(server.url)
        js = nc.jetstream()
        await bus.ensure_topology(js, partitions=4)
        await js.publish(bus.task_subject("x"), b"kept", headers={bus.HDR_MSG_ID: "t1"})
        await nc.close()
    async with bus.EmbeddedNats(tmp_path) as server:
        nc = await bus.connect(server.url)
        js = nc.jetstream()
        msg = await js.get_last_msg(bus.TASKS, f"tasks.{bus.partition_of('x', 4)}.x")
        assert msg.data == b"kept"
        await nc.close()


async def test_topology_is_idempotent_and_readable(js) -> None:
    topo = await bus.ensure_topology(js, partitions=8, tool_ack_wait=4.0)
    again = await bus.ensure_topology(js, partitions=8, tool_ack_wait=4.0)
    assert topo == again
    read = await bus.read_topology(js)
    assert (read.partitions, read.tool_ack_wait, read.tool_max_deliver) == (8, 4.0, 5)
    names = {si.config.name for si in await js.streams_info()}
    assert {bus.TASKS, bus.EVENTS, bus.TOOLS, bus.RESULTS, bus.DLQ, "KV_runs", "OBJ_payloads"} <= names
    for si in await js.streams_info():
        if si.config.name in (bus.TASKS, bus.EVENTS, bus.TOOLS, bus.RESULTS, bus.DLQ):
            assert si.config.max_consumers and si.config.max_consumers > 0
            assert si.config.duplicate_window >= 120
    # a changed setting is applied by update
    await bus.ensure_topology(js, partitions=8, tool_ack_wait=6.0)
    assert (await bus.read_topology(js)).tool_ack_wait == 6.0


async def test_partition_transform_matches_client_side_hash(js) -> None:
    await bus.ensure_topology(js, partitions=8)
    agents = [f"agent-{i}" for i in range(40)] + ["planner", "coder", "a:1"]
    for a in agents:
        await js.publish(bus.task_subject(a), a.encode())
    subjects = (await js.stream_info(bus.TASKS, subjects_filter=">")).state.subjects
    assert subjects == {f"tasks.{bus.partition_of(a, 8)}.{a}": 1 for a in agents}
    assert len({bus.partition_of(a, 8) for a in agents}) > 4  # really spread


async def test_partition_consumer_gets_only_its_partition_in_order(js) -> None:
    await bus.ensure_topology(js, partitions=4)
    tcons, _ = await bus.ensure_partition_consumers(js, 2)
    mine = [a for a in (f"ag{i}" for i in range(30)) if bus.partition_of(a, 4) == 2]
    others = [a for a in (f"ag{i}" for i in range(30)) if bus.partition_of(a, 4) != 2]
    for i in range(3):
        for a in [*mine, *others]:
            await js.publish(bus.task_subject(a), f"{a}#{i}".encode())
    psub = await js.pull_subscribe_bind(durable=tcons, stream=bus.TASKS)
    got = []
    while batch := await bus.fetch_batch(psub, 50, 0.3):
        for m in batch:
            got.append((bus.agent_of_task_subject(m.subject), m.data.decode()))
            await m.ack()
    assert {a for a, _ in got} == set(mine)
    for a in mine:
        assert [d for x, d in got if x == a] == [f"{a}#{i}" for i in range(3)]
    await psub.unsubscribe()


async def test_same_task_msg_id_is_stored_once(js) -> None:
    await bus.ensure_topology(js, partitions=2)
    a1 = await js.publish(bus.task_subject("p"), b"t", headers={bus.HDR_MSG_ID: "task-1"})
    a2 = await js.publish(bus.task_subject("p"), b"t", headers={bus.HDR_MSG_ID: "task-1"})
    assert a2.duplicate and a2.seq == a1.seq
    assert (await js.stream_info(bus.TASKS)).state.messages == 1


async def test_occ_rejects_second_writer_of_a_run(js) -> None:
    await bus.ensure_topology(js)
    ack1 = await js.publish(bus.event_subject("a", "r1", "run.started"), b"1",
                            headers=bus.occ_headers("a", "r1", 0, "r1:1"))
    # another run's events do not disturb r1's sequence check
    await js.publish(bus.event_subject("a", "r2", "run.started"), b"x",
                     headers=bus.occ_headers("a", "r2", 0, "r2:1"))
    ack2 = await js.publish(bus.event_subject("a", "r1", "tool.completed"), b"2",
                            headers=bus.occ_headers("a", "r1", ack1.seq, "r1:2"))
    with pytest.raises(BadRequestError) as err:  # a stale writer still believing ack1 is the last
        await js.publish(bus.event_subject("a", "r1", "tool.failed"), b"3",
                         headers=bus.occ_headers("a", "r1", ack1.seq, "r1:3"))
    assert err.value.err_code == bus.ERR_WRONG_LAST_SEQUENCE
    last = await js.get_last_msg(bus.EVENTS, bus.run_events_filter("a", "r1"), direct=True)
    assert last.seq == ack2.seq and last.data == b"2"


async def test_workers_consumer_shape_and_workspace_kv(js) -> None:
    await bus.ensure_topology(js, tool_ack_wait=3.0, tool_max_deliver=4, tool_max_ack_pending=64)
    ci = await js.consumer_info(bus.TOOLS, bus.WORKERS_CONSUMER)
    assert (ci.config.ack_wait, ci.config.max_deliver, ci.config.max_ack_pending) == (3.0, 4, 64)
    kv = await bus.workspace_kv(js, "demo")
    rev = await kv.put("notes/a.txt", b"hello")
    assert (await kv.get("notes/a.txt")).revision == rev
    idx = bus.RunIndex(agent="a", status="running", partition=1, last_seq=7)
    runs = await bus.runs_kv(js)
    await runs.put("r1", idx.encode())
    assert bus.RunIndex.decode((await runs.get("r1")).value) == idx
    store = await bus.payloads_store(js)
    await store.put("big", b"x" * 300_000)
    assert len((await store.get("big")).data) == 300_000
    with pytest.raises(msgspec.DecodeError):
        bus.RunIndex.decode(b"\xc1")


def test_atexit_guard_kills_leftover_server() -> None:
    server = bus.EmbeddedNats().start()
    proc = server.proc
    bus._kill_leftovers()
    assert proc.poll() is not None and not server.running
    assert proc.returncode in (0, -signal.SIGTERM)
