"""Tools that reach the world, against a real nats-server, real Monty and a real HTTP service on loopback:
externals from a factory and Python tools in bundles reach the service; a worker killed with -9 after an
external call was answered does not make that call again; `ask_llm` on a worker is recorded in the run's
events; a granted secret never appears in the events, the job messages, the outcomes or the logs; a
script written for grail without a docstring loads; bad input is a clear error at load time or a value."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from typer.testing import CliRunner

from runtime import events as ev
from runtime.bundle import BundleError, load_bundle
from runtime.cli import app
from runtime.commands import publish_task
from runtime.externals import ExecutionContext, ExternalsError, Grants, Secrets, call_key, load_factory
from runtime.externals.builtins import builtin_externals
from runtime.jobs import ToolJob
from runtime.log import RunLog
from runtime.nats.subjects import EVENTS, TOOLS
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer, hermes_call, last_message
from runtime.tools import ScriptTool
from runtime.tools.hosted import HostedPythonTool, RetryPolicy
from runtime.worker import build_registry
from tests.host_helpers import SUBMIT, running_host, running_worker
from tests.worker.test_worker import collect_outcomes, run_worker_until, stop

AGENTS = Path(__file__).parents[2] / "agents"
ASYNC = pytest.mark.anyio

# ---- the service on loopback -------------------------------------------------------------------------


class Shop:
    """A tiny HTTP service: it records every request (path, headers, body) and answers it."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # the first /gate request waits for this
        shop = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                with shop.lock:
                    shop.requests.append((self.path, dict(self.headers), b""))
                if self.path.startswith("/orders/"):
                    self._answer({"order": self.path.rsplit("/", 1)[-1], "status": "shipped"})
                else:
                    self._answer({"hello": self.headers.get("Authorization", "")[:6]})

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with shop.lock:
                    shop.requests.append((self.path, dict(self.headers), body))
                    n = sum(p == self.path for p, _, _ in shop.requests)
                if self.path == "/gate" and n == 1:
                    shop.release.wait(120)  # the first caller is held here (and killed meanwhile)
                self._answer({"charge_id": f"ch-{n}", "open": True})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def calls(self, path: str) -> list[dict[str, str]]:
        with self.lock:
            return [h for p, h, _ in self.requests if p == path]


