"""Dead letters against a real nats-server, real worker processes and real Monty: a job whose worker is
SIGKILLed on every delivery ends in the DLQ with a `crashed` outcome carrying the delivery count; a
message the server gave up on (MaxDeliver advisory) is moved by the watch; `sa dlq` lists, replays."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest
from test_worker import BUSY, collect_outcomes, job, start_worker, stop

from runtime import events
from runtime.jobs import ToolJob
from runtime.nats.pull import fetch_batch
from runtime.nats.subjects import DLQ, HDR_MSG_ID, TOOLS, WORKERS_CONSUMER
from runtime.nats.topology import ensure_topology
from runtime.worker import dlq

pytestmark = pytest.mark.anyio


@pytest.fixture
def busy_tool(tmp_path: Path) -> Path:
    path = tmp_path / "busy.pym"
    path.write_text(BUSY)
    return path


async def wait_delivered(js, n: int) -> None:
    """Until the `workers` consumer has made its n-th delivery and that job is held by someone."""
    with anyio.fail_after(30):
        while True:
            ci = await js.consumer_info(TOOLS, WORKERS_CONSUMER)
            if ci.delivered.consumer_seq >= n and ci.num_ack_pending == 1:
                return
            await anyio.sleep(0.02)


async def test_a_job_that_kills_every_worker_is_dead_lettered_with_a_crashed_outcome(
        js, nats_server, busy_tool: Path, tmp_path: Path) -> None:
    await ensure_topology(js, tool_ack_wait=1.0, tool_max_deliver=3)
    poison = job("1.0", "busy", {"n": 50_000_000, "name": "never"}, workspace="wd",
                 limits={"max_duration": 60})
    ack = await js.publish(poison.subject, poison.encode(), headers=poison.headers())
    for delivery in (1, 2):  # each worker takes the job and is killed while running it
        proc = start_worker(nats_server.url, str(busy_tool), tmp_path / f"killed{delivery}.log")
        await wait_delivered(js, delivery)
        await anyio.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(10) == -signal.SIGKILL
    last = start_worker(nats_server.url, str(busy_tool), tmp_path / "last.log")
    try:
        (outcome,) = await collect_outcomes(js, 1, timeout=30)
    finally:
        assert stop(last) == 0
    assert outcome.call_id == "r1/1.0" and outcome.attempt == 3
    err = outcome.result.error
    assert err is not None and err.kind == "crashed" and err.detail == dlq.CRASHED_DETAIL
    assert "delivered 3 time(s)" in err.message and "dead-letter" in err.message
    (failed,) = outcome.events()
    assert events.kind_of(failed) == "tool.failed" and failed.error.kind == "crashed"
    assert "delivered 3 time(s)" in failed.error.for_model()  # what the model reads next turn

    assert (await js.stream_info(TOOLS)).state.messages == 0  # term()ed: not stuck
    (dead,) = await dlq.list_dead_letters(js)
    assert dead.subject == "tools.busy" and dead.stream_seq == ack.seq and dead.deliveries == 3
    assert "2 earlier deliveries" in dead.reason and dead.job == poison
    assert dead.headers[dlq.HDR_ORIGINAL_MSG_ID] == "r1/1.0"
    info = await js.stream_info("KV_ws_wd", subjects_filter=">")
    assert not info.state.subjects  # the killed runs never wrote; the dead-lettered one never ran

    # replay: back on its subject under a fresh Msg-Id (the original one is still in the dedup window)
    again = await js.publish(poison.subject, poison.encode(), headers=poison.headers())
    assert again.duplicate and (await js.stream_info(TOOLS)).state.messages == 0
    replayed = await dlq.replay(js, dead.seq)
    assert replayed.seq == dead.seq
    assert (await js.stream_info(TOOLS)).state.messages == 1
    back = await js.get_last_msg(TOOLS, "tools.busy")
    assert ToolJob.decode(back.data) == poison
    assert back.headers[HDR_MSG_ID] == f"r1/1.0#dlq{dead.seq}" and back.headers[dlq.HDR_REPLAYS] == "1"
    assert await dlq.list_dead_letters(js) == []
    with pytest.raises(KeyError, match=str(dead.seq)):
        await dlq.replay(js, dead.seq)


async def test_the_advisory_watch_moves_a_message_the_server_gave_up_on(js, nc) -> None:
    await ensure_topology(js, tool_ack_wait=0.3, tool_max_deliver=2)
    advisories: list[dict] = []

    async def witness(msg) -> None:
        advisories.append(json.loads(msg.data))

    seen = await nc.subscribe(dlq.max_deliveries_advisory(), cb=witness)
    psub = await js.pull_subscribe_bind(durable=WORKERS_CONSUMER, stream=TOOLS)

    async def deliver_twice_and_drop(j: ToolJob) -> int:
        ack = await js.publish(j.subject, j.encode(), headers=j.headers())
        for _ in range(2):  # two deliveries, never acked: as if each worker died holding it
            with anyio.fail_after(10):
                while not await fetch_batch(psub, 1, 0.5):
                    pass
        return ack.seq

    lost = job("2.0", "echo", {"text": "x"}, run="r2")
    seq1 = await deliver_twice_and_drop(lost)
    with anyio.fail_after(10):  # the server sends the advisory when a pull finds only the exhausted job
        while not advisories:
            assert await fetch_batch(psub, 1, 0.3) == []  # nobody gets it again...
    assert advisories[0]["stream_seq"] == seq1 and advisories[0]["deliveries"] == 2
    assert (await js.stream_info(TOOLS)).state.messages == 1  # ...yet it is still in the stream

    watch = dlq.MaxDeliveriesWatch(nc, js, worker="w-test")
    assert await watch.settle_stuck(seq1, 2)  # what the watch does with the advisory it receives
    assert not await watch.settle_stuck(seq1, 2)  # gone: a repeated advisory is a no-op
    assert (await js.stream_info(TOOLS)).state.messages == 0
    assert (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending == 0  # slot freed

    # and live: the watch is subscribed when the server gives up on the next one
    await watch.start()
    try:
        seq2 = await deliver_twice_and_drop(job("3.0", "echo", {"text": "y"}, run="r2"))
        with anyio.fail_after(10):
            while watch.settled < 2:
                assert await fetch_batch(psub, 1, 0.3) == []  # a worker's pull, as in production
    finally:
        await watch.stop()
        await seen.unsubscribe()
        await psub.unsubscribe()
    letters = await dlq.list_dead_letters(js)
    assert [(d.stream_seq, d.deliveries) for d in letters] == [(seq1, 2), (seq2, 2)]
    assert all("MaxDeliver advisory" in d.reason for d in letters)
    outcomes = {o.call_id: o for o in await collect_outcomes(js, 2)}
    assert set(outcomes) == {"r2/2.0", "r2/3.0"}
    assert all(o.result.error.kind == "crashed" and o.worker == "w-test" for o in outcomes.values())
    assert "delivered 2 time(s)" in outcomes["r2/3.0"].result.error.message


def sa(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-c", "from runtime.cli import main; main()", *args]
    env = {**os.environ, "NATS_URL": url}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)


async def test_sa_dlq_lists_and_replays(js, nats_server) -> None:
    await ensure_topology(js)
    j = job("4.0", "echo", {"text": "z"}, run="r4")
    await dlq.settle(js, subject=j.subject, data=j.encode(), stream_seq=77, deliveries=5,
                     reason="test reason")
    await dlq.copy_to_dlq(js, subject="tools.echo", data=b"\x00junk", stream_seq=78, deliveries=1,
                          reason="not a tool job: junk")

    listed = await anyio.to_thread.run_sync(sa, nats_server.url, "dlq", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["stream_seq"], r["deliveries"], r["reason"]) for r in rows] == [
        (77, 5, "test reason"), (78, 1, "not a tool job: junk")]
    assert rows[0]["job"]["call_id"] == "r4/4.0" and rows[1]["job"] is None
    human = await anyio.to_thread.run_sync(sa, nats_server.url, "dlq")
    assert "r4/4.0" in human.stdout and "(not a tool job)" in human.stdout
    assert "2 dead letter(s)" in human.stdout

    missing = await anyio.to_thread.run_sync(sa, nats_server.url, "dlq", "replay", "999")
    assert missing.returncode == 1 and "999" in missing.stderr
    done = await anyio.to_thread.run_sync(sa, nats_server.url, "dlq", "replay", "--all")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("replayed") == 2 and "(r4/4.0)" in done.stdout
    assert (await js.stream_info(DLQ)).state.messages == 0
    assert (await js.stream_info(TOOLS)).state.messages == 2
    empty = await anyio.to_thread.run_sync(sa, nats_server.url, "dlq")
    assert "no dead letters" in empty.stdout


async def test_the_dead_letter_path_works_under_the_shipped_auth_config(secured) -> None:
    """On a server running deploy/nats/auth.conf, a worker connected as `worker` hears the MaxDeliver
    advisory and dead-letters the job no worker finished; nothing it does is refused."""
    from nats_fixtures import PASSWORDS

    from runtime import nats as bus
    from runtime.nats.credentials import Credentials

    refused: list[str] = []

    async def on_error(err: Exception) -> None:
        refused.append(str(err))

    def login(role: str) -> dict:
        return Credentials(user=role, password=PASSWORDS[role]).connect_options()

    admin = await bus.connect(secured.url, name="test-admin", **login("admin"))
    worker_nc = await bus.connect(secured.url, name="test-worker", error_cb=on_error, **login("worker"))
    try:
        ajs = bus.jetstream_for(admin)
        await ensure_topology(ajs, tool_ack_wait=0.3, tool_max_deliver=2)
        watch = dlq.MaxDeliveriesWatch(worker_nc, bus.jetstream_for(worker_nc), worker="w-secure")
        await watch.start()
        psub = await ajs.pull_subscribe_bind(durable=WORKERS_CONSUMER, stream=TOOLS)
        lost = job("4.0", "echo", {"text": "z"}, run="r-secure")
        await ajs.publish(lost.subject, lost.encode(), headers=lost.headers())
        for _ in range(2):  # delivered twice and never acked: as if each worker died holding it
            with anyio.fail_after(10):
                while not await fetch_batch(psub, 1, 0.5):
                    pass
        with anyio.fail_after(15):
            while watch.settled < 1:
                assert await fetch_batch(psub, 1, 0.3) == []  # the pull that makes the server give up
        await watch.stop()
        await psub.unsubscribe()
        letters = await dlq.list_dead_letters(ajs)
        assert [d.deliveries for d in letters] == [2] and "MaxDeliver advisory" in letters[0].reason
        assert (await ajs.stream_info(TOOLS)).state.messages == 0
    finally:
        await bus.close(worker_nc)
        await bus.close(admin)
    assert refused == []
