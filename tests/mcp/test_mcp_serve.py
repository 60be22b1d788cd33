"""`sa mcp serve` against a real fleet (nats-server, an in-process host and Monty worker, the scripted model),
driven by real MCP clients: the `mcp` SDK's own client starting `sa mcp serve` as a child process over stdio,
the SDK's streamable-HTTP client, raw JSON-RPC lines (to send one request id twice), and the official
TypeScript SDK under Node. Every check reads the fleet back through `runtime.client`: one run per task, the
run's log ending as the MCP result says."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from control_helpers import control_bundle, control_model
from host_helpers import running_host, running_worker
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from nats_fixtures import PASSWORDS

from runtime import Client
from runtime import events as ev
from runtime import nats as bus
from runtime.commands import run_id_for
from runtime.nats.auth import User, permissions, server_config
from runtime.nats.server import EmbeddedNats
from runtime.nats.subjects import TASKS
from runtime.testing import ScriptedModelServer

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).parents[2]
SA = [sys.executable, "-c", "from runtime.cli import main; main()"]
DESCRIPTION = "Moves money and computes answers with tools."
NODE_SDK = "@modelcontextprotocol/sdk@1.32.2"
NODE_CACHE = ROOT / ".cache" / "node-mcp"
RUN_ID_META = "structured-agents/run_id"


def responder(body: dict[str, Any]) -> str:
    """The control model, and a task starting `fail` answered in text, which never calls the terminal tool:
    its run fails `no_terminal_call` at the turn limit."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return "I will not." if task.startswith("fail") else control_model(body)


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    return js


@asynccontextmanager
async def fleet(url: str, root: Path) -> AsyncIterator[Client]:
    """Agent `ctl` (with a description) served by a host and a worker; a client to check the fleet with."""
    with ScriptedModelServer(responder=responder) as server:
        bundle = control_bundle(root, server.base_url)
        bundle.write_text(bundle.read_text() + f"description: {DESCRIPTION}\n")
        async with (running_host(url, [bundle], server), running_worker(url, [bundle], concurrency=2),
                    await Client.connect(url) as client):
            yield client


def child_env(url: str) -> dict[str, str]:
    """What `sa mcp serve` needs from the environment (the SDKs pass a child only a few variables)."""
    return {"NATS_URL": url, "PYTHONPATH": str(ROOT), "COLUMNS": "200"}


@asynccontextmanager
async def stdio_session(url: str, *args: str, modern: bool = False) -> AsyncIterator[ClientSession]:
    """A session with `sa mcp serve ARGS` as a child process: the 2025 handshake (`initialize`), or with
    `modern` the session-less 2026-07-28 protocol (`discover`)."""
    params = StdioServerParameters(command=SA[0], args=[*SA[1:], "mcp", "serve", *args], env=child_env(url))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await (session.discover() if modern else session.initialize())
        yield session


def text_of(result: Any) -> str:
    return "\n".join(block.text for block in result.content if getattr(block, "type", "") == "text")


