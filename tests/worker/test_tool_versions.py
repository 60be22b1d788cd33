"""Tool versions on workers, against a real nats-server, real hosts and workers and real Monty: two bundles
each with an `add.pym` of different code, served by one worker or by two; a job runs exactly the version its
run's host resolved, reaches a worker that has it, or fails naming the version no worker serves."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import SUBMIT, running_host, running_worker
from test_worker import collect_outcomes

from runtime import events as ev
from runtime import nats as bus
from runtime.bundle import load_bundle
from runtime.commands import publish_task
from runtime.jobs import ToolJob
from runtime.log import RunLog
from runtime.nats.pull import fetch_batch
from runtime.nats.subjects import TOOLS, WORKERS_CONSUMER
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer, hermes_call, last_message
from runtime.worker import Worker, build_registry
from runtime.worker.registry import ToolVersion
from runtime.worker.stats import Beat, WorkerStats
from tests.nats.test_auth import creds

pytestmark = pytest.mark.anyio

ADD = '''\
"""Add two numbers."""
from grail import Input

a: int = Input("a")
b: int = Input("b")

{{"value": {expression}}}
'''
SUM = ADD.format(expression="a + b")  # bundle alpha's add
TAGGED = ADD.format(expression="a + b + 1000")  # bundle beta's add: same name, other code
PRODUCT = ADD.format(expression="a * b")  # a newer alpha's add, which no worker serves


def bundle(root: Path, name: str, add_source: str) -> Path:
    """A bundle `name` with an `add` tool of the given code and a `submit` terminal tool."""
    folder = root / name
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "add.pym").write_text(add_source)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    (folder / "bundle.yaml").write_text(
        f"name: {name}\nsystem_prompt: You add numbers with tools.\n"
        "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
        "constraint: {strategy: ebnf}\ntools:\n  - tools/add.pym\n  - tools/submit.pym\n"
        "termination: {terminal_tool: submit, max_turns: 4}\n")
    return folder / "bundle.yaml"


def add_responder(body: dict[str, Any]) -> str:
    """`add: A B` calls `add`; a tool response is submitted: its `value`, or the error it reports."""
    last = last_message(body)
    if "<tool_response>" in last:
        m = re.search(r'"value": (-?\d+)', last)
        return hermes_call("submit", {"answer": m.group(1) if m else "error"})
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    a, b = (int(x) for x in task.split(":", 1)[1].split())
    return hermes_call("add", {"a": a, "b": b})


def digest(bundle_file: Path) -> str:
    return load_bundle(bundle_file).tools["add"].content_hash


async def run_tasks(js, tasks: list[tuple[str, str]]) -> list[list[ev.Event]]:
    """Publish each (agent, task) and read every run to its end, in the order given."""
    run_ids = [await publish_task(js, agent, text) for agent, text in tasks]
    out = []
    with anyio.fail_after(60):
        for run_id in run_ids:
            out.append([e async for e in RunLog(js).follow(run_id)])
    return out


def answer(events: list[ev.Event]) -> Any:
    assert isinstance(events[-1], ev.RunCompleted), [ev.kind_of(e) for e in events]
    return events[-1].output["answer"]


def add_runners(events: list[ev.Event]) -> set[str]:
    """The workers that ran the run's `add` in the sandbox."""
    return {e.worker for e in ev.expand_all(events) if isinstance(e, ev.ScriptStarted) and e.tool == "add"}


@pytest.fixture
async def topo(js):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    return js


def test_the_registry_finds_the_version_a_job_names_and_nothing_else(tmp_path: Path) -> None:
    alpha, beta = bundle(tmp_path, "alpha", SUM), bundle(tmp_path, "beta", TAGGED)
    (tmp_path / "glob").mkdir()
    (tmp_path / "glob" / "add.pym").write_text(PRODUCT)
    reg = build_registry(bundles=[alpha, beta], tool_globs=[str(tmp_path / "glob" / "add.pym")])
    a, b, loose = digest(alpha), digest(beta), reg.tools["add"][-1].content_hash
    assert len({a, b, loose}) == 3 and set(reg.tools) == {"add", "submit"}

    def found(actor: str, tool_digest: str) -> ToolVersion | None:
        job = ToolJob(run_id="r", actor=actor, call_id="r/1", tool="add", tool_digest=tool_digest)
        served = reg.find(job)
        return served.version if served is not None else None

    assert found("alpha", a) == ToolVersion("add", a, "alpha")
    assert found("alpha:ann", a) == ToolVersion("add", a, "alpha")  # an instance is its bundle's
    assert found("beta", b) == ToolVersion("add", b, "beta")
    assert found("beta", a) is None  # alpha's code is not beta's tool: its bundle may grant it otherwise
    assert found("gamma", loose) == ToolVersion("add", loose, "")  # a glob's script serves any bundle
    assert found("alpha", "0" * 16) is None  # a version nobody loaded: never another one in its place
    assert found("beta", "") == ToolVersion("add", b, "beta")  # no version named: its bundle's, as before


