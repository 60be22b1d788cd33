"""A call's script run reads the same from either shape of log: carried inside the call's outcome (what
hosts write now: `events.ScriptRun` on `tool.completed`/`tool.failed`) or as `script.*` entries of their own
(what older versions wrote, and durable logs keep). The kernel folds both to the same state, and the
replay, the inspector's rows and waterfall and the trace derived from the log show the same sandbox runs;
only the seqs differ, because a newer log has fewer entries (a carried event shows its outcome's seq)."""

from __future__ import annotations

import dataclasses
import io
from typing import Any

import msgspec
from rich.console import Console

from runtime import events as ev
from runtime import kernel as k
from runtime.client.describe import describe
from runtime.client.diff import diverge, render
from runtime.client.fork import fork_points
from runtime.client.replay import summarize, timeline
from runtime.jobs import ToolOutcome
from runtime.observe.traces import span_id_for, trace_of
from runtime.types import ScriptNote, ToolCall, ToolError, ToolResult, ToolSchema, Usage
from runtime.ui import views
from runtime.ui import waterfall as wf

RUN, T0 = "r-shapes", 1_700_000_000.0
BOOM = ToolError("execution", "ZeroDivisionError: division by zero", 2)
CALC = ToolSchema("calc", "the calc tool", {"type": "object", "properties": {"x": {"type": "integer"}}})
CONFIG = k.KernelConfig(system_prompt="You compute.", tools=(CALC,))
CALLS = (ToolCall(f"{RUN}/1.0", "calc", {"x": 1}), ToolCall(f"{RUN}/1.1", "calc", {"x": 0}))
# what the sandbox reported for each call: one run that prints and completes, one that prints and fails
NOTES = {
    CALLS[0].id: (ScriptNote(kind="started", ts=T0 + 1.30, worker_pid=41),
                  ScriptNote(kind="printed", ts=T0 + 1.35, text="thinking\n", stream="stdout"),
                  ScriptNote(kind="completed", ts=T0 + 1.50, duration_ms=180.0)),
    CALLS[1].id: (ScriptNote(kind="started", ts=T0 + 1.31, worker_pid=42),
                  ScriptNote(kind="printed", ts=T0 + 1.40, text="about to divide\n", stream="stdout"),
                  ScriptNote(kind="failed", ts=T0 + 1.60, duration_ms=250.0, error=BOOM)),
}
RESULTS = {CALLS[0].id: ToolResult(output=1, duration_ms=300.0), CALLS[1].id: ToolResult(error=BOOM,
                                                                                          duration_ms=400.0)}


def outcome(call: ToolCall, finished: float) -> ToolOutcome:
    return ToolOutcome(run_id=RUN, actor="calc", call_id=call.id, tool=call.name, result=RESULTS[call.id],
                       notes=NOTES[call.id], worker="w1", finished=finished)


def old_events(o: ToolOutcome) -> list[ev.Event]:
    """What a host of an older version appended for an outcome: a `script.*` event per note, then it."""
    notes = [ev.script_event(n, o.run_id, o.call_id, o.tool, worker=o.worker) for n in o.notes]
    result = ev.tool_outcome(o.run_id, o.call_id, o.tool, o.result)
    return [*notes, msgspec.structs.replace(result, ts=o.finished)]


def log(shape: str) -> list[ev.Event]:
    """One run with two parallel calls of a script tool, recorded the `old` or the `new` way."""
    timed: list[ev.Event] = [
        ev.RunStarted(run_id=RUN, input="go", ts=T0),
        ev.ModelRequested(run_id=RUN, request_id=f"{RUN}/1", turn=1, ts=T0 + 0.1),
        ev.ModelResponded(run_id=RUN, request_id=f"{RUN}/1", turn=1, calls=CALLS, usage=Usage(100, 20),
                          latency_ms=1000.0, ts=T0 + 1.1),
        ev.ToolCalled(run_id=RUN, call=CALLS[0], ts=T0 + 1.2),
        ev.ToolCalled(run_id=RUN, call=CALLS[1], ts=T0 + 1.2),
    ]
    for i, call in enumerate(CALLS):
        o = outcome(call, T0 + 1.7 + i / 10)
        timed += o.events() if shape == "new" else old_events(o)
    timed += [
        ev.TurnCompleted(run_id=RUN, turn=1, calls_ok=1, calls_failed=1, ts=T0 + 2.0),
        ev.ModelRequested(run_id=RUN, request_id=f"{RUN}/2", turn=2, ts=T0 + 2.1),
        ev.ModelResponded(run_id=RUN, request_id=f"{RUN}/2", turn=2, content="1", usage=Usage(150, 5),
                          latency_ms=500.0, ts=T0 + 2.6),
        ev.TurnCompleted(run_id=RUN, turn=2, ts=T0 + 2.7),
        ev.RunCompleted(run_id=RUN, output="1", ts=T0 + 2.8),
    ]
    return [ev.stamp(e, seq=i, actor="calc") for i, e in enumerate(timed)]


