"""`RunLog.purge` and `sa runs purge` against a real nats-server: a finished run's events, payload objects
and index entry go; a run sharing nothing with it (not even the bytes of its payloads' names) stays whole;
a run in flight is skipped, never touched; a dry run deletes nothing."""

from __future__ import annotations

import json
import time

import anyio
import pytest
from typer.testing import CliRunner

from runtime import events as ev
from runtime.cli import app
from runtime.log import RunLog
from runtime.log.payloads import Payloads, object_name
from runtime.nats.connection import connect
from runtime.nats.kv import fleet_kv, runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import ACTIVE_BUCKET, EVENTS, active_key
from runtime.nats.topology import ensure_topology

BIG = "x" * 10_000  # over the 4 KiB threshold below: stored as an object


async def write_run(log: RunLog, js, run_id: str, *, actor: str = "calc", end: bool = True,
                    index: str | None = "completed", active: bool = False) -> None:
    """A run: `run.started` with a big input, optionally `run.completed`, its index entry and active key."""
    seq = await log.create(ev.stamp(ev.RunStarted(run_id=run_id, input=BIG), seq=0, ts=time.time(),
                                    actor=actor))
    assert seq is not None
    if end:
        seq = await log.append(ev.stamp(ev.RunCompleted(run_id=run_id, output={"answer": BIG}), seq=1,
                                        ts=time.time(), actor=actor), expect=seq)
    if index is not None:
        await (await runs_kv(js)).put(run_id, RunIndex(actor=actor, status=index, partition=0, last_seq=seq,
                                                       updated=time.time() - 3600).encode())
    if active:
        await (await fleet_kv(js, ACTIVE_BUCKET)).put(active_key(0, run_id), actor.encode())


async def event_count(js, run_id: str) -> int:
    info = await js.stream_info(EVENTS, subjects_filter=f"events.*.{run_id}.>")
    return sum((info.state.subjects or {}).values())


async def objects_of(log: RunLog, run_id: str) -> list[str]:
    return sorted(o.name for o in (await log.payloads.objects_by_run()).get(run_id, []))


@pytest.mark.anyio
async def test_purge_deletes_a_finished_run_and_nothing_else(js) -> None:
    await ensure_topology(js)
    log = RunLog(js, payloads=Payloads(js, threshold=4096))
    await write_run(log, js, "r-done")
    await write_run(log, js, "r-other")  # the very same big values: its own objects all the same
    await write_run(log, js, "r-live", end=False, index="running", active=True)
    await write_run(log, js, "r-ending", index="running")  # terminal in the log, index not yet updated
    legacy = await (await log.payloads.store()).put(  # an object from before objects were named per run
        "sha256-" + "0" * 64, b"shared by anyone")
    assert len(await objects_of(log, "r-done")) == 2 and await event_count(js, "r-done") == 2

    dry = await log.purge(["r-done", "r-live"], dry_run=True)
    assert [(p.run_id, p.events, len(p.objects), p.skipped is None) for p in dry] == [
        ("r-done", 2, 2, True), ("r-live", 0, 0, False)]
    assert await event_count(js, "r-done") == 2 and len(await objects_of(log, "r-done")) == 2
    assert (await (await runs_kv(js)).get("r-done")).value  # the dry run deleted nothing

    done, live, ending = await log.purge(["r-done", "r-live", "r-ending"])
    assert done.deleted and done.status == "completed" and done.events == 2 and done.index
    assert len(done.objects) == 2 and all(name.startswith("r-done/") for name in done.objects)
    assert await event_count(js, "r-done") == 0 and await objects_of(log, "r-done") == []
    assert (await log.read("r-done")).events == []
    with pytest.raises(Exception, match="not found"):
        await (await runs_kv(js)).get("r-done")
    assert live.skipped == "in flight: its last event is run.started" and not live.deleted
    assert ending.skipped == "in flight: the runs index says running"
    for run in ("r-live", "r-ending"):  # untouched
        assert await event_count(js, run) >= 1 and await objects_of(log, run)

    other = await log.read("r-other")  # the run that produced the same bytes still reads whole
    assert other.events[0].input == BIG and other.events[-1].output == {"answer": BIG}
    assert (await (await log.payloads.store()).get_info(legacy.name)).size == len(b"shared by anyone")
    assert object_name(BIG.encode(), "r-other").startswith("r-other/")

    again = await log.purge(["r-done"])  # nothing left: a second purge finds nothing to delete
    assert again[0].events == 0 and again[0].objects == [] and not again[0].index


def test_sa_runs_purge_selects_by_date_and_agent(nats_server) -> None:
    """The CLI runs its own event loop, so this test is synchronous and sets up through `anyio.run`."""

    async def with_js(fn):
        nc = await connect(nats_server.url, name="test")
        try:
            return await fn(nc.jetstream())
        finally:
            await nc.close()

    async def setup(js) -> None:
        for info in await js.streams_info():
            await js.delete_stream(info.config.name)
        await ensure_topology(js)
        log = RunLog(js, payloads=Payloads(js, threshold=4096))
        await write_run(log, js, "r-calc", actor="calc")
        await write_run(log, js, "r-mail", actor="mail:inbox")
        await write_run(log, js, "r-busy", actor="calc", end=False, index="running", active=True)

    def count(run_id: str) -> int:
        return anyio.run(with_js, lambda js: event_count(js, run_id))

    anyio.run(with_js, setup)
    runner = CliRunner()

    def sa(*args: str) -> dict:
        result = runner.invoke(app, ["runs", "purge", *args, "--json", "--nats", nats_server.url])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    assert sa("--before", "2000-01-01")["runs"] == []  # nothing that old
    dry = sa("--before", "0", "--agent", "calc", "--dry-run")
    assert [(r["run_id"], r["skipped"]) for r in dry["runs"]] == [
        ("r-calc", None), ("r-busy", "in flight: its last event is run.started")]
    assert dry["deleted"] == 1 and dry["events"] == 2 and count("r-calc") == 2

    real = sa("--before", "0", "--agent", "calc")
    assert real["deleted"] == 1 and real["skipped"] == 1 and count("r-calc") == 0
    assert count("r-mail") == 2 and count("r-busy") == 1

    text = runner.invoke(app, ["runs", "purge", "--before", "0", "--nats", nats_server.url])
    assert text.exit_code == 0 and "deleted r-mail (mail:inbox, completed): 2 event(s)" in text.output
    assert "skipped r-busy (calc): in flight" in text.output
    bad = runner.invoke(app, ["runs", "purge", "--before", "someday", "--nats", nats_server.url])
    assert bad.exit_code == 2 and "--before 'someday'" in bad.output
    listed = runner.invoke(app, ["runs", "calc", "--json", "--nats", nats_server.url])
    assert [r["run_id"] for r in json.loads(listed.output)] == ["r-busy"]  # `sa runs AGENT` still lists
