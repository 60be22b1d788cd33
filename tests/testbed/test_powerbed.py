"""The power-loss bed's own arithmetic (`testbed.powerbed`), without a cluster: which config each sync mode
runs, and what counts as an acknowledged event lost."""

from __future__ import annotations

import pytest

from runtime.nats.cluster import CONFIG_TEMPLATE
from testbed.powerbed import acked_lost, nats_config


def test_always_runs_the_shipped_config_itself():
    assert nats_config(CONFIG_TEMPLATE.parent, "always") == CONFIG_TEMPLATE
    assert "sync_interval: always" in CONFIG_TEMPLATE.read_text()


def test_default_runs_the_shipped_config_without_its_sync_line(tmp_path):
    text = nats_config(tmp_path, "default").read_text()
    assert not [line for line in text.splitlines() if line.strip().startswith("sync_interval:")]
    assert text == CONFIG_TEMPLATE.read_text().replace("  sync_interval: always", "")  # nothing else changed
    assert "sync_interval: 1s" in nats_config(tmp_path, "1s").read_text()


@pytest.mark.parametrize(("after", "lost"), [
    ({"r": [(0, "run.started", 1.0), (1, "model.requested", 2.0)]}, 0),  # all there
    ({"r": [(0, "run.started", 1.0), (1, "model.requested", 2.0), (2, "x", 3.0)]}, 0),  # and more
    ({"r": [(0, "run.started", 1.0)]}, 1),  # the tail gone
    ({"r": [(0, "run.started", 1.0), (1, "model.requested", 9.0)]}, 1),  # rewritten by another writer
    ({}, 2),  # the whole run gone
])
def test_an_acknowledged_event_is_lost_when_gone_or_replaced(after, lost):
    before = {"r": [(0, "run.started", 1.0), (1, "model.requested", 2.0)]}
    assert acked_lost(before, after) == lost