async def test_an_agent_is_a_tool_a_call_returns_its_output_once_and_the_run_reads_back(nats_server, topo,
                                                                                         tmp_path):
    async with fleet(nats_server.url, tmp_path) as client, stdio_session(nats_server.url) as session:
        [tool] = (await session.list_tools()).tools  # every served bundle: here, ctl
        assert (tool.name, tool.description) == ("ctl", DESCRIPTION)
        assert tool.input_schema["required"] == ["input"]
        assert set(tool.input_schema["properties"]) == {"input", "task_id", "thread"}

        seen: list[str] = []

        async def progress(done: float, total: float | None, message: str | None) -> None:
            seen.append(message or "")

        result = await session.call_tool("ctl", {"input": "compute 6*7", "task_id": "mcp-t1"},
                                         progress_callback=progress)
        assert not result.is_error, text_of(result)
        assert result.structured_content == {"answer": "compute 6*7"}
        assert json.loads(text_of(result)) == {"answer": "compute 6*7"}
        run_id = result.meta[RUN_ID_META]
        assert run_id == run_id_for("ctl", "mcp-t1")
        assert any("tool submit called" in m for m in seen), seen  # progress from the run's events
        assert await client.get(run_id).result(timeout=5) == {"answer": "compute 6*7"}

        again = await session.call_tool("ctl", {"input": "compute 6*7", "task_id": "mcp-t1"})
        assert again.meta[RUN_ID_META] == run_id and again.structured_content == {"answer": "compute 6*7"}
        runs = [r for r in await client.runs("ctl") if r.task_id == "mcp-t1"]
        assert [r.run_id for r in runs] == [run_id]  # the retried call started nothing
        started = [e for e in await client.get(run_id).replay() if isinstance(e, ev.RunStarted)]
        assert len(started) == 1

        templates = (await session.list_resource_templates()).resource_templates
        assert [t.uri_template for t in templates] == ["run://{run_id}"]
        assert f"run://{run_id}" in [str(r.uri) for r in (await session.list_resources()).resources]
        [contents] = (await session.read_resource(f"run://{run_id}")).contents
        timeline = contents.text
        for word in (run_id, "run.started", "tool.called", "submit", "run.completed"):
            assert word in timeline, timeline
        with pytest.raises(Exception, match="no events for run"):
            await session.read_resource("run://rnosuchrun")


async def test_a_failed_run_is_an_error_result_naming_the_reason(nats_server, topo, tmp_path):
    async with (fleet(nats_server.url, tmp_path) as client,
                stdio_session(nats_server.url, "--agents", "ctl", modern=True) as session):
        result = await session.call_tool("ctl", {"input": "fail at once"})
        assert result.is_error
        run_id = result.meta[RUN_ID_META]
        ending = (await client.get(run_id).replay())[-1]
        assert isinstance(ending, ev.RunFailed) and ending.reason == "no_terminal_call"
        assert result.meta["structured-agents/reason"] == "no_terminal_call"
        assert "no_terminal_call" in text_of(result) and run_id in text_of(result)

        bad = await session.call_tool("ctl", {"task": "no input"})  # bad arguments: said, nothing started
        assert bad.is_error and "unknown argument(s) task" in text_of(bad)
        with pytest.raises(Exception, match="unknown tool 'calc'"):
            await session.call_tool("calc", {"input": "1+1"})


async def test_a_call_waiting_for_approval_says_so_and_returns_once_a_person_decides(nats_server, topo,
                                                                                         tmp_path):
    async with fleet(nats_server.url, tmp_path) as client, stdio_session(nats_server.url) as session:
        waiting: list[str] = []
        asked = anyio.Event()

        async def progress(done: float, total: float | None, message: str | None) -> None:
            if message and "waits for a person's approval" in message:
                waiting.append(message)
                asked.set()

        async def decide() -> None:
            with anyio.fail_after(30):
                await asked.wait()
            [pending] = await client.approvals("ctl")
            assert f"sa approve {pending.run_id} {pending.call_id}" in waiting[0]
            await client.get(pending.run_id).approve(pending.call_id, note="fine")

        async with anyio.create_task_group() as tg:
            tg.start_soon(decide)
            result = await session.call_tool("ctl", {"input": "pay: 500 to acme"}, progress_callback=progress)
        assert not result.is_error and "500" in text_of(result) and "acme" in text_of(result)


async def call_then_cancel_once_spinning(session: Any, text: str, task_id: str) -> None:
    """Call the agent `ctl` with `text` and abandon the call once its progress says the `spin` tool was
    called: the SDK then sends notifications/cancelled for the request (or, on HTTP, closes its stream)."""
    spinning = anyio.Event()

    async def progress(done: float, total: float | None, message: str | None) -> None:
        if message and "tool spin called" in message:
            spinning.set()

    async with anyio.create_task_group() as tg:
        async def call() -> None:
            await session.call_tool("ctl", {"input": text, "task_id": task_id}, progress_callback=progress)

        tg.start_soon(call)
        with anyio.fail_after(30):
            await spinning.wait()
        tg.cancel_scope.cancel()


