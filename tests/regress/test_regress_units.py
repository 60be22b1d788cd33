"""The pure parts of regressions: the canonical match of a call, each recorded call served once and in
order, the cache key of a request, the times and run-id files `sa regress` reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import events as ev
from runtime.cli.regress_cmds import parse_when
from runtime.regress.cache import request_key
from runtime.regress.recorded import Matcher, PymCompare, Recorded, canonical
from runtime.regress.sets import RegressError, read_ids
from runtime.types import ToolCall, ToolError


def test_canonical_json_ignores_key_order_and_integral_floats_and_the_keys_asked() -> None:
    same = {"a": "é", "b": [1, {"x": 1, "y": 2}]}
    assert canonical({"b": [1.0, {"y": 2, "x": 1}], "a": "é"}) == canonical(same)
    assert canonical({"a": 1}) != canonical({"a": 1.5})
    matcher = Matcher({"search": frozenset({"request_id"})})
    assert matcher.key("search", {"q": "tea", "request_id": "x1"}) == matcher.key("search", {"q": "tea"})
    assert matcher.key("other", {"q": "tea", "request_id": "x1"}) != matcher.key("other", {"q": "tea"})


@pytest.mark.anyio
async def test_each_recorded_call_is_served_once_in_order_and_only_with_its_outcome() -> None:
    run = "r1"
    calls = [ToolCall(f"{run}/1.0", "add", {"a": 1}), ToolCall(f"{run}/2.0", "add", {"a": 1}),
             ToolCall(f"{run}/3.0", "add", {"a": 2})]
    events: list[ev.Event] = [ev.RunStarted(run_id=run, input="x")]
    events += [ev.ToolCalled(run_id=run, call=c) for c in calls]
    events += [ev.ToolCompleted(run_id=run, call_id=calls[0].id, tool="add", output=1),
               ev.ToolFailed(run_id=run, call_id=calls[1].id, tool="add",
                             error=ToolError("execution", "boom"))]
    recorded = Recorded(events, Matcher())
    first, second = await recorded.take_call("add", {"a": 1.0}), await recorded.take_call("add", {"a": 1})
    assert first is not None and isinstance(first.outcome, ev.ToolCompleted) and first.outcome.output == 1
    assert second is not None and isinstance(second.outcome, ev.ToolFailed)
    assert await recorded.take_call("add", {"a": 1}) is None  # a third time: the world was never asked
    assert await recorded.take_call("add", {"a": 2}) is None  # made, but its outcome was never recorded


def test_the_cache_key_is_the_bytes_sent_with_the_regression_runs_own_id_written_as_a_placeholder() -> None:
    body = b'{"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"gab12/1.0"}]}]}'
    again = body.replace(b"gab12", b"gcd34")
    url = "http://gpu:8000/v1"
    assert request_key(url, body, "gab12") == request_key(url, again, "gcd34")
    assert request_key(url, body, "gab12") != request_key(url, body.replace(b'"m"', b'"n"'), "gab12")
    assert request_key(url, body, "gab12") != request_key("http://gpu2:8000/v1", body, "gab12")


def test_times_and_run_id_files(tmp_path: Path) -> None:
    assert parse_when("1700000000", "--since") == 1700000000.0
    assert parse_when("2023-11-14T22:13:20", "--since") == 1700000000.0  # UTC unless it says
    assert parse_when("2023-11-14T23:13:20+01:00", "--since") == 1700000000.0
    with pytest.raises(ValueError, match="--until takes a time ago"):
        parse_when("last tuesday", "--until")
    ids = tmp_path / "runs.txt"
    ids.write_text("r1\nr2, r3  # the refunds\n\n# none here\nr1\n")
    assert read_ids(ids) == ("r1", "r2", "r3")


SAME_QUERY = """\
\"\"\"Two searches ask the same when their queries differ only in case.\"\"\"
from grail import Input

recorded: dict = Input("recorded")
candidate: dict = Input("candidate")

recorded["q"].lower() == candidate["q"].lower()
"""


@pytest.mark.anyio
async def test_a_pym_matcher_says_when_two_calls_ask_the_same(tmp_path: Path) -> None:
    path = tmp_path / "same_query.pym"
    path.write_text(SAME_QUERY)
    run = "r1"
    calls = [ToolCall(f"{run}/1.0", "search", {"q": "Tea"}), ToolCall(f"{run}/2.0", "search", {"q": "Cups"})]
    events: list[ev.Event] = [ev.RunStarted(run_id=run, input="x")]
    for i, c in enumerate(calls):
        events += [ev.ToolCalled(run_id=run, call=c),
                   ev.ToolCompleted(run_id=run, seq=2 * i + 2, call_id=c.id, tool="search", output=i)]
    recorded = Recorded(events, Matcher(compare={"search": PymCompare.load(path)}))
    cups = await recorded.take_call("search", {"q": "CUPS"})
    assert cups is not None and cups.call.id == calls[1].id
    assert await recorded.take_call("search", {"q": "cups"}) is None  # served once
    assert await recorded.take_call("search", {"q": 3}) is None  # the function failed on it: no match
    tea = await recorded.take_call("search", {"q": "tea"})
    assert tea is not None and tea.call.id == calls[0].id
    (tmp_path / "bad.pym").write_text('from grail import Input\n\nx: int = Input("x")\n\nTrue\n')
    with pytest.raises(RegressError, match="declares the inputs \\['x'\\], not recorded and candidate"):
        PymCompare.load(tmp_path / "bad.pym")


def test_a_shipped_candidate_holds_its_tools_outside_its_folder_and_loads_the_same(tmp_path: Path) -> None:
    """What a host unpacks is the bundle the client loaded: its folder, and a tool named outside it (the
    project's agents/calculator.pym), laid out so that the bundle file's paths still resolve."""
    from host_helpers import write_bundle

    from runtime.bundle import load_bundle
    from runtime.regress.shipped import pack, unpacked

    (tmp_path / "b" / "calc" / "__pycache__").mkdir(parents=True)
    (tmp_path / "b" / "calc" / "__pycache__" / "x.pyc").write_bytes(b"\0")
    bundle = load_bundle(write_bundle(tmp_path / "b"))
    assert not Path(str(bundle.tools["calculator"].path)).is_relative_to(bundle.root)  # outside its folder
    archive = pack(bundle)
    assert pack(bundle) == archive  # the same files, the same bytes: stored once
    again = load_bundle(unpacked(archive, tmp_path / "host"))
    assert again.digest == bundle.digest and again.root.is_relative_to(tmp_path / "host")
    assert set(again.tools) == set(bundle.tools)
    assert not list((tmp_path / "host").rglob("*.pyc"))


@pytest.mark.anyio
async def test_a_candidate_reading_a_file_beyond_what_is_shipped_is_refused(tmp_path: Path) -> None:
    from host_helpers import write_bundle

    from runtime.bundle import load_bundle
    from runtime.regress.shipped import ship

    (tmp_path / "prompt.txt").write_text("You compute.")
    path = write_bundle(tmp_path / "b")
    path.write_text(path.read_text().replace("system_prompt: You compute things with tools.",
                                             "system_prompt_file: ../../prompt.txt"))
    with pytest.raises(RegressError, match=r"cannot be shipped to the fleet: it does not load from its own "
                                           r"files .*regress it in process \(--local\)"):
        await ship(None, load_bundle(path))  # type: ignore[arg-type]  # refused before the store is asked
