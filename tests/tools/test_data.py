"""DataProvider / ResultHandler against a real nats-server: files in, writes out, exactly once."""

from __future__ import annotations

import pytest

from runtime.jobs import ToolJob
from runtime.nats.kv import applied_kv, workspace_kv
from runtime.nats.topology import ensure_topology
from runtime.tools.data import (
    JobContext,
    NullDataProvider,
    NullResultHandler,
    StaticDataProvider,
    WorkspaceConflict,
    WorkspaceDataProvider,
    WorkspaceResultHandler,
    WriteError,
    key_for_path,
    parse_writes,
    path_for_key,
)

pytestmark = pytest.mark.anyio


def job(call: str = "1.0", ws: str | None = "w1") -> ToolJob:
    return ToolJob(run_id="r1", actor="a", call_id=f"r1/{call}", tool="t", workspace=ws)


def write_count(info, key: str) -> int:
    return (info.state.subjects or {}).get(key, 0)


def test_keys_and_writes_parsing() -> None:
    for p in ["notes/a.txt", "a b/ü.md", "=x", ".hidden", "x..y", "trail."]:
        assert path_for_key(key_for_path(p)) == p
    assert key_for_path("notes/a.txt") == "notes/a.txt"
    assert parse_writes({"writes": [{"path": "/data/x/y.txt", "content": "hi"}]}) == [("x/y.txt", b"hi")]
    assert parse_writes({"message": "no writes"}) == []
    assert parse_writes("plain") == []
    with pytest.raises(WriteError, match="outside /data/"):
        parse_writes({"writes": [{"path": "/etc/passwd", "content": "x"}]})
    with pytest.raises(WriteError, match=r"'\.\.'"):
        parse_writes({"writes": [{"path": "a/../../b", "content": "x"}]})
    with pytest.raises(WriteError, match=r"writes\[0\]\.content"):
        parse_writes({"writes": [{"path": "a", "content": 3}]})
    with pytest.raises(WriteError, match="must be a list"):
        parse_writes({"writes": "a"})


async def test_null_and_static_providers(tmp_path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "a.txt").write_text("alpha")
    (tmp_path / "b.bin").write_bytes(b"\xff\x00")
    ctx = JobContext(job(ws=None))
    assert await NullDataProvider().load_files("t", {}, ctx) == {}
    files = await StaticDataProvider({"/data/x": "1"}, folder=tmp_path).load_files("t", {}, ctx)
    assert files == {"/data/x": "1", "/data/sub/a.txt": "alpha", "/data/b.bin": b"\xff\x00"}
    assert await NullResultHandler().recorded(ctx) is None


async def test_workspace_roundtrip_and_exactly_once(js) -> None:
    await ensure_topology(js)
    kv = await workspace_kv(js, "w1")
    await kv.put("notes/a.txt", b"first")
    provider, handler = WorkspaceDataProvider(js), WorkspaceResultHandler(js)

    ctx = JobContext(job())
    files = await provider.load_files("t", {}, ctx)
    assert files == {"/data/notes/a.txt": "first"}
    assert ctx.complete and ctx.revisions == {"notes/a.txt": 1}
    result = {"writes": [{"path": "/data/notes/a.txt", "content": "second"},
                         {"path": "new file.txt", "content": "n"}], "message": "ok"}
    await handler.handle("t", result, ctx)
    assert ctx.writes_applied == 2
    assert (await kv.get("notes/a.txt")).value == b"second"
    assert (await kv.get(key_for_path("new file.txt"))).value == b"n"

    # the same job again (a redelivery): nothing is written twice, the recorded output comes back
    again = JobContext(job())
    assert (await handler.recorded(again)).output == result
    await provider.load_files("t", {}, again)
    await handler.handle("t", result, again)
    info = await js.stream_info("KV_ws_w1", subjects_filter=">")
    assert write_count(info, "$KV.ws_w1.notes/a.txt") == 2  # the put + exactly one write

    # a redelivery that lost its marker (crash between writes and marker) is still applied once
    applied = await applied_kv(js)
    await applied.purge(handler._marker_key(again))
    lost = JobContext(job(), revisions={"notes/a.txt": 1}, complete=True)
    await handler.handle("t", result, lost)
    info = await js.stream_info("KV_ws_w1", subjects_filter=">")
    assert write_count(info, "$KV.ws_w1.notes/a.txt") == 2


