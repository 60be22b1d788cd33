"""The inspector's team pages over real HTTP, on a real nats-server, host, worker and scripted model: a
run's waterfall (the trace export's spans), the conversation the model saw at a turn (folded by the kernel,
a thread's earlier runs included, big payloads fetched on demand), pending work, the fleet (hosts, workers,
queues, dead letters and their replay) and an agent's page (its bundle, runs and failures)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from host_helpers import running_fleet
from ui_helpers import Gate, serving, ui_responder, write_ui_bundle

from runtime import events as ev
from runtime import kernel
from runtime.bundle import load_bundle
from runtime.client import Client
from runtime.log import RunLog
from runtime.log.threads import conversation_for
from runtime.nats.topology import ensure_topology
from runtime.types import Message, Usage
from runtime.ui.app import create_app

pytestmark = pytest.mark.anyio


async def _get(client: httpx.AsyncClient, path: str, status: int = 200, **params: Any) -> Any:
    answer = await client.get(path, params=params)
    assert answer.status_code == status, answer.text
    return answer.json()


async def test_waterfall_and_conversation_of_real_runs(nats_server, nc, js, tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_ui_bundle(tmp_path)
    app_client = Client(nc)
    async with running_fleet(nats_server.url, js, bundle, responder=ui_responder(Gate())), \
            serving(create_app(client=app_client)) as base, \
            httpx.AsyncClient(base_url=base, timeout=30) as client:
        pair = await app_client.start("calc", "pair: 2 + 3 | 10 * 4")
        await pair.result(60)
        first = await app_client.start("calc", "compute: 6 * 7", thread="t-42")
        await first.result(60)
        second = await app_client.start("calc", "compute: 1 + 1", thread="t-42")
        await second.result(60)

        # -- the waterfall: the traces' spans, two parallel calls side by side, where the time went -------
        view = await _get(client, f"/api/runs/{pair.run_id}/waterfall")
        kinds = [s["kind"] for s in view["spans"]]
        assert kinds[:3] == ["run", "turn", "model"] and kinds.count("turn") == 2 and kinds.count("tool") == 3
        assert kinds.count("script") == 3 and view["ended"] and view["status"] == "completed"
        turn1 = [s for s in view["spans"] if s["kind"] == "tool"][:2]
        # the two calls of turn 1 overlap in time
        assert turn1[0]["start_ms"] < turn1[1]["end_ms"] and turn1[1]["start_ms"] < turn1[0]["end_ms"]
        model = next(s for s in view["spans"] if s["kind"] == "model")
        assert model["tokens"]["input"] > 0 and model["duration_ms"] > 0
        b = view["breakdown"]
        assert b["wall_ms"] >= b["model_ms"] > 0 and b["tool_ms"] > 0
        assert b["model_ms"] + b["tool_ms"] + b["other_ms"] == pytest.approx(b["wall_ms"], abs=0.5)
        missing = await _get(client, "/api/runs/nope/waterfall", 404)
        assert "no events for run 'nope'" in missing["error"]

        # -- the conversation at turn 2: the system prompt, the task, the reply with two calls, two results --
        seen = await _get(client, f"/api/runs/{pair.run_id}/conversation", turn="2")
        assert [(m["role"], m["sent"]) for m in seen["messages"]] == [
            ("system", True), ("user", True), ("assistant", True), ("tool", True), ("tool", True)]
        assert seen["messages"][0]["content"] == "You compute things with tools."
        assert seen["system"]["source"] == "recorded" and seen["mismatches"] == []
        assert [c["name"] for c in seen["messages"][2]["tool_calls"]] == ["calculator", "calculator"]
        assert json.loads(seen["messages"][4]["content"])["value"] == 40
        assert seen["answer"]["kind"] == "model.responded"
        assert seen["reply"]["tool_calls"][0]["name"] == "submit"
        assert [t["turn"] for t in seen["turns"]] == [1, 2]
        latest = await _get(client, f"/api/runs/{pair.run_id}/conversation")
        assert latest["turn"] == 2
        whole = await _get(client, f"/api/runs/{pair.run_id}/conversation", turn="all")
        assert whole["turn"] is None and len(whole["messages"]) == 7  # + the submit call and its result
        nothing = await _get(client, f"/api/runs/{pair.run_id}/conversation", 404, turn="9")
        assert "turn 9 asked the model nothing (turns with a request: 1, 2)" in nothing["error"]
        odd = await client.get(f"/api/runs/{pair.run_id}/conversation", params={"turn": "x"})
        assert odd.status_code == 400

        # -- a fork at turn 2's request saw what its source saw (the kept events fold the same way) ----------
        at = next(e.seq for e in await pair.replay() if isinstance(e, ev.ModelRequested) and e.turn == 2)
        fork = await pair.fork(at)
        await fork.result(60)
        forked = await _get(client, f"/api/runs/{fork.run_id}/conversation", turn="2")
        assert [(m["role"], m["content"]) for m in forked["messages"]] == \
            [(m["role"], m["content"]) for m in seen["messages"]]
        assert forked["system"]["source"] == "recorded" and forked["mismatches"] == []

        # -- a thread's later run: the earlier run's messages first, each naming its run --------------------
        later = await _get(client, f"/api/runs/{second.run_id}/conversation", turn="1")
        assert later["thread"] == [first.run_id]
        runs = [m["origin"]["run_id"] for m in later["messages"]]
        assert runs[0] == second.run_id and set(runs[1:5]) == {first.run_id} and runs[-1] == second.run_id
        assert later["messages"][1]["content"] == "compute: 6 * 7" and later["messages"][-1]["content"] == \
            "compute: 1 + 1"
        assert later["system"]["source"] == "bundle"  # a later run records only its task: its bundle says
        # the very conversation the host continued the thread with (runtime.log.threads.conversation_for)
        config = load_bundle(bundle).kernel_config()
        events = (await RunLog(js).read(second.run_id)).events
        continued = await conversation_for(RunLog(js), config, events)
        assert continued is not None
        folded = kernel.fold(config, events, continued)
        assert [(m["role"], m["content"]) for m in later["messages"]] == \
            [(m.role, m.content) for m in folded.messages[:len(later["messages"])]]


async def test_a_big_message_is_fetched_on_demand(nats_server, nc, js):
    """A task over the payload threshold: the conversation shows its size, its own URL gives it whole."""
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    big = "y" * 300_000 + " the end"
    log = RunLog(js)
    system = Message("system", "be thorough")
    raw: list[ev.Event] = [
        ev.RunStarted(run_id="rbig2", input=big),
        ev.ModelRequested(run_id="rbig2", request_id="rbig2/1", turn=1,
                          messages=(system, Message("user", big))),
        ev.ModelResponded(run_id="rbig2", request_id="rbig2/1", turn=1, content="read it",
                          usage=Usage(9, 2)),
        ev.TurnCompleted(run_id="rbig2", turn=1),
        ev.RunCompleted(run_id="rbig2", output="read it"),
    ]
    events = [ev.stamp(e, seq=i, ts=1_700_000_000.0 + i, actor="calc") for i, e in enumerate(raw)]
    last = await log.create(events[0])  # type: ignore[arg-type]
    assert last is not None
    for e in events[1:]:
        last = await log.append(e, expect=last)
    async with serving(create_app(client=Client(nc))) as base, \
            httpx.AsyncClient(base_url=base, timeout=30) as client:
        seen = await _get(client, "/api/runs/rbig2/conversation", turn="1")
        system_view, task = seen["messages"]
        assert task["content"] == "" and task["origin"]["stub"] > 300_000 and task["origin"]["seq"] == 0
        assert system_view["origin"]["stub"] is not None  # the first request is stored apart too
        assert seen["system"]["source"] == "recorded"
        fetched = await _get(client, "/api/runs/rbig2/conversation/messages/1")
        assert fetched["content"] == big and fetched["origin"]["stub"] is None and not fetched["cut"]
        prompt = await _get(client, "/api/runs/rbig2/conversation/messages/0")
        assert prompt["role"] == "system" and prompt["content"] == "be thorough"
        assert seen["reply"]["content"] == "read it"
        gone = await _get(client, "/api/runs/rbig2/conversation/messages/9", 404)
        assert "has 3 message(s), not one at 9" in gone["error"]


async def test_pending_work_fleet_and_agent(nats_server, nc, js, tmp_path: Path):
    """A fleet with no worker: a tool job waits (one delivery given back, as a worker would record it), a
    call waits for a person; the pending page says what is stuck and why, and decides the call. Then a
    worker, a dead letter on the fleet page, replayed from it; and the agent's page."""
    from host_helpers import running_worker

    from runtime.jobs import ToolJob
    from runtime.worker.attempts import record_end
    from runtime.worker.dlq import copy_to_dlq

    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_ui_bundle(tmp_path)
    app_client = Client(nc)
    responder = ui_responder(Gate())
    async with running_fleet(nats_server.url, js, bundle, responder=responder, worker=False) as env, \
            serving(create_app(client=app_client)) as base, \
            httpx.AsyncClient(base_url=base, timeout=30) as client:
        computed = await app_client.start("calc", "compute: 2 + 2", instance="a")  # an actor runs one task at
        paid = await app_client.start("calc", "pay: 250", instance="b")  # a time: two of them, one run each
        for handle, kind in ((computed, "tool.called"), (paid, "approval.requested")):
            async for e in handle.events():
                if ev.kind_of(e) == kind:
                    break
        await record_end(js, f"{computed.run_id}/1.0", 1, "w-gone", "NATS went away mid-run")

        seen = await _get(client, "/api/pending")
        assert [(a["run_id"], a["tool"], a["role"]) for a in seen["approvals"]] == \
            [(paid.run_id, "transfer", "finance")]
        job = next(j for j in seen["tool_jobs"] if j["run_id"] == computed.run_id)
        assert (job["tool"], job["call"], job["state"], job["deliveries"]) == \
            ("calculator", "1.0", "waiting", 2)
        assert "given back by worker w-gone: NATS went away mid-run" in job["last_failure"]
        assert job["workers"] == []
        kinds = {(s["kind"], s.get("run_id")) for s in seen["stuck"]}
        assert {("job-no-worker", computed.run_id), ("job-given-back", computed.run_id)} <= kinds
        assert "no worker is running: the calculator job waits for one" in str(seen["stuck"])
        waits = {r["run_id"]: [w["what"] for w in r["waiting_on"]] for r in seen["runs"]}
        assert waits[computed.run_id] == ["tool"] and waits[paid.run_id] == ["approval"]
        approved = await client.post(f"/api/runs/{paid.run_id}/approve",
                                     json={"call_id": "1.0", "note": "ok"})
        assert approved.status_code == 200, approved.text
        assert (await _get(client, "/api/pending"))["approvals"] == []

        fleet = await _get(client, "/api/fleet")
        host = env.host
        assert [h["agents"] for h in fleet["hosts"]] == [["calc"]] and not fleet["hosts"][0]["stale"]
        assert sorted(fleet["hosts"][0]["leases"]["calc"]) == [0, 1] and fleet["agents"] == ["calc"]
        assert fleet["workers"] == [] and fleet["dead_letters"] == []
        assert fleet["queues"]["tool_jobs_pending"] >= 1
        assert host is not None

        async with running_worker(nats_server.url, [bundle]):
            assert await computed.result(60) == {"answer": "4"}
            await paid.result(60)
            dead = ToolJob(run_id=computed.run_id, actor="calc", call_id=f"{computed.run_id}/1.0",
                           tool="calculator", arguments={"expression": "2 + 2"})
            await copy_to_dlq(js, subject=dead.subject, data=dead.encode(), stream_seq=4242, deliveries=5,
                              reason="delivered 5 times, every worker died")
            fleet = await _get(client, "/api/fleet")
            assert len(fleet["workers"]) == 1 and "calculator" in fleet["workers"][0]["tools"]
            [letter] = fleet["dead_letters"]
            assert (letter["tool"], letter["run_id"], letter["call"], letter["deliveries"]) == \
                ("calculator", computed.run_id, "1.0", 5)
            assert letter["reason"] == "delivered 5 times, every worker died"
            assert '"2 + 2"' in letter["arguments"]
            replayed = await client.post(f"/api/dead-letters/{letter['seq']}/replay", json={})
            assert replayed.status_code == 200, replayed.text
            assert replayed.json()["replayed"]["seq"] == letter["seq"]
            assert (await _get(client, "/api/fleet"))["dead_letters"] == []
            again = await client.post(f"/api/dead-letters/{letter['seq']}/replay", json={})
            assert again.status_code == 404 and "replayed or purged already" in again.json()["error"]
            form = await client.post(f"/api/dead-letters/{letter['seq']}/replay", content="x")
            assert form.status_code == 415

        agent = await _get(client, "/api/agents/calc")
        b = agent["bundle"]
        assert b["system_prompt"] == "You compute things with tools." and b["model"]["name"] == "scripted"
        assert b["constraint"]["strategy"] == "ebnf" and b["termination"]["terminal_tool"] == "submit"
        tools = {t["name"]: t for t in b["tools"]}
        assert set(tools) == {"submit", "calculator", "transfer"} and tools["submit"]["terminal"]
        assert tools["transfer"]["approval"] == [
            {"when": "amount > 100", "role": "finance", "timeout_s": None, "on_timeout": "deny"}]
        assert "expression" in tools["calculator"]["input_schema"]["properties"]
        assert tools["calculator"]["kind"] == "script" and tools["calculator"]["limits"]
        assert [h["partitions"] for h in agent["hosts"]] == [[0, 1]]
        assert {r["run_id"] for r in agent["runs"]} == {computed.run_id, paid.run_id}
        assert agent["failures"]["statuses"] == {"completed": 2} and sum(
            bk["runs"] for bk in agent["failures"]["buckets"]) == 2
        nobody = await _get(client, "/api/agents/nobody", 404)
        assert "no run and no host knows an agent 'nobody' (agents: calc)" in nobody["error"]


