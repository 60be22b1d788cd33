"""A run resumed after a crash uses the bundle version it started with: a host that has another version
fails it with the reason (`resume: same-version`, the default) or continues it (`resume: latest`)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from host_helpers import calc_responder, kinds, running_host, running_worker, write_bundle

from runtime import events as ev
from runtime.bundle import load_bundle
from runtime.client.verify import verify
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv
from runtime.nats.subjects import ACTIVE_BUCKET, active_key, partition_of
from runtime.nats.topology import ensure_topology, read_partitions
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio


async def an_unfinished_run(js, run_id: str, digest: str) -> None:
    """What a host that died right after starting a run leaves: `run.started` and the run's active key."""
    await ensure_topology(js, partitions=4)
    started = ev.RunStarted(run_id=run_id, seq=0, ts=1.0, actor="calc", input="compute: 2 + 2",
                            bundle_digest=digest)
    assert await RunLog(js).create(started) is not None
    p = partition_of("calc", await read_partitions(js))
    await (await fleet_kv(js, ACTIVE_BUCKET)).put(active_key(p, run_id), b"calc")


async def finished(js, run_id: str) -> list[ev.Event]:
    with anyio.fail_after(60):
        return [e async for e in RunLog(js).follow(run_id)]


@pytest.mark.parametrize("policy", ["same-version", "latest"])
async def test_a_run_on_a_changed_bundle_follows_the_bundles_resume_policy(nats_server, js, tmp_path: Path,
                                                                          policy: str):
    bundle = write_bundle(tmp_path, extra="" if policy == "same-version" else "resume: latest\n")
    await an_unfinished_run(js, "r-old", digest="0123456789abcdef")  # another version of the bundle
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server), \
                running_worker(nats_server.url, [bundle]):
            events = await finished(js, "r-old")
            requests = len(server.requests)
    if policy == "same-version":
        assert kinds(events) == ["run.started", "run.failed"]
        assert requests == 0  # nothing ran on the changed bundle
        failed = events[-1]
        assert isinstance(failed, ev.RunFailed) and failed.reason == "bundle_changed"
        assert "0123456789abcdef" in failed.detail and "resume: latest" in failed.detail
    else:
        assert kinds(events)[-1] == "run.completed" and requests >= 1
    # either way the log verifies: a host's own verdict is an input, not a kernel prediction
    assert verify(load_bundle(bundle).kernel_config(), (await RunLog(js).read("r-old")).events).ok


async def test_a_run_on_its_own_bundle_version_resumes(nats_server, js, tmp_path: Path):
    bundle = write_bundle(tmp_path)
    await an_unfinished_run(js, "r-same", digest=load_bundle(bundle).digest)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server), running_worker(nats_server.url, [bundle]):
            events = await finished(js, "r-same")
    assert kinds(events)[-1] == "run.completed"
