"""Backups on real nats-servers: a mirror of EVENTS and the runs index keeps what the primary loses, and a run
restored from it is whole again (`sa audit` clean) and re-folds to the state it had. First in one server (the
copy a mirror beside EVENTS), then in another JetStream domain reached through a leaf node (a copy in another
cluster), the copy made and the run restored with `sa backup`."""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

import anyio
import pytest
from host_helpers import running_fleet, write_bundle

from runtime import events as ev
from runtime import kernel
from runtime import nats as bus
from runtime.client.audit import audit
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.log.backup import (
    COPY_STREAM,
    INDEX_COPY_STREAM,
    RestoreRefused,
    copy_state,
    ensure_copy,
    restore_run,
    runs_to_restore,
)
from runtime.nats.kv import runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.server import EmbeddedNats
from runtime.nats.subjects import EVENTS

pytestmark = pytest.mark.anyio
CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]


async def sa(url: str, *args: str) -> tuple[int, str, str]:
    env = {**os.environ, "NATS_URL": url, "XDG_DATA_HOME": "/nonexistent-sa", "COLUMNS": "300"}
    proc = await anyio.run_process([*CLI, *args], env=env, check=False)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def caught_up(copy_js, js) -> None:
    """Until the copies hold every message of EVENTS and of the runs index (the mirrors run on their own; a
    mirror keeps its source's stream sequences)."""
    with anyio.fail_after(30):
        while True:
            want = [(await js.stream_info(s)).state.last_seq for s in (EVENTS, "KV_runs")]
            have = [(await copy_state(copy_js, s)).last_seq for s in (COPY_STREAM, INDEX_COPY_STREAM)]
            if have == want:
                return
            await anyio.sleep(0.05)


async def folded(log: RunLog, run: str) -> kernel.State:
    return kernel.fold(kernel.KernelConfig(), (await log.read(run)).events)


async def record_runs(url: str, js, tmp_path: Path, n: int) -> list[str]:
    async with running_fleet(url, js, write_bundle(tmp_path)) as env:
        runs = [await publish_task(js, "calc", f"compute: {i} * 3") for i in range(n)]
        for run in runs:
            await env.wait_run(run)
    return runs


async def lose(js, log: RunLog, run: str, which: slice) -> None:
    """Storage loses the run's messages `which` (deleted by stream sequence, as a lost block would)."""
    for message in (await log.stored(run))[which]:
        await js.delete_msg(EVENTS, message.stream_seq)


async def test_a_run_lost_from_events_is_restored_from_the_mirror_whole(nats_server, js, tmp_path: Path):
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    runs = await record_runs(nats_server.url, js, tmp_path, 4)
    assert await ensure_copy(js) == [COPY_STREAM, INDEX_COPY_STREAM]
    assert await ensure_copy(js) == []  # kept as it is
    await caught_up(js, js)
    log = RunLog(js)
    before = {run: await folded(log, run) for run in runs}
    sizes = {run: len(await log.stored(run)) for run in runs}  # messages (a group of events is one)
    gone, gapped, forgotten, _kept = runs
    counts = {run: len((await log.read(run)).events) for run in runs}
    in_fourth = len(ev.decode_all((await log.stored(gapped))[3].data))  # the message lost from `gapped`

    await lose(js, log, gone, slice(None))  # every event; the index still lists it
    await lose(js, log, gapped, slice(3, 4))  # one message in the middle
    await lose(js, log, forgotten, slice(None))  # every event and its index entry: the audit cannot see it
    await (await runs_kv(js)).delete(forgotten)
    faults = {r.run_id: sorted({f.fault for f in r.findings}) for r in (await audit(js)).runs if r.findings}
    assert faults == {gone: ["no_log"], gapped: ["gap"]}
    # the deletes were not mirrored
    assert (await copy_state(js)).messages > (await js.stream_info(EVENTS)).state.messages

    assert [run for _, run in await runs_to_restore(js, js)] == sorted([gone, gapped, forgotten])
    restored = {run: await restore_run(js, js, run) for run in (gone, gapped, forgotten)}
    assert (restored[gapped].had, restored[gapped].events) == (counts[gapped] - in_fourth, counts[gapped])
    assert (restored[gone].had, restored[gone].events) == (0, counts[gone])
    assert restored[forgotten].index_restored and not restored[gone].index_restored
    report = await audit(js)
    assert not report.findings and {r.run_id for r in report.runs} == set(runs)
    assert {run: len(await log.stored(run)) for run in runs} == sizes
    for run in runs:  # each re-folds to exactly the state it had before the loss
        assert await folded(log, run) == before[run], run
    for run in (gone, forgotten):  # the index names where the restored log ends (what a next append expects)
        entry = RunIndex.decode((await (await runs_kv(js)).get(run)).value)
        last = await log.last(run)
        assert last is not None and (entry.status, entry.last_seq) == ("completed", last[0])
    assert await runs_to_restore(js, js) == []

    last = await log.last(gapped)
    assert last is not None and "/restored-" in last[1]  # not dropped as a duplicate of the lost one

    await caught_up(js, js)  # the mirror copied the restore too: the run is in the copy twice
    await lose(js, log, gapped, slice(0, 1))  # lost again, its first event this time
    assert [run for _, run in await runs_to_restore(js, js)] == [gapped]
    assert (await restore_run(js, js, gapped)).events == counts[gapped]
    assert await folded(log, gapped) == before[gapped] and not (await audit(js, run_id=gapped)).findings
    with pytest.raises(RestoreRefused, match="holds no event of run r-nothing"):
        await restore_run(js, js, "r-nothing")
    code, out, err = await sa(nats_server.url, "replay", forgotten)
    assert code == 0, err
    assert "run.completed" in out and "tool.completed" in out


