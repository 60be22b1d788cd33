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


def test_the_demo_into_a_pipe_wraps_no_line():
    """`make demo > log` once wrapped at 80 columns, cutting `sa replay RUN` in two."""
    import os
    import subprocess
    import sys

    code = ("from rich.text import Text\n"
            "from runtime.demo import make_console, rule\n"
            "c = make_console()\n"
            "rule(c, 'the run, live')\n"
            "c.print(Text('completed in 9.9 s · ' + 'x' * 100 + '   (sa replay r0123456789abcdef)'))\n")
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rule_line, last = out.stdout.splitlines()
    assert last.endswith("(sa replay r0123456789abcdef)") and len(last) > 120
    assert len(rule_line) == 100 and "the run, live" in rule_line  # a rule stays a readable width
