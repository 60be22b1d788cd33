"""What `sa` prints of a run: data is shown as written, never read as rich markup, whatever it holds.

A task, a model's reply, a task id or a thread name with square brackets (`again [/oops]`, `[/INST]`,
`[run:x1]`) once made `sa send -f`, `sa replay` and `sa replay --verify` exit 1 with a rich MarkupError
after the run had completed, and made `[run:x1]` vanish from tables. Here they go through the real
commands against a real fleet, and through every renderer the client has."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from control_helpers import sa
from host_helpers import running_host, running_worker, write_bundle
from rich.console import Console

from runtime import events as ev
from runtime import nats as bus
from runtime.nats.kv import runs_kv
from runtime.nats.records import RunIndex
from runtime.testing import ScriptedModelServer, hermes_call
from testbed.fleet import CLI

pytestmark = pytest.mark.anyio

REPLY = "[/INST] the answer is [run:x1] [bold]"


def bracket_model(body: dict[str, Any]) -> str:
    """`say: ...` gets a reply full of brackets, in text and in the submitted answer (the bundle's runs end
    through its terminal tool); any other task is submitted as its answer."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if task.startswith("say:"):
        return REPLY + "\n" + hermes_call("submit", {"answer": REPLY})
    return hermes_call("submit", {"answer": f"echo {task}"})


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=4, tool_ack_wait=2.0)
    return js


async def test_square_brackets_in_tasks_replies_ids_and_threads_are_printed_as_written(nats_server, topo,
                                                                                      tmp_path: Path):
    url = nats_server.url
    bundle = write_bundle(tmp_path, "calc", tools=())
    with ScriptedModelServer(responder=bracket_model) as model:
        async with running_host(url, [bundle], model), running_worker(url, [bundle]):
            sent = await sa(url, "send", "calc", "again [/oops]", "--follow", "--task-id", "[run:x1]",
                            "--thread", "t[/x]")
            said = await sa(url, "send", "calc", "say: go", "--follow")
            run_id = sent.out.split()[1]
            replayed = await sa(url, "replay", run_id)
            verified = await sa(url, "replay", sent.out.split()[1], "--verify")
            reply_replayed = await sa(url, "replay", said.out.split()[1])
            listed = await sa(url, "runs")
            threads = await sa(url, "threads", "calc")
            thread = await sa(url, "threads", "calc", "t[/x]")

    for result in (sent, said, replayed, verified, reply_replayed, listed, threads, thread):
        assert result.code == 0, (result.out, result.err)
        assert "MarkupError" not in result.err and "Traceback" not in result.err, result.err
    assert "again [/oops]" in sent.out and "echo again [/oops]" in sent.out and "completed" in sent.out
    assert REPLY in said.out  # the streamed reply, and the recorded one
    assert "again [/oops]" in replayed.out and "verified: the kernel reproduces all" in verified.out
    assert "[/INST] the answer is [run:x1]" in reply_replayed.out
    assert "[run:x1]" in listed.out and run_id in listed.out  # the task id, in the runs table
    assert "t[/x]" in threads.out and "again [/oops]" in thread.out and "t[/x]" in thread.out


def test_every_renderer_shows_data_with_brackets_verbatim():
    from runtime.client.diff import diverge, render
    from runtime.client.replay import event_line, timeline
    from runtime.client.status import render as render_status

    started = ev.RunStarted(run_id="r1", seq=0, ts=1.0, actor="calc", input="again [/oops] [bold]x")
    replied = ev.ModelResponded(run_id="r1", seq=1, ts=2.0, actor="calc", request_id="r1/1", turn=1,
                                text="[/INST]", content="[/INST] [run:x1]")
    other = ev.ModelResponded(run_id="r2", seq=1, ts=2.0, actor="calc", request_id="r2/1", turn=1,
                              content="[/red] elsewhere")
    status = {"partitions_total": 1, "replicas": 1, "runs_in_flight": 0, "unserved_partitions": 0,
              "queues": {k: 0 for k in ("dlq", "tasks_pending", "tasks_held", "tool_jobs_pending",
                                        "tool_jobs_held", "results_pending", "results_held")},
              "hosts": [{"id": "h[/x]:1", "partitions": [0], "runs": 0, "queued": 0, "max_runs": 1,
                         "agents": ["[run:x1]"], "up_s": 1.0, "beat_age_s": 0.1}],
              "partitions": [{"partition": 0, "host": "h[/x]:1", "runs_in_flight": 0, "tasks_pending": 0,
                              "tasks_held": 0, "results_pending": 0, "results_held": 0}],
              "workers": [{"name": "w[/y]", "concurrency": 1, "running": 0, "completed": 0, "failed": 0,
                           "up_s": 1.0, "beat_age_s": 0.1}]}
    shown = io.StringIO()
    console = Console(file=shown, width=300)
    console.print(timeline([started, replied], title="run r1 [/t]"))
    console.print(event_line(replied))
    console.print(render(diverge("r1", [started, replied], "r2", [started, other])))
    console.print(render_status(status))
    text = shown.getvalue()
    for data in ("again [/oops] [bold]x", "[/INST] [run:x1]", "run r1 [/t]", "[/red] elsewhere", "h[/x]:1",
                 "[run:x1]", "w[/y]"):
        assert data in text, (data, text)


