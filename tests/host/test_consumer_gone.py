"""A slot's consumer deleted behind its host's back is made again: the host does not keep pulling from a
consumer that is gone while it renews the slot's lease (issue 28's idle host).

How a consumer goes while its owner serves the slot, seen on machines of their own (`bench/partitions.py`,
the NATS minority cut): a takeover recreates the slot's consumers (delete, then create); a delete that a
previous owner sent while NATS was electing a leader, and gave up waiting for, is carried out later, after
the new owner created its consumer. The owner's pull requests were then answered "no responders" for ever,
its lease kept being renewed, and the slot's tasks waited in TASKS until the host was cut off and another
one took the slot. On one loopback node no API call is slow enough for this, which is why it was seen
only on a cluster.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from host_helpers import Env, kinds, running_fleet, write_bundle

from runtime import nats as bus
from runtime.commands import publish_task
from runtime.nats.subjects import RESULTS, TASKS, partition_of, result_consumer_name, task_consumer_name

pytestmark = pytest.mark.anyio
PARTITIONS = 4


@pytest.fixture
async def fleet(nats_server, js, tmp_path: Path) -> AsyncIterator[Env]:
    await bus.ensure_topology(js, partitions=PARTITIONS, tool_ack_wait=2.0)
    async with running_fleet(nats_server.url, js, write_bundle(tmp_path)) as env:
        yield env


@pytest.mark.parametrize("stream", [TASKS, RESULTS])
async def test_a_slot_whose_consumer_was_deleted_is_served_again(fleet: Env, stream: str):
    js, host = fleet.js, fleet.host
    p = partition_of("calc", PARTITIONS)
    first = await publish_task(js, "calc", "compute: 6 * 7")
    assert kinds(await fleet.wait_run(first, timeout=60))[-1] == "run.completed"
    name = (task_consumer_name if stream == TASKS else result_consumer_name)(p, "calc")
    await js.delete_consumer(stream, name)  # the late delete of a previous owner
    assert ("calc", p) in host.slots  # the host still holds the slot, and its lease
    run_id = await publish_task(js, "calc", "compute: 6 * 7")  # a task, and a tool outcome on RESULTS
    assert kinds(await fleet.wait_run(run_id, timeout=60))[-1] == "run.completed"
    assert (await js.consumer_info(stream, name)).name == name  # made again by the host