async def test_cancelling_the_call_cancels_the_run(nats_server, topo, tmp_path):
    async with fleet(nats_server.url, tmp_path) as client, stdio_session(nats_server.url) as session:
        await call_then_cancel_once_spinning(session, "spin forever", "mcp-spin")
        handle = client.get(run_id_for("ctl", "mcp-spin"))
        with anyio.fail_after(30):
            ending = await handle.ending()
        assert isinstance(ending, ev.RunCancelled), ev.kind_of(ending)
        assert ending.reason == "cancelled by the MCP client"


async def test_a_connection_that_ends_without_a_cancel_leaves_the_run_going(nats_server, topo, tmp_path):
    """A stdio client that exits mid-call has not cancelled it (runs are durable; a call with the task id
    picks the run up again): the server exits, and the run is still there to be cancelled by someone else."""
    async with fleet(nats_server.url, tmp_path) as client:
        proc = await anyio.open_process([*SA, "mcp", "serve"],
                                        env={**os.environ, **child_env(nats_server.url)})
        try:
            assert proc.stdin is not None
            for message in ({"id": 1, "method": "initialize", "params": {
                                "protocolVersion": "2025-06-18", "capabilities": {},
                                "clientInfo": {"name": "raw", "version": "1"}}},
                            {"method": "notifications/initialized"},
                            {"id": 2, "method": "tools/call", "params": {"name": "ctl", "arguments": {
                                "input": "spin until someone stops me", "task_id": "mcp-left"}}}):
                await proc.stdin.send((json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode())
            handle = client.get(run_id_for("ctl", "mcp-left"))
            with anyio.fail_after(30):
                async for event in handle.events():
                    if isinstance(event, ev.ToolCalled):
                        break
            await proc.stdin.aclose()  # the client goes away without a word
            with anyio.fail_after(30):
                await proc.wait()
        finally:
            if proc.returncode is None:
                proc.terminate()
                await proc.wait()
        ending = await handle.cancel("stopped by the test")  # still running: the server did not cancel it
        assert isinstance(ending, ev.RunCancelled) and ending.reason == "stopped by the test"


async def test_a_run_is_followed_by_the_servers_holding_its_key(nats_server, topo, tmp_path):
    """A later `sa mcp serve` given the same --key-file follows a run an earlier one started (a call with its
    task id returns its output); one with another secret is told it did not start that run, and starts
    nothing."""
    key_file = tmp_path / "mcp.key"
    async with fleet(nats_server.url, tmp_path) as client:
        async with stdio_session(nats_server.url, "--key-file", str(key_file)) as session:
            first = await session.call_tool("ctl", {"input": "compute once", "task_id": "kf-1"})
        assert first.structured_content == {"answer": "compute once"}, text_of(first)
        assert oct(key_file.stat().st_mode & 0o777) == "0o600" and len(key_file.read_text().strip()) >= 16
        async with stdio_session(nats_server.url, "--key-file", str(key_file)) as session:
            again = await session.call_tool("ctl", {"input": "compute once", "task_id": "kf-1"})
        assert again.structured_content == {"answer": "compute once"}, text_of(again)
        assert again.meta[RUN_ID_META] == first.meta[RUN_ID_META]
        async with stdio_session(nats_server.url) as session:
            stranger = await session.call_tool("ctl", {"input": "compute once", "task_id": "kf-1"})
        assert stranger.is_error and "which this server did not start" in text_of(stranger), text_of(stranger)
        assert "not started with this key" in text_of(stranger)
        runs = [r.run_id for r in await client.runs("ctl") if r.task_id == "kf-1"]
        assert runs == [first.meta[RUN_ID_META]]


async def test_a_call_made_before_any_host_runs_returns_once_one_does(nats_server, topo, tmp_path):
    """No host answers the starters' requests yet (the task waits in TASKS): the call waits, asking again,
    and returns the output once a host and a worker start."""
    async with stdio_session(nats_server.url, "--agents", "ctl") as session:
        results: list[Any] = []

        async def call() -> None:
            results.append(await session.call_tool("ctl", {"input": "compute early", "task_id": "early"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(60):  # the task is stored: the server now asks hosts that are not there
                while (await topo.stream_info(TASKS)).state.messages == 0:
                    await anyio.sleep(0.1)
            async with fleet(nats_server.url, tmp_path) as client:
                with anyio.fail_after(120):
                    while not results:
                        await anyio.sleep(0.1)
                assert await client.get(run_id_for("ctl", "early")).status() == "completed"
        [result] = results
        assert result.structured_content == {"answer": "compute early"}, text_of(result)


async def test_one_request_id_sent_twice_starts_one_run(nats_server, topo, tmp_path):
    """A client that repeats a request (same id, same arguments: a retry) gets the same run; a request id
    reused for other arguments is another call."""
    def line(message: dict[str, Any]) -> bytes:
        return (json.dumps({"jsonrpc": "2.0", **message}) + "\n").encode()

    async with fleet(nats_server.url, tmp_path) as client:
        proc = await anyio.open_process([*SA, "mcp", "serve"],
                                        env={**os.environ, **child_env(nats_server.url)})
        try:
            assert proc.stdin is not None and proc.stdout is not None
            lines = anyio.streams.text.TextReceiveStream(proc.stdout)
            buffered = ""

            async def reply(request_id: int) -> dict[str, Any]:
                nonlocal buffered
                with anyio.fail_after(60):
                    while True:
                        while "\n" in buffered:
                            text, buffered = buffered.split("\n", 1)
                            message = json.loads(text)
                            if message.get("id") == request_id and "method" not in message:
                                return message
                        buffered += await lines.receive()

            await proc.stdin.send(line({"id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"}}}))
            assert "result" in await reply(1)
            await proc.stdin.send(line({"method": "notifications/initialized"}))

            def call(task: str) -> dict[str, Any]:
                arguments = {"input": task}
                return {"id": 7, "method": "tools/call", "params": {"name": "ctl", "arguments": arguments}}

            runs = []
            for message in (call("compute 1"), call("compute 1"), call("compute 2")):
                await proc.stdin.send(line(message))
                answer = await reply(7)
                assert not answer["result"].get("isError"), answer
                runs.append(answer["result"]["_meta"][RUN_ID_META])
            assert runs[0] == runs[1] != runs[2]
            assert len({r.run_id for r in await client.runs("ctl")}) == 2
        finally:
            proc.terminate()
            await proc.wait()


async def test_http_needs_the_token(nats_server, topo, tmp_path):
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    token_file = tmp_path / "token"
    async with fleet(nats_server.url, tmp_path) as client:
        proc = await anyio.open_process([*SA, "mcp", "serve", "--http", "--port", "0", "--token-file",
                                         str(token_file)], env={**os.environ, **child_env(nats_server.url)})
        try:
            assert proc.stderr is not None
            said = ""
            with anyio.fail_after(60):
                while not (found := re.search(r"MCP at (http://\S+/mcp)", said)):
                    said += (await proc.stderr.receive()).decode()
            url = found.group(1)
            token = token_file.read_text().strip()
            assert token and oct(token_file.stat().st_mode & 0o777) == "0o600" and token not in said
            hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}}
            accept = {"accept": "application/json, text/event-stream"}
            async with httpx.AsyncClient() as http:
                refused = await http.post(url, json=hello, headers=accept)
                wrong = await http.post(url, json=hello, headers={**accept, "authorization": "Bearer nope"})
                let_in = await http.post(url, json=hello,
                                         headers={**accept, "authorization": f"Bearer {token}"})
            assert (refused.status_code, wrong.status_code) == (401, 401)
            assert "Authorization: Bearer" in refused.json()["error_description"]
            assert let_in.status_code == 200, let_in.text

            headers = {"authorization": f"Bearer {token}"}
            async with (httpx2.AsyncClient(headers=headers, timeout=60) as authed,
                        streamable_http_client(url, http_client=authed) as (read, write),
                        ClientSession(read, write) as session):
                await session.initialize()
                assert [t.name for t in (await session.list_tools()).tools] == ["ctl"]
                result = await session.call_tool("ctl", {"input": "compute over http"})
                assert result.structured_content == {"answer": "compute over http"}
                assert await client.get(result.meta[RUN_ID_META]).status() == "completed"

            # the session-less 2026-07-28 protocol (`discover`, no handshake), where a client cancels a call
            # by closing its stream: the run is cancelled
            async with (httpx2.AsyncClient(headers=headers, timeout=60) as authed,
                        streamable_http_client(url, http_client=authed) as (read, write),
                        ClientSession(read, write) as session):
                assert "2026-07-28" in (await session.discover()).supported_versions
                await call_then_cancel_once_spinning(session, "spin over http", "http-spin")
            with anyio.fail_after(30):
                ending = await client.get(run_id_for("ctl", "http-spin")).ending()
            assert isinstance(ending, ev.RunCancelled) and ending.reason == "cancelled by the MCP client"
        finally:
            proc.terminate()
            await proc.wait()


