"""The runs index never goes back: a write arriving late, or a stale owner's, does not land over a newer one.

Seen on machines of their own (`bench/partitions.py`, the cut of the NATS node leading EVENTS): a host
connected to the cut node wrote a run's ``running`` entry into the dead connection, reconnected elsewhere,
drove the run to its end and indexed it ``completed``; when the link came back the kernel's retransmission
delivered the old bytes, the node applied them, and the completed run stayed indexed as running. The tests
here replay exactly that: every publish the host made for a run's entries, sent again verbatim after the run
ended, must change nothing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import Env, kinds, running_fleet, write_bundle
from nats.js.errors import APIError, KeyNotFoundError

from runtime import kernel
from runtime import nats as bus
from runtime.commands import publish_task
from runtime.host.runs_index import RunsIndex, Standing, supersedes
from runtime.nats.kv import fleet_kv, runs_kv
from runtime.nats.records import RunIndex, active_value
from runtime.nats.subjects import ACTIVE_BUCKET, RUNS_BUCKET, active_key

pytestmark = pytest.mark.anyio


def entry(status: str, last_seq: int) -> RunIndex:
    return RunIndex(actor="calc", status=status, partition=0, last_seq=last_seq, updated=time.time())


def test_an_entry_supersedes_only_one_not_further_along_and_never_reopens_an_ended_run():
    assert supersedes(entry("running", 5), entry("running", 3))
    assert supersedes(entry("completed", 9), entry("running", 5))
    assert supersedes(entry("running", 5), entry("running", 5))  # a retry of the same write
    assert not supersedes(entry("running", 3), entry("running", 5))
    assert not supersedes(entry("running", 9), entry("completed", 5))  # an ended run stays ended
    assert not supersedes(entry("failed", 3), entry("completed", 5))


@pytest.fixture
async def fleet(nats_server, js, tmp_path: Path) -> AsyncIterator[Env]:
    await bus.ensure_topology(js, partitions=2)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path)) as env:
        yield env


async def test_the_hosts_own_writes_delivered_again_late_change_nothing(fleet: Env, monkeypatch):
    sent: list[tuple[str, bytes, dict[str, str] | None]] = []
    host_js = fleet.host.index.js
    publish = host_js.publish

    async def recording(subject: str, payload: bytes = b"", *args: Any, headers: Any = None,
                        **kw: Any) -> Any:
        if subject.startswith((f"$KV.{RUNS_BUCKET}.", f"$KV.{ACTIVE_BUCKET}.")):
            sent.append((subject, payload, dict(headers) if headers else None))
        return await publish(subject, payload, *args, headers=headers, **kw)

    monkeypatch.setattr(host_js, "publish", recording)
    run_id = await publish_task(fleet.js, "calc", "compute: 6 * 7")
    assert kinds(await fleet.wait_run(run_id, timeout=60))[-1] == "run.completed"
    with anyio.fail_after(30):  # the host indexes the run's end after appending it: wait for the purge
        while not any(m[0].startswith(f"$KV.{ACTIVE_BUCKET}.") and m[0].endswith(f".{run_id}")
                      and m[2] and m[2].get("KV-Operation") == "PURGE" for m in sent):
            await anyio.sleep(0.02)
    mine = [m for m in sent if m[0].endswith(f".{run_id}")]
    assert {m[0].split(".")[1] for m in mine} == {RUNS_BUCKET, ACTIVE_BUCKET}, mine
    runs = await runs_kv(fleet.js)
    before = await runs.get(run_id)
    assert RunIndex.decode(before.value).status == "completed"

    assert mine[-1][0].startswith(f"$KV.{ACTIVE_BUCKET}.")  # the last: the active entry's purge
    for subject, payload, headers in mine[:-1]:  # every write before it, again, as late bytes would be
        with pytest.raises(APIError, match="wrong last sequence"):
            await publish(subject, payload, headers=headers)
    after = await runs.get(run_id)
    assert RunIndex.decode(after.value).status == "completed"
    assert after.revision == before.revision  # nothing landed over it
    active = await fleet_kv(fleet.js, ACTIVE_BUCKET)
    with pytest.raises(KeyNotFoundError):  # the ended run is not left looking unfinished to a takeover
        await active.get(active_key(partition_of_run(mine), run_id))


def partition_of_run(sent: list[tuple[str, bytes, dict[str, str] | None]]) -> int:
    key = next(s for s, _, _ in sent if s.startswith(f"$KV.{ACTIVE_BUCKET}."))
    return int(key.split(".")[2][1:])


async def test_a_stale_owner_does_not_write_over_the_run_it_lost(nats_server, js):
    await bus.ensure_topology(js, partitions=2)
    owner, stale = RunsIndex(js), RunsIndex(js)
    await owner.open()
    await stale.open()
    owner.fresh("r1", 0)
    assert await owner.put("r1", entry("running", 1))
    assert await stale.put("r1", entry("running", 1))  # recovery of a host that is about to lose the run
    assert await owner.put("r1", entry("running", 4))  # its cached revision is stale: re-read, still newer
    assert await owner.put("r1", entry("completed", 7))
    assert not await stale.put("r1", entry("running", 3))  # behind the log: dropped
    assert not await stale.put("r1", entry("running", 9))  # an ended run does not become unfinished
    got = await owner.get("r1")
    assert got is not None and (got.status, got.last_seq) == ("completed", 7)


async def test_a_retry_whose_first_try_landed_finds_its_own_entry(nats_server, js):
    await bus.ensure_topology(js, partitions=2)
    index = RunsIndex(js)
    await index.open()
    index.fresh("r2", 0)
    assert await index.put("r2", entry("running", 1))
    index._revisions[(RUNS_BUCKET, "r2")] = 0  # the ack of that create was lost: the host still holds 0
    assert await index.put("r2", entry("running", 1))  # refused as a create, re-read, written again
    got = await index.get("r2")
    assert got is not None and (got.status, got.last_seq) == ("running", 1)
    with pytest.raises(KeyNotFoundError):
        await (await fleet_kv(js, ACTIVE_BUCKET)).get(active_key(0, "r2"))  # `put` writes runs only


async def test_the_index_records_a_run_from_a_standing_written_by_hand(nats_server, js):
    """`record` reads a small `Standing` (who, where, how far, the folded state), never a whole driver."""
    await bus.ensure_topology(js, partitions=2)
    index = RunsIndex(js)
    await index.open()
    index.fresh("r3", 1)
    running = Standing(run_id="r3", actor="calc:a", partition=1, last_seq=4, bundle="/b/calc", task_id="t-3",
                       state=kernel.State(config=kernel.KernelConfig(), status="running"), forked=("r0", 2))
    await index.record(running)
    got = await index.get("r3")
    assert got is not None
    assert got == RunIndex(actor="calc:a", status="running", partition=1, last_seq=4, updated=got.updated,
                           task_id="t-3", bundle="/b/calc", forked_from="r0", forked_at=2)
    active = await fleet_kv(js, ACTIVE_BUCKET)
    assert (await active.get(active_key(1, "r3"))).value == active_value("calc:a")
    await index.record(replace(running, last_seq=6, state=replace(running.state, status="completed")))
    got = await index.get("r3")
    assert got is not None and (got.status, got.last_seq) == ("completed", 6)
    with pytest.raises(KeyNotFoundError):
        await active.get(active_key(1, "r3"))  # an ended run leaves the active bucket
