"""The bundle as the one entry point in process: `Agent.from_bundle(path).run(task)` against a real HTTP
model server (scripted), real Monty, the bundle's own tools, data and workspace writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from host_helpers import hermes_call, write_bundle

from runtime import Agent, LocalWorkspace, kernel
from runtime import events as ev
from runtime.client.verify import verify
from runtime.model import ModelClient
from runtime.testing import ScriptedModelServer, last_message

pytestmark = pytest.mark.anyio
DEMO = Path(__file__).parents[2] / "bundles" / "demo"


def demo_model(body: dict[str, Any]) -> str:
    """What the demo's model does: calculate, then answer with the value the tool returned."""
    last = last_message(body)
    if "<tool_response>" in last:
        value = json.loads(last.split("<tool_response>")[1].split("</tool_response>")[0])["value"]
        return hermes_call("final_answer", {"answer": str(value)})
    return hermes_call("calculator", {"expression": "17 * 23 + 4"})


async def test_the_demo_bundle_runs_in_process_in_three_lines():
    with ScriptedModelServer(responder=demo_model) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(DEMO, client=client)
            result = await agent.run("What is 17 * 23 + 4?")
        requests = server.requests
    assert result.ok and result.output == {"answer": "395"}
    kinds = [ev.kind_of(e) for e in result.events]
    assert kinds[0] == "run.started" and kinds[-1] == "run.completed" and "script.completed" not in kinds
    # the sandbox run rides in its call's outcome, as a host records a worker's
    ran = [e for e in result.events if isinstance(e, ev.ToolCompleted) and e.script is not None]
    assert ran and "script.completed" in [ev.kind_of(e) for e in ev.expand_all(result.events)]
    started = result.events[0]
    assert isinstance(started, ev.RunStarted) and started.bundle_digest == agent.bundle.digest
    assert started.actor == "demo" and started.timeout_s == agent.bundle.deadline_s  # the bundle's deadline
    # the bundle's model settings went over the wire: its constraint and sampling
    assert "grammar" in requests[0]["structured_outputs"] and requests[0]["temperature"] == 0.0
    # the same log a host writes: it folds, and the kernel re-decides it event for event
    assert kernel.fold(agent.config, result.events).status == "completed"
    report = verify(agent.config, result.events)
    assert report.ok and report.checked >= 6, report.problems


async def test_a_workspace_bundle_reads_its_files_and_keeps_what_its_tools_wrote(tmp_path: Path):
    bundle = write_bundle(tmp_path, tools=("note",), extra="workspace: notes\ndata_provider: workspace\n")

    def model(body: dict[str, Any]) -> str:
        last = last_message(body)
        if "<tool_response>" in last:
            return hermes_call("submit", {"answer": last.split("<tool_response>")[1].strip()[:40]})
        return hermes_call("note", {"line": last.split(":", 1)[1].strip()})

    with ScriptedModelServer(responder=model) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(bundle, client=client)
            first = await agent.run("note: first line")
            second = await agent.run("note: second line")
    assert first.ok and second.ok
    # the second run's script read what the first one's write left in the workspace
    assert isinstance(agent.data, LocalWorkspace)
    assert agent.data.entries["log.txt"] == b"first line\nsecond line\n"
    (done,) = [e for e in second.events if isinstance(e, ev.ToolCompleted) and e.tool == "note"]
    assert done.output["lines"] == 2


