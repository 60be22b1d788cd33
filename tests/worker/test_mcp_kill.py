"""Redelivery honesty with a real `kill -9`: `sa worker` processes (real ones, started as an operator would)
calling a real MCP server over stdio, an in-process host and the scripted model, on a real nats-server.

The worker is killed (SIGKILL) while it holds five calls in the middle (the counting server's `slow_*` tools
hold a call while a file exists; the server records each call on its own side first). A second worker
gets the redelivered jobs. What each does follows from the tool and the bundle's `in_doubt:` policy
(`runtime.worker.mcp_clients.in_doubt`):

* a read-only tool (`slow_peek`, `readOnlyHint`) is called again, and its run completes;
* `slow_bump` (no hints) under the default `in_doubt: fail` is not called again: the call fails `in_doubt`
  and the model reads that it may or may not have happened;
* under `in_doubt: ask` the run asks a person (`question.asked`, answered with `sa answer`): `recall` calls
  it again, `failed` fails it `in_doubt` without calling;
* under `in_doubt: recall` it is called again.

The server's own count says how many times each call really happened: never twice unless the tool or the
bundle said it may be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from control_helpers import sa
from host_helpers import SUBMIT, running_host
from mcp_helpers import PYTHON, calls, counter_server

from runtime import events as ev
from runtime import nats as bus
from runtime.client.verify import verify
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.testing import ScriptedModelServer, hermes_call, last_message

pytestmark = pytest.mark.anyio

SERVERS = {"once": "fail", "asking": "ask", "recalling": "recall"}  # server name -> its in_doubt policy


def bundle(root: Path) -> tuple[Path, dict[str, Path], Path]:
    """The bundle (one counting server per policy, each with a count file of its own), and the hold file."""
    script, _ = counter_server(root)
    hold = root / "hold"
    counts = {name: root / f"{name}.txt" for name in SERVERS}
    folder = root / "slow"
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    servers = "".join(
        f"  {name}:\n    command: {PYTHON}\n    args: [{script}]\n"
        f"    env: {{COUNT_FILE: '{counts[name]}', HOLD_FILE: '{hold}'}}\n"
        f"    allow: [slow_bump, slow_peek]\n    in_doubt: {policy}\n"
        for name, policy in SERVERS.items())
    path = folder / "bundle.yaml"
    path.write_text("name: slow\nsystem_prompt: You use tools.\n"
                    "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
                    "tools: [tools/submit.pym]\ntermination: {terminal_tool: submit, max_turns: 4}\n"
                    f"mcp:\n{servers}")
    return path, counts, hold


def responder(body: dict[str, Any]) -> str:
    """`tool ARGS-JSON` calls that tool; what came back is submitted."""
    last = last_message(body)
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-300:]})
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    tool, _, arguments = task.partition(" ")
    return hermes_call(tool, json.loads(arguments))


def start_worker(url: str, path: Path, log: Path) -> subprocess.Popen[bytes]:
    """`sa worker --bundle PATH` as its own process (`serving` waits until it says it serves)."""
    cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker", "--bundle", str(path),
           "--ack-wait", "1"]
    return subprocess.Popen(cmd, env={**os.environ, "NATS_URL": url}, stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"))


async def serving(proc: subprocess.Popen[bytes], log: Path) -> None:
    with anyio.fail_after(60):
        while b"serving" not in log.read_bytes():
            assert proc.poll() is None, log.read_text()
            await anyio.sleep(0.05)


async def wait_for(predicate: Any, what: str, timeout: float = 30.0) -> None:
    with anyio.fail_after(timeout):
        while not predicate():
            await anyio.sleep(0.05)
    assert predicate(), what


async def events_until(js: Any, run_id: str, done: Any, timeout: float = 60.0) -> list[ev.Event]:
    """The run's events up to the first one `done` accepts (or its end)."""
    out: list[ev.Event] = []
    with anyio.fail_after(timeout):
        async for e in RunLog(js).follow(run_id):
            out.append(e)
            if done(e):
                break
    return out