async def test_on_a_secured_server_the_team_pages_are_bounded_by_the_operator_role(tmp_path: Path):
    """`sa ui` as the operator role: the pending page answers without the tool jobs (the operator may not
    read a worker's queue) and says so; the fleet page lists dead letters, and a replay (admin only)
    comes back as a refusal that says so."""
    import os

    from runtime import nats as bus
    from runtime.jobs import ToolJob
    from runtime.nats.auth import ROLES
    from runtime.nats.credentials import Credentials
    from runtime.nats.server import EmbeddedNats
    from runtime.worker.dlq import copy_to_dlq

    passwords = {role: f"pw-{role}" for role in ROLES}
    conf = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
    env = {**os.environ, **{f"SA_{r.upper()}_PASSWORD": pw for r, pw in passwords.items()}}
    server = EmbeddedNats(extra_args=["-c", str(conf)], env=env).start()
    try:
        admin = await bus.connect(server.url, name="ui-admin",
                                  **Credentials(user="admin", password=passwords["admin"]).connect_options())
        operator = await bus.connect(server.url, name="ui-operator", **Credentials(
            user="operator", password=passwords["operator"]).connect_options())
        try:
            ajs = admin.jetstream()
            await ensure_topology(ajs, partitions=2, tool_ack_wait=2.0)
            job = ToolJob(run_id="rsec2", actor="calc", call_id="rsec2/1.0", tool="calculator")
            await ajs.publish(job.subject, job.encode(), headers=job.headers())
            await copy_to_dlq(ajs, subject=job.subject, data=job.encode(), stream_seq=9, deliveries=5,
                              reason="every worker died")
            async with serving(create_app(client=Client(operator))) as base, \
                    httpx.AsyncClient(base_url=base, timeout=30) as client:
                seen = await _get(client, "/api/pending")
                assert seen["tool_jobs"] == []
                assert "the tool jobs cannot be read" in seen["tool_jobs_unreadable"]
                assert "msg.get.tools" in seen["tool_jobs_unreadable"].lower()
                fleet = await _get(client, "/api/fleet")
                [letter] = fleet["dead_letters"]
                assert letter["reason"] == "every worker died"
                refused = await client.post(f"/api/dead-letters/{letter['seq']}/replay", json={})
                assert refused.status_code == 403, refused.text
                assert "NATS refused" in refused.json()["error"]
        finally:
            await bus.close(operator)
            await bus.close(admin)
    finally:
        server.stop()