async def test_one_worker_with_two_bundles_runs_each_agents_own_add(nats_server, topo,
                                                                     tmp_path: Path) -> None:
    alpha, beta = bundle(tmp_path, "alpha", SUM), bundle(tmp_path, "beta", TAGGED)
    with ScriptedModelServer(responder=add_responder) as server:
        async with running_host(nats_server.url, [alpha, beta], server), \
                running_worker(nats_server.url, [alpha, beta]) as worker:
            await worker.ready.wait()
            runs = await run_tasks(topo, [("alpha", "add: 3 4"), ("beta", "add: 3 4"), ("alpha", "add: 5 6"),
                                          ("beta", "add: 5 6")])
    assert [answer(r) for r in runs] == ["7", "1007", "11", "1011"]  # each its own bundle's code
    assert worker.stats.handed_off == 0 and worker.stats.failed == 0


async def test_two_workers_each_with_one_bundle_each_job_is_run_by_the_one_that_has_its_version(
        nats_server, topo, tmp_path: Path) -> None:
    alpha, beta = bundle(tmp_path, "alpha", SUM), bundle(tmp_path, "beta", TAGGED)
    tasks = [(agent, f"add: {i} 1") for i in range(6) for agent in ("alpha", "beta")]
    with ScriptedModelServer(responder=add_responder) as server:
        async with running_host(nats_server.url, [alpha, beta], server), \
                running_worker(nats_server.url, [alpha]) as wa, running_worker(nats_server.url, [beta]) as wb:
            await wa.ready.wait()
            await wb.ready.wait()
            runs = await run_tasks(topo, tasks)
    for (agent, text), events in zip(tasks, runs, strict=True):
        i = int(text.split()[1])
        assert answer(events) == str(i + 1 if agent == "alpha" else i + 1001), (agent, text)
        assert add_runners(events) == {wa.name if agent == "alpha" else wb.name}, (agent, text)
        assert not [e for e in events if isinstance(e, ev.ToolRedelivered)]  # a hand-over is no redelivery
    assert wa.stats.failed == wb.stats.failed == 0
    # every job delivered to the worker without its version went straight to the other one
    assert (wa.stats.handed_off, wb.stats.handed_off) == (wb.stats.handed_in, wa.stats.handed_in)


async def test_a_version_no_worker_serves_fails_naming_it_and_runs_nothing(nats_server, topo,
                                                                            tmp_path: Path) -> None:
    """The host has a newer alpha (add multiplies) than the only worker (add adds): the call fails."""
    newer, older = bundle(tmp_path / "host", "alpha", PRODUCT), bundle(tmp_path / "worker", "alpha", SUM)
    with ScriptedModelServer(responder=add_responder) as server:
        async with running_host(nats_server.url, [newer], server), \
                running_worker(nats_server.url, [older]) as worker:
            await worker.ready.wait()
            (events,) = await run_tasks(topo, [("alpha", "add: 3 4")])
    failed = next(e for e in events if isinstance(e, ev.ToolFailed) and e.tool == "add")
    assert failed.error.kind == "input" and failed.error.detail == "missing_version"
    assert failed.error.message.startswith(
        f"tool add version {digest(newer)} (bundle alpha) is not served by any worker: start a worker with "
        "that bundle"), failed.error.message
    assert f"has tool add version {digest(older)} (bundle alpha)" in failed.error.message  # the stale copy
    assert add_runners(events) == set() and answer(events) == "error"  # the older code never ran


async def put_beat(js, name: str, bundle_file: Path) -> None:
    """The `WorkerBeat` of a worker serving `bundle_file`'s tools (as `Worker.run` puts it), without one
    running: a worker that serves the version but never takes the job (busy, or cut off)."""
    reg = build_registry(bundles=[bundle_file])
    await Beat(js, name, 1, sorted(reg.tools), [(v.name, v.digest, v.bundle) for v in reg.versions()], [],
               WorkerStats()).put()


