"""The run log (`runtime.log.RunLog`) on a real nats-server: one writer per run, reads that give back what
was written (big values through the object store), following a run to its end, and copying a prefix into
a new run with every id re-derived."""

from __future__ import annotations

import anyio
import pytest
from nats.js.errors import BadRequestError, ServiceUnavailableError

from runtime import events as ev
from runtime import nats as bus
from runtime.log import TERMINAL_KINDS, RunLog, Superseded
from runtime.nats.subjects import ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_CONSTANT
from runtime.types import ToolCall

pytestmark = pytest.mark.anyio


@pytest.fixture
async def log(js) -> RunLog:
    await bus.ensure_topology(js, partitions=2)
    return RunLog(js)


def stamped(event: ev.Event, seq: int, actor: str = "calc") -> ev.Event:
    return ev.stamp(event, seq=seq, ts=1_700_000_000.0 + seq, actor=actor)


def a_run(run_id: str, output: object = "done") -> list[ev.Event]:
    call = ToolCall(id=f"{run_id}/1.0", name="add", arguments={"a": 1, "b": 2})
    return [stamped(e, i) for i, e in enumerate([
        ev.RunStarted(run_id=run_id, input="1 + 2"),
        ev.ModelRequested(run_id=run_id, request_id=f"{run_id}/1", turn=1),
        ev.ModelResponded(run_id=run_id, request_id=f"{run_id}/1", turn=1, calls=(call,)),
        ev.ToolCalled(run_id=run_id, call=call),
        ev.ToolCompleted(run_id=run_id, call_id=call.id, tool="add", output=3),
        ev.RunCompleted(run_id=run_id, output=output),
    ])]


async def test_the_single_writer_appends_and_a_stale_one_is_superseded(log: RunLog) -> None:
    events = a_run("rw1")
    last = await log.create(events[0])
    assert last is not None
    assert await log.create(events[0]) is None  # a re-sent task finds its run instead of starting another
    for e in events[1:3]:
        last = await log.append(e, expect=last)
    stale = last - 1
    with pytest.raises(Superseded, match="another writer appended first"):
        await log.append(events[3], expect=stale)
    assert await log.append(events[3], expect=last) > last  # the owner goes on
    again = await log.append(events[3], expect=last)  # its own retry whose ack was lost: the same place
    assert again == (await log.last("rw1", "calc"))[0]


async def test_an_unstamped_event_is_refused_before_anything_is_written(log: RunLog) -> None:
    with pytest.raises(ValueError, match="not stamped"):
        await log.append(ev.RunStarted(run_id="rw2", input="x"), expect=0)
    assert (await log.read("rw2")).events == []


async def test_read_gives_back_what_was_written_with_big_values_resolved(log: RunLog) -> None:
    big = "x" * (400 * 1024)  # over the object-store threshold (256 KiB): stored by reference
    written = await log.write_run(a_run("rw3", output=big))
    raw = await log.read("rw3", resolve=False)
    assert raw.events[-1].ref is not None  # the stub in the stream...
    back = await log.read("rw3")
    assert back.events == written.events and back.events[-1].output == big  # ...the value when read
    assert back.actor == "calc" and back.last_seq == written.last_seq


async def test_follow_ends_after_the_terminal_event_even_when_it_starts_first(log: RunLog) -> None:
    events = a_run("rw4")
    seen: list[str] = []

    async def follow() -> None:
        async for e in log.follow("rw4"):
            seen.append(ev.kind_of(e))

    async with anyio.create_task_group() as tg:
        tg.start_soon(follow)  # before the run exists: it waits for the first event
        await anyio.sleep(0)
        with anyio.fail_after(10):
            await log.write_run(events)
    assert seen == [ev.kind_of(e) for e in events] and seen[-1] in TERMINAL_KINDS


async def test_a_prefix_copied_to_a_new_run_folds_to_the_source_state_at_that_point(log: RunLog) -> None:
    from runtime import kernel

    await log.write_run(a_run("rw5"))
    copy = await log.copy_prefix("rw5", 4, "rw5-fork")
    assert [ev.kind_of(e) for e in copy.events] == ["run.started", "model.requested", "model.responded",
                                                   "tool.called"]
    assert all(e.run_id == "rw5-fork" for e in copy.events)
    assert copy.events[3].call.id == "rw5-fork/1.0"  # every id re-derived for the new run
    state = kernel.fold(kernel.KernelConfig(), copy.events)
    assert state.turn is not None and state.turn.called == {"rw5-fork/1.0"}  # the call is pending there
    with pytest.raises(Superseded):
        await log.copy_prefix("rw5", 2, "rw5-fork")  # the new run exists already
    with pytest.raises(ValueError, match="a prefix must keep 1 to 6"):
        await log.copy_prefix("rw5", 9, "rw5-other")


