"""runtime.nats: the pure parts, then on a real nats-server (lifecycle, topology, dedup, OCC, consumers)."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import msgspec
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, StreamConfig, SubjectTransform
from nats.js.errors import BadRequestError

from runtime.nats.connection import connect, servers_from_env
from runtime.nats.kv import payloads_store, runs_kv, workspace_kv
from runtime.nats.pull import consume, fetch_batch
from runtime.nats.records import RunIndex
from runtime.nats.retry import ERR_NO_PLACEMENT, placing, retrying, wait_until
from runtime.nats.server import EmbeddedNats, _stop_leftovers
from runtime.nats.subjects import (
    DLQ,
    ERR_WRONG_LAST_SEQUENCE,
    EVENTS,
    HDR_MSG_ID,
    RESULTS,
    TASKS,
    TOOLS,
    WORKERS_CONSUMER,
    agent_of_task_subject,
    bundle_of_slug,
    bundle_slug,
    bundle_token,
    event_subject,
    job_msg_id,
    lease_key,
    occ_headers,
    parse_lease_key,
    parse_task_subject,
    partition_of,
    result_subject,
    run_events_filter,
    stored_bundle,
    task_consumer_name,
    task_subject,
    tool_subject,
    workspace_bucket,
)
from runtime.nats.topology import (
    ensure_partition_consumers,
    ensure_topology,
    ensure_transforms,
    read_topology,
)

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def test_the_wire_formats_import_without_a_nats_client() -> None:
    # jobs and commands need subject names only: importing them must not load nats-py or start-up I/O
    code = ("import sys, runtime.jobs; "
            "print(sorted(m for m in ('nats', 'subprocess', 'urllib.request') if m in sys.modules))")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                         check=True)
    assert out.stdout.strip() == "[]"


def test_the_package_exports_every_public_name() -> None:
    import runtime.nats as package

    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert package.attach_topology.__module__ == "runtime.nats.topology"
    # the package's face is what a program needs to get onto NATS; every other name is its module's
    assert sorted(package.__all__) == ["EmbeddedNats", "LocalCluster", "attach_topology", "close", "connect",
                                       "ensure_topology", "jetstream_for", "servers_from_env"]
    assert not hasattr(package, "TASKS") and not hasattr(package, "ENV_VARS")
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        package.nope  # noqa: B018


async def test_retrying_retries_outages_only() -> None:
    calls: list[int] = []

    async def election() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise TimeoutError("no leader yet")
        return "ok"

    assert await retrying(election, what="a call", delay=0.01) == "ok" and len(calls) == 3

    async def rejected() -> None:
        raise BadRequestError(description="bad config")

    async def bug() -> None:
        raise ValueError("a bug")

    async def down() -> None:
        raise TimeoutError("still down")

    with pytest.raises(BadRequestError):  # fatal: at once
        await retrying(rejected, what="a call", fatal=BadRequestError, delay=0.01)
    with pytest.raises(ValueError):  # not an outage: at once
        await retrying(bug, what="a call", retry_on=TimeoutError, delay=0.01)
    with pytest.raises(TimeoutError, match="still down"):  # gave up: the last error
        await retrying(down, what="a call", delay=0.01, give_up=0.05)


async def test_a_stream_create_refused_for_placement_is_tried_again_until_the_cluster_places_it() -> None:
    """A cluster just formed can refuse an R3 create with 10005 ("no suitable peers for placement") for a
    moment; that refusal alone is tried again, for `patience` seconds; any other refusal is raised at once."""
    calls: list[int] = []

    async def forming() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise BadRequestError(err_code=ERR_NO_PLACEMENT, description="no suitable peers for placement, "
                                                                         "peer offline")
        return "created"

    assert await placing(forming, what="creating stream X", patience=5.0) == "created" and len(calls) == 3

    async def never() -> None:
        raise BadRequestError(err_code=ERR_NO_PLACEMENT, description="no suitable peers for placement")

    async def other() -> None:
        calls.append(1)
        raise BadRequestError(err_code=10058, description="stream name already in use")

    with pytest.raises(BadRequestError, match="no suitable peers"):  # past its patience: the refusal itself
        await placing(never, what="creating stream X", patience=0.3)
    calls.clear()
    with pytest.raises(BadRequestError, match="already in use"):
        await placing(other, what="creating stream X")
    assert len(calls) == 1  # not retried


def test_wait_until_returns_the_first_answer_or_times_out() -> None:
    answers = iter([None, None, "leader"])
    assert wait_until(lambda: next(answers), timeout=5, every=0.001, what="a leader") == "leader"
    with pytest.raises(TimeoutError, match=r"waited 0\.05 s for a leader"):
        wait_until(lambda: None, timeout=0.05, every=0.01, what="a leader")


def test_tokens_and_subjects() -> None:
    assert task_subject("planner") == "agents.planner.tasks"
    assert event_subject("a", "r1", "tool.completed") == "events.a.r1.tool.completed"
    assert run_events_filter("a", "r1") == "events.a.r1.>"
    assert result_subject(3, "a", "r1") == "results.3.a.r1"
    assert job_msg_id("r1", "r1/2.0") == "r1/2.0"
    assert job_msg_id("r1", "c7") == "r1/c7"
    assert agent_of_task_subject("tasks.3.planner") == "planner"
    assert agent_of_task_subject("agents.planner.tasks") == "planner"
    # as stored now: the bundle (and instance) follow as tokens of their own; older forms still parse
    assert parse_task_subject("tasks.3.planner:a.agents.tasks.planner.a") == ("planner:a", None)
    assert parse_task_subject("tasks.3.planner:a.ops.alice.planner.a") == ("planner:a", "alice")
    assert parse_task_subject("tasks.3.planner:a.ops.alice") == ("planner:a", "alice")
    assert stored_bundle("tasks.3.planner:a.agents.tasks.planner.a") == "planner"
    assert stored_bundle("results.3.planner:a.r1.planner.a") == "planner"
    assert stored_bundle("tasks.3.planner:a.agents.tasks") is None
    assert [bundle_token(a) for a in ("p", "p:a", "p::a", ":a")] == ["p", "p", "p", "a"]
    # a slot's lease key and consumer names; a bundle name that is no plain word is spelled in base32
    assert lease_key(3, "planner") == "planner.p3" and parse_lease_key("planner.p3") == ("planner", 3)
    assert parse_lease_key(lease_key(0, "pl@n:x")) == ("pl@n:x", 0) and parse_lease_key("p3") is None
    assert task_consumer_name(3, "planner") == "tasks-p3-planner"
    assert bundle_of_slug(bundle_slug("né")) == "né" and bundle_slug("a-b_c") == "a-b_c"
    with pytest.raises(ValueError, match=r"agent 'a\.b' contains '\.'"):
        task_subject("a.b")
    with pytest.raises(ValueError, match="must not be empty"):
        tool_subject("")
    with pytest.raises(ValueError, match="workspace"):
        workspace_bucket("a/b")
    assert servers_from_env({"NATS_URL": "nats://a:1, nats://b:2"}) == ["nats://a:1", "nats://b:2"]
    assert servers_from_env({}) is None


def test_embedded_server_restart_keeps_store(tmp_path) -> None:
    server = EmbeddedNats(tmp_path / "store").start()
    pid = server.proc.pid
    assert server.running and server.url.startswith("nats://127.0.0.1:")
    server.stop()
    assert not server.running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert (tmp_path / "store" / "js").is_dir()


async def test_embedded_server_async_and_durable_store(tmp_path) -> None:
    async with EmbeddedNats(tmp_path) as server:
        nc = await connect(server.url)
        js = nc.jetstream()
        await ensure_topology(js, partitions=4)
        await js.publish(task_subject("x"), b"kept", headers={HDR_MSG_ID: "t1"})
        await nc.close()
    async with EmbeddedNats(tmp_path) as server:
        nc = await connect(server.url)
        js = nc.jetstream()
        msg = await js.get_last_msg(TASKS, f"tasks.{partition_of('x', 4)}.x.agents.tasks.x")
        assert msg.data == b"kept"
        await nc.close()


async def test_topology_is_idempotent_and_readable(js) -> None:
    topo = await ensure_topology(js, partitions=8, tool_ack_wait=4.0)
    again = await ensure_topology(js, partitions=8, tool_ack_wait=4.0)
    assert topo == again
    read = await read_topology(js)
    assert (read.partitions, read.tool_ack_wait, read.tool_max_deliver) == (8, 4.0, 5)
    names = {si.config.name for si in await js.streams_info()}
    assert {TASKS, EVENTS, TOOLS, RESULTS, DLQ, "KV_runs", "OBJ_payloads"} <= names
    for si in await js.streams_info():
        if si.config.name in (TASKS, EVENTS, TOOLS, RESULTS, DLQ):
            assert si.config.max_consumers and si.config.max_consumers > 0
            assert si.config.duplicate_window >= 120
    # a changed setting is applied by update
    await ensure_topology(js, partitions=8, tool_ack_wait=6.0)
    assert (await read_topology(js)).tool_ack_wait == 6.0


async def test_tasks_is_made_last_so_a_client_that_finds_it_finds_the_rest(tmp_path) -> None:
    """`submit` and a waiting worker take TASKS's existence as the topology's: on a fresh server every other
    stream, bucket and store is made before it (a client once followed a run whose EVENTS was not there)."""
    async with EmbeddedNats(tmp_path) as server:
        nc = await connect(server.url)
        js = nc.jetstream()
        made: list[str] = []
        add_stream = js.add_stream

        async def recording(config=None, **params):  # type: ignore[no-untyped-def]
            made.append(config.name if config is not None else params["name"])
            return await add_stream(config, **params)

        js.add_stream = recording  # type: ignore[method-assign]
        await ensure_topology(js, partitions=4)
        await nc.close()
    assert made[-1] == TASKS and made.count(TASKS) == 1
    assert {EVENTS, TOOLS, RESULTS, DLQ, "KV_runs", "KV_active", "OBJ_payloads"} <= set(made[:-1])


async def test_partition_transform_matches_client_side_hash(js) -> None:
    await ensure_topology(js, partitions=8)
    agents = [f"agent-{i}" for i in range(40)] + ["planner", "coder", "a:1"]
    for a in agents:
        await js.publish(task_subject(a), a.encode())
    subjects = (await js.stream_info(TASKS, subjects_filter=">")).state.subjects
    # the agent's bundle and instance follow as tokens of their own (NATS's split at ":")
    split = {a: a.replace(":", ".") for a in agents}
    assert subjects == {f"tasks.{partition_of(a, 8)}.{a}.agents.tasks.{split[a]}": 1 for a in agents}
    assert len({partition_of(a, 8) for a in agents}) > 4  # really spread


async def test_a_slot_consumer_gets_only_its_bundles_tasks_of_its_partition_in_order(js) -> None:
    await ensure_topology(js, partitions=4)
    tcons, _ = await ensure_partition_consumers(js, 2, "ag")
    # another bundle's slot of the same partition consumes beside it (WorkQueue filters must not overlap)
    other, _ = await ensure_partition_consumers(js, 2, "zz")
    actors = ["ag", *(f"ag:{i}" for i in range(30)), *(f"zz:{i}" for i in range(30))]
    mine = [a for a in actors if partition_of(a, 4) == 2 and a.startswith("ag")]
    for i in range(3):
        for a in actors:
            await js.publish(task_subject(a), f"{a}#{i}".encode())
    psub = await js.pull_subscribe_bind(durable=tcons, stream=TASKS)
    got = []
    while batch := await fetch_batch(psub, 50, 0.3):
        for m in batch:
            got.append((agent_of_task_subject(m.subject), m.data.decode()))
            await m.ack()
    assert {a for a, _ in got} == set(mine) and len(mine) > 1
    for a in mine:
        assert [d for x, d in got if x == a] == [f"{a}#{i}" for i in range(3)]
    theirs = [a for a in actors if partition_of(a, 4) == 2 and a.startswith("zz")]
    assert (await js.consumer_info(TASKS, other)).num_pending == 3 * len(theirs) > 0
    await psub.unsubscribe()


async def test_streams_of_an_older_version_get_the_bundle_token_and_keep_their_tasks(js) -> None:
    """A host attaching to streams made before bundles had a token of their own updates their transforms;
    a task stored before that, for the bundle's own actor, still reaches the bundle's slot."""
    await ensure_topology(js, partitions=4)
    for name, transform in ((TASKS, SubjectTransform(
            src="*.*.*", dest="tasks.{{partition(4,2)}}.{{wildcard(2)}}.{{wildcard(1)}}.{{wildcard(3)}}")),
                            (RESULTS, None)):
        config = (await js.stream_info(name)).config
        await js.update_stream(dataclasses.replace(config, subject_transform=transform))
    await js.publish(task_subject("calc"), b"before")
    assert await ensure_transforms(js) and not await ensure_transforms(js)  # changed once, then as it is
    await js.publish(task_subject("calc"), b"after")
    await js.publish(result_subject(1, "calc:i", "r1"), b"outcome")
    p = partition_of("calc", 4)
    subjects = (await js.stream_info(TASKS, subjects_filter=">")).state.subjects
    assert subjects == {f"tasks.{p}.calc.agents.tasks": 1, f"tasks.{p}.calc.agents.tasks.calc": 1}
    outcomes = (await js.stream_info(RESULTS, subjects_filter=">")).state.subjects
    assert outcomes == {"results.1.calc:i.r1.calc.i": 1}
    tasks, _ = await ensure_partition_consumers(js, p, "calc")
    psub = await js.pull_subscribe_bind(durable=tasks, stream=TASKS)
    got = [m.data for m in await fetch_batch(psub, 10, 0.5)]
    assert got == [b"before", b"after"]
    await psub.unsubscribe()


async def test_fetch_batch_never_returns_more_than_the_batch() -> None:
    """nats-py's fetch hands over every message already on the inbox (late deliveries of a fetch that timed
    out) whatever the batch; a worker sized its buffer by the batch and overflowed. The surplus comes back,
    in order, from the next calls before anything is fetched again."""

    class Psub:
        def __init__(self) -> None:
            self.fetches = 0

        async def fetch(self, batch: int, timeout: float) -> list[str]:
            self.fetches += 1
            return ["m0", "m1", "m2", "m3", "m4"] if self.fetches == 1 else ["m5"]

    psub = Psub()
    got = [await fetch_batch(psub, 2, 0.1) for _ in range(4)]  # type: ignore[arg-type]
    assert got == [["m0", "m1"], ["m2", "m3"], ["m4"], ["m5"]]
    assert psub.fetches == 2


async def test_a_finishing_consume_takes_what_its_open_request_still_delivers(js) -> None:
    """A stop with `finish` issues no new pull request but lets the open one deliver: a message the server
    handed to this consumer after the stop is taken, not stranded until its AckWait (a stopping worker's
    jobs, `runtime.worker.loop`)."""
    await js.add_stream(StreamConfig(name="Q", subjects=["q.>"]))
    await js.add_consumer("Q", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
    got: list[bytes] = []

    async def take(msg) -> None:
        got.append(msg.data)
        await msg.ack()

    stop = anyio.Event()
    with anyio.fail_after(30):  # a hang guard
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: consume(js._nc, "Q", "c", take, stop=stop, expires=1.0, finish=True))
            while (await js.consumer_info("Q", "c")).num_waiting < 1:  # its request is open
                await anyio.sleep(0.01)
            stop.set()
            await js.publish("q.x", b"after the stop")
    assert got == [b"after the stop"]
    info = await js.consumer_info("Q", "c")
    assert (info.num_waiting, info.num_ack_pending, info.num_pending) == (0, 0, 0)  # no new request was made


async def test_consume_hands_messages_over_in_order_and_a_stop_lets_the_handler_under_way_finish(js) -> None:
    """Handlers run in the subscription's callback: one at a time, in stream order, however slow; the
    budget's units all come back once the handlers released theirs; a stop (not a cancel) waits for the
    handler under way instead of cutting it off, and takes nothing after it."""
    from runtime.nats.pull import Budget

    await js.add_stream(StreamConfig(name="Q", subjects=["q.>"]))
    await js.add_consumer("Q", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
    for i in range(12):
        await js.publish("q.x", str(i).encode())
    budget = Budget(4)
    got: list[str] = []
    running = 0
    stop = anyio.Event()

    async def take(msg) -> None:
        nonlocal running
        running += 1
        assert running == 1  # never two at once
        await anyio.sleep(0.005)
        got.append(msg.data.decode())
        await msg.ack()
        running -= 1
        budget.release()
        if len(got) == 10:
            stop.set()  # the stop arrives while this handler is under way ...
            await anyio.sleep(0.05)
            got.append("finished")  # ... and it still finishes

    with anyio.fail_after(30):  # a hang guard
        await consume(js._nc, "Q", "c", take, stop=stop, batch=3, expires=1.0, budget=budget)
    assert got == [str(i) for i in range(10)] + ["finished"]
    assert budget.used == 0 and budget.sharers == 0
    info = await js.consumer_info("Q", "c")
    assert info.ack_floor.stream_seq == 10  # the first ten acked; the rest wait for the next consumer


async def test_a_cancelled_consume_cuts_off_the_handler_under_way(js) -> None:
    """A cancel (a host losing its slot) stops the handler under way with the pull, as when handlers ran
    inline in the loop: it does not wait for it. The message, never acked, is the next owner's."""
    await js.add_stream(StreamConfig(name="Q", subjects=["q.>"]))
    await js.add_consumer("Q", ConsumerConfig(durable_name="c", ack_policy=AckPolicy.EXPLICIT))
    await js.publish("q.x", b"slow")
    began, outcome = anyio.Event(), []

    async def take(msg) -> None:
        began.set()
        try:
            await anyio.sleep(30)
            outcome.append("finished")
        except BaseException:
            outcome.append("cut off")
            raise

    stop = anyio.Event()
    with anyio.fail_after(10):  # waiting for the handler would take 20 s (expires) or 30 s (itself)
        async with anyio.create_task_group() as tg:
            tg.start_soon(lambda: consume(js._nc, "Q", "c", take, stop=stop, expires=20.0))
            await began.wait()
            stop.set()  # as a host losing a slot does: stop, then cancel at once
            tg.cancel_scope.cancel()
        while not outcome:
            await anyio.sleep(0.01)
    assert outcome == ["cut off"]
    assert (await js.consumer_info("Q", "c")).num_ack_pending == 1  # not acked: delivered again later