@pytest.fixture(scope="session")
def node_client() -> Path:
    """The TypeScript SDK installed once into the repository's cache folder (gitignored), with the test's
    client script beside it so Node resolves the SDK from there."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        pytest.skip("Node and npm are not installed: the non-Python MCP client cannot run")
    NODE_CACHE.mkdir(parents=True, exist_ok=True)
    if not (NODE_CACHE / "node_modules" / "@modelcontextprotocol" / "sdk" / "package.json").exists():
        (NODE_CACHE / "package.json").write_text('{"name": "node-mcp-test", "private": true}\n')
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", NODE_SDK], cwd=NODE_CACHE,
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            pytest.skip(f"npm could not install {NODE_SDK} (is the npm registry reachable?): "
                        f"{done.stderr.strip()[-500:]}")
    script = NODE_CACHE / "node_client.mjs"
    shutil.copyfile(Path(__file__).with_name("node_client.mjs"), script)
    return script


async def test_a_client_not_written_in_python_runs_an_agent(nats_server, topo, tmp_path, node_client):
    async with fleet(nats_server.url, tmp_path) as client:
        command = ["node", str(node_client), "ctl", "compute from node", *SA, "mcp", "serve"]
        done = await anyio.run_process(command, env={**os.environ, **child_env(nats_server.url)}, check=False)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        said = json.loads(done.stdout.decode().strip().splitlines()[-1])
        assert said["tools"] == [{"name": "ctl", "description": DESCRIPTION}]
        result = said["result"]
        assert not result.get("isError") and result["structuredContent"] == {"answer": "compute from node"}
        output = await client.get(result["_meta"][RUN_ID_META]).result(timeout=5)
        assert output == {"answer": "compute from node"}


# -- credentials: what each role lets `sa mcp serve` do --------------------------------------------------


@asynccontextmanager
async def secured_fleet(url: str, root: Path) -> AsyncIterator[Client]:
    """Agent `ctl` on a secured server: a host connected as `host`, a worker as `worker`; an admin client
    (every role's password is `PASSWORDS`')."""
    from runtime.host import Host, HostConfig, load_agents
    from runtime.model.client import ModelClient
    from runtime.nats.credentials import Credentials
    from runtime.worker import Worker, build_registry

    def login(role: str) -> dict[str, Any]:
        return Credentials(user=role, password=PASSWORDS[role]).connect_options()

    with ScriptedModelServer(responder=responder) as server:
        bundle = control_bundle(root, server.base_url)
        host_nc = await bus.connect(url, name="test-host", **login("host"))
        worker_nc = await bus.connect(url, name="test-worker", **login("worker"))
        model = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
        host = Host(host_nc, load_agents([bundle], client=model), config=HostConfig(task_ack_wait=2.0))
        worker = Worker(worker_nc.jetstream(), build_registry(bundles=[bundle]), concurrency=2)
        stop = anyio.Event()
        try:
            async with anyio.create_task_group() as tg, await Client.connect(url, **login("admin")) as admin:
                tg.start_soon(host.run, stop)
                tg.start_soon(worker.run, stop)
                with anyio.fail_after(30):
                    await host.ready.wait()
                yield admin
                stop.set()
        finally:
            await model.aclose()
            await bus.close(worker_nc)
            await bus.close(host_nc)


def as_role(role: str) -> dict[str, str]:
    return {"NATS_USER": role, "NATS_PASSWORD": PASSWORDS[role]}


def publisher_session(url: str, *args: str) -> Any:
    params = StdioServerParameters(command=SA[0], args=[*SA[1:], "mcp", "serve", "--agents", "ctl", *args],
                                   env={**child_env(url), **as_role("publisher")})
    return stdio_client(params)


async def test_publisher_credentials_alone_run_an_agent_follow_it_and_cancel_a_call(secured, tmp_path):
    """`sa mcp serve` as the shipped publisher: a call gets its progress and structured output, a cancelled
    call's run ends cancelled, and its own runs read back as resources, all through the hosts
    (`runtime.host.starters`); a run it did not start is not offered to it."""
    async with secured_fleet(secured.url, tmp_path) as admin:
        other = await admin.start("ctl", "compute for someone else", task_id="pub-other")
        assert await other.result(timeout=60) == {"answer": "compute for someone else"}
        async with publisher_session(secured.url) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            [tool] = (await session.list_tools()).tools  # named with --agents: no heartbeat read needed
            assert tool.name == "ctl" and "No live host" not in (tool.description or "")
            seen: list[str] = []

            async def progress(done: float, total: float | None, message: str | None) -> None:
                seen.append(message or "")

            with anyio.fail_after(120):
                result = await session.call_tool("ctl", {"input": "compute as publisher", "task_id": "pub-1"},
                                                 progress_callback=progress)
            assert not result.is_error, text_of(result)
            assert result.structured_content == {"answer": "compute as publisher"}
            run_id = result.meta[RUN_ID_META]
            assert run_id == run_id_for("ctl", "pub-1")
            assert any("tool submit called" in m for m in seen), seen

            await call_then_cancel_once_spinning(session, "spin as publisher", "pub-spin")
            with anyio.fail_after(60):
                ending = await admin.get(run_id_for("ctl", "pub-spin")).ending()
            assert isinstance(ending, ev.RunCancelled), ev.kind_of(ending)
            assert (ending.reason, ending.by) == ("cancelled by the MCP client", "starter")

            [contents] = (await session.read_resource(f"run://{run_id}")).contents
            assert "run.completed" in contents.text and run_id in contents.text
            listed = [str(r.uri) for r in (await session.list_resources()).resources]
            assert f"run://{run_id}" in listed and f"run://{other.run_id}" not in listed
            with pytest.raises(Exception, match="needs an operator's credentials"):
                await session.read_resource(f"run://{other.run_id}")
        assert await admin.get(run_id).status() == "completed"


async def test_publisher_credentials_cannot_read_or_cancel_a_run_they_did_not_start(secured, tmp_path):
    """What stops a publisher from reaching runs that are not its own: the server refuses it the log, and a
    host answers a starter's request only with the key the run started with, whoever holds the same
    credentials, and even after it re-sends the run's task under its own key."""
    from runtime.log import RunLog
    from runtime.mcp.started import StartedRuns, StarterRefused
    from runtime.nats.connection import explain_refusal
    from runtime.nats.credentials import Credentials

    async with secured_fleet(secured.url, tmp_path) as admin:
        login = Credentials(user="publisher", password=PASSWORDS["publisher"]).connect_options()
        async with (await Client.connect(secured.url, **login) as victim,
                    await Client.connect(secured.url, **login) as thief):
            owner = StartedRuns(victim.nc, b"the victim's secret, 32 bytes!!")
            mallory = StartedRuns(thief.nc, b"another secret, of the same user")
            keyless = await admin.start("ctl", "compute without a key", task_id="keyless")
            assert await keyless.result(timeout=60) == {"answer": "compute without a key"}
            run_id = run_id_for("ctl", "victim-spin")
            await victim.start("ctl", "spin for the victim", task_id="victim-spin",
                               metadata=owner.metadata(run_id))
            with anyio.fail_after(60):  # running its spin tool
                async for event in admin.get(run_id).events():
                    if isinstance(event, ev.ToolCalled):
                        break

            with pytest.raises(Exception) as refused:  # the log itself: refused by the server
                await RunLog(thief.nc.jetstream(timeout=2.0)).read(run_id, timeout=5)
            assert "permissions violation" in (explain_refusal(refused.value) or ""), refused.value
            for target in (run_id, keyless.run_id):
                with pytest.raises(StarterRefused, match="not started with this key"):
                    async for _ in mallory.events("ctl", target):
                        pass
                with pytest.raises(StarterRefused, match="not started with this key"):
                    await mallory.cancel("ctl", target, "mine now")
            # the run's task again, under the thief's key: stored once (one task id), and a task for a run
            # that exists starts nothing, so the key the run recorded stays the victim's
            await thief.start("ctl", "spin for the victim", task_id="victim-spin",
                              metadata=mallory.metadata(run_id))
            with pytest.raises(StarterRefused, match="not started with this key"):
                await mallory.cancel("ctl", run_id, "mine now")
            assert await admin.get(run_id).status() == "running"

            await owner.cancel("ctl", run_id, "the starter stops it")  # the key was the only thing missing
            with anyio.fail_after(60):
                ending = await admin.get(run_id).ending()
            assert isinstance(ending, ev.RunCancelled) and ending.reason == "the starter stops it"
            followed = [e async for e in owner.events("ctl", run_id)]
            assert [e.seq for e in followed] == list(range(len(followed)))
            assert isinstance(followed[-1], ev.RunCancelled)