async def test_stale_write_is_a_conflict(js) -> None:
    await ensure_topology(js)
    kv = await workspace_kv(js, "w2")
    provider, handler = WorkspaceDataProvider(js), WorkspaceResultHandler(js)
    ctx = JobContext(job("2.0", ws="w2"))
    assert await provider.load_files("t", {}, ctx) == {}
    await kv.put("f.txt", b"someone else")  # lands after the script read an empty workspace
    with pytest.raises(WorkspaceConflict, match=r"f\.txt changed while t ran"):
        await handler.handle("t", {"writes": [{"path": "f.txt", "content": "mine"}]}, ctx)
    assert (await kv.get("f.txt")).value == b"someone else"
    assert await handler.recorded(ctx) is None


async def test_writes_without_workspace_are_refused(js) -> None:
    await ensure_topology(js)
    with pytest.raises(WriteError, match="no workspace"):
        await WorkspaceResultHandler(js).handle("t", {"writes": [{"path": "a", "content": "x"}]},
                                                JobContext(job(ws=None)))


async def test_a_conflict_on_the_second_write_leaves_the_first_unapplied(js) -> None:
    """All of one job's writes land or none does: the second write's file changed after the script read
    it, so the job reports the conflict and the first file keeps its old content; re-run on fresh data,
    the same job applies both."""
    await ensure_topology(js)
    kv = await workspace_kv(js, "w3")
    await kv.put("a.txt", b"a0")
    await kv.put("b.txt", b"b0")
    provider, handler = WorkspaceDataProvider(js), WorkspaceResultHandler(js)
    result = {"writes": [{"path": "a.txt", "content": "a1"}, {"path": "b.txt", "content": "b1"}]}

    ctx = JobContext(job("3.0", ws="w3"))
    await provider.load_files("t", {}, ctx)
    await kv.put("b.txt", b"someone else")  # the second file changes after the script read it
    with pytest.raises(WorkspaceConflict, match=r"b\.txt changed while t ran \(none of its 2 writes"):
        await handler.handle("t", result, ctx)
    assert (await kv.get("a.txt")).value == b"a0"  # the first write did not land either
    assert (await kv.get("b.txt")).value == b"someone else"
    assert await handler.recorded(ctx) is None
    info = await js.stream_info("KV_ws_w3", subjects_filter=">")
    assert write_count(info, "$KV.ws_w3.a.txt") == 1

    fresh = JobContext(job("3.0", ws="w3"))  # the worker's retry: read again, write again
    await provider.load_files("t", {}, fresh)
    await handler.handle("t", result, fresh)
    assert fresh.writes_applied == 2
    assert [(await kv.get(k)).value for k in ("a.txt", "b.txt")] == [b"a1", b"b1"]
    assert fresh.revisions["b.txt"] == fresh.revisions["a.txt"] + 1  # one batch: consecutive revisions

    # the batch landed but its ack was lost (the marker too): the same job again is recognised as done
    await (await applied_kv(js)).purge(handler._marker_key(fresh))
    lost = JobContext(job("3.0", ws="w3"), revisions={"a.txt": 1, "b.txt": 3}, complete=True)
    await handler.handle("t", result, lost)
    info = await js.stream_info("KV_ws_w3", subjects_filter=">")
    assert write_count(info, "$KV.ws_w3.a.txt") == 2 and write_count(info, "$KV.ws_w3.b.txt") == 3


async def test_a_bucket_made_before_atomic_writes_is_upgraded_on_first_batch(js) -> None:
    await ensure_topology(js)
    await workspace_kv(js, "w4")
    config = (await js.stream_info("KV_ws_w4")).config
    config.allow_atomic = False  # as an older version created it
    await js.update_stream(config)
    assert not (await js.stream_info("KV_ws_w4")).config.allow_atomic
    ctx = JobContext(job("4.0", ws="w4"), complete=True)
    await WorkspaceResultHandler(js).handle(
        "t", {"writes": [{"path": "x", "content": "1"}, {"path": "y", "content": "2"}]}, ctx)
    assert ctx.writes_applied == 2 and (await js.stream_info("KV_ws_w4")).config.allow_atomic