async def test_same_task_msg_id_is_stored_once(js) -> None:
    await ensure_topology(js, partitions=2)
    a1 = await js.publish(task_subject("p"), b"t", headers={HDR_MSG_ID: "task-1"})
    a2 = await js.publish(task_subject("p"), b"t", headers={HDR_MSG_ID: "task-1"})
    assert a2.duplicate and a2.seq == a1.seq
    assert (await js.stream_info(TASKS)).state.messages == 1


async def test_occ_rejects_second_writer_of_a_run(js) -> None:
    await ensure_topology(js)
    ack1 = await js.publish(event_subject("a", "r1", "run.started"), b"1",
                            headers=occ_headers("a", "r1", 0, "r1:1"))
    # another run's events do not disturb r1's sequence check
    await js.publish(event_subject("a", "r2", "run.started"), b"x",
                     headers=occ_headers("a", "r2", 0, "r2:1"))
    ack2 = await js.publish(event_subject("a", "r1", "tool.completed"), b"2",
                            headers=occ_headers("a", "r1", ack1.seq, "r1:2"))
    with pytest.raises(BadRequestError) as err:  # a stale writer still believing ack1 is the last
        await js.publish(event_subject("a", "r1", "tool.failed"), b"3",
                         headers=occ_headers("a", "r1", ack1.seq, "r1:3"))
    assert err.value.err_code == ERR_WRONG_LAST_SEQUENCE
    last = await js.get_last_msg(EVENTS, run_events_filter("a", "r1"), direct=True)
    assert last.seq == ack2.seq and last.data == b"2"


