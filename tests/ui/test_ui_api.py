"""The inspector's JSON API, live following and one-file export over real HTTP, on a real host, worker,
nats-server and scripted model: filters of the runs index, a run's view grouped by turns and calls, big
payloads fetched on demand, server-sent events until the run ends, the ordered consumer released when the
client goes away, clear errors for bad input, and an export that needs no network and runs no data."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from host_helpers import Env, running_fleet, write_bundle
from ui_helpers import HOSTILE, Gate, serving, ui_responder

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.nats.subjects import EVENTS
from runtime.nats.topology import ensure_topology
from runtime.ui.app import create_app
from runtime.ui.export import embed_json

pytestmark = pytest.mark.anyio


async def _runs(client: httpx.AsyncClient, **params: str) -> list[dict[str, Any]]:
    response = await client.get("/api/runs", params=params)
    assert response.status_code == 200, response.text
    return response.json()["runs"]


async def _consumers_of(js: Any, run_id: str) -> list[str]:
    """The EVENTS consumers whose filter names this run (the live views' ordered consumers)."""
    return [c.name for c in await js.consumers_info(EVENTS)
            if run_id in (c.config.filter_subject or "")]


async def test_index_run_view_follow_and_errors(nats_server, nc, js, tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_bundle(tmp_path)
    gate = Gate()
    async with running_fleet(nats_server.url, js, bundle, responder=ui_responder(gate)) as env, \
            serving(create_app(client=Client(nc))) as base, \
            httpx.AsyncClient(base_url=base, timeout=30) as client:
        pair = await publish_task(js, "calc", "pair: 2 + 3 | 10 * 4")
        hostile = await publish_task(js, "calc", "hostile: show it")
        failing = await publish_task(js, "calc", "compute: 1 / 0")
        empty = await publish_task(js, "calc", "empty: say nothing")
        for run_id in (pair, hostile, failing, empty):
            await Env(nats_server.url, js, env.host, env.server, []).wait_run(run_id)

        # -- the index: every filter narrows to the runs it should ----------------------------------------
        assert {r["run_id"] for r in await _runs(client)} >= {pair, hostile, failing}
        assert {r["run_id"] for r in await _runs(client, q="10 * 4")} == {pair}
        assert {r["run_id"] for r in await _runs(client, q="window.__PWNED")} == {hostile}  # any case
        with_calc = {r["run_id"] for r in await _runs(client, tool="calculator")}
        assert pair in with_calc and hostile not in with_calc
        errors = {r["run_id"] for r in await _runs(client, error="execution")}
        assert failing in errors and pair not in errors, errors
        assert {r["run_id"] for r in await _runs(client, agent="calc", status="completed", since="1h")} >= \
            {pair, hostile}
        assert await _runs(client, agent="nobody") == []
        assert await _runs(client, until="2001-01-01") == []
        body = (await client.get("/api/runs", params={"q": "10 * 4"})).json()
        row = body["runs"][0]
        assert row["input"] == "pair: 2 + 3 | 10 * 4" and row["turns"] == 2
        assert row["output"] == '{"answer":"pair done"}'
        assert body["facets"]["agents"] == ["calc"] and "calculator" in body["facets"]["tools"]
        assert "execution" in body["facets"]["errors"] and "completed" in body["facets"]["statuses"]
        # -- flags: a completed run with no token and an empty answer is picked out of the completed ones --
        suspicious = await _runs(client, flag="suspicious")
        assert [r["run_id"] for r in suspicious] == [empty]
        assert [(f["name"], f["why"]) for f in suspicious[0]["flags"]] == [
            ("no-tokens", "completed without the model using a single token: was a model called at all?"),
            ("empty-output", 'completed with an empty output: {"answer":""}')]
        assert {r["run_id"] for r in await _runs(client, flag="empty-output")} == {empty}
        assert await _runs(client, flag="tool-redelivered") == []
        assert all(r["flags"] == [] for r in await _runs(client) if r["run_id"] != empty)
        odd = await client.get("/api/runs", params={"flag": "odd"})
        assert odd.status_code == 400 and "flag='odd'" in odd.json()["error"]
        flagged = (await client.get(f"/api/runs/{empty}")).json()
        assert [f["name"] for f in flagged["flags"]] == ["no-tokens", "empty-output"]
        async with client.stream("GET", f"/api/runs/{empty}/follow") as stream:
            ends = [json.loads(line[6:]) async for line in stream.aiter_lines() if line.startswith("data: ")]
        assert [f["name"] for f in ends[-1]["flags"]] == ["no-tokens", "empty-output"]
        assert ends[-1]["summary"]["status"] == "completed"

        bad = await client.get("/api/runs", params={"since": "yesterday-ish"})
        assert bad.status_code == 400 and "since='yesterday-ish'" in bad.json()["error"] and "'2h'" in \
            bad.json()["error"]
        assert (await client.get("/api/runs", params={"limit": "many"})).status_code == 400

        # -- a run: totals, turns, the two parallel calls in two lanes of turn 1 ---------------------------
        view = (await client.get(f"/api/runs/{pair}")).json()
        assert view["run_id"] == pair and view["actor"] == "calc" and view["summary"]["status"] == "completed"
        assert view["summary"]["tool_calls"] == 3 and view["summary"]["turns"] == 2
        turn1 = [e for e in view["events"] if e["turn"] == 1]
        lanes = {e["lane"] for e in turn1 if e["lane"]}
        assert lanes == {f"{pair}/1.0", f"{pair}/1.1"}
        outputs = sorted(e["data"]["output"]["value"] for e in turn1 if e["kind"] == "tool.completed")
        assert outputs == [5, 40]
        # a row per log entry (keyed by its seq), the script runs the outcomes carry before them (`seq.i`)
        entries = [e for e in view["events"] if not e["virtual"]]
        assert [e["seq"] for e in entries] == list(range(len(entries))) == [int(e["key"]) for e in entries]
        carried = [e for e in view["events"] if e["virtual"]]
        assert {e["kind"] for e in carried} == {"script.started", "script.completed"}
        assert len(carried) == 2 * 3  # three calls, each a sandbox run that started and completed
        assert all(e["key"].startswith(f"{e['seq']}.") for e in carried)
        assert [e["seq"] for e in view["events"]] == sorted(e["seq"] for e in view["events"])
        assert view["events"][0]["turn"] is None and view["events"][-1]["kind"] == "run.completed"
        replied = next(e for e in view["events"] if e["kind"] == "model.responded")
        assert replied["duration_ms"] > 0 and "tok" in replied["describe"]
        assert view["fork_tree"] == {"run_id": pair, "at": None, "status": "completed", "current": True,
                                     "children": []}
        failed_view = (await client.get(f"/api/runs/{failing}")).json()
        failure = next(e for e in failed_view["events"] if e["kind"] == "tool.failed")
        assert failure["failed"] and failure["data"]["error"]["kind"] == "execution"

        missing = await client.get("/api/runs/no-such-run")
        assert missing.status_code == 404 and "no events for run 'no-such-run'" in missing.json()["error"]
        dotted = await client.get("/api/runs/a.b")
        assert dotted.status_code == 400 and "run id" in dotted.json()["error"]
        assert (await client.get(f"/api/runs/{pair}/events/999")).status_code == 404

        # -- live: a held run streams its events as they are appended, then `end` -------------------------
        held = await publish_task(js, "calc", "hold: 6 * 7")
        seen: list[dict[str, Any]] = []
        kinds: list[str] = []
        tokens: dict[str, list[str]] = {}
        async with client.stream("GET", f"/api/runs/{held}/follow", params={"after": "0"}) as stream:
            assert stream.headers["content-type"].startswith("text/event-stream")
            kind = ""
            async for line in stream.aiter_lines():
                if line.startswith("event: "):
                    kind = line[len("event: "):]
                elif line.startswith("data: "):
                    kinds.append(kind)
                    data = json.loads(line[len("data: "):])
                    if kind == "token":  # the model's output as generated, before it is recorded
                        tokens.setdefault(data["request_id"], []).append(data.get("text", ""))
                    if kind == "event":
                        assert data["flags"] == []  # the run's flags so far, with each event
                        seen.append(data["event"])
                        if data["event"]["kind"] == "tool.completed":
                            gate.release()  # only now may the run finish: what follows arrived live
                    if kind == "end":
                        assert data["summary"]["status"] == "completed"
                        break
        assert kinds[-1] == "end" and seen[-1]["kind"] == "run.completed"
        # the reply made after the gate opened streamed live, and its tokens are the recorded reply
        replies = {e["data"]["request_id"]: e["data"]["text"] for e in seen if e["kind"] == "model.responded"}
        assert tokens and set(tokens) <= set(replies)
        for request_id, parts in tokens.items():
            assert "".join(parts) == replies[request_id]
        assert kinds.index("token") < max(i for i, k in enumerate(kinds) if k == "event")
        live_entries = [e for e in seen if not e["virtual"]]
        assert [e["seq"] for e in live_entries] == list(range(len(live_entries)))
        assert [e["key"] for e in seen] == [e["key"] for e in (await client.get(f"/api/runs/{held}")).json()[
            "events"]]  # live, the same rows as the page's view
        assert seen[-1]["data"]["output"] == {"answer": "released"}
        # `after` skips what the page already has
        async with client.stream("GET", f"/api/runs/{held}/follow", params={"after": "5"}) as stream:
            first = next(iter([json.loads(line[6:]) async for line in stream.aiter_lines()
                               if line.startswith("data: ")]))
        assert first["event"]["seq"] == 5

        # -- a client that goes away releases its consumer at once, even on a quiet run -------------------
        gate.reset()
        quiet = await publish_task(js, "calc", "hold: 1 + 1")
        async with client.stream("GET", f"/api/runs/{quiet}/follow") as stream:
            async for line in stream.aiter_lines():
                if '"tool.completed"' in line:
                    break  # the run now waits on the gate: no more events will come
            assert (await client.get("/api/health")).json()["followers"] == 1
            assert len(await _consumers_of(js, quiet)) == 1
        with anyio.fail_after(20):  # the server notices the disconnect and unsubscribes
            while (await client.get("/api/health")).json()["followers"] != 0:
                await anyio.sleep(0.05)
        with anyio.fail_after(30):  # and the server drops the ordered consumer that lost its subscriber
            while await _consumers_of(js, quiet):
                await anyio.sleep(0.2)
        gate.release()
        await Env(nats_server.url, js, env.host, env.server, []).wait_run(quiet)

        # -- fork: input errors are clear and nothing is written; a fork is a new run the tree shows -------
        before = len(await _runs(client))
        points = view["fork_points"]
        assert points and 0 not in points and len(view["events"]) not in points
        off = await client.post(f"/api/runs/{pair}/fork", json={"at_seq": 0})
        assert off.status_code == 400
        assert "fork" in off.json()["error"] and str(points[0]) in off.json()["error"]
        plain = await client.post(f"/api/runs/{pair}/fork", content="at_seq=3",
                                  headers={"content-type": "application/x-www-form-urlencoded"})
        assert plain.status_code == 415 and "JSON" in plain.json()["error"]
        wrong = await client.post(f"/api/runs/{pair}/fork", json={"at_seq": "three"})
        assert wrong.status_code == 400 and '"three"' in wrong.json()["error"]
        disk = await client.post(f"/api/runs/{pair}/fork", json={"at_seq": 5, "edit": {
            "kind": "bundle", "digest": "x", "path": "/etc/passwd"}})
        assert disk.status_code == 400 and "output, reply, system" in disk.json()["error"]
        half = await client.post(f"/api/runs/{pair}/fork", json={"at_seq": 5, "edit": {"kind": "output"}})
        assert half.status_code == 400 and "the output edit is not valid" in half.json()["error"] and \
            "call_id" in half.json()["error"]
        late = await client.post(f"/api/runs/{pair}/fork", json={"at_seq": 12, "edit": {
            "kind": "output", "call_id": "1.0", "output": {"value": 1}}})
        assert late.status_code == 400 and "call 1.0 has no pending result" in late.json()["error"]
        assert len(await _runs(client)) == before
        second_turn = next(e["seq"] for e in view["events"]
                           if e["kind"] == "model.requested" and e["turn"] == 2)
        made = await client.post(f"/api/runs/{pair}/fork", json={"at_seq": second_turn})
        assert made.status_code == 200, made.text
        child = made.json()["run_id"]
        assert child != pair and made.json()["source_run"] == pair and made.json()["at_seq"] == second_turn
        done = await Env(nats_server.url, js, env.host, env.server, []).wait_run(child)
        assert ev.kind_of(done[-1]) == "run.completed"
        forked = (await client.get(f"/api/runs/{child}")).json()
        assert forked["events"][0]["kind"] == "run.forked"
        assert forked["events"][0]["data"]["source_run"] == pair
        # the fork's clock starts when it was made: the events it kept from its source come before it
        assert forked["events"][0]["offset_ms"] == 0
        kept = [e for e in forked["events"] if 0 < e["seq"] < second_turn]
        assert kept and all(e["offset_ms"] < 0 for e in kept)
        assert forked["fork_tree"]["run_id"] == pair and forked["fork_tree"]["current"] is False
        assert [(c["run_id"], c["at"], c["current"]) for c in forked["fork_tree"]["children"]] == \
            [(child, second_turn, True)]
        source_tree = (await client.get(f"/api/runs/{pair}")).json()["fork_tree"]
        assert [c["run_id"] for c in source_tree["children"]] == [child]
        listed = {r["run_id"]: r for r in await _runs(client)}
        assert listed[child]["forked_from"] == pair and listed[child]["forked_at"] == second_turn

        # -- run control: the same checks as the command line, as clear errors ----------------------------
        form = await client.post(f"/api/runs/{pair}/cancel", content="reason=x",
                                 headers={"content-type": "application/x-www-form-urlencoded"})
        assert form.status_code == 415
        ended = await client.post(f"/api/runs/{pair}/cancel", json={"reason": "late"})
        assert ended.status_code == 400 and "already completed" in ended.json()["error"]
        nocall = await client.post(f"/api/runs/{pair}/approve", json={})
        assert nocall.status_code == 400 and '"call_id" must be a non-empty string' in nocall.json()["error"]
        decided = await client.post(f"/api/runs/{pair}/deny", json={"call_id": "1.0", "reason": "no"})
        assert decided.status_code == 400 and "already completed" in decided.json()["error"]

        # -- the export over HTTP is the same one file ---------------------------------------------------
        exported = await client.get(f"/api/runs/{hostile}/export")
        assert exported.status_code == 200 and "attachment" in exported.headers["content-disposition"]
        _check_export(exported.text, hostile)
        page = await client.get("/runs/anything")
        assert "script-src 'self'" in page.headers["content-security-policy"]


async def test_big_payload_is_fetched_on_demand(nats_server, nc, js):
    """An event whose big fields live in the object store comes as a stub; its own URL gives it whole."""
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    big = "x" * 300_000 + " the end"
    log = RunLog(js)
    started = ev.stamp(ev.RunStarted(run_id="rbig", input=big), seq=0, ts=1_700_000_000.0, actor="calc")
    last = await log.create(started)  # type: ignore[arg-type]
    assert last is not None
    await log.append(ev.stamp(ev.RunCompleted(run_id="rbig", output="ok"), seq=1, ts=1_700_000_001.0,
                              actor="calc"), expect=last)
    async with serving(create_app(client=Client(nc))) as base, \
            httpx.AsyncClient(base_url=base, timeout=30) as client:
        view = (await client.get("/api/runs/rbig")).json()
        stub = view["events"][0]
        assert stub["ref"]["size"] > 300_000 and stub["data"]["input"] == ""
        assert "object store" in stub["describe"]
        whole = (await client.get("/api/runs/rbig/events/0")).json()
        assert whole["ref"] is None and whole["data"]["input"] == big
        # the export reads events whole: the file holds the input itself
        html = (await client.get("/api/runs/rbig/export")).text
        assert " the end" in html and '"ref":null' in html


def _check_export(html: str, run_id: str) -> None:
    """One file, no URL at all, the data inert, only our own script."""
    assert not re.search(r"https?://", html), re.search(r".{40}https?://.{40}", html)
    assert html.count("<script") == 2  # the JSON block and the page's own script
    assert '<script type="application/json" id="run-data">' in html
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    assert 'rel="stylesheet"' not in html and '"/static' not in html
    assert HOSTILE not in html and "<img" not in html  # the reply is only inside the JSON, escaped
    assert embed_json(HOSTILE) in html
    data = re.search(r'id="run-data">(.*?)</script>', html, re.S)
    assert data is not None
    view = json.loads(data.group(1))
    assert view["run_id"] == run_id and view["exported"] is True
    assert view["events"][-1]["data"]["output"] == {"answer": HOSTILE}


async def test_sa_replay_html_prints_one_file(nats_server, js, tmp_path: Path):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_bundle(tmp_path)
    async with running_fleet(nats_server.url, js, bundle, responder=ui_responder(Gate())) as env:
        run_id = await publish_task(js, "calc", "hostile: show it")
        await Env(nats_server.url, js, env.host, env.server, []).wait_run(run_id)
    cli = [sys.executable, "-c", "from runtime.cli import main; main()"]
    env_vars = {"NATS_URL": nats_server.url, "XDG_DATA_HOME": "/nonexistent-sa-test", "PATH": "/usr/bin:/bin",
                "PYTHONPATH": os.environ.get("PYTHONPATH", "")}

    def sa(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, *args], env=env_vars, capture_output=True, text=True, timeout=60)

    done = await anyio.to_thread.run_sync(sa, "replay", run_id, "--html")
    assert done.returncode == 0, done.stderr
    _check_export(done.stdout, run_id)
    missing = await anyio.to_thread.run_sync(sa, "replay", "nope", "--html")
    assert missing.returncode == 2 and "no events for run 'nope'" in missing.stderr and missing.stdout == ""


async def test_sa_ui_serves_and_refuses_bad_usage(nats_server, js):
    """`sa ui` as a user starts it: the address on stderr, the app answering there and to the names given
    with --allow-host; a taken port, no NATS server or a name that is not one is exit 2 with what to do."""
    env_vars = {"XDG_DATA_HOME": "/nonexistent-sa-test", "PATH": "/usr/bin:/bin",
                "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    cli = [sys.executable, "-c", "from runtime.cli import main; main()"]
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    proc = subprocess.Popen([*cli, "ui", "--port", "0", "--nats", nats_server.url, "--allow-host",
                             "inspector.test"], env=env_vars, stderr=subprocess.PIPE, text=True)
    try:
        line = await anyio.to_thread.run_sync(proc.stderr.readline)  # type: ignore[union-attr]
        match = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert match, line
        base = f"http://127.0.0.1:{match.group(1)}"
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            with anyio.fail_after(30):
                while True:
                    try:
                        health = await client.get("/api/health")
                        break
                    except httpx.ConnectError:
                        await anyio.sleep(0.1)
            assert health.json() == {"ok": True, "followers": 0}
            assert (await client.get("/api/runs")).json()["runs"] == []
            index = await client.get("/")
            assert index.status_code == 200 and 'id="filters"' in index.text
            assert (await client.get("/static/run.js")).status_code == 200
            # the names it answers to: its own, and the one given with --allow-host, not another
            named = await client.get("/api/health", headers={"Host": f"inspector.test:{match.group(1)}"})
            assert named.status_code == 200
            other = await client.get("/api/health", headers={"Host": f"other.test:{match.group(1)}"})
            assert other.status_code == 400 and "--allow-host other.test" in other.json()["error"]

            with socket.create_server(("127.0.0.1", 0)) as taken:
                port = str(taken.getsockname()[1])
                busy = await anyio.to_thread.run_sync(lambda: subprocess.run(
                    [*cli, "ui", "--port", port, "--nats", nats_server.url], env=env_vars,
                    capture_output=True, text=True, timeout=60))
            assert busy.returncode == 2 and f"cannot listen on 127.0.0.1:{port}" in busy.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    alone = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [*cli, "ui"], env=env_vars, capture_output=True, text=True, timeout=60))
    assert alone.returncode == 2 and "no NATS server" in alone.stderr
    bad = await anyio.to_thread.run_sync(lambda: subprocess.run(
        [*cli, "ui", "--nats", nats_server.url, "--allow-host", "a/b"], env=env_vars, capture_output=True,
        text=True, timeout=60))
    assert bad.returncode == 2 and "sa ui: 'a/b' is not a host name" in bad.stderr, bad.stderr


