"""`kv_entries` lists a bucket exactly, however many purge markers stand among its keys.

The look for orphans lists a host's partitions of ``active`` every 15 s, and every run that ended in the last
minute left a purge marker there: at a sustained load most of what a listing reads is markers. The listing
reads with its own pull requests (no per-message task, no metadata parsed for a marker); these tests pin what
it returns, on a real server.
"""

from __future__ import annotations

import anyio
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, KeyValueConfig
from nats.js.errors import ServiceUnavailableError

from runtime.nats import kv as kv_module
from runtime.nats.kv import _pending, _read_all, kv_entries, last_per_subject

pytestmark = pytest.mark.anyio

KEYS = 2_500  # more than one page of the fetch the listing used before (1,000 per request)
SLOW_KEYS = 8_000  # delivered in 2-6 ms per 3,000 on this kind of machine: several 2 ms requests


async def test_a_listing_among_purge_markers_returns_exactly_the_live_keys(js) -> None:
    kv = await js.create_key_value(KeyValueConfig(bucket="listing"))
    for i in range(KEYS):
        await kv.put(f"p1.r{i}", f"actor-{i}".encode())
    live = {f"p1.r{i}" for i in range(0, KEYS, 97)}
    for i in range(KEYS):
        if f"p1.r{i}" not in live:
            await kv.purge(f"p1.r{i}")
    await kv.put("p2.other", b"another partition")

    entries = await kv_entries(kv, "p1.>", complete=True)

    assert set(entries) == live
    for key, entry in entries.items():
        assert entry.value == f"actor-{key.split('.r')[1]}".encode()
        assert entry.operation is None
        assert entry.revision == (await kv.get(key)).revision
        assert entry.created is not None


async def test_a_listing_with_deleted_keys_gives_their_markers_and_every_subject_once(js) -> None:
    kv = await js.create_key_value(KeyValueConfig(bucket="markers", history=5))
    for round_ in range(3):  # history: several messages per key, the listing reads only the last
        for i in range(40):
            await kv.put(f"k{i}", f"v{round_}".encode())
    for i in range(10):
        await kv.delete(f"k{i}")

    entries = await kv_entries(kv, deleted=True)
    msgs = await last_per_subject(js, "KV_markers", "$KV.markers.>")

    assert len(msgs) == 40 and len({m.subject for m in msgs}) == 40
    assert {k for k, e in entries.items() if e.operation == "DEL"} == {f"k{i}" for i in range(10)}
    assert {e.value for e in entries.values() if e.operation is None} == {b"v2"}
    assert set(await kv_entries(kv)) == {f"k{i}" for i in range(10, 40)}


async def test_an_empty_filter_lists_nothing(js) -> None:
    kv = await js.create_key_value(KeyValueConfig(bucket="empty"))
    await kv.put("a", b"1")
    assert await kv_entries(kv, "p9.>", complete=True) == {}


def test_the_pending_count_is_read_from_either_reply_layout() -> None:
    assert _pending("$JS.ACK.KV_active.kvls-1.1.4711.3.1764320000000000000.17") == 17
    assert _pending("$JS.ACK.hub.ACCHASH.KV_active.kvls-1.1.4711.3.1764320000000000000.0.r4nd0m") == 0
    assert _pending("_INBOX.abc") == -1
    assert _pending(None) == -1


async def test_a_consumer_not_yet_reachable_is_asked_again_until_it_answers(js) -> None:
    """On a cluster a listing consumer's create can be answered before the client's node knows where it
    takes pull requests: the first requests find no responder (503). Here the consumer is made 0.2 s after
    the listing starts asking: the requests meanwhile get 503, and the listing still reads every message."""
    kv = await js.create_key_value(KeyValueConfig(bucket="late"))
    for i in range(30):
        await kv.put(f"k{i}", b"v")
    name = "kvls-late"
    out: list = []

    async def make_it_later() -> None:
        await anyio.sleep(0.2)
        await js.add_consumer("KV_late", ConsumerConfig(
            name=name, filter_subject="$KV.late.>", deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE, mem_storage=True))

    async with anyio.create_task_group() as tg:
        tg.start_soon(make_it_later)
        await _read_all(js._nc, "KV_late", name, 30, out)

    assert sorted(m.subject for m in out) == sorted(f"$KV.late.k{i}" for i in range(30))


async def test_a_consumer_that_never_answers_is_a_clear_error(js) -> None:
    await js.create_key_value(KeyValueConfig(bucket="never"))
    with pytest.raises(ServiceUnavailableError, match="kvls-missing on KV_never"):
        await _read_all(js._nc, "KV_never", "kvls-missing", 3, [])


async def test_a_request_that_expires_while_messages_still_come_is_followed_by_one_for_the_rest(
        js, monkeypatch) -> None:
    """A big listing on a slow server outlives one pull request: what came counts, and the rest is asked for
    (here each request lives 2 ms, so 8,000 keys take several)."""
    kv = await js.create_key_value(KeyValueConfig(bucket="slow"))
    for i in range(SLOW_KEYS):
        await kv.put(f"k{i}", b"v")
    nc = js._nc
    asked: list[bytes] = []
    publish = nc.publish

    async def counting(subject: str, payload: bytes = b"", **kw):
        if subject.startswith("$JS.API.CONSUMER.MSG.NEXT."):
            asked.append(payload)
        return await publish(subject, payload, **kw)

    monkeypatch.setattr(nc, "publish", counting)
    monkeypatch.setattr(kv_module, "PULL_EXPIRES_S", 0.002)

    entries = await kv_entries(kv)

    assert set(entries) == {f"k{i}" for i in range(SLOW_KEYS)}
    assert len(asked) > 1, "one request was enough: the test did not make it expire"