async def test_an_operator_alone_cannot_start_a_run(secured, tmp_path):
    async with secured_fleet(secured.url, tmp_path) as admin:
        params = StdioServerParameters(command=SA[0], args=[*SA[1:], "mcp", "serve"],
                                       env={**child_env(secured.url), **as_role("operator")})
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert [t.name for t in (await session.list_tools()).tools] == ["ctl"]  # reads the heartbeats
            with anyio.fail_after(120):
                refused = await session.call_tool("ctl", {"input": "compute as operator", "task_id": "op-1"})
            assert refused.is_error and "was not sent (refused)" in text_of(refused), text_of(refused)
        assert await admin.run_info(run_id_for("ctl", "op-1")) is None


@pytest.fixture(scope="module")
def with_mcp_user(tmp_path_factory) -> Any:
    """nats-server with the shipped roles (admin, host, worker, operator, publisher) and a user `mcp` whose
    permissions are the publisher's and the operator's together: what the how-to tells a secured fleet to
    give `sa mcp serve` that should also offer every run (not only its own) as a resource and list the
    agents from the hosts' heartbeats; and a user `oldpub` with the publisher's permissions of an auth
    config older than the starters' subjects."""
    def rule(allow: list[str]) -> str:
        return "allow: " + json.dumps(allow)

    publisher, operator = permissions("publisher", "mcp"), permissions("operator", "mcp")
    assert publisher is not None and operator is not None
    pub = sorted({*publisher.pub_allow, *operator.pub_allow})
    sub = sorted({*publisher.sub_allow, *operator.sub_allow})
    users = [User(role, role, PASSWORDS[role]) for role in PASSWORDS]
    config = server_config(users).rstrip().removesuffix("}").rstrip().removesuffix("]")
    old = [s for s in publisher.pub_allow if not s.startswith("starter.")]
    config += (f'    {{user: "mcp", password: "{PASSWORDS["admin"]}-mcp", permissions: {{\n'
               f"      publish: {{{rule(pub)}}}\n      subscribe: {{{rule(sub)}}}\n    }}}}\n"
               f'    {{user: "oldpub", password: "{PASSWORDS["admin"]}-old", permissions: {{\n'
               f"      publish: {{{rule(old)}}}\n      subscribe: {{{rule(['_INBOX_oldpub.>'])}}}\n    }}}}\n"
               "  ]\n}\n")
    path = tmp_path_factory.mktemp("auth") / "auth.conf"
    path.write_text(config)
    server = EmbeddedNats(extra_args=["-c", str(path)]).start()
    try:
        yield server
    finally:
        server.stop()