async def test_workers_consumer_shape_and_workspace_kv(js) -> None:
    await ensure_topology(js, tool_ack_wait=3.0, tool_max_deliver=4, tool_max_ack_pending=64)
    ci = await js.consumer_info(TOOLS, WORKERS_CONSUMER)
    assert (ci.config.ack_wait, ci.config.max_deliver, ci.config.max_ack_pending) == (3.0, 4, 64)
    kv = await workspace_kv(js, "demo")
    rev = await kv.put("notes/a.txt", b"hello")
    assert (await kv.get("notes/a.txt")).revision == rev
    idx = RunIndex(actor="a", status="running", partition=1, last_seq=7)
    runs = await runs_kv(js)
    await runs.put("r1", idx.encode())
    assert RunIndex.decode((await runs.get("r1")).value) == idx
    old = msgspec.msgpack.encode({"agent": "calc:bob", "status": "completed", "partition": 2})  # older
    assert RunIndex.decode(old).actor == "calc:bob"
    store = await payloads_store(js)
    await store.put("big", b"x" * 300_000)
    assert len((await store.get("big")).data) == 300_000
    with pytest.raises(msgspec.DecodeError):
        RunIndex.decode(b"\xc1")


def test_atexit_guard_kills_leftover_server() -> None:
    server = EmbeddedNats().start()
    proc = server.proc
    _stop_leftovers()
    assert proc.poll() is not None and not server.running
    assert proc.returncode in (0, -signal.SIGTERM)