OLD, NEW = log("old"), log("new")


def test_a_new_log_has_two_entries_fewer_per_script_run_and_the_same_facts():
    printed = sum(1 for notes in NOTES.values() for n in notes if n.kind == "printed")
    assert len(OLD) - len(NEW) == 2 * len(CALLS) + printed  # started and ended, and every printed line
    assert not any(ev.kind_of(e).startswith("script.") for e in NEW)
    carried = [e for e in NEW if isinstance(e, ev.ToolCompleted | ev.ToolFailed)]
    assert all(e.script is not None and e.script.worker == "w1" for e in carried)
    # decoded from the wire, as a reader gets them
    assert [ev.decode(ev.encode(e)) for e in NEW] == NEW


def test_both_shapes_fold_to_the_same_state():
    for upto in range(1, len(NEW) + 1):  # at every point of the run, not only at its end
        new = k.fold(CONFIG, NEW[:upto])
        old = k.fold(CONFIG, OLD[:len(ev.expand_all(NEW[:upto]))])  # the same events, the old way
        assert dataclasses.replace(old, seq=0) == dataclasses.replace(new, seq=0), upto  # seq: entries
        assert k.decide(old) == k.decide(new)
    assert k.fold(CONFIG, NEW).status == "completed" and k.fold(CONFIG, NEW).output == "1"
    assert (k.fold(CONFIG, OLD).seq, k.fold(CONFIG, NEW).seq) == (len(OLD), len(NEW))


def _facts(events: list[ev.Event]) -> list[tuple[Any, ...]]:
    """What each event shows, whatever its seq."""
    return [(ev.kind_of(e), e.ts, describe(e), msgspec.structs.replace(e, seq=0)) for e in events]


def test_expanding_a_new_log_gives_the_old_logs_events_under_the_seqs_of_the_entries_that_hold_them():
    expanded = ev.expand_all(NEW)
    assert _facts(expanded) == _facts(OLD)
    assert ev.expand_all(OLD) == OLD  # an old log passes through unchanged
    # a virtual event carries the seq of its outcome's entry: seqs still count log entries only
    first_outcome = next(e for e in NEW if isinstance(e, ev.ToolCompleted))
    held = [e for e in expanded if e.seq == first_outcome.seq]
    assert [ev.kind_of(e) for e in held] == ["script.started", "script.printed", "script.completed",
                                             "tool.completed"]
    assert held[0] == ev.ScriptStarted(run_id=RUN, seq=first_outcome.seq, ts=T0 + 1.30, actor="calc",
                                       call_id=CALLS[0].id, tool="calc", worker="w1")
    assert held[1].text == "thinking\n" and held[2].duration_ms == 180.0
    failed = [e for e in expanded if isinstance(e, ev.ScriptFailed)]
    assert [(e.error, e.duration_ms, e.ts) for e in failed] == [(BOOM, 250.0, T0 + 1.60)]
    assert sorted({e.seq for e in expanded}) == [e.seq for e in NEW]


def _rows(events: list[ev.Event]) -> list[list[str]]:
    """The replay's rows without the seq column."""
    console = Console(width=240, record=True, color_system=None)
    console.print(timeline(events))
    lines = [line for line in console.export_text().splitlines() if line.count("│") >= 3]
    return [[cell.strip() for cell in line.split("│")[2:]] for line in lines]


def test_the_replay_shows_the_same_rows_from_both_shapes():
    old, new = _rows(OLD), _rows(NEW)
    assert old == new and len(old) == len(OLD)  # a row per event
    shown = [row[1] for row in new]
    assert shown.count("script.started") == 2 and "script.failed" in shown and "script.printed" in shown
    assert any("calc on w1" in row[2] for row in new) and any("thinking" in row[2] for row in new)
    # the totals count log entries
    assert summarize(NEW).events == len(NEW) and summarize(OLD).events == len(OLD)


def _view_facts(events: list[ev.Event]) -> list[dict[str, Any]]:
    rows = views.run_view(RUN, "calc", events)["events"]
    drop = ("seq", "key", "virtual")
    return [{**{k: v for k, v in row.items() if k not in drop}, "data": {**row["data"], "seq": 0}}
            for row in rows]


