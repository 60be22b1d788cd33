"""runtime.nats.jetstream: the leaner acked publish gives what nats-py's gives, on a real nats-server."""

from __future__ import annotations

import anyio
import nats.errors
import pytest
from nats.js import api
from nats.js.errors import BadRequestError, NoStreamResponseError

from runtime.nats.jetstream import JetStream
from runtime.nats.subjects import ERR_WRONG_LAST_SEQUENCE, HDR_MSG_ID

pytestmark = pytest.mark.anyio


async def test_acks_sequences_and_duplicates_like_nats_py(js) -> None:
    assert isinstance(js, JetStream)
    await js.add_stream(api.StreamConfig(name="J", subjects=["j.>"]))
    first = await js.publish("j.a", b"1", headers={HDR_MSG_ID: "one"})
    second = await js.publish("j.b", b"2")
    again = await js.publish("j.a", b"1", headers={HDR_MSG_ID: "one"})
    assert isinstance(first, api.PubAck) and (first.stream, first.seq) == ("J", 1)
    assert second.seq == 2 and not second.duplicate
    assert again.seq == 1 and again.duplicate is True
    stored = await js.get_msg("J", 2)
    assert stored.data == b"2" and stored.subject == "j.b"


async def test_every_concurrent_publish_gets_its_own_ack(js) -> None:
    await js.add_stream(api.StreamConfig(name="J", subjects=["j.>"]))
    seqs: dict[int, int] = {}

    async def one(i: int) -> None:
        ack = await js.publish(f"j.{i}", str(i).encode())
        seqs[i] = ack.seq

    async with anyio.create_task_group() as tg:
        for i in range(200):
            tg.start_soon(one, i)
    assert sorted(seqs.values()) == list(range(1, 201))
    for i in (0, 57, 199):  # each ack names the message that publish stored
        assert (await js.get_msg("J", seqs[i])).data == str(i).encode()


async def test_refusals_raise_nats_py_errors(js) -> None:
    await js.add_stream(api.StreamConfig(name="J", subjects=["j.>"]))
    await js.publish("j.run.1", b"x")
    with pytest.raises(BadRequestError) as occ:  # an OCC conflict, as the run log sees it
        await js.publish("j.run.2", b"y", headers={"Nats-Expected-Last-Subject-Sequence": "7",
                                                    "Nats-Expected-Last-Subject-Sequence-Subject": "j.run.>"})
    assert occ.value.err_code == ERR_WRONG_LAST_SEQUENCE
    with pytest.raises(NoStreamResponseError):  # no stream stores this subject
        await js.publish("nowhere.at.all", b"z")
    ack = await js.publish("j.run.2", b"y", stream="J")  # nats-py's own path, expected-stream header
    assert ack.seq == 2


async def test_no_ack_in_time_is_nats_py_timeout(js, nc) -> None:
    """A responder that never answers (here a plain subscriber on the subject) leaves the publish to time
    out with the client's TimeoutError, which every caller treats as an outage and retries."""
    sub = await nc.subscribe("silent.>")
    with pytest.raises(nats.errors.TimeoutError):
        await js.publish("silent.x", b"?", timeout=0.2)
    assert (await sub.next_msg(timeout=1)).data == b"?"  # it was sent; nobody acked it
    assert not js._replies  # the waiting request is forgotten


async def test_send_then_acked_gives_each_message_its_ack_in_any_order(js) -> None:
    """`send` hands messages over at once; their acks are awaited later, in any order, with `publish`'s
    results and errors. A dropped pending ack is forgotten, its message still stored."""
    await js.add_stream(api.StreamConfig(name="J", subjects=["j.>"]))
    pending = [await js.send(f"j.{i}", str(i).encode(), headers={HDR_MSG_ID: f"m{i}"}) for i in range(3)]
    dropped = await js.send("j.dropped", b"d")
    nowhere = await js.send("nowhere.at.all", b"z")
    acks = [await p.acked() for p in reversed(pending)]
    assert [(a.stream, a.seq) for a in acks] == [("J", 3), ("J", 2), ("J", 1)]
    dropped.drop()
    with pytest.raises(NoStreamResponseError):
        await nowhere.acked()
    assert not js._replies  # nothing left waiting: the dropped one included
    again = await (await js.send("j.0", b"0", headers={HDR_MSG_ID: "m0"})).acked()
    assert (again.seq, again.duplicate) == (1, True)
    assert (await js.get_msg("J", 4)).data == b"d"  # dropped is not unsent


async def test_a_sent_message_without_an_ack_times_out(js, nc) -> None:
    sub = await nc.subscribe("silent.>")
    pending = await js.send("silent.x", b"?", timeout=0.2)
    assert (await sub.next_msg(timeout=1)).data == b"?"
    with pytest.raises(nats.errors.TimeoutError):
        await pending.acked()
    assert not js._replies
