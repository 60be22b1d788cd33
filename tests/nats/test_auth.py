"""Who may do what, on a real nats-server running the shipped auth config (deploy/nats/auth.conf).

Every role tries every operation and the server allows or refuses it as the table says; a client without
credentials is refused at connect; and a host run under the host user records the operator the server
authenticated as the author of a cancel, whatever the message's `by` says, while a cancel smuggled on a
task subject by a publisher changes nothing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import nats
import pytest
from host_helpers import kinds, write_bundle
from nats_fixtures import AUTH_CONF, PASSWORDS

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_command, publish_task
from runtime.host import Host, HostConfig, load_agents
from runtime.jobs import ToolJob
from runtime.log import RunLog
from runtime.log.threads import thread_key
from runtime.model.client import ModelClient
from runtime.nats.auth import ROLES, default_users, server_config
from runtime.nats.connection import explain_refusal
from runtime.nats.credentials import Credentials
from runtime.nats.kv import runs_kv
from runtime.nats.server import EmbeddedNats
from runtime.nats.starter import starter_subject
from runtime.nats.subjects import (
    EVENTS,
    HDR_MSG_ID,
    TASKS,
    TOOLS,
    WORKERS_CONSUMER,
    command_subject,
    event_subject,
    partition_of,
    result_subject,
    script_subject,
    stream_subject,
    task_subject,
    tool_subject,
)
from runtime.nats.topology import ensure_partition_consumers
from runtime.schedules import list_schedules, make_schedule, put_schedule
from runtime.testing import Reply, ScriptedModelServer
from runtime.worker import Worker, build_registry

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


def creds(role: str) -> Credentials:
    return Credentials(user=role, password=PASSWORDS[role])


async def as_role(url: str, role: str, refusals: list[str]) -> Any:
    async def on_error(err: Exception) -> None:
        refusals.append(str(err))

    return await bus.connect(url, name=f"test-{role}", error_cb=on_error, max_reconnect_attempts=2,
                             **creds(role).connect_options())


def test_the_shipped_auth_config_is_the_generated_one() -> None:
    assert AUTH_CONF.read_text() == server_config(default_users(env=True))


async def test_a_client_without_credentials_is_refused(secured: EmbeddedNats) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation") as caught:
        await bus.connect(secured.url, name="anon", max_reconnect_attempts=1)
    text = explain_refusal(caught.value, Credentials())
    assert text is not None and "authorization violation" in text and "--creds" in text
    with pytest.raises(nats.errors.Error, match="Authorization Violation") as caught:
        await bus.connect(secured.url, **Credentials(user="operator", password="wrong").connect_options())
    text = explain_refusal(caught.value, Credentials(user="operator", password="wrong"))
    assert text is not None and "user 'operator'" in text and "check the user name and password" in text


# -- the matrix ---------------------------------------------------------------------------------------------

AGENT, RUN = "demo", "r0000000000000001"
TIMEOUT = 1.0


async def op_publish_task(js: Any, role: str) -> None:
    await js.publish(task_subject(AGENT), b"hello", headers={HDR_MSG_ID: f"t-{role}"}, timeout=TIMEOUT)


async def op_start_subrun(js: Any, role: str) -> None:
    await js.publish(f"agents.{AGENT}.subtasks", b"hello", headers={HDR_MSG_ID: f"s-{role}"}, timeout=TIMEOUT)


async def op_own_command(js: Any, role: str) -> None:
    cancel = ev.encode_command(ev.Cancel(run_id=RUN))
    await js.publish(command_subject(AGENT, role), cancel, timeout=TIMEOUT)


async def op_impersonate(js: Any, role: str) -> None:
    cancel = ev.encode_command(ev.Cancel(run_id=RUN, by="mallory"))
    await js.publish(command_subject(AGENT, "mallory"), cancel, timeout=TIMEOUT)


async def op_read_events(js: Any, role: str) -> None:
    msg = await js.get_last_msg(EVENTS, f"events.{AGENT}.{RUN}.>", direct=True)
    assert msg.data


async def op_replay_run(js: Any, role: str) -> None:
    log = await RunLog(js).read(RUN, timeout=TIMEOUT * 3)
    assert kinds(log.events) == ["run.started"]


async def op_write_event(js: Any, role: str) -> None:
    await js.publish(event_subject(AGENT, "r-forged", "run.started"), b"forged", timeout=TIMEOUT)


async def op_tool_job(js: Any, role: str) -> None:
    await js.publish(tool_subject("calculator"), b"job", headers={HDR_MSG_ID: f"j-{role}"}, timeout=TIMEOUT)


async def op_publish_result(js: Any, role: str) -> None:
    await js.publish(result_subject(0, AGENT, RUN), b"outcome", timeout=TIMEOUT)


async def op_take_tool_job(js: Any, role: str) -> None:
    psub = await js.pull_subscribe_bind(durable=WORKERS_CONSUMER, stream=TOOLS)
    try:
        msgs = await psub.fetch(1, timeout=TIMEOUT)
        assert msgs
        for m in msgs:
            await m.nak()
    finally:
        await psub.unsubscribe()


async def op_read_runs_kv(js: Any, role: str) -> None:
    kv = await js.key_value("runs")
    assert (await kv.get(RUN)).value == b"indexed"


async def op_write_runs_kv(js: Any, role: str) -> None:
    kv = await js.key_value("runs")
    await kv.put(f"{RUN}-{role}", b"forged")


async def op_follow_stream(js: Any, role: str) -> None:
    """Subscribe to a run's live model output (`sa send --follow`); a refusal comes back as an error."""
    nc = js._nc
    sub = await nc.subscribe(stream_subject(AGENT, RUN))
    await nc.flush()  # the server's refusal comes before this PONG; nats-py reports it from a task
    await anyio.sleep(0.2)
    await sub.unsubscribe()