async def test_the_pending_api_lists_questions_and_answers_them(nats_server, nc, js, tmp_path: Path):
    """A question a run asks (`ask_human`) is listed by /api/pending with its schema; an answer that does not
    fit it is refused (400, what is wrong, nothing recorded), a fitting one is recorded, a second refused."""
    await ensure_topology(js, partitions=2)
    app_client = Client(nc)
    bundle = write_ui_bundle(tmp_path)
    async with running_fleet(nats_server.url, js, bundle, responder=ui_responder(Gate())), \
            serving(create_app(client=app_client)) as base, \
            httpx.AsyncClient(base_url=base, timeout=30) as client:
        asking = await app_client.start("calc", "ask: ship?", instance="q")
        async for e in asking.events():
            if ev.kind_of(e) == "question.asked":
                break
        seen = await _get(client, "/api/pending")
        [question] = seen["questions"]
        assert question["run_id"] == asking.run_id and question["schema"] == {"enum": ["yes", "no"]}
        assert [w["what"] for r in seen["runs"] for w in r["waiting_on"]] == ["question"]
        path = f"/api/runs/{asking.run_id}/answer"
        wrong = await client.post(path, json={"call_id": "1.0", "answer": "maybe"})
        assert wrong.status_code == 400 and "does not fit the question's schema" in wrong.json()["error"]
        missing = await client.post(path, json={"call_id": "1.0"})
        assert missing.status_code == 400 and '"answer" is missing' in missing.json()["error"]
        answered = await client.post(path, json={"call_id": "1.0", "answer": "no"})
        assert answered.status_code == 200, answered.text
        assert answered.json()["event"]["kind"] == "question.answered"
        assert '{"answer": "no"}' in (await asking.result(60))["answer"]
        again = await client.post(path, json={"call_id": "1.0", "answer": "yes"})
        assert again.status_code == 400 and "already" in again.json()["error"]
        events = [e async for e in asking.events()]
    assert [e.answer for e in events if isinstance(e, ev.QuestionAnswered)] == ["no"]  # nothing else recorded