async def test_on_a_secured_server_the_inspector_acts_as_its_own_user(tmp_path: Path):
    """`sa ui` run as the operator role reads runs, and a fork (which writes events: host and admin only)
    comes back as a refusal that says so, not as a hang or a crash."""
    from runtime.nats.auth import ROLES
    from runtime.nats.credentials import Credentials
    from runtime.nats.server import EmbeddedNats

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
            log = RunLog(ajs)
            last = await log.create(ev.stamp(ev.RunStarted(run_id="rsec", input="2 + 2"), seq=0,  # type: ignore[arg-type]
                                             ts=1_700_000_000.0, actor="calc"))
            assert last is not None
            await log.append(ev.stamp(ev.ModelRequested(run_id="rsec", request_id="rsec/1", turn=1), seq=1,
                                      ts=1_700_000_001.0, actor="calc"), expect=last)
            app = create_app(client=Client(operator), fork_wait=3.0)
            async with serving(app) as base, httpx.AsyncClient(base_url=base, timeout=30) as client:
                view = (await client.get("/api/runs/rsec")).json()
                assert [e["kind"] for e in view["events"]] == ["run.started", "model.requested"]
                refused = await client.post("/api/runs/rsec/fork", json={"at_seq": 1})
                assert refused.status_code == 403, refused.text
                assert "may not write events (forking needs the host or admin role)" in \
                    refused.json()["error"]
        finally:
            await bus.close(operator)
            await bus.close(admin)
    finally:
        server.stop()