async def test_a_local_model_bundle_without_a_model_server_says_how_to_start_one(monkeypatch, tmp_path):
    monkeypatch.delenv("SA_LOCAL_MODEL_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))  # no `sa up` state file
    with pytest.raises(ValueError, match="sa model serve"):
        Agent.from_bundle(DEMO)


async def test_a_local_model_bundle_finds_the_model_of_a_running_sa_up(monkeypatch, tmp_path):
    """`sa up` records its model server's URL; an in-process agent of a `local` bundle uses it."""
    import json
    import os

    from runtime.running import state_file

    monkeypatch.delenv("SA_LOCAL_MODEL_URL", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    state_file().parent.mkdir(parents=True)
    state_file().write_text(json.dumps({"nats_url": "nats://127.0.0.1:1", "pid": os.getpid(),
                                        "model_url": "http://127.0.0.1:9/v1"}))
    async with Agent.from_bundle(DEMO) as agent:
        assert str(agent.client.base_url).rstrip("/") == "http://127.0.0.1:9/v1"
    state_file().write_text(json.dumps({"model_url": "http://127.0.0.1:9/v1", "pid": 2**22 + 12345}))
    with pytest.raises(ValueError, match="sa model serve"):  # a stale file (its `sa up` is gone) is ignored
        Agent.from_bundle(DEMO)


STAMP_PYM = '''"""Stamp a line through the host's ledger; returns what the ledger said."""

from grail import external, Input

line: str = Input("line", description="the line to stamp")


@external
def stamp(line: str) -> dict:
    """The ledger (the bundle's externals factory)."""
    ...


done = stamp(line)
{"stamped": done["stamped"], "key": done["key"]}
'''

LEDGER_PY = '''from runtime.externals import ExecutionContext


class Ledger:
    def build(self, tool_name: str, context: ExecutionContext):
        def stamp(line: str, *, idempotency_key: str) -> dict:
            return {"stamped": line.upper(), "key": idempotency_key}

        return {"stamp": stamp}
'''


async def test_a_bundle_s_externals_factory_binds_its_scripts_externals_in_process(tmp_path: Path):
    """The bundle's `externals:` reaches its scripts in process as on a worker: the factory builds the
    functions per call, and each external call gets its idempotency key (`<call id>#<n>`)."""
    bundle = write_bundle(tmp_path, tools=(), extra="externals: ledger:Ledger\n")
    folder = bundle.parent
    (folder / "tools" / "stamp.pym").write_text(STAMP_PYM)
    (folder / "ledger.py").write_text(LEDGER_PY)
    text = bundle.read_text().replace("  - tools/submit.pym", "  - tools/submit.pym\n  - tools/stamp.pym")
    bundle.write_text(text)

    def model(body: dict[str, Any]) -> str:
        last = last_message(body)
        if "<tool_response>" in last:
            return hermes_call("submit", {"answer": last.split("<tool_response>")[1].strip()[:60]})
        return hermes_call("stamp", {"line": "hello"})

    with ScriptedModelServer(responder=model) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(bundle, client=client)
            result = await agent.run("stamp it")
    assert result.ok, (result.reason, result.events[-3:])
    stamped = [e for e in result.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)]
    assert [e.tool for e in stamped] == ["stamp", "submit"], stamped
    done = stamped[0]
    assert isinstance(done, ev.ToolCompleted), done
    assert done.output == {"stamped": "HELLO", "key": f"{done.call_id}#1"}  # the call's first external call


TEXT = "I am not a tool call at all }}}{{"
REPORT = '''\
"""Report the answer."""
from grail import Input

answer: str = Input("answer", description="the answer")

{"answer": answer, "length": len(answer)}
'''


def typed_bundle(root: Path) -> Path:
    """Issue 36's bundle: a run must end through the terminal tool `report`, whose output model types it."""
    (root / "tools").mkdir(parents=True)
    (root / "tools" / "report.pym").write_text(REPORT)
    (root / "bundle.yaml").write_text(
        "name: typed\nsystem_prompt: Answer with report.\n"
        "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
        "constraint: {strategy: structural_tag}\n"
        "tools:\n  - path: tools/report.pym\n"
        "    output_model: {type: object, properties: {answer: {type: string}, length: {type: integer}},\n"
        "                   required: [answer, length]}\n"
        "termination: {terminal_tool: report, max_turns: 6, max_consecutive_errors: 3}\n")
    return root


async def test_a_server_that_answers_in_text_fails_a_run_that_must_end_with_a_typed_answer(tmp_path: Path):
    """Issue 36: the model server ignores the decoding constraint and writes text. The run is told, asked
    again, and fails `no_terminal_call`: it never completes with the text as its output."""
    with ScriptedModelServer(responder=lambda body: TEXT) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(typed_bundle(tmp_path), client=client)
            result = await agent.run("What is the answer?")
        requests = server.requests
    assert result.status == "failed" and not result.ok and result.output is None
    assert result.reason is not None and result.reason.startswith("no_terminal_call")
    assert "'report'" in result.reason
    assert not any(isinstance(e, ev.RunCompleted) for e in result.events)
    assert len(requests) == 3  # asked again up to max_consecutive_errors
    told = requests[1]["messages"][-1]
    assert told["role"] == "user" and "Call the tool report" in told["content"]
    report = verify(agent.config, result.events)
    assert report.ok, report.problems


async def test_a_model_told_after_a_text_reply_ends_with_the_typed_answer(tmp_path: Path):
    replies = [TEXT, hermes_call("report", {"answer": "forty-two"})]
    with ScriptedModelServer(replies) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(typed_bundle(tmp_path), client=client)
            result = await agent.run("What is the answer?")
    assert result.ok and result.output == {"answer": "forty-two", "length": 9}
