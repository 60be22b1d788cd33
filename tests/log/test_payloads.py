"""Big payloads against a real nats-server (max_payload 1 MiB) and real Monty: values over the threshold go
to the object store and come back byte-exact; events carry refs; a 20 MB tool output travels worker ->
RESULTS -> resolve end to end."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from runtime import events
from runtime.events import PayloadRef
from runtime.log import RunLog
from runtime.log.payloads import DEFAULT_THRESHOLD, PayloadError, Payloads, object_name, threshold_from_env
from runtime.nats.kv import applied_kv
from runtime.nats.subjects import EVENTS, PAYLOADS_BUCKET, TOOLS
from runtime.nats.topology import ensure_topology
from runtime.types import Message, ToolCall
from runtime.worker import Worker, build_registry
from tests.worker.test_worker import collect_outcomes, job

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
    return (await js.stream_info(f"OBJ_{PAYLOADS_BUCKET}")).state.messages


async def test_small_values_stay_inline_and_big_ones_round_trip(js) -> None:
    await ensure_topology(js)
    p = Payloads(js)
    assert p.threshold == DEFAULT_THRESHOLD == 256 * 1024
    assert await p.offload({"a": 1}, run="r1") == {"a": 1}
    assert await p.resolve({"a": 1}) == {"a": 1}  # not a ref: returned as is

    value = {"rows": [{"i": i, "text": f"row {i} " * 20} for i in range(3000)]}  # ~ 500 KB of msgpack
    ref = await p.offload(value, run="r1")
    data = msgspec.msgpack.encode(value)
    assert isinstance(ref, PayloadRef) and ref.size == len(data) > p.threshold
    assert ref.object_name == object_name(data, "r1") and ref.object_name.startswith("r1/sha256-")
    assert ref.digest.startswith("sha256:")
    assert await p.resolve(ref) == value

    stored = await object_count(js)
    assert await p.offload(value, run="r1") == ref  # content-addressed: the same bytes are stored once
    assert await object_count(js) == stored
    other = await p.offload(value, run="r2")  # ... per run: another run's copy is its own object
    assert other.object_name.startswith("r2/") and await p.resolve(other) == value

    with pytest.raises(PayloadError, match="not in the 'payloads' object store"):
        await p.resolve(PayloadRef(object_name="sha256-" + "0" * 64, size=3, digest="sha256:00"))
    with pytest.raises(PayloadError, match="digest"):
        await p.resolve(msgspec.structs.replace(ref, digest="sha256:" + "f" * 64))


async def test_the_threshold_is_configurable_and_fits_the_server(js, monkeypatch) -> None:
    await ensure_topology(js)
    assert await Payloads(js, threshold=10).offload("x" * 20, run="r1") != "x" * 20
    assert await Payloads(js, threshold=100).offload("x" * 20, run="r1") == "x" * 20
    monkeypatch.setenv("SA_PAYLOAD_THRESHOLD", "1kb")
    assert threshold_from_env() == 1024 and Payloads(js).threshold == 1024
    monkeypatch.setenv("SA_PAYLOAD_THRESHOLD", "lots")
    with pytest.raises(ValueError, match="SA_PAYLOAD_THRESHOLD"):
        threshold_from_env()
    # the server accepts 1 MiB per message: a larger threshold could never be published inline
    assert Payloads(js, threshold=50 << 20).threshold < js._nc.max_payload == 1 << 20


async def test_the_log_stores_big_events_as_stubs_and_reads_them_back_whole(js) -> None:
    await ensure_topology(js)
    log = RunLog(js, payloads=Payloads(js, threshold=4096))
    big_input = "summarise: " + "lorem ipsum " * 2000
    call = ToolCall("r1/1.0", "write", {"text": "a" * 9000})
    written = [
        events.RunStarted(run_id="r1", input=big_input),
        events.ModelRequested(run_id="r1", request_id="r1/1", turn=1,
                              messages=(Message(role="user", content="m" * 9000),)),
        events.ModelResponded(run_id="r1", request_id="r1/1", turn=1, text="t" * 10_000, calls=(call,)),
        events.ToolCalled(run_id="r1", call=call),
        events.RunCompleted(run_id="r1", output={"ok": True}),
    ]
    expect = 0
    for seq, event in enumerate(written):
        written[seq] = events.stamp(event, seq=seq, ts=float(seq), actor="a")
        expect = await log.append(written[seq], expect=expect)
    stored = (await log.read("r1", resolve=False)).events
    assert stored[4] == written[4]  # under the threshold: as written
    for stub in stored[:4]:
        assert stub.ref is not None and stub.ref.size > 4096  # the whole event is in the object store
    raw = [m.data for m in [await js.get_msg(EVENTS, s) for s in (await log.read("r1")).stream_seqs]]
    assert all(len(data) < 1024 for data in raw[:4])  # what went to EVENTS is small
    assert stored[0].input == "" and stored[1].messages == () and stored[2].text == ""
    assert stored[2].calls == (ToolCall("r1/1.0", "write", {}),) == (stored[3].call,)  # names kept
    assert (await log.read("r1")).events == written  # whole again: Message structs, strings, calls


async def test_a_20_mb_tool_output_goes_end_to_end(js, tmp_path: Path) -> None:
    await ensure_topology(js)
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
    with pytest.raises(ValueError, match="resolve it first"):
        big.events()  # an event is made from the value, never from the outcome's ref
    resolved = await Payloads(js).resolve_outcome(big)
    (completed,) = [e for e in resolved.events() if events.kind_of(e) == "tool.completed"]
    assert resolved.ref is None and completed.output["size"] == n
    assert completed.output["blob"] == "0123456789" * (n // 10)

    chatty = outcomes["r1/1.1"]  # 3 MB of print() would not fit a message: the notes are capped
    assert chatty.result.error is None and chatty.ref is None and chatty.result.output["size"] == 1000
    printed = "".join(note.text for note in chatty.notes if note.kind == "printed")
    assert printed.startswith("zzz") and "bytes of printed output cut" in printed
    assert DEFAULT_THRESHOLD <= len(printed) <= DEFAULT_THRESHOLD + 1000
    assert (await js.stream_info(TOOLS)).state.messages == 0 and worker.stats.nacked == 0


async def test_the_applied_marker_of_a_big_output_keeps_a_ref_and_replays_the_value(js) -> None:
    """A workspace job whose output is over the threshold: the `applied` marker (a KV value, one NATS
    message) holds a ref, and a redelivery still gets the whole output back."""
    from runtime.jobs import ToolJob
    from runtime.tools.data import JobContext, WorkspaceResultHandler

    await ensure_topology(js)
    handler = WorkspaceResultHandler(js)
    result = {"writes": [{"path": "/data/big.txt", "content": "small"}], "blob": "x" * 2_000_000}
    job = ToolJob(run_id="r1", actor="a", call_id="r1/1.0", tool="t", workspace="w1")
    ctx = JobContext(job, complete=True)
    await handler.handle("t", result, ctx)
    assert ctx.writes_applied == 1
    marker = await (await applied_kv(js)).get(handler._marker_key(ctx))
    assert len(marker.value) < 4096  # the 2 MB is not in KV (it would not even fit a message)
    again = await handler.recorded(JobContext(job))
    assert again is not None and again.writes == 1 and again.output == result and again.ref is None
