"""Regressions over recorded runs, end to end: runs of the shipped `bundles/shop` recorded by a real host and
worker on real NATS (the shop's own stand-in service behind its Python tool and its refund external, a
scripted model server), then driven again on candidates that change the system prompt, a tool's approval rule
and the model's answers. The report must name exactly the runs that changed, each with its first divergence;
nothing reaches the shop during a regression; a second regression of the same set asks the model nothing and
reports the same; bad input is refused with nothing written."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import calc_responder, running_host, running_worker, write_bundle

from runtime import events as ev
from runtime.bundle import load_bundle
from runtime.client import Client
from runtime.client.verify import verify
from runtime.host import HostConfig
from runtime.log import RunLog
from runtime.nats.kv import workspace_kv
from runtime.regress import ExactMatch, JsonSchema, PymGrader, RegressError, Report
from runtime.testing import ScriptedModelServer, hermes_call

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).parents[2]
SHOP, RESEARCHER = ROOT / "bundles" / "shop", ROOT / "bundles" / "researcher"
N = 24  # recorded runs: every third a refund of 5, the others a look-up


def task_of(body: dict[str, Any]) -> str:
    return next(m["content"] for m in body["messages"] if m["role"] == "user")


def turn_of(body: dict[str, Any]) -> int:
    return sum(m["role"] == "assistant" for m in body["messages"])


def order_of(task: str) -> str:
    m = re.search(r"\b(O\d+)\b", task)
    assert m, task
    return m.group(1)


def answer(task: str) -> str:
    order = order_of(task)
    return f"refunded 5 for {order}" if task.startswith("refund") else f"{order} was delivered broken"


def source_model(body: dict[str, Any]) -> str:
    """The model the runs were recorded with: look the order up, refund 5 if asked, answer."""
    task, turn = task_of(body), turn_of(body)
    order = order_of(task)
    if turn == 0:
        return hermes_call("lookup_order", {"order_id": order})
    if turn == 1 and task.startswith("refund"):
        return hermes_call("refund", {"order_id": order, "amount": 24.5 if "in full" in task else 5})
    return hermes_call("final_answer", {"answer": answer(task)})


def changed(n: int) -> bool:
    return n % 8 == 1


def brief_model(body: dict[str, Any]) -> str:
    """Told to be brief (the candidate's prompt), it answers some tasks (`changed`) in fewer words."""
    system, task = body["messages"][0]["content"], task_of(body)
    n = int(order_of(task)[1:])
    reply = source_model(body)
    if "Be brief." in system and changed(n) and "final_answer" in reply:
        return hermes_call("final_answer", {"answer": f"{order_of(task)}: broken"})
    return reply


def other_model(body: dict[str, Any]) -> str:
    """Another model: it looks up the wrong order for some tasks, refunds 6 instead of 5 for others."""
    task, turn = task_of(body), turn_of(body)
    n = int(order_of(task)[1:])
    if turn == 0 and n % 8 == 2:
        return hermes_call("lookup_order", {"order_id": f"X{n}"})
    if turn == 1 and task.startswith("refund") and n % 6 == 3:
        return hermes_call("refund", {"order_id": order_of(task), "amount": 6})
    return source_model(body)


@dataclass
class Shop:
    calls: list[tuple[str, str]]
    module: Any


@pytest.fixture(scope="module")
def shop() -> Iterator[Shop]:
    """The shop bundle's own stand-in service, every request it serves counted."""
    spec = importlib.util.spec_from_file_location("shop_service_regress", SHOP / "service.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    calls: list[tuple[str, str]] = []

    class Counting(module.Handler):  # type: ignore[name-defined,misc]
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            calls.append(("GET", self.path))
            super().do_GET()

        def do_POST(self) -> None:
            calls.append(("POST", self.path))
            super().do_POST()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Counting)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    mp = pytest.MonkeyPatch()
    mp.setenv("SHOP_URL", f"http://127.0.0.1:{server.server_address[1]}")
    try:
        yield Shop(calls, module)
    finally:
        mp.undo()
        server.shutdown()


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@dataclass
class Recorded:
    url: str
    runs: dict[int, str]  # task number -> its recorded run
    other: str  # a run of another agent (the researcher)
    split: float  # the N runs ended before this time, the thread's runs after it
    thread: tuple[str, str]  # two runs of one conversation
    approved: str  # a refund over 20 that alice approved for 20 (after `split`, after the thread's runs)


@pytest.fixture(scope="module")
async def recorded(nats_server: Any, shop: Shop) -> AsyncIterator[Recorded]:
    """N runs of the shop recorded by a real host and worker, with their ground truth in the task metadata."""
    url = nats_server.url
    with ScriptedModelServer(responder=source_model) as server:
        async with running_host(url, [SHOP, RESEARCHER], server), running_worker(url, [SHOP, RESEARCHER]):
            async with await Client.connect(url) as client:
                runs: dict[int, str] = {}
                for n in range(N):
                    task = f"refund order O{n}" if n % 3 == 0 else f"look order O{n} up"
                    handle = await client.start("shop", task, metadata={"expected": {"answer": answer(task)}})
                    assert (await handle.result(timeout=60))["answer"] == answer(task)
                    runs[n] = handle.run_id
                with anyio.fail_after(20):  # the host indexes a run just after its ending is in the log
                    while sum(r.status == "completed" for r in await client.runs("shop")) < N:
                        await anyio.sleep(0.05)
                split = time.time()
                thread = []
                for n in (100, 101):  # the second run goes on from the first's conversation
                    handle = await client.start("shop", f"look order O{n} up", thread="th")
                    await handle.result(timeout=60)
                    thread.append(handle.run_id)
                approved = await client.start("shop", "refund order O50 in full")
                with anyio.fail_after(20):
                    while not (waiting := await approved.approvals()):
                        await anyio.sleep(0.05)
                await approved.approve(waiting[0].call_id, arguments={"order_id": "O50", "amount": 20},
                                       by="alice")
                await approved.result(timeout=60)
                server.responder = lambda body: hermes_call("final_answer", {"answer": "tea"})
                other = await client.start("researcher", "what is tea?")
                await other.result(timeout=60)
    assert sum(method == "POST" for method, _ in shop.calls) == N // 3 + 1  # the refunds reached the shop
    yield Recorded(url, runs, other.run_id, split, (thread[0], thread[1]), approved.run_id)


async def written(client: Client) -> tuple[int, list[str]]:
    """How many events the log holds, and which streams (KV buckets among them) exist."""
    return ((await client.js.stream_info("EVENTS")).state.messages,
            sorted(i.config.name for i in await client.js.streams_info()))


def by_source(report: Report) -> dict[str, Any]:
    return {row.source_run: row for row in report.rows}


def comparable(report: Report) -> dict[str, Any]:
    """The report without what differs between two regressions of the same set (new run ids, wall times)."""
    out = report.to_json()
    out.pop("model_calls"), out.pop("cached")
    for row in out["rows"]:
        row.pop("run_id")
        for side in ("source", "candidate"):
            if row[side]:
                row[side].pop("wall_s"), row[side].pop("run_id")
    return out


async def test_same_candidate_changes_nothing_touches_nothing_and_the_second_time_asks_no_model(
        recorded: Recorded, shop: Shop) -> None:
    before = len(shop.calls)
    with ScriptedModelServer(responder=source_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", until=recorded.split, save="all-shop",
                                          base_url=server.base_url, model="scripted",
                                          graders=[ExactMatch("expected")])
            first_calls = len(server.requests)
            again = await client.regress(SHOP, set_name="all-shop", base_url=server.base_url,
                                         model="scripted", graders=[ExactMatch("expected")])
            assert len(server.requests) == first_calls  # the second regression asked the model nothing
            regression_run = report.rows[0].run_id
            assert regression_run is not None
            history = await RunLog(client.js).read(regression_run)
            indexed = {r.run_id for r in await client.runs("shop")}
            diff = await client.diff(report.rows[0].source_run, regression_run)  # `sa replay --diff`
            purged = await client.log.purge([regression_run])
    assert len(shop.calls) == before  # no look-up, no refund reached the shop
    assert sorted(r.source_run for r in report.rows) == sorted(recorded.runs.values())
    assert {r.verdict for r in report.rows} == {"same"}, [(r.verdict, r.diverged_at) for r in report.rows]
    assert report.pass_rate("source") == report.pass_rate("candidate") == 1.0
    assert not report.regressions and not report.fixes
    assert first_calls == report.model_calls == sum(3 if n % 3 == 0 else 2 for n in range(N))
    assert again.model_calls == 0 and again.cached == report.model_calls
    assert comparable(again) == comparable(report)
    # a regression run is a run in the log, marked, and never in the production index
    first = history.events[0]
    assert isinstance(first, ev.RunStarted) and first.regression is not None
    assert first.regression.source_run == report.rows[0].source_run and first.regression.set == "all-shop"
    assert first.task_id is None and regression_run not in indexed
    assert diff.identical and diff.common == len(history.events)
    assert verify(load_bundle(SHOP).kernel_config(), history.events).ok  # `sa replay RUN --verify --bundle`
    assert purged[0].deleted and purged[0].events == len(history.events)  # purged by id like any run
    assert all(r.served >= 2 and r.ran == r.refused == 0 for r in report.rows)


async def test_a_prompt_change_names_exactly_the_runs_whose_answer_changed(recorded: Recorded,
                                                                          shop: Shop) -> None:
    before = len(shop.calls)
    with ScriptedModelServer(responder=brief_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", until=recorded.split, system_prompt="Be brief.",
                                          base_url=server.base_url, model="scripted",
                                          graders=[ExactMatch("expected")], concurrency=6)
            sources = {run: (await client.log.read(run)).events for run in recorded.runs.values()}
    assert len(shop.calls) == before
    rows = by_source(report)
    want = {recorded.runs[n] for n in range(N) if changed(n)}
    assert {run for run, row in rows.items() if row.verdict != "same"} == want
    for run in want:
        row = rows[run]
        answered = [e.seq for e in sources[run] if isinstance(e, ev.ModelResponded)][-1]
        assert (row.verdict, row.diverged_at) == ("different-output", answered)
        assert row.change == "regression" and row.source_pass and not row.candidate_pass
    assert {r.source_run for r in report.regressions} == want and not report.fixes
    assert report.pass_rate("candidate") == 1 - len(want) / N


async def test_a_stricter_approval_rule_is_denied_for_want_of_a_recorded_verdict(
        recorded: Recorded, shop: Shop, tmp_path: Path) -> None:
    candidate = tmp_path / "shop"
    shutil.copytree(SHOP, candidate)
    text = (candidate / "bundle.yaml").read_text()
    text = text.replace("value: 20}", "value: 2}").replace("../../agents/summarize.pym",
                                                          str(ROOT / "agents" / "summarize.pym"))
    (candidate / "bundle.yaml").write_text(text)
    before = len(shop.calls)
    with ScriptedModelServer(responder=source_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(candidate, agent="shop", until=recorded.split,
                                          base_url=server.base_url, model="scripted",
                                          graders=[JsonSchema({"type": "object", "required": ["answer"]})])
            sources = {run: (await client.log.read(run)).events for run in recorded.runs.values()}
            denied = {row.source_run: (await client.log.read(row.run_id)).events for row in report.rows
                      if row.run_id and row.verdict != "same"}
    assert len(shop.calls) == before
    refunds = {recorded.runs[n] for n in range(N) if n % 3 == 0}
    assert set(denied) == refunds
    for run, events in denied.items():
        row = by_source(report)[run]
        refund_reply = [e.seq for e in sources[run] if isinstance(e, ev.ModelResponded)][1]
        # the same reply asked for the refund; the candidate's rule then asked for an approval instead of
        # calling it, and nobody recorded a verdict for it: denied; the scripted model answers the same
        assert (row.verdict, row.diverged_at) == ("diverged", refund_reply + 1)
        asked = next(e for e in events if e.seq == refund_reply + 1)
        assert isinstance(asked, ev.ApprovalRequested) and asked.call.name == "refund"
        assert any(isinstance(e, ev.ApprovalDenied) and "no recorded verdict" in e.reason for e in events)
    assert report.pass_rate("candidate") == 1.0 and not report.regressions


async def test_another_model_is_served_what_was_recorded_and_refused_what_was_not(
        recorded: Recorded, shop: Shop, tmp_path: Path) -> None:
    same_order = tmp_path / "same_order.pym"
    same_order.write_text('"""X12 is O12."""\nfrom grail import Input\n\nrecorded: dict = Input("recorded")\n'
                          'candidate: dict = Input("candidate")\n\n'
                          'recorded["order_id"][1:] == candidate["order_id"][1:]\n')
    before = len(shop.calls)
    with ScriptedModelServer(responder=other_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", until=recorded.split, base_url=server.base_url,
                                          model="scripted", graders=[ExactMatch("expected")])
            stopped = await client.regress(SHOP, agent="shop", base_url=server.base_url, model="scripted",
                                           rules={"lookup_order": "diverge"}, runs=[recorded.runs[2]])
            ignored = await client.regress(SHOP, agent="shop", base_url=server.base_url, model="scripted",
                                           ignore={"lookup_order": ["order_id"]}, runs=[recorded.runs[2]])
            matched = await client.regress(SHOP, agent="shop", base_url=server.base_url, model="scripted",
                                           match={"lookup_order": same_order}, runs=[recorded.runs[2]])
            events = {row.source_run: (await client.log.read(row.run_id)).events for row in report.rows
                      if row.run_id and row.verdict != "same"}
    assert len(shop.calls) == before  # a wrong look-up and a refund of 6 never reached the shop
    wrong_lookup = {recorded.runs[n] for n in range(N) if n % 8 == 2}
    other_refund = {recorded.runs[n] for n in range(N) if n % 3 == 0 and n % 6 == 3}
    rows = by_source(report)
    assert {run for run, row in rows.items() if row.verdict != "same"} == wrong_lookup | other_refund
    for run in wrong_lookup:  # the first reply differs (seq 2); the Python tool is refused, not called
        assert (rows[run].diverged_at, rows[run].refused, rows[run].unmatched) == (2, 1, ["lookup_order"])
        failed = next(e for e in events[run] if isinstance(e, ev.ToolFailed))
        assert failed.tool == "lookup_order" and "no recorded result exists" in failed.error.message
    for run in other_refund:  # the refund script ran here, and its external refused to reach the shop
        assert rows[run].ran == 1
        failed = next(e for e in events[run] if isinstance(e, ev.ToolFailed))
        assert failed.tool == "refund" and failed.error.kind == "external"
        assert "does not reach the world" in failed.error.message
    row = stopped.rows[0]
    assert (row.verdict, row.diverged_at) == ("diverged", 2) and row.candidate is not None
    assert row.candidate.status == "cancelled" and "lookup_order" in row.detail
    # with the order id left out of the comparison, the wrong look-up is the recorded one: served, not refused
    for row in (ignored.rows[0], matched.rows[0]):  # ... or a .pym matcher calls it the same
        assert (row.served, row.refused, row.verdict, row.diverged_at) == (2, 0, "diverged", 2)


async def test_a_pym_grader_grades_both_sides(recorded: Recorded, tmp_path: Path) -> None:
    grader = tmp_path / "short.pym"
    grader.write_text('"""Pass answers under 20 characters."""\nfrom grail import Input\n\n'
                      'output: dict = Input("output")\n\n'
                      '{"pass": len(output["answer"]) < 20, "reason": "too long"}\n')
    with ScriptedModelServer(responder=brief_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", until=recorded.split, system_prompt="Be brief.",
                                          base_url=server.base_url, model="scripted",
                                          graders=[PymGrader.load(grader)])
    fixed = {recorded.runs[n] for n in range(N) if changed(n) and len(answer(f"look order O{n} up")) >= 20
             and n % 3}
    assert fixed and {r.source_run for r in report.fixes} == fixed

    crashing = tmp_path / "crashing.pym"
    crashing.write_text('"""Crash on refunds."""\nfrom grail import Input\n\n'
                        'output: dict = Input("output")\n\n'
                        'if output["answer"].startswith("refunded"):\n'
                        '    raise ValueError("no refunds here")\nTrue\n')
    with ScriptedModelServer(responder=source_model) as server:
        async with await Client.connect(recorded.url) as client:
            crashed = await client.regress(SHOP, agent="shop", runs=[recorded.runs[0], recorded.runs[1]],
                                           base_url=server.base_url, model="scripted",
                                           graders=[PymGrader.load(crashing)])
    refund, lookup = crashed.rows
    assert refund.grader_errors and all("grader crashing failed: " in e and "no refunds here" in e
                                        for e in refund.grader_errors)
    assert not refund.source_pass and not refund.candidate_pass and not lookup.grader_errors
    assert crashed.grader_errors[0].startswith(recorded.runs[0])
    with pytest.raises(RegressError, match=r"the grader \S+ does not load"):
        broken = tmp_path / "broken.pym"
        broken.write_text("def (:\n")
        PymGrader.load(broken)


async def test_bad_input_is_refused_and_nothing_is_written(recorded: Recorded, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "bundle.yaml").write_text("name: shop\nsystem_prompt: hi\ntools: [nothing.pym]\n")
    async with await Client.connect(recorded.url) as client:
        before = await written(client)
        with pytest.raises(RegressError, match="no run 'r-nope'"):
            await client.regress(SHOP, agent="shop", runs=["r-nope"])
        with pytest.raises(RegressError, match="belongs to agent 'researcher', not 'shop'"):
            await client.regress(SHOP, agent="shop", runs=[recorded.runs[0], recorded.other])
        with pytest.raises(RegressError, match=r"the candidate bundle at \S+ does not load"):
            await client.regress(broken, agent="shop", runs=[recorded.runs[0]], save="never")
        with pytest.raises(RegressError, match="no saved set 'nope'"):
            await client.regress(SHOP, set_name="nope")
        with pytest.raises(RegressError, match="--ignore/--match name tool 'nope'"):
            await client.regress(SHOP, agent="shop", runs=[recorded.runs[0]], base_url="http://127.0.0.1:9/v1",
                                 ignore={"nope": ["x"]})
        with pytest.raises(RegressError, match="unknown rule"):
            await client.regress(SHOP, agent="shop", runs=[recorded.runs[0]], base_url="http://127.0.0.1:9/v1",
                                 rules={"refund": "maybe"})
        assert await written(client) == before  # no run, no set, no bucket
        with pytest.raises(RegressError, match="no saved set 'never'"):
            await client.regress(SHOP, set_name="never")


def sa(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    env.update(NATS_URL=url, XDG_DATA_HOME="/nonexistent-sa-test", COLUMNS="250")
    return subprocess.run([sys.executable, "-c", "from runtime.cli import main; main()", "regress", *args],
                          env=env, capture_output=True, text=True, timeout=120)


async def test_sa_regress_prints_the_table_and_gates_on_regressions(recorded: Recorded,
                                                                    tmp_path: Path) -> None:
    one, two = recorded.runs[1], recorded.runs[2]  # the brief model answers task 1 otherwise, task 2 the same
    with ScriptedModelServer(responder=brief_model) as server:
        common = ["--system", "Be brief.", "--model-url", server.base_url, "--model", "scripted",
                  "--expected", "expected"]
        gated = await anyio.to_thread.run_sync(lambda: sa(
            str(SHOP), "--agent", "shop", "--run", one, "--run", two, "--save", "cli-set", *common,
            "--html", str(tmp_path / "cli.html"), url=recorded.url))
        allowed = await anyio.to_thread.run_sync(lambda: sa(
            str(SHOP), "--set", "cli-set", "--max-regressions", "1", "--json", *common, url=recorded.url))
        unknown = await anyio.to_thread.run_sync(lambda: sa(
            str(SHOP), "--agent", "shop", "--run", "r-nope", *common, url=recorded.url))
        both = await anyio.to_thread.run_sync(lambda: sa(
            str(SHOP), "--set", "cli-set", "--local", "--fleet", *common, url=recorded.url))
    assert gated.returncode == 1, gated.stderr
    lines = {line.split()[1]: line for line in gated.stdout.splitlines() if line.startswith("│")}
    assert "different-output" in lines[one] and "regression" in lines[one] and "same" in lines[two]
    assert f"regressions: {one}" in gated.stdout and "; set cli-set" in gated.stdout
    page = (tmp_path / "cli.html").read_text()  # `--html`: the same report as one page
    assert f'id="run-{one}"' in page and f'id="run-{two}"' not in page and two in page  # `two` is the same
    assert allowed.returncode == 0, allowed.stderr
    report = json.loads(allowed.stdout)
    assert report["regressions"] == [one] and report["counts"]["same"] == 1 and report["model_calls"] == 0
    assert report["tokens"]["candidate"] == sum(r["candidate"]["tokens"] for r in report["rows"]) > 0
    assert unknown.returncode == 2 and "sa regress: no run 'r-nope'" in unknown.stderr
    assert both.returncode == 2 and "--local and --fleet say opposite things" in both.stderr
    assert ", driven here:" in gated.stdout  # no host takes regression jobs: driven by `sa regress` itself


async def test_a_run_in_a_thread_goes_on_from_its_recorded_conversation(recorded: Recorded) -> None:
    first, second = recorded.thread
    with ScriptedModelServer(responder=source_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", runs=recorded.thread, base_url=server.base_url,
                                          model="scripted")
            started = (await client.log.read(by_source(report)[second].run_id)).events[0]
    assert [r.source_run for r in report.rows] == [first, second]
    assert [r.verdict for r in report.rows] == ["same", "same"]
    assert isinstance(started, ev.RunStarted) and started.previous_run == first and started.thread is None


async def test_a_script_without_a_recorded_result_writes_only_to_the_regressions_own_workspace(
        recorded: Recorded, tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, "notes", tools=("note",),
                          extra="data_provider: workspace\nworkspace: wsn\n")
    url = recorded.url
    with ScriptedModelServer(responder=calc_responder) as server:
        async with running_host(url, [bundle], server), running_worker(url, [bundle]):
            async with await Client.connect(url) as client:
                runs = []
                for line in ("a", "b"):
                    handle = await client.start("notes", f"note: {line}")
                    await handle.result(timeout=60)
                    runs.append(handle.run_id)
                ws = await workspace_kv(client.js, "wsn")
                before = await ws.get("log.txt")
    assert before.value == b"a\nb\n"

    def twice(body: dict[str, Any]) -> str:  # notes two other lines, then submits what the tool said
        done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
        if done < 2:
            return hermes_call("note", {"line": f"x{done}", "spin": 0})
        return calc_responder(body)

    with ScriptedModelServer(responder=twice) as server:
        async with await Client.connect(url) as client:
            report = await client.regress(bundle, agent="notes", runs=runs, base_url=server.base_url,
                                          model="scripted")
            events = (await client.log.read(report.rows[1].run_id)).events
            after = await (await workspace_kv(client.js, "wsn")).get("log.txt")
    assert (after.value, after.revision) == (before.value, before.revision)  # nothing applied there
    # two notes run here in each; the submit of "2" lines is served where the source also submitted 2
    assert [(r.ran, r.served) for r in report.rows] == [(3, 0), (2, 1)]
    written = [e.output["writes"][0]["content"] for e in events if isinstance(e, ev.ToolCompleted)
               and e.tool == "note"]
    assert written == ["x0\n", "x0\nx1\n"]  # the second call read the first's write, in the scratch only


async def test_a_recorded_verdict_is_given_again_with_the_approvers_edit(recorded: Recorded,
                                                                         shop: Shop) -> None:
    before = len(shop.calls)
    with ScriptedModelServer(responder=source_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", since=recorded.split, outcome="completed",
                                          base_url=server.base_url, model="scripted")
            events = (await client.log.read(by_source(report)[recorded.approved].run_id)).events
    assert len(shop.calls) == before
    assert [r.source_run for r in report.rows] == [*recorded.thread, recorded.approved]  # the time window
    assert {r.verdict for r in report.rows} == {"same"}
    granted = next(e for e in events if isinstance(e, ev.ApprovalGranted))
    assert granted.by == "alice" and granted.arguments == {"order_id": "O50", "amount": 20}
    refunded = next(e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "refund")
    assert refunded.output["amount"] == 20  # the edited call, served from the log


def asking(question: str) -> Any:
    """A model that asks a person `question`, then submits what they answered."""
    def model(body: dict[str, Any]) -> str:
        last = str(body["messages"][-1].get("content"))
        if "<tool_response>" not in last:
            return hermes_call("ask_human", {"question": question})
        said = re.search(r'"answer": "([^"]*)"', last) or re.search(r"(no recorded answer)", last)
        return hermes_call("submit", {"answer": said.group(1) if said else last[-40:]})
    return model


async def test_a_recorded_answer_is_given_again_and_a_new_question_gets_none(recorded: Recorded,
                                                                             tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, "asker", tools=(), extra="questions: {}\n")
    url = recorded.url
    with ScriptedModelServer(responder=asking("Which colour?")) as server:
        async with running_host(url, [bundle], server), running_worker(url, [bundle]):
            async with await Client.connect(url) as client:
                handle = await client.start("asker", "paint it")
                with anyio.fail_after(20):
                    while not (asked := await client.questions("asker")):
                        await anyio.sleep(0.05)
                await client.answer(handle.run_id, asked[0].call_id, "blue")
                assert (await handle.result(timeout=60)) == {"answer": "blue"}
    for question, verdict, output in (("Which colour?", "same", {"answer": "blue"}),
                                      ("Which size?", "different-output", {"answer": "no recorded answer"})):
        with ScriptedModelServer(responder=asking(question)) as server:
            async with await Client.connect(url) as client:
                report = await client.regress(bundle, agent="asker", runs=[handle.run_id],
                                              base_url=server.base_url, model="scripted")
        row = report.rows[0]
        assert row.verdict == verdict and row.candidate is not None and row.candidate.output == output
    with ScriptedModelServer(responder=asking("Which size?")) as server:
        async with await Client.connect(url) as client:
            stopped = await client.regress(bundle, agent="asker", runs=[handle.run_id],
                                           base_url=server.base_url, model="scripted",
                                           rules={"ask_human": "diverge"})
    row = stopped.rows[0]
    assert row.verdict == "diverged" and row.candidate is not None and row.candidate.status == "cancelled"


async def test_a_candidate_whose_run_fails_is_reported_failed_with_the_reason(recorded: Recorded) -> None:
    from runtime.testing import Reply

    with ScriptedModelServer(responder=lambda body: Reply.error(400, "no such model")) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", runs=[recorded.runs[1]],
                                          base_url=server.base_url, model="scripted")
            events = (await client.log.read(report.rows[0].run_id)).events
    row = report.rows[0]
    assert (row.verdict, row.diverged_at, row.change) == ("failed", 2, "regression")
    assert row.candidate is not None and row.candidate.status == "failed"
    assert row.detail == "2 errors in a row (limit 2)"  # the run's own failure, as its log says
    assert any(isinstance(e, ev.ModelFailed) and "no such model" in e.error for e in events)
    assert report.model_calls == 2 and report.cached == 0  # an error is asked again, never cached


HOSTILE = "<script>alert('pwned')</script></td></table><img src=https://evil.example/x>"


def hostile_model(body: dict[str, Any]) -> str:
    """Answers task 1 with markup (a reply is data, never the page's HTML), the others as recorded."""
    reply = source_model(body)
    if order_of(task_of(body)) == "O1" and "final_answer" in reply:
        return hermes_call("final_answer", {"answer": HOSTILE})
    return reply


class Page(HTMLParser):
    """What a browser would see of the report: its text by element id and class, tags and attributes."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.verdicts: list[str] = []
        self.seqs: list[str] = []
        self._in: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in.append(dict(attrs).get("class") or "")

    def handle_endtag(self, tag: str) -> None:
        if self._in:
            self._in.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        where = self._in[-1] if self._in else ""
        if "verdict" in where.split():
            self.verdicts.append(data)
        if where == "seq":
            self.seqs.append(data)


async def test_the_html_report_shows_each_changed_run_beside_its_source_and_escapes_what_runs_said(
        recorded: Recorded, tmp_path: Path) -> None:
    from runtime.regress import report_html

    chosen = [recorded.runs[1], recorded.runs[2], recorded.runs[3]]
    with ScriptedModelServer(responder=hostile_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", runs=chosen, base_url=server.base_url,
                                          model="scripted", graders=[ExactMatch("expected")])
            page = await report_html(client.js, report)
            source = (await client.log.read(recorded.runs[1])).events
    (tmp_path / "report.html").write_text(page)
    if os.environ.get("SA_KEEP_REPORT"):
        Path(os.environ["SA_KEEP_REPORT"]).write_text(page)
    row = by_source(report)[recorded.runs[1]]
    answered = [e.seq for e in source if isinstance(e, ev.ModelResponded)][-1]
    assert (row.verdict, row.diverged_at, row.change) == ("different-output", answered, "regression")
    parsed = Page()
    parsed.feed(page)
    text = "".join(parsed.text)
    for r in report.rows:  # every run id, source and regression, is on the page
        assert r.source_run in text and r.run_id is not None and r.run_id in text
    assert [r.verdict for r in report.rows] == ["different-output", "same", "same"]
    assert parsed.verdicts == ["different-output"]  # a section for the run that changed, a row for each
    assert parsed.seqs == [str(answered)]  # the one run that changed, and where
    assert "pass rate" in text and "source 100% → candidate 67%" in text
    assert "<script" not in page.lower() and HOSTILE in text  # the reply is text on the page, escaped
    assert not [t for t, a in parsed.tags if t in ("script", "img", "link", "iframe")]
    assert all(a["href"].startswith("#") for t, a in parsed.tags if t == "a" and a.get("href"))  # in-page
    csp = next(a["content"] for t, a in parsed.tags if t == "meta" and a.get("http-equiv"))
    assert csp is not None and csp.startswith("default-src 'none'")
    # the timelines side by side: the source's reply and the candidate's, at the first divergence
    first = page.split('class=first>', 1)[1].split("</tr>", 1)[0]
    assert f'<td class="n">{answered}</td>' in first and first.count("model.responded") == 2


async def test_the_inspector_lists_saved_reports_and_shows_each_run_beside_its_regression(
        recorded: Recorded) -> None:
    import httpx
    from ui_helpers import serving

    from runtime.ui.app import create_app

    one, two = recorded.runs[1], recorded.runs[2]
    with ScriptedModelServer(responder=brief_model) as server:
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", runs=[one, two], save="ui-set",
                                          system_prompt="Be brief.", base_url=server.base_url,
                                          model="scripted", graders=[ExactMatch("expected")])
    async with await Client.connect(recorded.url) as app_client, \
            serving(create_app(client=app_client)) as base, \
            httpx.AsyncClient(base_url=base, timeout=30) as http:
        listed = (await http.get("/api/regressions")).json()
        got = await http.get(f"/api/regressions/{report.id}")
        page = await http.get(f"/regressions/{report.id}")
        index_page = await http.get("/regressions")
        missing = await http.get("/api/regressions/20200101T000000-000-nope")
        bad = await http.get("/api/regressions/a.b")
        regression_run = (await http.get(f"/api/runs/{by_source(report)[one].run_id}")).json()
        if os.environ.get("SA_SHOT"):  # a look as a person would: SA_SHOT=/tmp/x pytest -k inspector
            for name, path in (("list", "/regressions"), ("one", f"/regressions/{report.id}")):
                await anyio.run_process(["chromium", "--headless", "--no-sandbox", "--disable-gpu",
                                         "--virtual-time-budget=4000", "--window-size=1400,700",
                                         f"--screenshot={os.environ['SA_SHOT']}-{name}.png", base + path],
                                        check=False)
    assert report.id and report.id in [r["id"] for r in listed["reports"]]
    summary = next(r for r in listed["reports"] if r["id"] == report.id)
    assert (summary["set"], summary["runs"], summary["regressions"]) == ("ui-set", 2, [one])
    assert "rows" not in summary
    assert {"name": "ui-set", "agent": "shop", "runs": 2} == {k: v for k, v in next(
        s for s in listed["sets"] if s["name"] == "ui-set").items() if k != "created"}
    saved = got.json()
    assert [(r["source_run"], r["run_id"], r["verdict"], r["diverged_at"]) for r in saved["rows"]] == [
        (r.source_run, r.run_id, r.verdict, r.diverged_at) for r in report.rows]
    assert saved["rows"][0]["change"] == "regression" and saved["rows"][1]["verdict"] == "same"
    assert page.status_code == 200 and "/static/regression.js" in page.text
    assert index_page.status_code == 200 and "/static/regressions.js" in index_page.text
    assert missing.status_code == 404 and "no saved report" in missing.json()["error"]
    assert bad.status_code == 404 and "not a report id" in bad.json()["error"]
    assert regression_run["events"][0]["kind"] == "run.started"  # its own timeline page reads it


def judge_bundle(tmp_path: Path, url: str, *, junk: bool = False) -> Path:
    """The shipped judge on the scripted model at `url`; `junk`: its terminal tool returns another shape."""
    judge = tmp_path / ("junk-judge" if junk else "judge")
    shutil.copytree(ROOT / "bundles" / "judge", judge)
    text = (judge / "bundle.yaml").read_text().replace("base_url: local", f"base_url: {url}")
    text = text.replace("deadline: 5m}", "deadline: 5m, max_consecutive_errors: 1}")
    text = text.replace("strategy: ebnf", "strategy: none")  # no grammar to compile: verdicts are the point
    (judge / "bundle.yaml").write_text(text.replace("name: smollm2-135m-instruct", "name: scripted"))
    if junk:
        script = (judge / "verdict.pym").read_text()
        (judge / "verdict.pym").write_text(script.replace('{"better": better, "why": why.strip()}',
                                                          '{"verdict": better}'))
    return judge


def judge_model(body: dict[str, Any]) -> Any:
    """A judge: prefers the source's answer for task 1, is down for task 17, says `same` otherwise."""
    from runtime.testing import Reply

    prompt = task_of(body)
    candidate = prompt.split("The candidate output (now):", 1)[1]
    if "O17:" in candidate:
        return Reply.error(400, "the judge's model refuses")
    better = "source" if "O1:" in candidate else "same"
    return hermes_call("verdict", {"better": better, "why": f"judged {order_of(prompt)}"})


async def test_a_judge_agent_grades_the_candidate_against_the_source_and_its_failures_are_grader_errors(
        recorded: Recorded, tmp_path: Path) -> None:
    from runtime.cli.regress_cmds import _graders
    from runtime.regress import JudgeGrader

    chosen = [recorded.runs[1], recorded.runs[2], recorded.runs[17]]
    with ScriptedModelServer(responder=brief_model) as server, \
            ScriptedModelServer(responder=judge_model) as judge_server:
        judge = JudgeGrader.load(judge_bundle(tmp_path, judge_server.base_url))
        junk = JudgeGrader.load(judge_bundle(tmp_path, judge_server.base_url, junk=True))
        async with await Client.connect(recorded.url) as client:
            report = await client.regress(SHOP, agent="shop", runs=chosen, system_prompt="Be brief.",
                                          base_url=server.base_url, model="scripted", graders=[judge])
            junked = await client.regress(SHOP, agent="shop", runs=[recorded.runs[2]],
                                          system_prompt="Be brief.", base_url=server.base_url,
                                          model="scripted", graders=[junk])
        asked = [task_of(body) for body in judge_server.requests]
    one, two, seventeen = (by_source(report)[run] for run in chosen)
    assert (one.verdict, one.change, one.candidate_pass) == ("different-output", "regression", False)
    assert one.reasons == ["judge judge: the judge prefers the source's output: judged O1"]
    assert (two.verdict, two.candidate_pass, two.grader_errors) == ("same", True, [])
    assert seventeen.verdict == "different-output" and not seventeen.candidate_pass
    failed = "judge judge failed: consecutive_errors: 1 errors in a row (limit 1)"  # the judge run's reason
    assert seventeen.grader_errors == [failed] and report.grader_errors == [f"{recorded.runs[17]}: {failed}"]
    # the judge saw the task and both outputs; it was asked of the candidates only
    first = next(p for p in asked if "look order O1 up" in p)
    assert '"O1 was delivered broken"' in first and '"O1: broken"' in first
    assert {order_of(p) for p in asked} == {"O1", "O2", "O17"}
    [row] = junked.rows
    assert not row.candidate_pass and row.source_pass
    assert row.grader_errors and "judge judge returned {'verdict': 'same'}: its terminal tool must return" \
        in row.grader_errors[0]
    # the CLI's `--grader judge:BUNDLE`; a judge that does not load, or has no terminal tool, is refused
    assert isinstance(_graders(None, None, [Path(f"judge:{ROOT / 'bundles' / 'judge'}")])[0], JudgeGrader)
    with pytest.raises(RegressError, match=r"the judge bundle at \S+ does not load"):
        JudgeGrader.load(tmp_path / "nope")
    no_end = judge_bundle(tmp_path / "x", "http://127.0.0.1:9/v1")
    (no_end / "bundle.yaml").write_text((no_end / "bundle.yaml").read_text().replace(
        "termination: {terminal_tool: verdict, max_turns: 2, deadline: 5m, max_consecutive_errors: 1}", ""))
    with pytest.raises(RegressError, match="has no terminal tool"):
        JudgeGrader.load(no_end)


async def regress_jobs_waiting(client: Client) -> int:
    """Pull requests out on the regression jobs' consumer: one per live host with a free regression slot."""
    from nats.js.errors import NotFoundError

    from runtime.regress.fleet import CONSUMER, STREAM

    try:
        return (await client.js.consumer_info(STREAM, CONSUMER)).num_waiting
    except NotFoundError:  # no host has made the jobs' stream yet
        return 0


async def test_the_fleet_drives_a_regression_as_this_process_does_and_touches_nothing(
        recorded: Recorded, shop: Shop) -> None:
    """Two hosts and a worker: the runs are driven by the hosts' regression slots (each host's child
    process: both take some), the report is the in-process one, the cache answers a second regression on
    the fleet, nothing reaches the shop (a look-up refused, a refund of 6 run on the host with its external
    refused)."""
    before = len(shop.calls)
    options: dict[str, Any] = {"agent": "shop", "until": recorded.split, "model": "scripted",
                               "graders": [ExactMatch("expected")]}
    with ScriptedModelServer(responder=other_model) as server:
        options["base_url"] = server.base_url
        slots = HostConfig(task_ack_wait=2.0, regress_slots=2)
        async with running_host(recorded.url, [SHOP, RESEARCHER], server, config=slots) as one, \
                running_host(recorded.url, [SHOP, RESEARCHER], server, config=slots) as two, \
                running_worker(recorded.url, [SHOP, RESEARCHER]):
            async with await Client.connect(recorded.url) as client:
                with anyio.fail_after(20):  # both hosts wait for a job (one pull out for their free slots)
                    while await regress_jobs_waiting(client) < 2:
                        await anyio.sleep(0.05)
                hosts: list[str] = []
                on_fleet = await client.regress(SHOP, where="fleet", save="fleet-shop",
                                                on_done=lambda d: hosts.append(d.host), **options)
                asked = len(server.requests)
                same_set = {"set_name": "fleet-shop", "base_url": server.base_url, "model": "scripted",
                            "graders": [ExactMatch("expected")]}
                again = await client.regress(SHOP, on_done=lambda d: hosts.append(d.host), **same_set)
                assert len(server.requests) == asked  # the second regression asked the model nothing
                here = await client.regress(SHOP, where="local", **same_set)
                history = await RunLog(client.js).read(on_fleet.rows[0].run_id or "")
                indexed = {r.run_id for r in await client.runs("shop")}
                left = (await client.js.stream_info("REGRESS")).state.messages
            driven = (hosts.count(one.id), hosts.count(two.id))
    assert len(shop.calls) == before  # no look-up, no refund reached the shop
    assert (on_fleet.where, again.where, here.where) == ("fleet", "fleet", "local")  # `auto`: the fleet
    assert sum(driven) == 2 * N and all(driven), driven  # both hosts drove runs of both regressions
    fleet_json, here_json = comparable(on_fleet), comparable(here)
    assert fleet_json.pop("where") == "fleet" and here_json.pop("where") == "local"
    assert fleet_json == here_json
    changed_runs = {recorded.runs[n] for n in range(N) if n % 8 == 2 or (n % 3 == 0 and n % 6 == 3)}
    assert {r.source_run for r in on_fleet.rows if r.verdict != "same"} == changed_runs, [
        (r.source_run, r.verdict, r.diverged_at, r.detail) for r in on_fleet.rows if r.verdict != "same"]
    assert any(r.ran == 1 for r in on_fleet.rows) and any(r.refused == 1 for r in on_fleet.rows)
    assert on_fleet.model_calls > 0 and again.model_calls == 0 and again.cached == on_fleet.model_calls
    assert comparable(again) == comparable(on_fleet)
    first = history.events[0]  # a regression run like the in-process ones: marked, unindexed
    assert isinstance(first, ev.RunStarted) and first.regression is not None
    assert first.regression.set == "fleet-shop" and first.task_id is None
    assert on_fleet.rows[0].run_id not in indexed and left == 0
