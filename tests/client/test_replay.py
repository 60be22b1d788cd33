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


def test_a_forks_clock_starts_when_it_was_made_as_the_runs_index_counts_it():
    """A fork keeps its source's events (older timestamps) after its own first event: its wall time and its
    timeline count from the fork (the kept events show before it), not from when the source began."""
    from runtime.client.replay import summarize, timeline
    from runtime.ui.views import start_of

    kept = [ev.stamp(e, seq=i, ts=10.0 + i, actor="calc") for i, e in enumerate(
        [ev.ModelRequested(run_id="f1", request_id="f1/1", turn=1),
         ev.ModelResponded(run_id="f1", request_id="f1/1", turn=1, text="hi")], start=1)]
    forked = ev.stamp(ev.RunForked(run_id="f1", input="x", source_run="src", source_seq=3), seq=0, ts=100.0,
                      actor="calc")
    ended = ev.stamp(ev.RunCompleted(run_id="f1", output="hi"), seq=3, ts=104.5, actor="calc")
    events = [forked, *kept, ended]
    assert summarize(events).wall_s == 4.5  # was 94.5: from the source's first event
    assert start_of(events) == 100.0
    plain = [ev.stamp(ev.RunStarted(run_id="r", input="x"), seq=0, ts=50.0, actor="calc")]
    assert start_of(plain) == 50.0 and summarize(plain).wall_s == 0.0
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(timeline(events))
    rows = console.export_text()
    assert "-89000" in rows and "-88000" in rows  # the kept events, in ms before the fork