async def test_restore_refuses_a_copy_that_is_not_whole(nats_server, js, tmp_path: Path):
    """A copy that lost an event itself would put back a broken log: refused, EVENTS untouched."""
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    (run,) = await record_runs(nats_server.url, js, tmp_path, 1)
    await ensure_copy(js)
    await caught_up(js, js)
    copy = RunLog(js, stream=COPY_STREAM)
    second = (await copy.stored(run))[1]
    await js.delete_msg(COPY_STREAM, second.stream_seq)
    held = await RunLog(js).stored(run)
    with pytest.raises(RestoreRefused, match=f"the copy of run {run} is not whole either"):
        await restore_run(js, js, run)
    assert await RunLog(js).stored(run) == held


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_sa_backup_keeps_a_copy_in_another_domain_and_restores_a_run_from_it(tmp_path: Path):
    """The fleet's JetStream (domain `hub`) and a backup server (domain `backup`) joined by a leaf node: the
    copy is made with `sa backup start`, the loss found with `sa audit`, the run put back with `sa backup
    restore --missing`, and `sa audit` is clean again."""
    leaf = free_port()
    hub_conf, backup_conf = tmp_path / "hub.conf", tmp_path / "backup.conf"
    hub_conf.write_text(f'jetstream {{ domain: hub }}\nleafnodes {{ listen: "127.0.0.1:{leaf}" }}\n')
    backup_conf.write_text(f'jetstream {{ domain: backup }}\n'
                           f'leafnodes {{ remotes: [ {{ url: "nats-leaf://127.0.0.1:{leaf}" }} ] }}\n')
    hub = EmbeddedNats(extra_args=["-c", str(hub_conf)], sync=None).start()
    backup = EmbeddedNats(extra_args=["-c", str(backup_conf)], sync=None).start()
    try:
        nc, bnc = await bus.connect(hub.url, name="test"), await bus.connect(backup.url, name="test-backup")
        js, bjs = bus.jetstream_for(nc), bus.jetstream_for(bnc)
        await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
        runs = await record_runs(hub.url, js, tmp_path, 2)
        code, out, err = await sa(hub.url, "backup", "start", "--to", backup.url, "--domain", "hub")
        assert code == 0, err
        assert COPY_STREAM in out
        await caught_up(bjs, js)
        log = RunLog(js)
        before = await folded(log, runs[0])
        await lose(js, log, runs[0], slice(None))
        code, out, _ = await sa(hub.url, "audit", "--json")
        assert code == 1 and [(f["run_id"], f["fault"]) for f in json.loads(out)["findings"]] == \
            [(runs[0], "no_log")]

        code, out, err = await sa(hub.url, "backup", "status", "--to", backup.url)
        assert code == 0, err
        assert COPY_STREAM in out and INDEX_COPY_STREAM in out
        code, out, err = await sa(hub.url, "backup", "restore", "--missing", "--from", backup.url)
        assert code == 0, err
        assert runs[0] in out and runs[1] not in out
        code, out, err = await sa(hub.url, "audit")
        assert code == 0, out + err
        assert await folded(log, runs[0]) == before
        assert isinstance((await log.read(runs[0])).events[-1], ev.RunCompleted)
        await nc.close()
        await bnc.close()
    finally:
        backup.stop()
        hub.stop()