async def test_piped_runs_print_every_id_whole_one_run_per_line(nats_server, topo):
    """`sa runs | grep` once got run ids and task ids cut to fit 80 columns with an ellipsis."""
    kv = await runs_kv(topo)
    runs = {f"r{i:016x}": (f"task-{i}-" + "x" * 40, "calc:" + "instance" * 4) for i in range(3)}
    for i, (run_id, (task_id, actor)) in enumerate(runs.items()):
        await kv.put(run_id, RunIndex(status="completed", actor=actor, partition=0, last_seq=700 + i,
                                      seq=6, updated=1000.0 + i, task_id=task_id).encode())
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["NATS_URL"] = nats_server.url
    piped = await anyio.run_process([*CLI, "runs"], env=env, check=False)  # stdout is a pipe
    lines = piped.stdout.decode().splitlines()
    assert piped.returncode == 0, piped.stderr.decode()
    assert lines[0].split("\t") == ["run", "agent", "status", "updated", "task id", "last seq"]
    rows = [line.split("\t") for line in lines[1:]]
    assert [(r[0], r[4], r[1]) for r in rows] == [(run_id, task_id, actor) for run_id, (task_id, actor)
                                                  in reversed(runs.items())]  # newest first, all whole
    # `last seq` is the run's seq, the one `sa replay` shows and `sa fork --at` takes, not the stream's
    assert all(r[2] == "completed" and r[5] == "6" for r in rows)


# an OSC that retitles the terminal, an SGR that recolours it, a C1 CSI that clears it (8-bit terminals)
ESCAPES = "title \x1b]0;pwned\x07 red \x1b[31m csi \x9b2J end"
ESCAPED = "title \\x1b]0;pwned\\x07 red \\x1b[31m csi \\x9b2J end"
RAW = ("\x1b", "\x07", "\x9b")


def _clean(text: str) -> None:
    assert not any(c in text for c in RAW), repr(text)


async def test_escape_sequences_in_a_run_reach_no_terminal(nats_server, topo, tmp_path: Path):
    """A publisher's task with terminal escapes once retitled and recoloured the operator's terminal through
    `sa replay` and `sa send -f`: every human view shows them escaped; --json keeps them, JSON-escaped."""
    import json

    url = nats_server.url
    bundle = write_bundle(tmp_path, "calc", tools=())
    with ScriptedModelServer(responder=bracket_model) as model:
        async with running_host(url, [bundle], model), running_worker(url, [bundle]):
            sent = await sa(url, "send", "calc", ESCAPES, "--follow")
            run_id = sent.out.split()[1]
            replayed = await sa(url, "replay", run_id)
            as_json = await sa(url, "replay", run_id, "--json")
    for result in (sent, replayed):
        assert result.code == 0, (result.out, result.err)
        _clean(result.out)
        assert ESCAPED in result.out and "echo title " in result.out, result.out  # the task, its answer
    assert "\x1b" not in as_json.out and "\x07" not in as_json.out  # JSON escapes C0 controls itself
    assert json.loads(as_json.out.splitlines()[0])["input"] == ESCAPES


def test_every_renderer_escapes_control_characters():
    from runtime.client.diff import diverge, render
    from runtime.client.replay import _Live, event_line, timeline
    from runtime.client.status import render as render_status
    from runtime.client.terminal import printable, shown
    from runtime.streaming import Delta

    assert printable("a\nb\tc\rd\x00e\x7f") == "a\nb\tc\\x0dd\\x00e\\x7f"  # lines and tabs stay
    started = ev.RunStarted(run_id="r1", seq=0, ts=1.0, actor="calc", input=ESCAPES)
    replied = ev.ModelResponded(run_id="r1", seq=1, ts=2.0, actor="calc", request_id="r1/1", turn=1,
                                content=ESCAPES)
    other = ev.ModelResponded(run_id="r2", seq=1, ts=2.0, actor="calc", request_id="r2/1", turn=1,
                              content="elsewhere " + ESCAPES)
    status = {"partitions_total": 1, "replicas": 1, "runs_in_flight": 0, "unserved_partitions": 0,
              "queues": {k: 0 for k in ("dlq", "tasks_pending", "tasks_held", "tool_jobs_pending",
                                        "tool_jobs_held", "results_pending", "results_held")},
              "hosts": [{"id": "h\x1b[2J", "partitions": [0], "runs": 0, "queued": 0, "max_runs": 1,
                         "agents": ["calc"], "up_s": 1.0, "beat_age_s": 0.1}],
              "partitions": [{"partition": 0, "host": "h\x1b[2J", "runs_in_flight": 0, "tasks_pending": 0,
                              "tasks_held": 0, "results_pending": 0, "results_held": 0}],
              "workers": []}
    shown_out = io.StringIO()
    console = Console(file=shown_out, width=300)
    console.print(timeline([started, replied], title="run r1"))
    console.print(event_line(replied))
    console.print(render(diverge("r1", [started, replied], "r2", [started, other])))
    console.print(render_status(status))
    console.print(shown(ESCAPES))  # what every CLI table's cells are (runs, threads, questions, approvals)
    live = _Live(console)  # the model's tokens as `sa send -f` streams them
    live.show(Delta(run_id="r1", request_id="r1/1", turn=1, n=0, text=ESCAPES))
    live.end_line()
    text = shown_out.getvalue()
    _clean(text)
    assert text.count(ESCAPED) >= 6 and "h\\x1b[2J" in text, text
