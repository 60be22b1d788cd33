"""A real 3-node JetStream cluster on loopback, started from deploy/nats/nats.conf (the file compose
uses): it forms, the runtime's topology is created with three replicas, and killing the leader of a
stream with SIGKILL loses and duplicates nothing when publishers retry with the same Msg-Id."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import nats.errors
import pytest
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import APIError

from runtime.nats.cluster import CONFIG_ENV, CONFIG_TEMPLATE, LocalCluster
from runtime.nats.connection import close, connect
from runtime.nats.subjects import (
    DLQ,
    EVENTS,
    HDR_MSG_ID,
    PAYLOADS_BUCKET,
    RESULTS,
    RUNS_BUCKET,
    TASKS,
    TOOLS,
    WORKERS_CONSUMER,
)
from runtime.nats.topology import ENV_REPLICAS, ensure_topology, read_topology

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def cluster() -> LocalCluster:
    c = LocalCluster(3).start()
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture
async def cjs(cluster: LocalCluster) -> AsyncIterator[object]:
    nc = await connect(cluster.urls, name="cluster-test")
    try:
        yield nc.jetstream()
    finally:
        await close(nc)


def test_every_node_runs_the_deploy_config(cluster: LocalCluster) -> None:
    text = CONFIG_TEMPLATE.read_text()
    for name in CONFIG_ENV:  # the file reads exactly the names the class (and compose) set
        assert f"${name}" in text
        assert name in cluster.env(0)
    assert cluster.meta_leader() in {"n0", "n1", "n2"}
    assert len(set(cluster.env(0)["NATS_ROUTES"].split(","))) == 3
    for i, node in enumerate(cluster.nodes):
        assert node.running and f"Cluster name is {cluster.cluster_name}" in node.log_file.read_text()
        assert cluster.env(i)["NATS_SERVER_NAME"] == node.name


async def test_every_node_syncs_each_write_before_acknowledging_it(cluster: LocalCluster) -> None:
    """deploy/nats/nats.conf sets `sync_interval: always`; each node's /varz (what a host asks) says so."""
    from runtime.nats.durability import storage_sync

    report = await storage_sync(cluster.urls, [n.monitor_url for n in cluster.nodes])
    assert report.synced and {n.server for n in report.nodes} == {"n0", "n1", "n2"}


async def test_the_topology_is_replicated_three_times(cjs, monkeypatch) -> None:
    monkeypatch.setenv(ENV_REPLICAS, "3")
    topo = await ensure_topology(cjs, partitions=4)
    assert topo.replicas == 3 and (await read_topology(cjs)).replicas == 3
    for stream in (TASKS, EVENTS, TOOLS, RESULTS, DLQ, f"KV_{RUNS_BUCKET}",
                   f"OBJ_{PAYLOADS_BUCKET}"):
        info = await cjs.stream_info(stream)
        assert info.config.num_replicas == 3, stream
        assert info.cluster.leader and len(info.cluster.replicas) == 2, stream
    ci = await cjs.consumer_info(TOOLS, WORKERS_CONSUMER)
    assert ci.config.num_replicas == 3
    monkeypatch.delenv(ENV_REPLICAS)
    await ensure_topology(cjs, partitions=4)  # a process without SA_REPLICAS keeps R3...
    assert (await cjs.stream_info(EVENTS)).config.num_replicas == 3  # ...never scales it down


async def publish_until_acked(js, subject: str, data: bytes, msg_id: str) -> int:
    """What a host does with an append during a failover: retry the same Msg-Id until acked."""
    with anyio.fail_after(60):
        while True:
            try:
                ack = await js.publish(subject, data, headers={HDR_MSG_ID: msg_id}, timeout=1.0)
                return ack.seq
            except (nats.errors.Error, APIError, TimeoutError):
                await anyio.sleep(0.1)


async def test_killing_the_stream_leader_loses_and_duplicates_nothing(cluster: LocalCluster, cjs) -> None:
    await cjs.add_stream(StreamConfig(name="FAILOVER", subjects=["fo.>"], num_replicas=3,
                                      storage=StorageType.FILE, duplicate_window=120))
    leader = (await cjs.stream_info("FAILOVER")).cluster.leader
    victim = cluster.index_of(leader)
    total, kill_at = 400, 150
    seqs: list[int] = []
    for i in range(total):
        if i == kill_at:
            cluster.kill(victim)
        seqs.append(await publish_until_acked(cjs, f"fo.{i}", str(i).encode(), f"fo-{i}"))
    info = await cjs.stream_info("FAILOVER", subjects_filter="fo.>")
    assert info.cluster.leader != leader  # a survivor took over
    assert info.state.messages == total  # nothing lost, nothing stored twice
    assert info.state.subjects == {f"fo.{i}": 1 for i in range(total)}
    assert seqs == list(range(1, total + 1))  # every publish acked once, in order, no gaps
    # a publish retried after it landed is recognised as the duplicate it is
    again = await cjs.publish("fo.7", b"7", headers={HDR_MSG_ID: "fo-7"})
    assert again.duplicate and again.seq == 8

    await anyio.to_thread.run_sync(cluster.restart, victim)  # the killed node comes back and catches up
    with anyio.fail_after(30):
        while True:
            replicas = (await cjs.stream_info("FAILOVER")).cluster.replicas or []
            back = [r for r in replicas if r.name == leader]
            if back and back[0].current and not back[0].offline:
                break
            await anyio.sleep(0.2)
