"""One record of a script's lifecycle: the sandbox emits `ScriptNote`s, a worker ships them unchanged in its
`ToolOutcome`, and one function (`events.script_event`) turns each into its `script.*` event."""

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


def test_an_outcome_records_its_notes_through_the_same_mapping():
    job = ToolJob(run_id="r1", actor="a", call_id="r1/0.0", tool="calc")
    notes = (ScriptNote(kind="started", ts=1.0, worker_pid=9), ScriptNote(kind="printed", ts=2.0, text="x"),
             ScriptNote(kind="failed", ts=3.0, error=BOOM))
    outcome = ToolOutcome.for_job(job, ToolResult(error=BOOM), notes=notes, worker="w1", finished=4.0)
    decoded = ToolOutcome.decode(outcome.encode())
    assert decoded.notes == notes  # on the wire exactly as the sandbox made them
    got = decoded.events()
    assert got[:3] == [ev.script_event(note, "r1", "r1/0.0", "calc", worker="w1") for note in notes]
    assert isinstance(got[3], ev.ToolFailed) and got[3].ts == 4.0 and got[3].seq == ev.UNSTAMPED


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
    assert [ev.kind_of(e) for e in outcome.events()] == [
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