async def test_the_end_of_a_run_is_asked_of_the_stream_leader_not_any_replica(log: RunLog, js,
                                                                              monkeypatch) -> None:
    """A direct get is answered by whichever replica has the stream, and one catching up after a cut
    answers with an older last event: a host folding a run from that re-made a recorded model call
    (`bench/partitions.py`, a minority cut). `last` and `read` ask the leader (STREAM.MSG.GET)."""
    events = a_run("rw9")
    seq = await log.create(events[0])
    for e in events[1:]:
        seq = await log.append(e, expect=seq)
    asked: list[str] = []
    request = js._nc.request

    async def recording(subject: str, *args: object, **kw: object) -> object:
        asked.append(subject)
        return await request(subject, *args, **kw)

    monkeypatch.setattr(js._nc, "request", recording)
    assert (await log.last("rw9", "calc"))[0] == seq
    assert [ev.kind_of(e) for e in (await log.read("rw9")).events][-1] == "run.completed"
    gets = [s for s in asked if ".MSG.GET." in s or ".DIRECT.GET." in s]
    assert gets and all(s.startswith("$JS.API.STREAM.MSG.GET.EVENTS") for s in gets), gets


class ClusterRefusals:
    """A JetStream context that answers a failed expected-sequence check as a clustered stream may: with
    err_code 10164 ("wrong last sequence", no number) instead of 10071. Everything else is the server's."""

    def __init__(self, js) -> None:
        self._js = js
        self.unavailable = 0  # the next reads of a run's last event answered 503 (a leader being elected)

    def __getattr__(self, name: str):
        return getattr(self._js, name)

    async def get_last_msg(self, *args, **kw):
        if self.unavailable:
            self.unavailable -= 1
            raise ServiceUnavailableError(code=503, err_code=10008,
                                          description="JetStream system temporarily unavailable")
        return await self._js.get_last_msg(*args, **kw)

    async def publish(self, subject: str, payload: bytes = b"", **kw):
        try:
            return await self._js.publish(subject, payload, **kw)
        except BadRequestError as e:
            if e.err_code != ERR_WRONG_LAST_SEQUENCE:
                raise
            raise BadRequestError(code=400, err_code=ERR_WRONG_LAST_SEQUENCE_CONSTANT,
                                  description="wrong last sequence") from None


async def test_a_clustered_wrong_last_sequence_is_an_occ_conflict_not_a_refusal(log: RunLog, js) -> None:
    """Seen after an EVENTS leader was cut off mid-append: the retry of an append that had landed got
    10164, and the run failed as if the stream refused the event (`log_rejected`). It is the same check.
    And the read of what landed, asked of a leader being elected, answered 503: the driver stopped with an
    unexpected error and the run waited for a takeover that never came. It is retried."""
    cluster = ClusterRefusals(js)
    clustered = RunLog(cluster)
    events = a_run("rw10164")
    last = await clustered.create(events[0])
    assert last is not None
    assert await clustered.create(events[0]) is None  # the run exists
    last = await clustered.append(events[1], expect=last)
    cluster.unavailable = 2  # and the leader, asked what landed, is being elected: asked again
    again = await clustered.append(events[1], expect=last - 1)  # its own append whose ack was lost
    assert again == last and cluster.unavailable == 0
    with pytest.raises(Superseded):  # another writer's event is there: superseded, not rejected
        await clustered.append(events[2], expect=last - 1)


async def test_a_tail_hands_out_a_groups_events_and_acks_its_message_once_all_are(log: RunLog) -> None:
    """A durable reader (the trace exporter) gets each event of a group as an item; the message is acked
    only when every one of them is, so a reader that stopped halfway gets the whole group again."""
    events = a_run("rw9")
    last = await log.create(events[0])
    assert last is not None
    await log.append_group(events[1:], expect=last)
    tail = await log.tail("rw9-reader", ack_wait=1.0)
    try:
        with anyio.fail_after(10):
            items = []
            while len(items) < len(events):
                items += [i for i in await tail.fetch(16) if i.event is not None and i.event.run_id == "rw9"]
        assert [i.event for i in items] == events
        for item in items[:-1]:  # all but the group's last: its message stays unacked
            await item.ack()
        with anyio.fail_after(10):
            again: list = []
            while not again:
                again = [i for i in await tail.fetch(16) if i.event is not None and i.event.run_id == "rw9"]
        assert [i.event for i in again] == events[1:]  # the group, whole, after its AckWait
        for item in again:
            await item.ack()
        assert [i for i in await tail.fetch(16, timeout=1.5) if i.event and i.event.run_id == "rw9"] == []
    finally:
        await tail.close()
