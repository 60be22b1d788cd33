"""An MCP server's question answered while the call's next round runs on another worker (a real host, two
tool workers one after the other, the official SDK's server as a stdio process of each worker).

A person's answer is durable: the run parks for as long as it takes, and the call's next round is a tool
job any worker may take. Each worker runs its own process of a stdio server, and the official SDK seals the
state it sends with a question with a key of its own process unless it is given one. So the answer reaches
a server whose processes share their request-state key wherever it runs, and a server that seals with a
key of its process refuses it on another: a failure of the call that says why and what fixes it
(`runtime.worker.mcp_clients`), which the model reads, never a generic protocol error."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import SUBMIT, running_host, running_worker
from mcp_helpers import ASKER_SOURCE, PYTHON, calls

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.testing import ScriptedModelServer, hermes_call, last_message

pytestmark = pytest.mark.anyio

SHARED_KEY = """server = MCPServer("asker", request_state_security=RequestStateSecurity(
    keys=[os.environ["STATE_KEY"]]))"""


def bundle(root: Path, *, shared_key: bool) -> tuple[Path, Path]:
    """Agent `booker` whose MCP server `asker` asks who a booking is for; with `shared_key`, every process of
    the server seals its request state with one key (from its environment)."""
    source = ASKER_SOURCE
    if shared_key:
        source = source.replace('server = MCPServer("asker")', SHARED_KEY).replace(
            "from mcp.server.mcpserver import MCPServer",
            "from mcp.server.mcpserver import MCPServer\n"
            "from mcp.server.request_state import RequestStateSecurity")
        assert "RequestStateSecurity(" in source
    script, count = root / "asker_server.py", root / "asked.txt"
    script.write_text(source)
    folder = root / "booker"
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    path = folder / "bundle.yaml"
    path.write_text("name: booker\nsystem_prompt: You book places.\n"
                    "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
                    "tools: [tools/submit.pym]\ntermination: {terminal_tool: submit, max_turns: 4}\n"
                    f"mcp:\n  asker:\n    command: {PYTHON}\n    args: [{script}]\n"
                    f"    env: {{COUNT_FILE: '{count}', STATE_KEY: 'one key for every process of asker'}}\n")
    return path, count


def responder(body: dict[str, Any]) -> str:
    last = last_message(body)
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-200:]})
    return hermes_call("asker_book", {"place": "the blue room"})


async def asked_on_one_worker_answered_on_another(url: str, js: Any, path: Path) -> list[ev.Event]:
    """Book through a worker until the server asks, stop that worker (its server process with it), answer,
    and let a new worker (a new process of the server) take the call's next round; the run's events."""
    with ScriptedModelServer(responder=responder) as model:
        async with running_host(url, [path], model) as host:
            async with running_worker(url, [path]):
                run_id = await publish_task(js, "booker", "book the blue room")
                asked: ev.QuestionAsked | None = None
                with anyio.fail_after(60):
                    async for e in RunLog(js).follow(run_id):
                        if isinstance(e, ev.QuestionAsked):
                            asked = e
                            break
            assert asked is not None and "Who is booking the blue room?" in asked.question
            async with running_worker(url, [path]):
                await Client(host.nc).answer(run_id, asked.call_id, {"name": "Ann", "sure": True})
                with anyio.fail_after(60):
                    return [e async for e in RunLog(js).follow(run_id)]


async def test_an_answer_reaches_a_server_sharing_its_state_key_on_another_worker(nats_server, js, tmp_path):
    await bus.ensure_topology(js)
    path, count = bundle(tmp_path, shared_key=True)
    events = await asked_on_one_worker_answered_on_another(nats_server.url, js, path)
    done = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "asker_book")
    assert "booked the blue room for Ann (sure)" in json.dumps(done.output)
    assert isinstance(events[-1], ev.RunCompleted)
    assert calls(count)[0] == "asked" and calls(count).count("booked") == 1  # the other process finished it


async def test_an_answer_a_server_no_longer_takes_fails_the_call_saying_why(nats_server, js, tmp_path):
    await bus.ensure_topology(js)
    path, count = bundle(tmp_path, shared_key=False)
    events = await asked_on_one_worker_answered_on_another(nats_server.url, js, path)
    [failed] = [e for e in events if isinstance(e, ev.ToolFailed) and e.tool == "asker_book"]
    assert (failed.error.kind, failed.error.detail) == ("external", "mcp_state")
    said = failed.error.message
    assert "asker/book refused the answer to its question" in said
    assert "Invalid or expired requestState" in said
    assert "request-state key all its processes share" in said and "calling the tool again asks anew" in said
    assert calls(count) == ["asked"]  # the other process finished nothing