async def test_a_job_handed_off_at_every_delivery_fails_at_its_last_naming_who_serves_it(
        nats_server, js, tmp_path: Path) -> None:
    await ensure_topology(js, tool_max_deliver=3)
    alpha, beta = bundle(tmp_path, "alpha", SUM), bundle(tmp_path, "beta", TAGGED)
    await put_beat(js, "elsewhere", alpha)
    job = ToolJob(run_id="r1", actor="alpha", call_id="r1/1.0", tool="add", arguments={"a": 1, "b": 2},
                  tool_digest=digest(alpha))
    await js.publish(job.subject, job.encode(), headers=job.headers())
    worker = Worker(js, build_registry(bundles=[beta]))
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run, stop)
        (outcome,) = await collect_outcomes(js, 1, bundle="alpha")
        stop.set()
    error = outcome.result.error
    assert error is not None and error.kind == "input", outcome.result
    assert error.message.startswith(f"tool add version {digest(alpha)} (bundle alpha) was delivered 3 times, "
                                    "never to a worker that had it and room for it: worker(s) elsewhere "
                                    "serve it but did not take it"), error
    assert outcome.attempt == 3 and len(outcome.earlier) == 2  # the two hand-offs, each explained
    given_back = f"given back by worker {worker.name}: it lacks tool add version"
    assert all(given_back in why for why in outcome.earlier)
    assert (worker.stats.handed_off, worker.stats.dead_lettered) == (2, 0)  # never taken for a crash


async def test_the_last_delivery_of_a_job_only_handed_off_before_runs_where_its_version_is(
        nats_server, js, tmp_path: Path) -> None:
    await ensure_topology(js, tool_max_deliver=2)
    alpha, beta = bundle(tmp_path, "alpha", SUM), bundle(tmp_path, "beta", TAGGED)
    await put_beat(js, "alpha-worker", alpha)  # the worker that has it, not started yet
    job = ToolJob(run_id="r1", actor="alpha", call_id="r1/1.0", tool="add", arguments={"a": 1, "b": 2},
                  tool_digest=digest(alpha))
    await js.publish(job.subject, job.encode(), headers=job.headers())
    psub = await js.pull_subscribe_bind(durable=WORKERS_CONSUMER, stream=TOOLS)
    with anyio.fail_after(10):
        (first,) = await fetch_batch(psub, 1, 5.0)
    lacking = Worker(js, build_registry(bundles=[beta]), name="beta-worker")
    await lacking.handle(first)  # delivery 1 of 2, to a worker without alpha's add: handed off
    await psub.unsubscribe()
    assert lacking.stats.handed_off == 1 and lacking.stats.completed == 0
    worker = Worker(js, build_registry(bundles=[alpha]), name="alpha-worker")
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run, stop)
        (outcome,) = await collect_outcomes(js, 1, bundle="alpha")
        stop.set()
    assert outcome.attempt == 2 and outcome.worker == "alpha-worker"
    assert outcome.result.error is None and outcome.result.output == {"value": 3}  # run, not dead-lettered
    (why,) = outcome.earlier
    assert why.startswith("delivery 1 was given back by worker beta-worker: it lacks tool add version "
                          f"{digest(alpha)} (bundle alpha); worker(s) alpha-worker serve it"), why
    assert worker.stats.dead_lettered == 0


async def test_on_a_secured_server_a_worker_hands_a_delivery_it_cannot_run_to_one_that_can(
        secured, tmp_path: Path) -> None:
    """Both workers connect as the worker role: the offer, its answer and the taken delivery's ack are
    allowed; the job runs once, on the worker with alpha's add, as its first delivery."""
    alpha, beta = bundle(tmp_path, "alpha", SUM), bundle(tmp_path, "beta", TAGGED)
    admin = await bus.connect(secured.url, **creds("admin").connect_options())
    a_nc = await bus.connect(secured.url, **creds("worker").connect_options())
    b_nc = await bus.connect(secured.url, **creds("worker").connect_options())
    try:
        js = admin.jetstream()
        await ensure_topology(js)
        job = ToolJob(run_id="r1", actor="alpha", call_id="r1/1.0", tool="add", arguments={"a": 2, "b": 5},
                      tool_digest=digest(alpha))
        await js.publish(job.subject, job.encode(), headers=job.headers())
        has = Worker(a_nc.jetstream(), build_registry(bundles=[alpha]), name="alpha-worker")
        lacks = Worker(b_nc.jetstream(), build_registry(bundles=[beta]), name="beta-worker")
        psub = await b_nc.jetstream().pull_subscribe_bind(durable=WORKERS_CONSUMER, stream=TOOLS)
        with anyio.fail_after(10):  # delivered to the worker without alpha's add, as the server may
            (delivered,) = await fetch_batch(psub, 1, 5.0)
        await psub.unsubscribe()
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(has.run, stop)
            await has.ready.wait()
            await lacks.handle(delivered)
            (outcome,) = await collect_outcomes(js, 1, bundle="alpha")
            stop.set()
    finally:
        for nc in (admin, a_nc, b_nc):
            await bus.close(nc)
    assert (lacks.stats.handed_off, has.stats.handed_in) == (1, 1)
    assert outcome.worker == "alpha-worker" and outcome.attempt == 1 and outcome.earlier == ()
    assert outcome.result.output == {"value": 7}