def test_the_inspector_shows_the_same_rows_from_both_shapes_each_with_its_own_key():
    assert _view_facts(OLD) == _view_facts(NEW)
    rows = views.run_view(RUN, "calc", NEW)["events"]
    keys = [row["key"] for row in rows]
    assert len(set(keys)) == len(keys)  # the page tells every row apart
    outcome_seq = next(e.seq for e in NEW if isinstance(e, ev.ToolCompleted))
    held = [row for row in rows if row["seq"] == outcome_seq]
    assert [(row["key"], row["virtual"], row["kind"]) for row in held] == [
        (f"{outcome_seq}.0", True, "script.started"), (f"{outcome_seq}.1", True, "script.printed"),
        (f"{outcome_seq}.2", True, "script.completed"), (str(outcome_seq), False, "tool.completed")]
    assert held[-1]["data"]["script"] is None  # shown once: as its rows
    old_rows = views.run_view(RUN, "calc", OLD)["events"]
    assert [row["key"] for row in old_rows] == [str(e.seq) for e in OLD]
    assert not any(row["virtual"] for row in old_rows)
    # the runs index finds the script's error in either shape
    assert views.digest(RUN, NEW).errors == views.digest(RUN, OLD).errors == ["execution"]


def test_fork_points_count_log_entries_and_never_split_a_report():
    """In an old log a fork may not land between a call's `script.*` entries and its outcome (it would
    record a script that ran and run it again); in a new one the report is one entry, so every seq up to
    the ending is a point, and each names the same place in the run as its old counterpart."""
    old, new = fork_points(OLD), fork_points(NEW)
    assert new == list(range(1, len(NEW) - 1 + 1))
    script = ev.ScriptStarted | ev.ScriptPrinted | ev.ScriptCompleted | ev.ScriptFailed
    inside = [e.seq + 1 for e in OLD if isinstance(e, script)]
    assert len(inside) == len(OLD) - len(NEW) and not set(inside) & set(old)
    assert len(old) == len(new)  # the same places, numbered by entries


def _span_facts(events: list[ev.Event]) -> list[tuple[Any, ...]]:
    spans = trace_of(events)
    names = {s.span_id: s.name for s in spans}
    return sorted((s.name, names.get(s.parent_id or 0), s.start, s.end, s.error, s.kind, s.attributes)
                  for s in spans)


def test_the_trace_has_the_same_script_spans_from_both_shapes():
    assert _span_facts(OLD) == _span_facts(NEW)
    scripts = [s for s in trace_of(NEW) if s.name == "script calc"]
    assert len(scripts) == 2
    ok, failed = sorted(scripts, key=lambda s: s.start)
    assert ok.attributes["sa.worker"] == "w1" and ok.attributes["sa.sandbox_ms"] == 180.0 and ok.error is None
    assert (ok.start, ok.end) == (T0 + 1.30, T0 + 1.50)  # the sandbox's own times
    assert failed.error == BOOM.message and failed.attributes["error.type"] == "execution"
    # a carried script run starts at its outcome's seq, and its id names the role, apart from the tool's
    outcome_seq = next(e.seq for e in NEW if isinstance(e, ev.ToolCompleted))
    assert ok.start_seq == outcome_seq and ok.span_id == span_id_for(RUN, outcome_seq, "script")
    old_start = next(e.seq for e in OLD if isinstance(e, ev.ScriptStarted))
    old_ok = next(s for s in trace_of(OLD) if s.name == "script calc" and s.start_seq == old_start)
    assert old_ok.span_id == span_id_for(RUN, old_start)  # an old log's spans keep their ids


def test_the_waterfall_draws_the_same_bars_from_both_shapes():
    def bars(events: list[ev.Event]) -> list[tuple[Any, ...]]:
        view = wf.waterfall(events)
        return [(s["kind"], s["depth"], s["name"], s["start_ms"], s["end_ms"], s["error"], s["attributes"])
                for s in view["spans"]]

    assert bars(OLD) == bars(NEW)
    assert [b[0] for b in bars(NEW)].count("script") == 2
    assert wf.waterfall(OLD)["breakdown"] == wf.waterfall(NEW)["breakdown"]