async def op_follow_scripts(js: Any, role: str) -> None:
    """Subscribe to the notices of a run's tool jobs still running (`sa send --follow`, `sa ui`)."""
    nc = js._nc
    sub = await nc.subscribe(script_subject(AGENT, RUN))
    await nc.flush()
    await anyio.sleep(0.2)
    await sub.unsubscribe()


async def _core_publish(js: Any, subject: str) -> None:
    """A core NATS publish: a refusal comes back only as an error the server reports apart."""
    nc = js._nc
    await nc.publish(subject, b"{}")
    await nc.flush()
    await anyio.sleep(0.2)


async def op_tell_script_runs(js: Any, role: str) -> None:
    await _core_publish(js, script_subject(AGENT, RUN))


async def op_stream_model_output(js: Any, role: str) -> None:
    await _core_publish(js, stream_subject(AGENT, RUN))


async def op_ask_as_starter(js: Any, role: str) -> None:
    """Ask the hosts about a run one started (`runtime.nats.starter`): the host checks the key, not this."""
    await _core_publish(js, starter_subject(AGENT, "follow"))
    await _core_publish(js, starter_subject(AGENT, "cancel"))


async def op_answer_starters(js: Any, role: str) -> None:
    """Hear starters' requests, which carry their keys (`runtime.host.starters`)."""
    nc = js._nc
    subs = [await nc.subscribe(starter_subject(AGENT, op)) for op in ("follow", "cancel")]
    await nc.flush()
    await anyio.sleep(0.2)
    for sub in subs:
        await sub.unsubscribe()


async def op_read_threads(js: Any, role: str) -> None:
    kv = await js.key_value("threads")
    assert (await kv.get(thread_key(AGENT, "seeded"))).value == b"thread"


async def op_write_threads(js: Any, role: str) -> None:
    kv = await js.key_value("threads")
    await kv.put(thread_key(AGENT, f"forged-{role}"), b"forged")


async def op_steal_partition_consumer(js: Any, role: str) -> None:
    await ensure_partition_consumers(js, 0, AGENT)


async def op_purge_events(js: Any, role: str) -> None:
    await js.purge_stream(EVENTS, subject="events.nobody.>")


async def op_list_schedules(js: Any, role: str) -> None:
    assert "seeded" in [x.schedule.name for x in await list_schedules(js)]


async def op_add_schedule(js: Any, role: str) -> None:
    await put_schedule(js, make_schedule(f"by-{role}", AGENT, "x", every="1h", paused=True))


OPS = {
    "publish a task": op_publish_task,
    "start a sub-run": op_start_subrun,
    "command as itself": op_own_command,
    "command as another": op_impersonate,
    "read an event": op_read_events,
    "replay a run": op_replay_run,
    "write an event": op_write_event,
    "publish a tool job": op_tool_job,
    "publish a tool result": op_publish_result,
    "take a tool job": op_take_tool_job,
    "read the runs index": op_read_runs_kv,
    "follow a run's stream": op_follow_stream,
    "follow a run's scripts": op_follow_scripts,
    "tell that a script runs": op_tell_script_runs,
    "stream model output": op_stream_model_output,
    "ask about a run as its starter": op_ask_as_starter,
    "answer starters": op_answer_starters,
    "read the threads": op_read_threads,
    "write the threads": op_write_threads,
    "write the runs index": op_write_runs_kv,
    "take over a task partition": op_steal_partition_consumer,
    "purge events": op_purge_events,
    "list schedules": op_list_schedules,
    "add a schedule": op_add_schedule,
}