@pytest.fixture
def shop(monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    s = Shop()
    threading.Thread(target=s.server.serve_forever, daemon=True).start()
    monkeypatch.setenv("SHOP_URL", s.url)
    try:
        yield s
    finally:
        s.release.set()
        s.server.shutdown()
        s.server.server_close()


FACTORY = '''\
"""The shop's externals and a Python tool: plain urllib, the service's URL from SHOP_URL."""
import json
import os
import urllib.request


def _post(path, payload, key):
    req = urllib.request.Request(os.environ["SHOP_URL"] + path, data=json.dumps(payload).encode(),
                                 headers={"Idempotency-Key": key, "content-type": "application/json"},
                                 method="POST")
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


class Factory:
    def build(self, tool_name, context):
        def charge(amount, *, idempotency_key):
            if amount < 0:
                raise ValueError("a charge cannot be negative")
            return _post("/charge", {"amount": amount, "run": context.run_id, "tool": tool_name,
                                     "meta": dict(context.metadata), "attempt": context.attempt},
                         idempotency_key)

        async def gate(*, idempotency_key):
            import asyncio
            return await asyncio.to_thread(_post, "/gate", {}, idempotency_key)

        return {"charge": charge, "gate": gate}


def broken(tool_name, context):
    raise RuntimeError("the CRM is down")


def lookup_order(order_id: str) -> dict:
    """Look an order up in the shop.

    Args:
        order_id: the order's id, e.g. A17
    """
    with urllib.request.urlopen(os.environ["SHOP_URL"] + "/orders/" + order_id, timeout=10) as r:
        return json.loads(r.read())


def untyped(order_id):
    """No type hints."""
'''

ORDER = '''\
from grail import external, Input

amount: int = Input("amount")
wait: bool = Input("wait", default=False)


@external
def charge(amount: int) -> dict:
    ...


@external
async def gate() -> dict:
    ...


paid = charge(amount)
opened = {"open": False}
if wait:
    opened = await gate()
{"charge": paid["charge_id"], "gate": opened["open"]}
'''


def shop_bundle(root: Path, *, externals: str | None = "shopx:Factory", extra_tools: str = "") -> Path:
    folder = root / "shop"
    (folder / "tools").mkdir(parents=True, exist_ok=True)
    (folder / "shopx.py").write_text(FACTORY)
    (folder / "tools" / "order.pym").write_text(ORDER)
    text = ("name: shop\nsystem_prompt: You run a shop.\n"
            "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
            + (f"externals: {externals}\n" if externals else "")
            + "tools:\n"
            "  - path: tools/order.pym\n"
            "    description: Charges an order and waits at the gate when told.\n"
            "  - python: shopx:lookup_order\n"
            "    timeout: 5s\n    concurrency: 2\n"
            "    retry: {attempts: 2, backoff: 10ms, exceptions: [ConnectionError]}\n" + extra_tools)
    (folder / "bundle.yaml").write_text(text)
    return folder / "bundle.yaml"


def job(call: str, tool: str, args: dict[str, Any], **kw: Any) -> ToolJob:
    return ToolJob(run_id="r1", actor="shop", call_id=f"r1/{call}", tool=tool, arguments=args,
                   limits={"max_duration": 60}, **kw)


# ---- scripts written for grail -------------------------------------------------------------------------

GRAIL_SIMPLE = '''\
from grail import external, Input

budget_limit: float = Input("budget_limit")


@external
async def get_team_members(department: str) -> dict:
    ...


data = await get_team_members(department="Engineering")
{"members": len(data["members"]), "limit": budget_limit}
'''


def test_a_grail_script_without_a_docstring_loads_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "simple.pym"
    path.write_text(GRAIL_SIMPLE)
    tool = ScriptTool.from_path(path)
    assert tool.description_source == "default"
    assert tool.schema.description == "Runs the simple script with inputs budget_limit."
    assert 1 <= len(tool.schema.description) <= 200
    runner = CliRunner()
    checked = runner.invoke(app, ["check", str(path)])
    assert checked.exit_code == 0, checked.output
    assert "warning: the script has no docstring" in checked.output
    listed = runner.invoke(app, ["tools", "--json", str(path)])
    assert listed.exit_code == 0
    (entry,) = json.loads(listed.stdout)["tools"]
    assert entry["description_source"] == "default"
    # a bundle entry's description replaces the default, and `sa tools` says where it came from
    (tmp_path / "bundle.yaml").write_text("name: team\ntools:\n  - path: simple.pym\n"
                                          "    description: Counts a department's members.\n")
    b = load_bundle(tmp_path)
    assert b.tools["simple"].schema.description == "Counts a department's members."
    assert b.tools["simple"].description_source == "bundle"
    (tmp_path / "bundle.yaml").write_text(f"name: team\ntools:\n  - path: simple.pym\n"
                                          f"    description: '{'x' * 201}'\n")
    with pytest.raises(BundleError, match=r"tools\[0\].description: .*201 characters"):
        load_bundle(tmp_path)


def test_the_example_shop_bundle_loads_with_every_kind_of_tool() -> None:
    from runtime.tools.agent_tool import AgentTool

    shop = load_bundle(Path(__file__).parents[2] / "bundles" / "shop")
    kinds = {name: type(t).__name__ for name, t in shop.tools.items()}
    assert kinds == {"final_answer": "ScriptTool", "refund": "ScriptTool", "summarize": "ScriptTool",
                     "lookup_order": "HostedPythonTool", "researcher": "AgentTool"}
    assert shop.grants["summarize"].names == ("ask_llm",) and shop.factory is not None
    assert isinstance(shop.tools["researcher"], AgentTool) and shop.tools["researcher"].agent == "researcher"
    assert load_bundle(Path(__file__).parents[2] / "bundles" / "researcher").name == "researcher"


@ASYNC
async def test_a_bundle_entry_gives_the_sandbox_its_environ(tmp_path: Path) -> None:
    script = '"""Say the region."""\nimport os\n{"region": os.environ["REGION"]}\n'
    (tmp_path / "region.pym").write_text(script)
    (tmp_path / "bundle.yaml").write_text("name: geo\ntools:\n  - path: region.pym\n"
                                          "    environ: {REGION: eu-west}\n")
    tool = load_bundle(tmp_path).tools["region"]
    assert (await tool.execute({})).output == {"region": "eu-west"}


# ---- load-time errors ----------------------------------------------------------------------------------


def test_bad_factories_and_python_tools_are_clear_errors_at_load_time(tmp_path: Path) -> None:
    shop_bundle(tmp_path, externals="shopx_missing:Factory")
    with pytest.raises(BundleError) as info:
        load_bundle(tmp_path / "shop")
    assert "externals: cannot import module 'shopx_missing'" in str(info.value)
    shop_bundle(tmp_path, externals="shopx:nothing")
    with pytest.raises(BundleError, match="module 'shopx' has no 'nothing'"):
        load_bundle(tmp_path / "shop")
    shop_bundle(tmp_path, extra_tools="  - python: shopx:untyped\n")
    with pytest.raises(BundleError) as info:
        load_bundle(tmp_path / "shop")
    assert "tools[2].python: tool 'untyped': parameter 'order_id' has no type annotation" in str(info.value)
    shop_bundle(tmp_path, extra_tools="  - {path: tools/order.pym, python: shopx:lookup_order}\n")
    with pytest.raises(BundleError, match="a tool entry has one of `path:`"):
        load_bundle(tmp_path / "shop")
    with pytest.raises(ExternalsError, match="not a externals factory reference"):
        load_factory("no_colon")
    with pytest.raises(ExternalsError, match="does not take"):
        load_factory("os:getcwd")
    runner = CliRunner()
    result = runner.invoke(app, ["worker", "--nats", "nats://127.0.0.1:9", "--tools", str(AGENTS),
                                 "--externals", "nowhere:Factory"])
    assert result.exit_code == 2 and "cannot import module 'nowhere'" in result.output


def test_the_context_is_frozen_and_keys_are_per_call() -> None:
    ctx = ExecutionContext.of(agent="shop", run_id="r1", call_id="r1/2.0", tool="order", attempt=2,
                              metadata={"user": "ann"})
    assert ctx.idempotency_key(3) == "r1/2.0#3" == call_key("r1", "r1/2.0", 3)
    with pytest.raises(AttributeError):
        ctx.attempt = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        ctx.metadata["user"] = "bob"  # type: ignore[index]


@ASYNC
async def test_a_python_tool_retries_transient_failures_and_times_out_as_values() -> None:
    tries: list[int] = []

    def flaky(n: int) -> int:
        """Fail twice with a connection error, then answer."""
        tries.append(n)
        if len(tries) < 3:
            raise ConnectionError("reset by peer")
        return n * 2

    tool = HostedPythonTool(flaky, ref="m:flaky", retry=RetryPolicy(attempts=3, backoff_s=0.001,
                                                                    on=("ConnectionError",)))
    assert (await tool.execute({"n": 4})).output == 8 and tries == [4, 4, 4]
    tries.clear()
    once = tool.configured(retry=RetryPolicy(attempts=3, on=("TimeoutError",)))
    failed = await once.execute({"n": 4})
    assert failed.error is not None and failed.error.kind == "execution" and tries == [4]
    assert failed.error.message == "ConnectionError: reset by peer"

    async def slow(n: int) -> int:
        """Never answers in time."""
        await anyio.sleep(30)
        return n

    timed = await HostedPythonTool(slow, ref="m:slow", timeout_s=0.05).execute({"n": 1})
    assert timed.error is not None and timed.error.kind == "timeout" and "0.05 s" in timed.error.message


@ASYNC
async def test_http_request_reaches_only_the_granted_hosts(shop: Shop) -> None:
    secrets = Secrets()
    granted = builtin_externals(Grants(http=True, http_hosts=("127.0.0.1",)), tool="t", model=None,
                                sampling={}, secrets=secrets, printed=lambda _: None)
    ok = await granted["http_request"]("GET", shop.url + "/orders/A1")
    assert ok["status"] == 200 and ok["json"] == {"order": "A1", "status": "shipped"}
    with pytest.raises(PermissionError, match=r"'localhost' is not allowed for tool 't'; allowed: 127\.0"):
        await granted["http_request"]("GET", shop.url.replace("127.0.0.1", "localhost") + "/orders/A2")
    assert [p for p, _, _ in shop.requests] == ["/orders/A1"]  # the refused one never left


# ---- on workers ------------------------------------------------------------------------------------------


@ASYNC
async def test_a_pym_external_and_a_python_tool_reach_the_service_from_a_worker(js, shop: Shop,
                                                                                tmp_path: Path) -> None:
    await ensure_topology(js)
    await RunLog(js).create(ev.RunStarted(run_id="r1", seq=0, ts=1.0, input="t", actor="shop",
                                          metadata={"customer": "ann"}))
    registry = build_registry(bundles=[shop_bundle(tmp_path)])
    for j in (job("0.0", "order", {"amount": 5}), job("0.1", "lookup_order", {"order_id": "A17"}),
              job("0.2", "order", {"amount": -1})):
        await js.publish(j.subject, j.encode(), headers=j.headers())
    _, outcomes = await run_worker_until(js, registry, 3, bundle="shop")
    raised = next(o.result.error for o in outcomes if o.call_id == "r1/0.2")
    assert raised is not None and raised.kind == "external" and raised.line == 17  # `paid = charge(amount)`
    assert "external function 'charge' raised ValueError: a charge cannot be negative" in raised.message
    by_tool = {o.tool: o.result for o in outcomes if o.call_id != "r1/0.2"}
    assert by_tool["order"].error is None and by_tool["order"].output == {"charge": "ch-1", "gate": False}
    assert by_tool["lookup_order"].output == {"order": "A17", "status": "shipped"}
    (charged,) = shop.calls("/charge")
    assert charged["Idempotency-Key"] == "r1/0.0#1"
    (body,) = [json.loads(b) for p, _, b in shop.requests if p == "/charge"]
    assert body == {"amount": 5, "run": "r1", "tool": "order", "meta": {"customer": "ann"}, "attempt": 1}
    assert shop.calls("/orders/A17")


@ASYNC
async def test_missing_externals_and_failing_factories_are_error_values_and_the_worker_keeps_serving(
        js, shop: Shop, tmp_path: Path) -> None:
    await ensure_topology(js)
    plain = build_registry(bundles=[shop_bundle(tmp_path / "a", externals=None)])
    broken = build_registry(bundles=[shop_bundle(tmp_path / "b", externals="shopx:broken")])
    for j in (job("0.0", "order", {"amount": 1}), job("0.1", "lookup_order", {"order_id": "B2"})):
        await js.publish(j.subject, j.encode(), headers=j.headers())
    _, outcomes = await run_worker_until(js, plain, 2, bundle="shop")
    by_tool = {o.tool: o.result for o in outcomes}
    err = by_tool["order"].error
    assert err is not None and err.kind == "external" and err.line == 7
    assert "declares @external 'charge', 'gate'" in err.message and "no externals factory" in err.message
    assert by_tool["lookup_order"].output == {"order": "B2", "status": "shipped"}  # still serving
    j = job("1.0", "order", {"amount": 1})
    await js.publish(j.subject, j.encode(), headers=j.headers())
    _, (outcome,) = await run_worker_until(js, broken, 1, bundle="shop")
    assert outcome.result.error is not None and outcome.result.error.kind == "external"
    assert "RuntimeError: the CRM is down" in outcome.result.error.message
    assert shop.calls("/charge") == []


@ASYNC
async def test_kill_9_after_an_answered_external_call_does_not_call_it_again(js, nats_server, shop: Shop,
                                                                            tmp_path: Path) -> None:
    await ensure_topology(js, tool_ack_wait=2.0)
    bundle = str(shop_bundle(tmp_path))
    env_log = tmp_path / "a.log"
    first = start_bundle_worker(nats_server.url, bundle, env_log)
    j = job("3.0", "order", {"amount": 42, "wait": True})
    await js.publish(j.subject, j.encode(), headers=j.headers())
    with anyio.fail_after(30):  # charge answered (and recorded: the script went on), gate in flight
        while not shop.calls("/gate"):
            await anyio.sleep(0.02)
    first.send_signal(signal.SIGKILL)
    assert first.wait(10) == -signal.SIGKILL
    second = start_bundle_worker(nats_server.url, bundle, tmp_path / "b.log")
    try:
        (outcome,) = await collect_outcomes(js, 1, timeout=60, bundle="shop")
    finally:
        assert stop(second) == 0
    assert outcome.result.error is None, outcome.result.error
    assert outcome.attempt == 2 and outcome.result.output == {"charge": "ch-1", "gate": True}
    charges = shop.calls("/charge")
    assert [h["Idempotency-Key"] for h in charges] == ["r1/3.0#1"]  # answered: called once
    gates = shop.calls("/gate")
    assert [h["Idempotency-Key"] for h in gates] == ["r1/3.0#2", "r1/3.0#2"]  # in flight: again, same key
    assert "replayed 1 recorded external call(s), made 1" in (tmp_path / "b.log").read_text()
    assert (await js.stream_info(TOOLS)).state.messages == 0


def start_bundle_worker(url: str, bundle: str, log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "NATS_URL": url}
    cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker", "--bundle", bundle,
           "--concurrency", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))
    deadline = time.monotonic() + 30
    while b"serving" not in log.read_bytes():
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "worker did not start"
        time.sleep(0.02)
    return proc