async def test_kill_9_mid_call_recalls_what_may_be_repeated_and_never_silently_repeats_the_rest(
        nats_server, js, tmp_path: Path) -> None:
    await bus.ensure_topology(js, tool_ack_wait=1.0)
    path, counts, hold = bundle(tmp_path)
    hold.touch()
    tasks = {  # what each run calls, and the note that names its call on the server's side
        "peek": ("once_slow_peek", "peek"), "bump": ("once_slow_bump", "bump"),
        "ask_recall": ("asking_slow_bump", "ask_recall"), "ask_failed": ("asking_slow_bump", "ask_failed"),
        "recall": ("recalling_slow_bump", "recall")}
    first = start_worker(nats_server.url, path, tmp_path / "w1.log")  # starts while the host does
    second: subprocess.Popen[bytes] | None = None
    try:
        with ScriptedModelServer(responder=responder) as model:
            async with running_host(nats_server.url, [path], model) as host:
                await serving(first, tmp_path / "w1.log")
                runs = {key: await publish_task(js, "slow", f'{tool} {json.dumps({"note": note})}',
                                                instance=note.replace("_", "-"))  # an actor each: at once
                        for key, (tool, note) in tasks.items()}

                def all_held() -> bool:
                    seen = [c for f in counts.values() for c in calls(f)]
                    return len(seen) == len(tasks)

                await wait_for(all_held, "the first worker holds all five calls in the middle")
                first.send_signal(signal.SIGKILL)
                assert first.wait(10) == -signal.SIGKILL
                hold.unlink()  # the calls made from now on answer at once
                second = start_worker(nats_server.url, path, tmp_path / "w2.log")

                ended = {key: await events_until(js, runs[key], lambda e: isinstance(e, ev.RunCompleted))
                         for key in ("peek", "bump", "recall")}
                asked = {key: await events_until(js, runs[key], lambda e: isinstance(e, ev.QuestionAsked))
                         for key in ("ask_recall", "ask_failed")}
                for key, answer in (("ask_recall", "recall"), ("ask_failed", "failed")):
                    question = asked[key][-1]
                    assert isinstance(question, ev.QuestionAsked)
                    assert question.schema == {"type": "string", "enum": ["recall", "failed"]}
                    assert "may or may not have happened" in question.question
                    listed = await sa(nats_server.url, "questions")
                    assert question.call_id.rpartition("/")[2] in listed.out or question.call_id in listed.out
                    given = await sa(nats_server.url, "answer", runs[key], question.call_id,
                                     json.dumps(answer))
                    assert given.code == 0, given.err
                for key in ("ask_recall", "ask_failed"):
                    ended[key] = await events_until(js, runs[key], lambda e: isinstance(e, ev.RunCompleted))
    finally:
        hold.unlink(missing_ok=True)  # a worker stopping waits for the calls it holds
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(20)

    def outcome(key: str) -> ev.ToolCompleted | ev.ToolFailed:
        tool = tasks[key][0]
        return next(e for e in ended[key]
                    if isinstance(e, ev.ToolCompleted | ev.ToolFailed) and e.tool == tool)

    assert all(isinstance(events[-1], ev.RunCompleted) for events in ended.values())
    for key in ("peek", "recall", "ask_recall"):  # called again, and answered
        done = outcome(key)
        assert isinstance(done, ev.ToolCompleted), done
        assert done.output["note"] == tasks[key][1]
    failed = outcome("bump")  # not called again: in doubt
    assert isinstance(failed, ev.ToolFailed) and failed.error.kind == "in_doubt", failed
    assert "may or may not have happened" in failed.error.message
    answered = [e for e in ended["ask_failed"] if isinstance(e, ev.QuestionAnswered)]
    assert [a.answer for a in answered] == ["failed"]  # a person's answer is the call's (failed) result
    assert not [e for e in ended["ask_failed"] if isinstance(e, ev.ToolCompleted) and e.tool != "submit"]
    for key in ("bump", "ask_failed"):  # the model was told it may or may not have happened
        prompts = [json.dumps(body["messages"]) for body in model.requests]
        assert any(tasks[key][1] in p and "may or may not have happened" in p for p in prompts)  # told
    redelivered = [e for e in ended["bump"] if isinstance(e, ev.ToolRedelivered)]
    assert redelivered and redelivered[0].attempt == 2  # the log says it was a redelivery
    # on the server's side: what may be repeated was called twice, the rest once
    assert calls(counts["once"]).count("slow_peek:peek") == 2
    assert calls(counts["once"]).count("slow_bump:bump") == 1
    assert calls(counts["asking"]).count("slow_bump:ask_recall") == 2  # a person said to call it again
    assert calls(counts["asking"]).count("slow_bump:ask_failed") == 1
    assert calls(counts["recalling"]).count("slow_bump:recall") == 2
    for key in ("ask_recall", "ask_failed", "bump"):  # the kernel reproduces each run from its log alone
        report = verify(host.agents["slow"].config, ended[key])
        assert report.ok, report.problems
    assert calls(counts["asking"]).count("slow_bump:ask_recall") == 2  # verifying called nothing