ALLOWED: dict[str, set[str]] = {
    "publisher": {"publish a task", "ask about a run as its starter"},
    "operator": {"command as itself", "read an event", "replay a run", "read the runs index",
                 "follow a run's stream", "follow a run's scripts", "read the threads", "list schedules"},
    "host": {"command as itself", "command as another", "read an event", "replay a run", "write an event",
             "publish a tool job", "take a tool job", "read the runs index", "write the runs index",
             "take over a task partition", "purge events", "read the threads", "write the threads",
             "publish a task",  # a schedule's fire becomes a task (runtime.host.scheduler)
             "list schedules", "add a schedule", "tell that a script runs", "stream model output",
             "ask about a run as its starter", "answer starters"},  # the host answers starters
    "worker": {"read an event", "replay a run", "publish a tool result", "take a tool job",
               "read the runs index", "read the threads", "start a sub-run",  # agent tools: sub-runs
               "command as itself", "list schedules",
               "tell that a script runs"},  # a job still running (runtime.streaming), not model output
    "admin": set(OPS),
}


@pytest.fixture(scope="module")
async def seeded(secured: EmbeddedNats) -> AsyncIterator[EmbeddedNats]:
    """The topology, one run's first event, its index entry and a tool job, written by the admin."""
    nc = await as_role(secured.url, "admin", [])
    js = nc.jetstream()
    await bus.ensure_topology(js, partitions=4)
    started = ev.RunStarted(run_id=RUN, seq=0, ts=1.0, input="t", actor=AGENT)
    await RunLog(js).create(started)
    await (await runs_kv(js)).put(RUN, b"indexed")
    await (await js.key_value("threads")).put(thread_key(AGENT, "seeded"), b"thread")
    await put_schedule(js, make_schedule("seeded", AGENT, "x", every="1h", paused=True))
    for i in range(len(ROLES) + 2):
        job = ToolJob(run_id=RUN, call_id=f"c{i}", tool="calculator", actor=AGENT)
        await js.publish(tool_subject("calculator"), job.encode(), headers={HDR_MSG_ID: f"seed-{i}"})
    await bus.close(nc)
    yield secured


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


async def until_refused(op: Any, js: Any, role: str, refusals: list[str]) -> None:
    """Run `op`, ended the moment the server reports a refusal (raised as `RuntimeError` naming it): a
    refused request otherwise waits out its timeout, and some of the runtime's own calls retry for
    seconds, which made this table take two minutes."""
    seen = len(refusals)
    failed: list[BaseException] = []
    async with anyio.create_task_group() as tg:
        async def run() -> None:
            try:
                await op(js, role)
            except Exception as e:
                failed.append(e)
            tg.cancel_scope.cancel()

        async def watch() -> None:
            while len(refusals) == seen:
                await anyio.sleep(0.01)
            failed.append(RuntimeError(refusals[-1]))
            tg.cancel_scope.cancel()

        tg.start_soon(run)
        tg.start_soon(watch)
    if failed:
        raise failed[0]


@pytest.mark.parametrize("role", ROLES)
async def test_every_role_may_do_exactly_what_the_table_says(seeded: EmbeddedNats, role: str) -> None:
    refusals: list[str] = []
    nc = await as_role(seeded.url, role, refusals)
    js = nc.jetstream()
    outcome: dict[str, bool] = {}
    why: dict[str, str] = {}
    try:
        for name, op in OPS.items():
            await nc.flush()  # every refusal of the ops before has arrived (the server answers in order)
            before = len(refusals)
            try:
                await until_refused(op, js, role, refusals)
                ok = True
            except Exception as e:  # a refusal surfaces as a timeout, an API error or a closed sub
                ok = False
                why[name] = f"{type(e).__name__}: {e}"
            # a refused publish or subscribe is reported by the server apart from the operation
            if ok and len(refusals) > before:
                ok = False
            if not ok and len(refusals) > before:
                why[name] = refusals[-1]
            outcome[name] = ok
    finally:
        await bus.close(nc)
    allowed = {name for name, ok in outcome.items() if ok}
    assert allowed == ALLOWED[role], {n: why.get(n, "allowed") for n in OPS}
    for name in set(OPS) - ALLOWED[role]:  # refused by the server's permissions, not failing otherwise
        assert "ermissions violation" in why[name] or "Timeout" in why[name], (name, why[name])