def test_a_diff_compares_what_a_carried_script_run_records_not_when_or_where_it_ran():
    def retimed(e: ev.Event) -> ev.Event:
        if isinstance(e, ev.ToolCompleted | ev.ToolFailed) and e.script is not None:
            lines = tuple(ev.PrintedLine(line.ts + 9, line.text) for line in e.script.printed)
            return msgspec.structs.replace(e, script=msgspec.structs.replace(
                e.script, started=e.script.started + 9, worker="w2", printed=lines, duration_ms=1.0))
        return e

    assert diverge(RUN, NEW, RUN, [retimed(e) for e in NEW]).identical  # another worker, another time
    first = next(e for e in NEW if isinstance(e, ev.ToolCompleted))
    assert first.script is not None
    said = msgspec.structs.replace(first.script, printed=(ev.PrintedLine(0.0, "something else\n"),))
    other = [msgspec.structs.replace(e, script=said) if e is first else e for e in NEW]
    assert diverge(RUN, NEW, RUN, other).common == first.seq  # it printed otherwise: a different fact


def test_runs_driven_by_other_hosts_are_the_same_behaviour_whatever_fenced_them():
    """A fence (`run.taken`) says which host drove a run from there on, not what it did: a run taken over
    twice and a run driven by one host are the same, and a change after a fence is found where it is."""
    taken = [*NEW[:3], ev.RunTaken(run_id=RUN, seq=3, host="h2", lease=7), *NEW[3:6],
             ev.RunTaken(run_id=RUN, seq=7, host="h1", lease=9), *NEW[6:]]
    assert diverge(RUN, NEW, RUN, taken).identical and diverge(RUN, taken, RUN, NEW).identical
    changed = [msgspec.structs.replace(e, output="2") if isinstance(e, ev.RunCompleted) else e for e in taken]
    assert not diverge(RUN, NEW, RUN, changed).identical


def test_an_old_shape_log_and_a_new_one_diverge_where_their_facts_do_not_at_the_first_script_run():
    d = diverge(RUN, OLD, RUN, NEW)
    assert d.identical and (d.common, d.b_common) == (len(OLD), len(NEW))  # the same facts, fewer entries
    first = next(e for e in NEW if isinstance(e, ev.ToolCompleted))
    assert first.script is not None
    said = msgspec.structs.replace(first.script, printed=(ev.PrintedLine(0.0, "something else\n"),))
    other = [msgspec.structs.replace(e, script=said) if e is first else e for e in NEW]
    d = diverge(RUN, OLD, RUN, other)
    printed = next(e for e in OLD if isinstance(e, ev.ScriptPrinted))  # the old log's entry that differs
    assert (d.common, d.b_common) == (printed.seq, first.seq) and d.common > d.b_common
    assert d.a_rest[0] is printed and d.b_rest[0] is other[first.seq]
    assert [e.seq for e in d.b_rest] == list(range(first.seq, len(NEW)))
    shown = render_text(render(d))
    assert f"diverge at seq {printed.seq} and seq {first.seq}" in shown and "different shapes" in shown
    rows = [line for line in shown.splitlines() if "script.printed" in line]
    assert "calc: thinking" in rows[0] and "calc: something else" in rows[0]  # what differs, side by side
    assert render_text(render(diverge(RUN, OLD, RUN, NEW))).startswith(
        f"runs {RUN} and {RUN} record the same facts ({len(OLD)} and {len(NEW)} entries")


def render_text(renderable: Any) -> str:
    console = Console(width=240, record=True, file=io.StringIO())
    console.print(renderable)
    return console.export_text()


def test_a_diff_lines_up_an_edited_result_with_the_outcome_it_replaced_not_with_its_script_rows():
    first = next(e for e in NEW if isinstance(e, ev.ToolCompleted))
    edited = [msgspec.structs.replace(e, script=None, output="41") if e is first else e for e in NEW]
    d = diverge(RUN, NEW, RUN, edited)  # as a fork with `--output` records it: no script ran
    assert (d.common, d.b_common) == (first.seq, first.seq)
    rows = [line for line in render_text(render(d)).splitlines() if "│" in line]
    kinds_by_row = [[cell.strip() for cell in row.split("│")[1:-1]] for row in rows]
    a_kinds = [r[1] for r in kinds_by_row]
    b_kinds = [r[4] for r in kinds_by_row]
    assert a_kinds[:3] == ["script.started", "script.printed", "script.completed"]
    assert b_kinds[:3] == ["", "", ""]  # no script ran for the edited result
    assert a_kinds[3] == b_kinds[3] == "tool.completed"  # the two outcomes on one row
    assert "41" in kinds_by_row[3][5] and a_kinds[4:] == b_kinds[4:]
