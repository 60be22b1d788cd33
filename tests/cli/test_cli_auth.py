"""`sa send` on a secured server (the shipped auth.conf): what a refusal says, and what it means.

A publisher may publish tasks but not read runs; an operator reads runs and sends commands but may not
publish tasks. Once, an operator's `sa send` retried a refused publish for 10 s and then said "re-send it
with --task-id" (which cannot work), and a publisher's `sa send -f` stored the task and then exited 1 as
if nothing had been sent."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import anyio
import pytest
from nats_fixtures import PASSWORDS

from runtime import nats as bus
from runtime.commands import run_id_for
from runtime.nats.server import EmbeddedNats
from runtime.nats.subjects import TASKS
from testbed.fleet import CLI

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
async def topology(secured: EmbeddedNats) -> AsyncIterator[EmbeddedNats]:
    """The streams, made by the admin (a host would); no host runs: the tasks stay stored."""
    nc = await bus.connect(secured.url, user="admin", password=PASSWORDS["admin"])
    try:
        await bus.ensure_topology(nc.jetstream(), partitions=2)
    finally:
        await bus.close(nc)
    yield secured


async def sa_as(url: str, role: str, *args: str) -> tuple[int, str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NATS_")}
    env.update(NATS_URL=url, NATS_USER=role, NATS_PASSWORD=PASSWORDS[role], XDG_DATA_HOME="/nonexistent-sa")
    proc = await anyio.run_process([*CLI, *args], env=env, check=False)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def stored(url: str, agent: str) -> int:
    """How many tasks TASKS holds for `agent` (read as the admin)."""
    nc = await bus.connect(url, user="admin", password=PASSWORDS["admin"])
    try:
        info = await nc.jetstream().stream_info(TASKS, subjects_filter=f"tasks.*.{agent}.>")
        return sum((info.state.subjects or {}).values())
    finally:
        await bus.close(nc)


async def test_a_publisher_following_its_task_is_told_the_task_is_stored_and_how_to_follow_it(topology):
    code, out, err = await sa_as(topology.url, "publisher", "send", "demo", "hello", "--follow",
                                 "--task-id", "pub-1")
    run_id = run_id_for("demo", "pub-1")
    assert code == 3, (out, err)
    assert out.split() == ["run", run_id]
    assert f"the task is stored: run {run_id}" in err and "may publish tasks but not read runs" in err
    assert f"sa replay {run_id}" in err and "Traceback" not in err
    assert await stored(topology.url, "demo") == 1


async def test_a_role_that_may_not_publish_tasks_is_told_so_and_nothing_is_stored(topology):
    code, out, err = await sa_as(topology.url, "operator", "send", "other", "hello")
    assert code == 1 and out == "", (out, err)
    assert "NATS refused to store the task" in err and 'publish to "agents.other.tasks"' in err
    assert "may not publish tasks for other" in err
    assert "--task-id" not in err and "send it again" not in err  # re-sending cannot help
    assert await stored(topology.url, "other") == 0


async def test_a_task_too_big_for_one_message_that_these_credentials_cannot_store_apart(topology, tmp_path):
    """A publisher may not write the payload object store, where an input bigger than a message goes: the
    refusal says the size, the limit and what to do, instead of nats-py's raw MaxPayloadError."""
    (tmp_path / "big.txt").write_text("x" * 2_000_000)
    big = str(tmp_path / "big.txt")
    code, out, err = await sa_as(topology.url, "publisher", "send", "big", "--file", big)
    assert code == 1 and out == "", (out, err)
    assert "the task is 2,000," in err and "more than one message carries here" in err
    assert "payload object store" in err and "user 'publisher'" in err and "make it smaller" in err
    assert "MaxPayloadError" not in err and "Traceback" not in err
    assert await stored(topology.url, "big") == 0