async def test_a_refused_publish_is_explained(seeded: EmbeddedNats) -> None:
    refusals: list[str] = []
    nc = await as_role(seeded.url, "publisher", refusals)
    try:
        with pytest.raises(Exception) as caught:
            await op_write_event(nc.jetstream(), "publisher")
    finally:
        await bus.close(nc)
    text = explain_refusal(caught.value, creds("publisher"))
    assert text is not None
    assert "user 'publisher'" in text and 'publish to "events.demo.r-forged.run.started"' in text


# -- identity: the operator recorded is the one the server authenticated -----------------------------------


@asynccontextmanager
async def secured_fleet(url: str, bundle: Path, server: ScriptedModelServer) -> AsyncIterator[Host]:
    """A host connected as `host` and a worker as `worker`, in this process."""
    host_nc = await bus.connect(url, name="test-host", **creds("host").connect_options())
    worker_nc = await bus.connect(url, name="test-worker", **creds("worker").connect_options())
    client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
    host = Host(host_nc, load_agents([bundle], client=client), config=HostConfig(task_ack_wait=2.0))
    worker = Worker(worker_nc.jetstream(), build_registry(bundles=[bundle]), concurrency=2)
    stop = anyio.Event()
    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(host.run, stop)
            tg.start_soon(worker.run, stop)
            with anyio.fail_after(30):
                await host.ready.wait()
            yield host
            stop.set()
    finally:
        await client.aclose()
        await bus.close(worker_nc)
        await bus.close(host_nc)


async def test_the_recorded_operator_is_the_authenticated_one(seeded: EmbeddedNats, tmp_path: Path) -> None:
    url = seeded.url
    slow = [Reply.of_text("slow", delay=4.0)] * 4
    with ScriptedModelServer(slow) as model:
        async with secured_fleet(url, write_bundle(tmp_path), model):
            pub_nc = await bus.connect(url, **creds("publisher").connect_options())
            op_nc = await bus.connect(url, **creds("operator").connect_options())
            reader = await bus.connect(url, **creds("admin").connect_options())
            try:
                pub, op = pub_nc.jetstream(), op_nc.jetstream()
                run_id = await publish_task(pub, "calc", "compute: 1", task_id="auth-1")
                with anyio.fail_after(15):
                    while model.served < 1:
                        await anyio.sleep(0.02)
                # a publisher may publish on the task subject, but a command there is refused by the host
                smuggled = b'{"kind": "cancel", "run_id": "%s", "by": "operator"}' % run_id.encode()
                await pub.publish(task_subject("calc"), smuggled)
                # the operator's message claims to be someone else: the subject says who it is
                await publish_command(op, "calc", ev.Cancel(run_id=run_id, reason="stop", by="mallory"),
                                      operator="operator")
                events: list[ev.Event] = []
                with anyio.fail_after(20):
                    async for e in RunLog(reader.jetstream()).follow(run_id):
                        events.append(e)
            finally:
                for c in (pub_nc, op_nc, reader):
                    await bus.close(c)
    assert kinds(events) == ["run.started", "model.requested", "run.cancelled"]
    cancelled = events[-1]
    assert isinstance(cancelled, ev.RunCancelled)
    assert cancelled.by == "operator" and cancelled.reason == "stop"


async def test_tasks_and_commands_share_the_agent_partition(seeded: EmbeddedNats) -> None:
    nc = await as_role(seeded.url, "admin", [])
    try:
        js = nc.jetstream()
        await js.publish(task_subject("zeta"), b"t", headers={HDR_MSG_ID: "zeta-1"})
        await js.publish(command_subject("zeta", "operator"), b"c")
        subjects = (await js.stream_info(TASKS, subjects_filter="tasks.*.zeta.>")).state.subjects
    finally:
        await bus.close(nc)
    p = partition_of("zeta", 4)
    assert subjects == {f"tasks.{p}.zeta.agents.tasks.zeta": 1, f"tasks.{p}.zeta.ops.operator.zeta": 1}


async def test_a_fork_by_a_role_that_may_not_write_events_is_refused(secured: EmbeddedNats) -> None:
    """The run log retries what looks like an outage; a publish the permissions forbid is not one: the
    fork fails with the server's reason instead of retrying forever, and nothing is written."""
    from runtime import events as ev
    from runtime.client.fork import ForkError, fork
    from runtime.log import RunLog
    from runtime.nats.topology import ensure_topology

    admin = await as_role(secured.url, "admin", [])
    try:
        js = admin.jetstream()
        await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
        await runs_kv(js)
        started = ev.RunStarted(run_id="rauthfork", seq=0, ts=1.0, actor="calc", input="x")
        requested = ev.ModelRequested(run_id="rauthfork", seq=1, ts=2.0, actor="calc",
                                      request_id="rauthfork/1", turn=1)
        await RunLog(js).write_run([started, requested])
        before = (await js.stream_info(EVENTS)).state.messages
        operator = await as_role(secured.url, "operator", [])
        try:
            with pytest.raises(ForkError, match=r"(?i)could not be written.*permissions violation"):
                await fork(operator.jetstream(), "rauthfork", 2)
        finally:
            await bus.close(operator)
        assert (await js.stream_info(EVENTS)).state.messages == before
    finally:
        await bus.close(admin)