# ---- built-ins in a run ----------------------------------------------------------------------------------


def summarize_responder(body: dict[str, Any]) -> str:
    """The agent calls summarize, then submits what it said; ask_llm's own prompt gets a summary."""
    last = last_message(body)
    if last.startswith("Summarize in at most"):
        return "Ideas about gardens and bees."
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-120:]})
    return hermes_call("summarize", {"path": "/data/notes/ideas.md", "max_words": 8})


@ASYNC
async def test_summarize_pym_runs_in_a_bundle_on_a_worker_and_its_ask_llm_call_is_recorded(
        js, nats_server, tmp_path: Path) -> None:
    await ensure_topology(js)
    with ScriptedModelServer(responder=summarize_responder) as server:
        folder = tmp_path / "writer"
        folder.mkdir()
        (folder / "submit.pym").write_text(SUBMIT)
        (folder / "bundle.yaml").write_text(
            f"name: writer\nsystem_prompt: You summarise.\n"
            f"model: {{adapter: hermes, base_url: '{server.base_url}', name: scripted}}\n"
            f"tools:\n  - submit.pym\n  - path: {AGENTS / 'summarize.pym'}\n    grants: {{ask_llm: true}}\n"
            "data_provider: {type: static, files: {/data/notes/ideas.md: 'Plant clover. Keep bees.'}}\n"
            "termination: {terminal_tool: submit, max_turns: 4}\n")
        bundle = folder / "bundle.yaml"
        async with running_host(nats_server.url, [bundle], server), \
                running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "writer", "summarise my ideas")
            events = await wait_events(js, run_id)
    assert isinstance(events[-1], ev.RunCompleted), events[-1]
    printed = [e.text for e in ev.expand_all(events) if isinstance(e, ev.ScriptPrinted)]  # in the outcome
    assert any(t.startswith("ask_llm #1") and "Ideas about gardens and bees." in t for t in printed), printed
    done = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "summarize")
    assert done.output == {"path": "/data/notes/ideas.md", "summary": "Ideas about gardens and bees.",
                           "words": 5}
    asked = [r for r in server.requests if last_message(r).startswith("Summarize in at most 8 words")]
    assert len(asked) == 1


