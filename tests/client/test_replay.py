"""Replay: reading a run back from NATS, the rendered timeline, verification by the kernel, forking."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from host_helpers import Env, calc_responder, kinds, running_host, running_worker, write_bundle
from rich.console import Console

from runtime import events as ev
from runtime import kernel
from runtime.bundle import load_bundle
from runtime.client.replay import describe, summarize, timeline
from runtime.client.verify import verify
from runtime.commands import publish_task
from runtime.log import RunLog, Superseded
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio


async def test_replay_renders_and_verifies_a_run_and_catches_a_tampered_log(nats_server, js, tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_bundle(tmp_path)
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(nats_server.url, [bundle], server) as host, \
                running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "calc", "chain: 2")
            await Env(nats_server.url, js, host, server, []).wait_run(run_id)
    log = await RunLog(js).read(run_id)
    assert log.actor == "calc" and kinds(log.events)[0] == "run.started" and kinds(log.events)[-1] == \
        "run.completed"
    assert log.stream_seqs == sorted(log.stream_seqs) and len(log.stream_seqs) == len(log.events)

    console = Console(record=True, width=200)
    console.print(timeline(log.events, title=f"run {run_id}"))
    text = console.export_text()
    for kind in ("run.started", "model.requested", "model.responded", "tool.called", "script.started",
                 "script.completed", "tool.completed", "turn.completed", "run.completed"):
        assert kind in text
    assert "calculator(" in text and "tok" in text and "completed · " in text
    s = summarize(log.events)
    assert (s.status, s.turns, s.model_calls, s.tool_calls) == ("completed", 3, 3, 3)
    assert s.prompt_tokens > 0 and s.completion_tokens > 0
    assert "chained 2" in describe(log.events[-1])

    config = load_bundle(bundle).kernel_config()
    report = verify(config, log.events)
    assert report.ok, report.problems
    assert report.checked >= 10 and report.final is not None and report.final.status == "completed"

    # a log the kernel would not have written: a tool call it never asked for
    i = next(i for i, e in enumerate(log.events) if isinstance(e, ev.ToolCalled))
    call = log.events[i].call
    bad = [*log.events[:i], msgspec.structs.replace(log.events[i], call=msgspec.structs.replace(
        call, id=call.id + "x")), *log.events[i + 1:]]
    bad_report = verify(config, bad)
    assert not bad_report.ok and "tool.called" in bad_report.problems[0]
    # a gap in the log
    gap = [e for e in log.events if e.seq != 3]
    assert any("gap" in p for p in verify(config, gap).problems)
    # a copy of a prefix is a new run: every id re-derived, and it folds to the work the source had pending
    runs = RunLog(js)
    await runs.copy_prefix(run_id, 4, "rfork")
    copy = await runs.read("rfork")
    assert [e.run_id for e in copy.events] == ["rfork"] * 4 and kinds(copy.events) == kinds(log.events[:4])
    assert [e.seq for e in copy.events] == [0, 1, 2, 3] and copy.actor == "calc"
    assert run_id not in "".join(ev.to_json(e) for e in copy.events)
    source_next, copy_next = (kernel.decide(kernel.fold(config, events)) for events in (log.events[:4],
                                                                                        copy.events))
    assert [type(d) for d in copy_next] == [type(d) for d in source_next] == [kernel.CallTools]
    assert [(c.id, c.name, c.arguments) for c in copy_next[0].calls] == [
        (kernel.rebase_id(c.id, run_id, "rfork"), c.name, c.arguments) for c in source_next[0].calls]
    with pytest.raises(Superseded):  # the new run exists now: a second copy cannot overwrite it
        await runs.copy_prefix(run_id, 4, "rfork")
    with pytest.raises(ValueError, match="prefix"):
        await runs.copy_prefix(run_id, len(log.events) + 1, "rfork2")


def test_events_appended_after_the_run_ended_say_so_in_the_timeline():
    """A cancelled run's stopped job reports its script run after `run.cancelled`: the timeline shows it
    where the log has it, marked as reported after the end (it explains, it changes nothing)."""
    from rich.console import Console

    run = "r-late"
    events = [ev.stamp(e, seq=i, ts=10.0 + i, actor="calc") for i, e in enumerate([
        ev.RunStarted(run_id=run, input="x"),
        ev.RunCancelled(run_id=run, reason="stop", by="op"),
        ev.ScriptStarted(run_id=run, call_id=f"{run}/1.0", tool="spin", worker="w1"),
    ])]
    console = Console(width=200, record=True)
    console.print(timeline(events))
    lines = console.export_text().splitlines()
    started = next(line for line in lines if "script.started" in line)
    cancelled = next(line for line in lines if "run.cancelled" in line)
    assert "reported after the run ended" in started and "reported after" not in cancelled