async def test_the_operator_role_runs_the_trace_exporter_s_durable_reader(secured: EmbeddedNats) -> None:
    """`sa otel` runs as an operator (deploy/k8s/sa.yaml): its durable consumer on EVENTS is created,
    read and acked with the operator's permissions, and what it acked is not delivered again."""
    from runtime import events as ev
    from runtime.log import RunLog
    from runtime.nats.topology import ensure_topology

    admin = await as_role(secured.url, "admin", [])
    try:
        js = admin.jetstream()
        await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
        await RunLog(js).write_run([ev.RunStarted(run_id="rotel", seq=0, ts=1.0, actor="calc", input="x")])
        refusals: list[str] = []
        operator = await as_role(secured.url, "operator", refusals)
        try:
            tail = await RunLog(operator.jetstream()).tail("otel-as-operator", ack_wait=2.0)
            got = await tail.fetch(1000, timeout=2.0)  # this module's other tests wrote events too
            assert "rotel" in [t.event.run_id for t in got if t.event is not None]
            for t in got:
                await t.ack()
            await operator.flush()
            assert await tail.fetch(1000, timeout=3.0) == []  # acked: nothing comes back after AckWait
            await tail.close()
        finally:
            await bus.close(operator)
        assert not refusals, refusals
    finally:
        await bus.close(admin)


def test_the_helm_values_and_manifests_use_the_generated_users_and_roles() -> None:
    """deploy/k8s: the NATS chart's values carry the same users as auth.conf (passwords from the Secret
    sa-nats-auth), and each runtime Deployment connects as its role."""
    import yaml

    from runtime.nats.auth import helm_authorization

    values = yaml.safe_load((ROOT / "deploy" / "k8s" / "nats-values.yaml").read_text())
    assert values["config"]["merge"]["authorization"] == helm_authorization(default_users(env=True))
    env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in values["container"]["env"]}
    assert env == {f"SA_{r.upper()}_PASSWORD": {"name": "sa-nats-auth", "key": r} for r in ROLES}
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy" / "k8s" / "sa.yaml").read_text())
            if d and d.get("kind") == "Deployment"]
    roles = {}
    for d in docs:
        for c in d["spec"]["template"]["spec"]["containers"]:
            env_of = {e["name"]: e for e in c.get("env", [])}
            if "NATS_USER" in env_of:
                roles[c["name"]] = env_of["NATS_USER"]["value"]
                assert env_of["NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
                    "name": "sa-nats-auth", "key": roles[c["name"]]}
    assert roles == {"host": "host", "worker": "worker", "otel": "operator", "audit": "operator"}


async def test_a_standard_client_without_the_users_inbox_prefix_is_told_which_to_use(
        seeded: EmbeddedNats) -> None:
    """A client with the default reply inbox (`_INBOX.`, as every NATS client has unless told) as
    publisher: its JetStream publish times out, since it may not subscribe to `_INBOX.>`, and the
    explanation names the prefix it must use; with that prefix the same publish is acknowledged."""
    plain = await bus.connect(seeded.url, name="plain", max_reconnect_attempts=1,
                              **{**creds("publisher").connect_options(), "inbox_prefix": "_INBOX"})
    try:
        with pytest.raises(nats.errors.TimeoutError) as caught:
            await plain.jetstream(timeout=1.0).publish(task_subject("calc"), b"hello",
                                                       headers={HDR_MSG_ID: "inbox-1"})
    finally:
        await bus.close(plain)
    text = explain_refusal(caught.value, creds("publisher"))
    assert text is not None and "_INBOX_publisher" in text and "inbox_prefix" in text
    fixed = await nats.connect(seeded.url, user="publisher", password=PASSWORDS["publisher"],
                               inbox_prefix="_INBOX_publisher", max_reconnect_attempts=1)
    try:
        ack = await fixed.jetstream(timeout=5.0).publish(task_subject("calc"), b"hello",
                                                         headers={HDR_MSG_ID: "inbox-1"})
    finally:
        await fixed.close()
    assert ack.stream == TASKS and ack.duplicate  # the timed-out publish had been stored: same Msg-Id
