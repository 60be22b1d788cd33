"""Synced before acknowledged: the servers the runtime starts sync each write, and a host tells (and, when
told to, refuses) storage that acknowledges before it syncs. Real nats-server processes; the answer comes
from each server's own /varz, as in production."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from host_helpers import write_bundle
from nats.js.errors import NotFoundError

from runtime import nats as bus
from runtime.host import Host, HostConfig
from runtime.nats.durability import MONITOR_ENV, REQUIRE_SYNC_ENV, UnsyncedStorage, monitor_urls, node_sync
from runtime.nats.server import EmbeddedNats
from runtime.nats.subjects import TASKS

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def lazy() -> Iterator[EmbeddedNats]:
    """nats-server with JetStream's own default: acknowledged, synced every two minutes."""
    server = EmbeddedNats(sync=None).start()
    try:
        yield server
    finally:
        server.stop()


def test_the_embedded_server_syncs_every_write_and_varz_says_so(nats_server, secured, lazy) -> None:
    synced = node_sync(nats_server.monitor_url)
    assert synced.synced is True and "sync_interval always" in synced.describe()
    assert node_sync(secured.monitor_url).synced is True  # its -c auth.conf is included, not replaced
    lazily = node_sync(lazy.monitor_url)
    assert lazily.synced is False and lazily.interval_s == 120.0
    assert node_sync("http://127.0.0.1:9").synced is None  # nothing answers: unknown, never "synced"


def test_monitoring_urls_come_from_the_environment_or_port_8222(monkeypatch) -> None:
    monkeypatch.delenv(MONITOR_ENV, raising=False)
    assert monitor_urls(["nats://n1.example:4222", "nats://n1.example:4223", "n2:4222"]) == [
        "http://n1.example:8222", "http://n2:8222"]
    monkeypatch.setenv(MONITOR_ENV, "http://a:1/, http://b:2")
    assert monitor_urls(["nats://n1:4222"]) == ["http://a:1", "http://b:2"]


async def _serve_until_ready(url: str, config: HostConfig) -> Host:
    nc = await bus.connect(url, name="test-sync")
    try:
        host = Host(nc, {}, config=config)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run, stop)
            with anyio.fail_after(20):
                await host.ready.wait()
            stop.set()
        return host
    finally:
        await bus.close(nc)


async def test_a_host_on_lazy_storage_says_so_in_one_line_and_serves(lazy, caplog) -> None:
    caplog.set_level(logging.INFO, logger="runtime.host")
    host = await _serve_until_ready(lazy.url, HostConfig(require_sync=False, monitor=[lazy.monitor_url]))
    lines = [r for r in caplog.records if "acknowledges writes before they are on disk" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING
    assert "syncs every 120 s" in lines[0].getMessage() and "sync_interval: always" in lines[0].getMessage()
    assert host.storage.lazy and not host.storage.synced


async def test_a_host_on_synced_storage_says_so_and_serves_when_required(nats_server, caplog) -> None:
    caplog.set_level(logging.INFO, logger="runtime.host")
    host = await _serve_until_ready(nats_server.url, HostConfig(require_sync=True,
                                                                monitor=[nats_server.monitor_url]))
    assert host.storage.synced
    assert any("syncs every write to disk before acknowledging" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("which", ["lazy", "unknown"])
async def test_a_host_required_to_sync_refuses_before_touching_anything(lazy, which) -> None:
    monitor = lazy.monitor_url if which == "lazy" else "http://127.0.0.1:9"
    nc = await bus.connect(lazy.url, name="test-sync")
    try:
        for info in await nc.jetstream().streams_info():  # what an earlier test's host made
            await nc.jetstream().delete_stream(info.config.name)
        host = Host(nc, {}, config=HostConfig(require_sync=True, monitor=[monitor]))
        with pytest.raises(UnsyncedStorage, match="refusing to serve") as refused:
            await host.run(anyio.Event())
        assert ("acknowledges writes before" if which == "lazy" else "cannot tell") in str(refused.value)
        with pytest.raises(NotFoundError):  # refused before it made any stream or took any lease
            await nc.jetstream().stream_info(TASKS)
    finally:
        await bus.close(nc)


def test_sa_host_with_sa_require_sync_exits_1_naming_the_storage(lazy, tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path)
    env = {**os.environ, "NATS_URL": lazy.url, MONITOR_ENV: lazy.monitor_url, REQUIRE_SYNC_ENV: "1"}
    done = subprocess.run([sys.executable, "-c", "from runtime.cli import main; main()", "host", str(bundle)],
                          env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert done.returncode == 1, done.stderr[-3000:]
    assert "acknowledges writes before they are on disk" in done.stderr
    assert "refusing to serve (SA_REQUIRE_SYNC is set)" in done.stderr
    assert "Traceback" not in done.stderr


def test_sa_nats_sync_sets_the_embedded_servers_sync_interval(monkeypatch) -> None:
    """`sa up` on a laptop that prefers speed: SA_NATS_SYNC=default gives nats-server's own (every 2 min)."""
    for value, synced, interval in (("default", False, 120.0), ("1s", False, 1.0), ("", True, None)):
        monkeypatch.setenv("SA_NATS_SYNC", value)
        with EmbeddedNats() as server:
            node = node_sync(server.monitor_url)
        assert (node.synced, node.interval_s) == (synced, interval), value
