"""`make demo` claims success only for a completed run with the right answer (the verdict, without NATS)."""

from __future__ import annotations

from runtime import events as ev
from runtime.demo import EXPECTED, _problems

IDS = {"run_id": "r1", "seq": 9, "ts": 1.0, "actor": "demo"}


def test_only_a_completed_run_with_the_expected_answer_passes():
    done = ev.RunCompleted(**IDS, output={"answer": f"It is {EXPECTED}."})
    assert _problems(done, ["ran"], True, EXPECTED) == []
    failed = ev.RunFailed(**IDS, reason="max_turns", detail="no result after 3 turns")
    assert _problems(failed, ["ran"], True, EXPECTED) == [
        "the run ended as run.failed (max_turns: no result after 3 turns), not run.completed"]
    wrong = ev.RunCompleted(**IDS, output={"answer": "17 * 23 + 4"})
    assert _problems(wrong, ["ran"], True, EXPECTED) == [
        f"the answer '17 * 23 + 4' does not contain {EXPECTED}"]
    assert _problems(None, [], True, None) == ["the run did not end (no terminal event arrived)"]
    assert len(_problems(done, [], False, None)) == 2  # nothing ran in the sandbox; the log does not verify
