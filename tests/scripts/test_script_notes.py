"""One record of a script's lifecycle: the sandbox emits `ScriptNote`s, a worker ships them unchanged in its
`ToolOutcome`, the host records them inside the call's outcome event (`events.outcome_events`: one append,
not one per note), and `events.expand` gives them back as the `script.*` events `events.script_event`
makes of each note."""

import msgspec
import pytest

from runtime import events as ev
from runtime.jobs import ToolJob, ToolOutcome
from runtime.scripts import ScriptNote, loads
from runtime.types import ToolError, ToolResult

BOOM = ToolError("execution", "ZeroDivisionError: division by zero", 2)


def test_each_note_kind_becomes_its_event_with_its_fields():
    cases = [
        (ScriptNote(kind="started", ts=1.0, worker_pid=42), ev.ScriptStarted, {"worker": "42"}),
        (ScriptNote(kind="printed", ts=2.0, text="hi", stream="stdout"), ev.ScriptPrinted, {"text": "hi"}),
        (ScriptNote(kind="completed", ts=3.0, duration_ms=1.5), ev.ScriptCompleted, {"duration_ms": 1.5}),
        (ScriptNote(kind="failed", ts=4.0, duration_ms=2.5, error=BOOM), ev.ScriptFailed,
         {"error": BOOM, "duration_ms": 2.5}),
    ]
    for note, cls, fields in cases:
        ids = {"run_id": "r1", "call_id": "r1/0.0", "tool": "calc", "ts": note.ts}
        assert ev.script_event(note, "r1", "r1/0.0", "calc") == cls(**ids, **fields)  # unstamped
    named = ev.script_event(cases[0][0], "r1", "r1/0.0", "calc", worker="host-1:77")
    assert isinstance(named, ev.ScriptStarted) and named.worker == "host-1:77"  # a tool worker names itself


JOB = ToolJob(run_id="r1", actor="a", call_id="r1/0.0", tool="calc")


def test_an_outcome_is_one_event_carrying_its_script_run():
    notes = (ScriptNote(kind="started", ts=1.0, worker_pid=9), ScriptNote(kind="printed", ts=2.0, text="a\n"),
             ScriptNote(kind="printed", ts=2.5, text="b\n"),
             ScriptNote(kind="completed", ts=3.0, duration_ms=1.25, output_bytes=1))
    outcome = ToolOutcome.for_job(JOB, ToolResult(output=7, duration_ms=2.0), notes=notes, worker="w1",
                                  finished=4.0)
    [got] = ToolOutcome.decode(outcome.encode()).events()
    assert got == ev.ToolCompleted(run_id="r1", ts=4.0, call_id="r1/0.0", tool="calc", output=7,
                                   duration_ms=2.0, script=ev.ScriptRun(
                                       started=1.0, worker="w1", ended=3.0, duration_ms=1.25,
                                       printed=(ev.PrintedLine(2.0, "a\n"), ev.PrintedLine(2.5, "b\n"))))
    assert ev.decode(ev.encode(got)) == got  # and so it is stored


def test_a_redelivered_outcome_is_its_redelivery_then_its_one_outcome_event():
    notes = (ScriptNote(kind="started", ts=5.0), ScriptNote(kind="completed", ts=6.0, duration_ms=0.5))
    outcome = ToolOutcome.for_job(JOB, ToolResult(output=1), notes=notes, worker="w2", attempt=2,
                                  earlier=("w1 stopped heartbeating",), started=4.5, finished=6.5)
    got = outcome.events()
    assert [ev.kind_of(e) for e in got] == ["tool.redelivered", "tool.completed"]
    assert got[0] == ev.ToolRedelivered(run_id="r1", ts=4.5, call_id="r1/0.0", tool="calc", attempt=2,
                                        worker="w2", earlier=("w1 stopped heartbeating",))
    assert isinstance(got[1], ev.ToolCompleted) and got[1].script == ev.ScriptRun(
        started=5.0, worker="w2", ended=6.0, duration_ms=0.5)


def test_a_failed_scripts_outcome_carries_its_run_its_error_and_what_it_printed():
    notes = (ScriptNote(kind="started", ts=1.0, worker_pid=9), ScriptNote(kind="printed", ts=2.0, text="x"),
             ScriptNote(kind="failed", ts=3.0, duration_ms=2.0, error=BOOM))
    outcome = ToolOutcome.for_job(JOB, ToolResult(error=BOOM), notes=notes, worker="w1", finished=4.0)
    decoded = ToolOutcome.decode(outcome.encode())
    assert decoded.notes == notes  # on the wire exactly as the sandbox made them
    [got] = decoded.events()
    assert isinstance(got, ev.ToolFailed) and got.error == BOOM and got.ts == 4.0 and got.seq == ev.UNSTAMPED
    assert got.script == ev.ScriptRun(started=1.0, worker="w1", printed=(ev.PrintedLine(2.0, "x"),),
                                      ended=3.0, duration_ms=2.0, failed=True)  # its error: the outcome's
    # read back, they are exactly the events the one note -> event mapping makes, then the outcome
    expanded = ev.expand(got)
    assert expanded[:3] == [ev.script_event(note, "r1", "r1/0.0", "calc", worker="w1") for note in notes]
    assert expanded[3] == msgspec.structs.replace(got, script=None)


