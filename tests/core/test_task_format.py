"""Tasks from any NATS client (the README's task format), published with a plain nats-py client.

A task that carries only a `Nats-Msg-Id` (what `nats pub -H Nats-Msg-Id:t-p4` sends) runs under the run
id the README's formula gives for that id; it used to get one from the stream sequence, which `nats pub`
never sees. A message that is not a task (an unknown key such as `thred`, JSON that is not an object, a
control byte) is refused with the reason, recorded where its publisher finds it: a run of the agent that
fails at once with `bad_task`, under the run id any task gets; it used to be a host log line, or worse,
run as a text task."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from control_helpers import sa
from host_helpers import running_host, running_worker, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client, RunFailedError
from runtime.commands import BadCommand, decode
from runtime.nats.subjects import partition_of
from runtime.testing import ScriptedModelServer, hermes_call, last_message

pytestmark = pytest.mark.anyio


def readme_run_id(actor: str, task_id: str) -> str:
    """The run id as the README writes it, for a client in any language."""
    return "r" + hashlib.blake2b(f"{actor}\x00id:{task_id}".encode(), digest_size=8).hexdigest()


def readme_seq_run_id(actor: str, seq: int) -> str:
    return "r" + hashlib.blake2b(f"{actor}\x00seq:{seq}".encode(), digest_size=8).hexdigest()


def echo_model(body: dict[str, Any]) -> str:
    if "<tool_response>" in last_message(body):
        return "done"
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return hermes_call("submit", {"answer": f"did {task}"})


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    return js


async def test_tasks_from_a_plain_client_run_where_the_readme_says_and_bad_ones_say_why(nats_server, topo,
                                                                                       tmp_path: Path):
    url, js = nats_server.url, topo
    bundle = write_bundle(tmp_path, "calc", tools=())
    bad = {  # Nats-Msg-Id -> (body, what the refusal says)
        "bad-key": (b'{"input": "x", "thred": "t1"}',
                    "unknown key 'thred' in a task (a task has: agent, input"),
        "bad-timeout": (b'{"input": "x", "timeout": 5}', "unknown key 'timeout'"),
        "bad-array": (b"[1, 2, 3]", "a JSON task must be an object"),
        "bad-quoted": (b'"just text"', "not a JSON string"),
        "bad-control": (b"\x01", "control character 0x01 at character 0"),
    }
    with ScriptedModelServer(responder=echo_model) as model:
        async with running_host(url, [bundle], model), running_worker(url, [bundle]), \
                await Client.connect(url) as client:
            await js.publish("agents.calc.tasks", b"add 2 and 2", headers={"Nats-Msg-Id": "t-p4"})
            await js.publish("agents.calc.tasks", b'{"input": "add 3 and 3"}',
                             headers={"Nats-Msg-Id": "t-p5"})
            for msg_id, (body, _) in bad.items():
                await js.publish("agents.calc.tasks", body, headers={"Nats-Msg-Id": msg_id})
            unnamed = await js.publish("agents.calc.tasks", b"\x00\x07")  # no Msg-Id: by its sequence
            outputs = [await client.get(readme_run_id("calc", t)).result(timeout=30)
                       for t in ("t-p4", "t-p5")]
            refusals: dict[str, RunFailedError] = {}
            for msg_id in [*bad, "unnamed"]:
                run_id = readme_seq_run_id("calc", unnamed.seq) if msg_id == "unnamed" else \
                    readme_run_id("calc", msg_id)
                with pytest.raises(RunFailedError) as caught:
                    await client.get(run_id).result(timeout=30)
                refusals[msg_id] = caught.value
            still = await client.run("calc", "add 1 and 1", result_timeout=30)  # the host keeps serving
            listed = {r["run_id"]: r for r in (await sa(url, "runs", "--json")).json()}
            replayed = await sa(url, "replay", readme_run_id("calc", "bad-key"))

    assert outputs == [{"answer": "did add 2 and 2"}, {"answer": "did add 3 and 3"}]
    for msg_id, (_, says) in bad.items():
        assert refusals[msg_id].reason == "bad_task" and says in refusals[msg_id].detail, refusals[msg_id]
        assert listed[readme_run_id("calc", msg_id)]["status"] == "failed"
    assert "control character 0x00" in refusals["unnamed"].detail
    assert replayed.code == 0 and "bad_task" in replayed.out and "unknown key 'thred'" in replayed.out
    assert '{"input": "x", "thred": "t1"}' in replayed.out  # the message as published: its task
    assert still == {"answer": "did add 1 and 1"}


def test_a_json_or_msgpack_task_may_hold_escapes_but_not_nul():
    """The text form refused NUL while a JSON or msgpack task (what `sa send` publishes) carried it."""
    escaped = decode("calc", json.dumps({"input": "red \x1b[31m text"}).encode()).command
    assert escaped.input == "red \x1b[31m text"  # type: ignore[union-attr]  # shown escaped, not refused
    for body in (json.dumps({"input": "cut\x00here"}).encode(),
                 ev.encode_command(ev.Task(agent="calc", input="cut\x00here", task_id="t1"))):
        with pytest.raises(BadCommand, match="NUL character \\(0x00\\) at character 3"):
            decode("calc", body)


async def test_an_instance_named_in_the_body_runs_in_the_instances_partition(nats_server, topo,
                                                                             tmp_path: Path):
    """A task on ``agents.calc.tasks`` whose body names an instance runs in that instance's partition, as the
    same task published on ``agents.calc:<instance>.tasks`` does, under the run id the README gives for the
    actor ``calc:<instance>``: with a task id in the body, with only a Msg-Id, and with neither (its run id
    from the stream sequence of the message as published). It used to be stored, and run, in the partition
    of ``calc``: every instance on one host."""
    url, js = nats_server.url, topo
    bundle = write_bundle(tmp_path, "calc", tools=())
    home = partition_of("calc", 2)
    away = [i for i in (f"i{n}" for n in range(20)) if partition_of(f"calc:{i}", 2) != home]
    body_id, header_id, no_id = away[:3]

    def task(text: str, instance: str, **more: str) -> bytes:
        return json.dumps({"input": text, "instance": instance, **more}).encode()

    with ScriptedModelServer(responder=echo_model) as model:
        async with running_host(url, [bundle], model), running_worker(url, [bundle]), \
                await Client.connect(url) as client:
            await js.publish("agents.calc.tasks", task("one", body_id, task_id="t-i1"))
            await js.publish("agents.calc.tasks", task("two", header_id), headers={"Nats-Msg-Id": "t-i2"})
            unnamed = await js.publish("agents.calc.tasks", task("three", no_id))
            runs = {readme_run_id(f"calc:{body_id}", "t-i1"): (body_id, "one"),
                    readme_run_id(f"calc:{header_id}", "t-i2"): (header_id, "two"),
                    readme_seq_run_id(f"calc:{no_id}", unnamed.seq): (no_id, "three")}
            outputs = {run_id: await client.get(run_id).result(timeout=30) for run_id in runs}
            index = {run_id: await client.run_info(run_id) for run_id in runs}
            with anyio.fail_after(20):  # the originals were acked once moved: none is left for a second run
                while (await js.stream_info("TASKS")).state.messages:
                    await anyio.sleep(0.05)
    for run_id, (instance, text) in runs.items():
        assert outputs[run_id] == {"answer": f"did {text}"}
        info = index[run_id]
        assert info is not None and info.actor == f"calc:{instance}", info
        assert info.partition == partition_of(f"calc:{instance}", 2) != home, info


def test_what_a_task_subject_accepts():
    task = decode("calc", b"what is 2+2?", msg_id="t-p4").command
    assert task.input == "what is 2+2?" and task.task_id == "t-p4"  # type: ignore[union-attr]
    named = decode("calc", json.dumps({"input": "x", "task_id": "mine"}).encode(), msg_id="t-p4").command
    assert named.task_id == "mine"  # type: ignore[union-attr]  # the task's own id wins
    for text in ("[urgent] fix the build", "line one\nline two\ttabbed\r\n", '"unclosed quote'):
        assert decode("calc", text.encode()).command.input == text  # type: ignore[union-attr]
    for body, says in ((b'{"input": "x", "thred": "t"}', "unknown key 'thred'"),
                       (b'{"kind": "cancel", "run_id": "r1", "resaon": "typo"}',
                        "unknown key 'resaon' in a cancel"),
                       (b"[1, 2, 3]", "not a JSON array"), (b"ok\x1bnot", "control character 0x1b"),
                       (b"\x7f", "control character 0x7f")):
        with pytest.raises(BadCommand, match=says):
            decode("calc", body, "alice" if b"cancel" in body else None)
