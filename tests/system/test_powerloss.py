"""Power loss under load: the short version of `bench/powerloss.py` (phase "all nodes lose power at once").

A 3-node NATS cluster (R3 streams, deploy/nats/nats.conf) stores JetStream on `testbed.lazyfs` mounts, file
systems that drop every write not yet synced when the power goes; a host, a worker and the scripted model
run step tasks (workspace-writing tool steps) on it (`testbed.powerbed`). A third of the way into a batch,
every node is SIGKILLed and its unsynced writes dropped, then all power on again.

* With the shipped config (`sync_interval: always`) nothing the cluster acknowledged is lost: every
  checker count is 0 (`testbed.checker`: no run lost, no gap, no recorded model call made again, no write
  applied twice, ...), `sa audit` finds nothing, and every event a run's log held before the loss is still
  there.
* With nats-server's default (acknowledged from the page cache, synced every two minutes) the same bed
  loses acknowledged events and whole runs: the bed can fail, so its 0 above means something.

Needs FUSE (/dev/fuse, fusermount3, libfuse3: `make fuse`); skipped with the reason otherwise.
"""

from __future__ import annotations

import pytest

from testbed.checker import anomalies
from testbed.fleet import StepModel
from testbed.lazyfs import unavailable
from testbed.powerbed import PowerBed, load, lose_power_all, power_phase

pytestmark = [pytest.mark.anyio, pytest.mark.powerloss, pytest.mark.fault_bed]

WHY_NOT = unavailable()


async def _power_loss(tmp_path, sync: str, timeout: float):
    model = StepModel()
    bed = await PowerBed(tmp_path, responder=model, sync=sync, hosts=1, workers=1).astart()
    try:
        result = await power_phase(bed, model, f"power loss, sync {sync}", lose_power_all(), load(bed, 40),
                                   runs=12, window=3.0, timeout=timeout)
    finally:
        await bed.aclose()
    print(f"\n{result}")
    return result


@pytest.mark.skipif(WHY_NOT is not None, reason=f"no FUSE here: {WHY_NOT}")
async def test_all_nodes_losing_power_lose_nothing_with_sync_always(tmp_path):
    result = await _power_loss(tmp_path, "always", timeout=120.0)
    assert result.notes["acked_before"] > 0  # the loss struck runs under way
    assert not anomalies(result.counts), result
    assert result.notes["acked_lost"] == 0, result
    assert result.notes["audit"] == 0, result
    assert result.notes["stuck"] == 0, result


@pytest.mark.skipif(WHY_NOT is not None, reason=f"no FUSE here: {WHY_NOT}")
async def test_the_bed_shows_the_loss_with_nats_default_sync(tmp_path):
    result = await _power_loss(tmp_path, "default", timeout=8.0)  # lost runs never end
    assert result.notes["acked_before"] > 0
    assert result.notes["acked_lost"] > 0, result  # acknowledged events gone
    assert anomalies(result.counts), result  # and the checker sees it (runs lost)