def test_a_script_that_completed_under_a_failed_call_keeps_its_own_ending():
    """The script ran; its writes could not be persisted: `script.completed`, then `tool.failed`."""
    notes = (ScriptNote(kind="started", ts=1.0), ScriptNote(kind="completed", ts=2.0, duration_ms=1.0))
    failed = ToolResult(error=ToolError("output", "a write is malformed"))
    [got] = ToolOutcome.for_job(JOB, failed, notes=notes, worker="w1", finished=3.0).events()
    assert [ev.kind_of(e) for e in ev.expand(got)] == ["script.started", "script.completed", "tool.failed"]
    # a script error other than the call's is stored with the run
    other = (notes[0], ScriptNote(kind="failed", ts=2.0, error=BOOM))
    [got] = ToolOutcome.for_job(JOB, failed, notes=other, finished=3.0).events()
    assert got.script is not None and got.script.error == BOOM
    assert ev.expand(got)[1] == ev.ScriptFailed(run_id="r1", ts=2.0, call_id="r1/0.0", tool="calc",
                                                error=BOOM)


def test_notes_that_are_not_one_runs_shape_are_kept_as_separate_events():
    """Nothing a worker reported is dropped: notes this runtime's sandbox never makes (no `started` first,
    two endings) are recorded as older versions recorded every run."""
    for notes in [(ScriptNote(kind="printed", ts=1.0, text="early"), ScriptNote(kind="started", ts=2.0)),
                  (ScriptNote(kind="started", ts=1.0), ScriptNote(kind="completed", ts=2.0),
                   ScriptNote(kind="failed", ts=3.0, error=BOOM))]:
        got = ToolOutcome.for_job(JOB, ToolResult(output=1), notes=notes, worker="w1", finished=4.0).events()
        assert got[:-1] == [ev.script_event(n, "r1", "r1/0.0", "calc", worker="w1") for n in notes]
        assert isinstance(got[-1], ev.ToolCompleted) and got[-1].script is None
    [bare] = ToolOutcome.for_job(JOB, ToolResult(output=1), finished=4.0).events()  # a tool that is no script
    assert isinstance(bare, ev.ToolCompleted) and bare.script is None and ev.expand(bare) == [bare]


def test_a_version_1_job_still_in_the_stream_is_read_with_its_actor():
    old_job = msgspec.msgpack.encode({"run_id": "r1", "agent": "calc:alice", "call_id": "r1/1.0",
                                      "tool": "calc", "arguments": {"x": 1}, "v": 1})
    job = ToolJob.decode(old_job)
    assert job.actor == "calc:alice" and job.arguments == {"x": 1}
    again = ToolJob.decode(job.encode())
    assert again.v == 2 and again.actor == "calc:alice" and b"agent" not in job.encode()


def test_notes_written_by_an_older_worker_still_decode_and_new_ones_decode_for_old_readers():
    old_outcome = msgspec.msgpack.encode({
        "run_id": "r1", "agent": "a", "call_id": "r1/0.0", "tool": "calc", "result": {"output": 3},
        "notes": [{"kind": "started", "ts": 1.0}, {"kind": "printed", "ts": 2.0, "text": "hi"},
                  {"kind": "completed", "ts": 3.0, "duration_ms": 0.5}],
        "worker": "w0", "v": 1,
    })
    outcome = ToolOutcome.decode(old_outcome)
    assert outcome.actor == "a" and outcome.subject == "results.0.a.r1"  # version 1 said `agent`
    assert [n.kind for n in outcome.notes] == ["started", "printed", "completed"]
    assert [ev.kind_of(e) for e in outcome.events()] == ["tool.completed"]
    assert [ev.kind_of(e) for e in ev.expand_all(outcome.events())] == [
        "script.started", "script.printed", "script.completed", "tool.completed"]

    class OlderNote(msgspec.Struct, frozen=True, omit_defaults=True):  # what an older host decodes into
        kind: str
        ts: float
        text: str = ""
        duration_ms: float = 0.0
        error: ToolError | None = None

    new = ScriptNote(kind="printed", ts=2.0, text="hi", stream="stdout", script="calc", call_id="r1/0.0")
    as_old = msgspec.msgpack.decode(msgspec.msgpack.encode(new), type=OlderNote)
    assert as_old == OlderNote("printed", 2.0, "hi")


@pytest.mark.anyio
async def test_a_real_runs_notes_become_script_events_in_order():
    notes: list[ScriptNote] = []
    result = await loads('print("one")\nprint("two")\n7\n', name="calc").run(on_event=notes.append)
    assert result.output == 7
    kinds = [ev.kind_of(ev.script_event(n, "r1", "r1/0.0", "calc")) for n in notes]
    assert kinds[0] == "script.started" and kinds[-1] == "script.completed"
    assert set(kinds[1:-1]) == {"script.printed"}
    assert "".join(n.text for n in notes if n.kind == "printed") == "one\ntwo\n"  # in the order printed