async def test_a_user_with_the_publisher_and_operator_permissions_reads_every_run(with_mcp_user, tmp_path):
    async with secured_fleet(with_mcp_user.url, tmp_path) as admin:
        other = await admin.start("ctl", "compute for someone else", task_id="mcp-other")
        assert await other.result(timeout=60) == {"answer": "compute for someone else"}
        login = {"NATS_USER": "mcp", "NATS_PASSWORD": f"{PASSWORDS['admin']}-mcp"}
        params = StdioServerParameters(command=SA[0], args=[*SA[1:], "mcp", "serve"],
                                       env={**child_env(with_mcp_user.url), **login})
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert [t.name for t in (await session.list_tools()).tools] == ["ctl"]
            result = await session.call_tool("ctl", {"input": "compute as mcp"})
            assert result.structured_content == {"answer": "compute as mcp"}, text_of(result)
            run_id = result.meta[RUN_ID_META]
            for shown in (run_id, other.run_id):  # its own, and one it did not start: read from the log
                [contents] = (await session.read_resource(f"run://{shown}")).contents
                assert "run.completed" in contents.text and shown in contents.text
            listed = [str(r.uri) for r in (await session.list_resources()).resources]
            assert {f"run://{run_id}", f"run://{other.run_id}"} <= set(listed)
        assert await admin.get(run_id).status() == "completed"


async def test_credentials_that_may_not_ask_the_hosts_are_told_the_refusal(with_mcp_user, tmp_path):
    """A publisher from an auth config older than the starters' subjects: the task is sent, and the call
    says at once that following it was refused, and why, instead of waiting for ever."""
    async with secured_fleet(with_mcp_user.url, tmp_path) as admin:
        login = {"NATS_USER": "oldpub", "NATS_PASSWORD": f"{PASSWORDS['admin']}-old"}
        params = StdioServerParameters(command=SA[0], args=[*SA[1:], "mcp", "serve", "--agents", "ctl"],
                                       env={**child_env(with_mcp_user.url), **login})
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            with anyio.fail_after(60):
                result = await session.call_tool("ctl", {"input": "compute as oldpub", "task_id": "old-1"})
        said = text_of(result)
        assert result.is_error and "may not publish on starter.ctl.follow" in said, said
        assert "permissions violation" in said
        output = await admin.get(run_id_for("ctl", "old-1")).result(timeout=60)
        assert output == {"answer": "compute as oldpub"}
