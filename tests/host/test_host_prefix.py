"""Through a real host and worker, every turn's request starts with the previous request, byte for byte.

Why here too: `tests/model/test_prefix_stability.py` checks the model step on every adapter in one
process; a host builds its prompts from what the log holds (arguments and tool outputs that crossed NATS
as msgpack, and a worker's results in call order), so this checks that nothing on that path moves the
prompt, up to and including the forced last turn, where the kernel offers only the terminal tool.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from host_helpers import running_fleet, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_task

pytestmark = pytest.mark.anyio


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    return js


async def test_a_hosted_run_keeps_each_prompt_a_prefix_of_the_next(nats_server, topo, tmp_path: Path):
    bundle = write_bundle(tmp_path)  # hermes, ebnf, max_turns 6 with the terminal tool `submit`
    async with running_fleet(nats_server.url, topo, bundle) as env:
        run_id = await publish_task(topo, "calc", "chain: 5")  # 5 calculator turns, then the forced 6th
        events = await env.wait_run(run_id)
        bodies = env.server.requests
    assert isinstance(events[-1], ev.RunCompleted), events[-1]
    requested = [e for e in events if isinstance(e, ev.ModelRequested)]
    assert len(bodies) == len(requested) == 6 and requested[-1].tools == ("submit",)
    for turn, (before, after) in enumerate(itertools.pairwise(bodies), 2):
        was = [json.dumps(m, ensure_ascii=False) for m in before["messages"]]
        now = [json.dumps(m, ensure_ascii=False) for m in after["messages"]]
        assert now[: len(was)] == was, f"turn {turn}: the prompt changed"
    # the forced turn narrowed the grammar, not the prompt
    grammars = [b["structured_outputs"]["grammar"] for b in bodies]
    assert "calculator" in grammars[0] and "calculator" not in grammars[-1]
