"""Big payloads against a real nats-server (max_payload 1 MiB) and real Monty: values over the threshold go
to the object store and come back byte-exact; events carry refs; a 20 MB tool output travels worker ->
RESULTS -> resolve end to end."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest
from test_worker import collect_outcomes, job

from runtime import bus, events
from runtime.events import PayloadRef
from runtime.payloads import DEFAULT_THRESHOLD, PayloadError, Payloads, object_name, threshold_from_env
from runtime.types import Message
from runtime.worker import Worker, build_registry

pytestmark = pytest.mark.anyio

BIG = '''\
"""Return n characters of text, and print a lot while doing it."""
from grail import Input

n: int = Input("n")
chatter: int = Input("chatter", default=0)

if chatter:
    print("z" * chatter)
{"size": n, "blob": "0123456789" * (n // 10)}
'''


async def object_count(js) -> int:
    return (await js.stream_info(f"OBJ_{bus.PAYLOADS_BUCKET}")).state.messages


async def test_small_values_stay_inline_and_big_ones_round_trip(js) -> None:
    await bus.ensure_topology(js)
    p = Payloads(js)
    assert p.threshold == DEFAULT_THRESHOLD == 256 * 1024
    assert await p.offload({"a": 1}) == {"a": 1}
    assert await p.resolve({"a": 1}) == {"a": 1}  # not a ref: returned as is

    value = {"rows": [{"i": i, "text": f"row {i} " * 20} for i in range(3000)]}  # ~ 500 KB of msgpack
    ref = await p.offload(value)
    data = msgspec.msgpack.encode(value)
    assert isinstance(ref, PayloadRef) and ref.size == len(data) > p.threshold
    assert ref.object_name == object_name(data) and ref.digest.startswith("sha256:")
    assert await p.resolve(ref) == value

    stored = await object_count(js)
    assert await p.offload(value) == ref  # content-addressed: the same bytes are not stored twice
    assert await object_count(js) == stored

    with pytest.raises(PayloadError, match="not in the 'payloads' object store"):
        await p.resolve(PayloadRef(object_name="sha256-" + "0" * 64, size=3, digest="sha256:00"))
    with pytest.raises(PayloadError, match="digest"):
        await p.resolve(msgspec.structs.replace(ref, digest="sha256:" + "f" * 64))


async def test_the_threshold_is_configurable_and_fits_the_server(js, monkeypatch) -> None:
    await bus.ensure_topology(js)
    assert await Payloads(js, threshold=10).offload("x" * 20) != "x" * 20
    assert await Payloads(js, threshold=100).offload("x" * 20) == "x" * 20
    monkeypatch.setenv("SA_PAYLOAD_THRESHOLD", "1kb")
    assert threshold_from_env() == 1024 and Payloads(js).threshold == 1024
    monkeypatch.setenv("SA_PAYLOAD_THRESHOLD", "lots")
    with pytest.raises(ValueError, match="SA_PAYLOAD_THRESHOLD"):
        threshold_from_env()
    # the server accepts 1 MiB per message: a larger threshold could never be published inline
    assert Payloads(js, threshold=50 << 20).threshold < js._nc.max_payload == 1 << 20


async def test_events_carry_refs_and_resolve_to_the_original(js) -> None:
    await bus.ensure_topology(js)
    p = Payloads(js, threshold=4096)
    big_input = "summarise: " + "lorem ipsum " * 2000
    started = events.RunStarted(run_id="r1", seq=0, ts=1.0, agent="a", input=big_input)
    responded = events.ModelResponded(run_id="r1", seq=2, ts=2.0, request_id="q", turn=1, text="t" * 10_000)
    asked = events.ModelRequested(run_id="r1", seq=1, ts=1.5, request_id="q", turn=1,
                                  messages=(Message(role="user", content="m" * 9000),))
    small = events.RunCompleted(run_id="r1", seq=3, ts=3.0, output={"ok": True})
    log = [started, asked, responded, small]

    stored = [await p.offload_event(e) for e in log]
    assert stored[3] is small  # under the threshold: unchanged
    for after in stored[:3]:
        assert after.ref is not None and after.ref.size > 4096
        assert len(events.encode(after)) < 1024  # what goes to EVENTS is small
        assert events.decode(events.encode(after)) == after  # and survives the wire
    assert stored[0].input == "" and stored[2].text == "" and stored[1].messages == ()
    assert await p.resolve_events(stored) == log  # typed back: Message structs, strings
    assert await p.offload_event(stored[0]) is stored[0]  # already offloaded: left alone


async def test_a_20_mb_tool_output_goes_end_to_end(js, tmp_path: Path) -> None:
    await bus.ensure_topology(js)
    (tmp_path / "big.pym").write_text(BIG)
    reg = build_registry(tool_globs=[str(tmp_path / "big.pym")])
    limits = {"max_memory": "512mb", "max_output": "64mb", "max_duration": "60s"}
    n = 20_000_000
    for call, args in (("1.0", {"n": n}), ("1.1", {"n": 1000, "chatter": 3_000_000})):
        j = job(call, "big", args, limits=limits)
        await js.publish(j.subject, j.encode(), headers=j.headers())
    worker = Worker(js, reg)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        tg.start_soon(worker.run, stop)
        outcomes = {o.call_id: o for o in await collect_outcomes(js, 2, timeout=120)}
        stop.set()

    big = outcomes["r1/1.0"]
    assert big.result.error is None and big.result.output is None  # the value is not inline...
    assert big.ref is not None and big.ref.size > n  # ...the ref says where and how big
    assert len(big.encode()) < 4096
    (completed,) = [e for e in big.events(first_seq=0) if events.kind_of(e) == "tool.completed"]
    assert completed.ref == big.ref and len(events.encode(completed)) < 4096
    resolved = await Payloads(js).resolve_event(completed)
    assert resolved.ref is None and resolved.output["size"] == n
    assert resolved.output["blob"] == "0123456789" * (n // 10)
    assert (await Payloads(js).resolve_outcome(big)).result.output == resolved.output

    chatty = outcomes["r1/1.1"]  # 3 MB of print() would not fit a message: the notes are capped
    assert chatty.result.error is None and chatty.ref is None and chatty.result.output["size"] == 1000
    printed = "".join(note.text for note in chatty.notes if note.kind == "printed")
    assert printed.startswith("zzz") and "bytes of printed output cut" in printed
    assert DEFAULT_THRESHOLD <= len(printed) <= DEFAULT_THRESHOLD + 1000
    assert (await js.stream_info(bus.TOOLS)).state.messages == 0 and worker.stats.nacked == 0


async def test_the_applied_marker_of_a_big_output_keeps_a_ref_and_replays_the_value(js) -> None:
    """A workspace job whose output is over the threshold: the `applied` marker (a KV value, one NATS
    message) holds a ref, and a redelivery still gets the whole output back."""
    from runtime.jobs import ToolJob
    from runtime.tools.data import JobContext, WorkspaceResultHandler

    await bus.ensure_topology(js)
    handler = WorkspaceResultHandler(js)
    result = {"writes": [{"path": "/data/big.txt", "content": "small"}], "blob": "x" * 2_000_000}
    job = ToolJob(run_id="r1", agent="a", call_id="r1/1.0", tool="t", workspace="w1")
    ctx = JobContext(job, complete=True)
    await handler.handle("t", result, ctx)
    assert ctx.writes_applied == 1
    marker = await (await bus.applied_kv(js)).get(handler._marker_key(ctx))
    assert len(marker.value) < 4096  # the 2 MB is not in KV (it would not even fit a message)
    again = await handler.recorded(JobContext(job))
    assert again is not None and again.writes == 1 and again.output == result and again.ref is None