LEAK = '''\
"""Call the shop with the token, and (carelessly) print and return it."""
from grail import external, Input

url: str = Input("url")


@external
def secret(name: str) -> str:
    ...


@external
async def http_request(method: str, url: str, *, headers: dict | None = None) -> dict:
    ...


token = secret("SHOP_TOKEN")
resp = await http_request("GET", url + "/whoami", headers={"Authorization": "Bearer " + token})
print("using token", token)
{"status": resp["status"], "token": token}
'''

SECRET = "s3cr3t-Value-9f8e7d"


def leak_responder(body: dict[str, Any]) -> str:
    last = last_message(body)
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-200:]})
    url = next(m["content"] for m in body["messages"] if m["role"] == "user").split()[-1]
    return hermes_call("leak", {"url": url})


@ASYNC
async def test_a_secret_used_by_a_tool_appears_in_no_event_job_outcome_or_log(
        js, nc, nats_server, shop: Shop, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("SHOP_TOKEN", SECRET)
    await ensure_topology(js)
    wire: list[bytes] = []

    async def keep(msg: Any) -> None:
        wire.append(msg.data + repr(msg.headers).encode())

    subs = [await nc.subscribe(s, cb=keep) for s in ("tools.>", "results.>", "agents.>", "events.>")]
    with ScriptedModelServer(responder=leak_responder) as server:
        folder = tmp_path / "leaky"
        folder.mkdir()
        (folder / "submit.pym").write_text(SUBMIT)
        (folder / "leak.pym").write_text(LEAK)
        (folder / "bundle.yaml").write_text(
            f"name: leaky\nsystem_prompt: You call the shop.\n"
            f"model: {{adapter: hermes, base_url: '{server.base_url}', name: scripted}}\n"
            "tools:\n  - submit.pym\n  - path: leak.pym\n"
            "    grants: {secrets: [SHOP_TOKEN], http_request: {hosts: [127.0.0.1]}}\n"
            "termination: {terminal_tool: submit, max_turns: 4}\n")
        bundle = folder / "bundle.yaml"
        async with running_host(nats_server.url, [bundle], server), \
                running_worker(nats_server.url, [bundle]):
            run_id = await publish_task(js, "leaky", f"call the shop at {shop.url}")
            events = await wait_events(js, run_id)
        model_saw = json.dumps(server.requests)
    for s in subs:
        await s.unsubscribe()
    assert isinstance(events[-1], ev.RunCompleted), events[-1]
    (used,) = shop.calls("/whoami")
    assert used["Authorization"] == f"Bearer {SECRET}"  # the secret did its job
    done = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "leak")
    assert done.output == {"status": 200, "token": "[secret]"}
    stored = await stream_bytes(js, EVENTS)
    assert stored and SECRET.encode() not in stored
    assert wire and not any(SECRET.encode() in m for m in wire)
    assert SECRET not in caplog.text and SECRET not in model_saw
    assert "[secret]" in caplog.text or any(b"[secret]" in m for m in wire)


async def wait_events(js: Any, run_id: str, timeout: float = 60.0) -> list[ev.Event]:
    out: list[ev.Event] = []
    with anyio.fail_after(timeout):
        async for e in RunLog(js).follow(run_id):
            out.append(e)
    return out


async def stream_bytes(js: Any, stream: str) -> bytes:
    """Every stored message of `stream`, raw, concatenated."""
    info = await js.stream_info(stream)
    data = b""
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(stream, seq)
        except Exception:
            continue
        data += (msg.data or b"") + repr(msg.headers).encode()
    return data

