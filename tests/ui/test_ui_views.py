"""The inspector's pure parts, without NATS or a browser: what a run's events become for the pages (turns,
lanes, durations), the runs-index digest and filters, the fork tree, and the one-file export's escaping."""

from __future__ import annotations

import json
import re

import pytest

from runtime import events as ev
from runtime.nats.records import RunIndex
from runtime.types import ToolCall, ToolError, Usage
from runtime.ui import views
from runtime.ui.export import embed_json, render_html

T0 = 1_700_000_000.0


def _run(run_id: str = "r1", *, output: object = "done") -> list[ev.Event]:
    calls = (ToolCall(f"{run_id}/1.0", "calculator", {"expression": "1 + 1"}),
             ToolCall(f"{run_id}/1.1", "search", {"q": "cats"}))
    raw: list[ev.Event] = [
        ev.RunStarted(run_id=run_id, input="add things and find cats"),
        ev.ModelRequested(run_id=run_id, request_id=f"{run_id}/1", turn=1),
        ev.ModelResponded(run_id=run_id, request_id=f"{run_id}/1", turn=1, calls=calls,
                          usage=Usage(10, 5), latency_ms=12.5),
        ev.ToolCalled(run_id=run_id, call=calls[0]),
        ev.ToolCalled(run_id=run_id, call=calls[1]),
        ev.ScriptPrinted(run_id=run_id, call_id=calls[0].id, tool="calculator", text="thinking"),
        ev.ToolCompleted(run_id=run_id, call_id=calls[0].id, tool="calculator", output={"value": 2},
                         duration_ms=3.0),
        ev.ToolFailed(run_id=run_id, call_id=calls[1].id, tool="search",
                      error=ToolError("limit", "too slow", line=4, detail="duration")),
        ev.TurnCompleted(run_id=run_id, turn=1, calls_ok=1, calls_failed=1),
        ev.RunCompleted(run_id=run_id, output=output),
    ]
    return [ev.stamp(e, seq=i, ts=T0 + i, actor="calc") for i, e in enumerate(raw)]


def test_event_views_carry_turns_lanes_and_durations():
    out = [views.event_view(e, T0) for e in _run()]
    assert [(v["seq"], v["turn"], v["lane"]) for v in out] == [
        (0, None, None), (1, 1, None), (2, 1, None), (3, 1, "r1/1.0"), (4, 1, "r1/1.1"), (5, 1, "r1/1.0"),
        (6, 1, "r1/1.0"), (7, 1, "r1/1.1"), (8, 1, None), (9, None, None)]
    assert out[2]["duration_ms"] == 12.5 and out[6]["duration_ms"] == 3.0 and "duration_ms" not in out[0]
    assert out[7]["failed"] and not out[6]["failed"]
    assert out[7]["data"]["error"] == {"kind": "limit", "message": "too slow", "line": 4,
                                       "detail": "duration"}
    assert out[9]["offset_ms"] == 9000.0 and out[9]["describe"] == "output done"
    json.dumps(out)  # plain JSON all the way down


def test_digest_and_filters():
    d = views.digest("r1", _run(output={"answer": "two cats"}), last_seq=9)
    assert (d.status, d.turns, d.tokens, d.tools, d.errors) == ("completed", 1, 15, ["calculator", "search"],
                                                                ["limit"])
    assert d.input == "add things and find cats" and d.output == '{"answer":"two cats"}'
    assert "thinking" not in d.search and '"value":2' in d.search and "too slow" in d.search
    entry = RunIndex(status="completed", actor="calc:alice", partition=0, updated=T0 + 9)

    def admits(**params: str) -> bool:
        flt = views.RunFilter.from_query(params, now=T0 + 100)
        return flt.admits_entry(entry) and (not flt.needs_events or flt.admits(d))

    assert admits() and admits(agent="calc") and admits(agent="calc:alice") and not admits(agent="calc:bob")
    assert admits(status="completed") and not admits(status="failed")
    assert admits(tool="search") and not admits(tool="weather")
    assert admits(error="limit") and not admits(error="execution")
    assert admits(q="TWO CATS") and not admits(q="dogs")
    assert admits(since="2m") and not admits(since="30s")  # started 100 s before "now"
    assert admits(until="2m") is False and admits(until="30s")
    with pytest.raises(views.FilterError, match=r"since='soon'.*'15m'"):
        views.RunFilter.from_query({"since": "soon"})


def test_fork_tree_from_the_first_event_and_the_index():
    index = {"a": RunIndex(status="completed", partition=0),
             "b": RunIndex(status="completed", partition=0, forked_from="a", forked_at=4),
             "c": RunIndex(status="running", partition=0, forked_from="b", forked_at=7),
             "d": RunIndex(status="failed", partition=0, forked_from="a", forked_at=2)}
    tree = views.fork_tree("b", None, index)
    assert tree["run_id"] == "a" and not tree["current"]
    assert [(c["run_id"], c["at"], c["current"]) for c in tree["children"]] == [("b", 4, True),
                                                                                ("d", 2, False)]
    assert tree["children"][0]["children"][0]["run_id"] == "c"
    # a fork not yet in the index still finds its parent from its run.forked
    lone = views.fork_tree("x", ("a", 3), {"a": index["a"]})
    assert lone["run_id"] == "a" and lone["children"][0] == {"run_id": "x", "at": 3, "status": None,
                                                             "current": True, "children": []}
    # a cycle in a damaged index does not loop
    loop = {"p": RunIndex(status="completed", partition=0, forked_from="q", forked_at=1),
            "q": RunIndex(status="completed", partition=0, forked_from="p", forked_at=1)}
    assert views.fork_tree("p", None, loop)["run_id"] in {"p", "q"}


def test_export_is_one_inert_file_without_urls():
    hostile = "</script><script>alert(1)</script> see https://example.org/x & <b>"
    events = _run(output=hostile)
    view = views.run_view("r1", "calc", events, exported=True)
    html = render_html(view)
    assert not re.search(r"https?://", html)
    assert html.count("<script") == 2 and html.count("</script>") == 2
    assert "<style>" in html and 'href="/static' not in html and 'src="/static' not in html
    data = re.search(r'<script type="application/json" id="run-data">(.*?)</script>', html, re.S)
    assert data is not None and json.loads(data.group(1)) == json.loads(json.dumps(view))
    assert embed_json(hostile) == json.dumps(hostile).replace("/", "\\/").replace("<", "\\u003c").replace(
        ">", "\\u003e").replace("&", "\\u0026")
    # the CSP names the one inline script by its hash
    script = re.search(r"<script>(.*?)</script>", html, re.S)
    assert script is not None
    import base64
    import hashlib

    digest = base64.b64encode(hashlib.sha256(script.group(1).encode()).digest()).decode()
    assert f"script-src 'sha256-{digest}'" in html and "default-src 'none'" in html


def _stamped(raw: list[ev.Event]) -> list[ev.Event]:
    return [ev.stamp(e, seq=i, ts=T0 + i, actor="calc") for i, e in enumerate(raw)]


NO_USAGE = Usage(0, 0)


def _bare(output: object, *, usage: Usage = NO_USAGE) -> list[ev.Event]:
    """A one-turn run that submits `output` straight away, its reply using `usage` tokens."""
    return _stamped([
        ev.RunStarted(run_id="r2", input="anything"),
        ev.ModelRequested(run_id="r2", request_id="r2/1", turn=1),
        ev.ModelResponded(run_id="r2", request_id="r2/1", turn=1, usage=usage),
        ev.RunCompleted(run_id="r2", output=output),
    ])


def _names(events: list[ev.Event]) -> list[str]:
    return [f.name for f in views.flags(events)]


def test_flags_name_what_makes_a_completed_run_suspicious():
    assert _names(_run()) == []  # tokens used, an output: nothing to look at
    assert _names(_bare("", usage=Usage(0, 0))) == ["no-tokens", "empty-output"]
    assert _names(_bare("42", usage=Usage(0, 0))) == ["no-tokens"]
    for empty in (None, "", "  \n", {}, [], {"answer": ""}, {"answer": {"parts": []}}):
        assert _names(_bare(empty, usage=Usage(3, 1))) == ["empty-output"], empty
    for full in (0, False, {"answer": 0}, ["x"], {"answer": "", "value": 2}):
        assert _names(_bare(full, usage=Usage(3, 1))) == [], full
    why = views.flags(_bare({"answer": ""}))[1].why
    assert why == 'completed with an empty output: {"answer":""}'

    # a run that did not complete is not "completed without tokens": its ending already says what happened
    running = _bare("")[:-1]
    assert _names(running) == []
    ending = ev.stamp(ev.RunFailed(run_id="r2", reason="max_turns"), seq=3, ts=T0 + 3, actor="calc")
    assert _names([*running, ending]) == []


def test_flags_for_a_retried_model_call_and_a_redelivered_tool():
    call = ToolCall("r3/1.0", "calculator", {"expression": "1 + 1"})
    events = _stamped([
        ev.RunStarted(run_id="r3", input="add"),
        ev.ModelRequested(run_id="r3", request_id="r3/1", turn=1),
        ev.ModelFailed(run_id="r3", request_id="r3/1", turn=1, error="503", error_kind="http"),
        ev.ModelRequested(run_id="r3", request_id="r3/1#1", turn=1, attempt=1),
        ev.ModelFailed(run_id="r3", request_id="r3/1#1", turn=1, error="503", error_kind="http"),
        ev.ModelRequested(run_id="r3", request_id="r3/1#2", turn=1, attempt=2),
        ev.ModelResponded(run_id="r3", request_id="r3/1#2", turn=1, calls=(call,), usage=Usage(9, 3)),
        ev.ToolCalled(run_id="r3", call=call),
        ev.ToolRedelivered(run_id="r3", call_id=call.id, tool="calculator", attempt=2, worker="w2",
                           earlier=("w1 stopped heartbeating",)),
        ev.ToolCompleted(run_id="r3", call_id=call.id, tool="calculator", output={"value": 2}),
        ev.RunCompleted(run_id="r3", output={"answer": "2"}),
    ])
    found = views.flags(events)
    assert [f.name for f in found] == ["model-retried", "tool-redelivered"]
    assert "turn 1: 3 attempts" in found[0].why
    assert "calculator call 1.0 ran on delivery 2 (w1 stopped heartbeating)" in found[1].why
    # the first attempt alone is no retry, and a failed call without a redelivery is no redelivery
    assert _names(events[:2] + events[6:8] + events[9:]) == []


def test_flags_reach_the_digest_the_filter_the_index_row_and_the_run_view():
    flagged, clean = views.digest("r2", _bare("", usage=Usage(0, 0))), views.digest("r1", _run())
    entry = RunIndex(status="completed", actor="calc", partition=0, updated=T0)

    def admits(d: views.Digest, flag: str) -> bool:
        flt = views.RunFilter.from_query({"flag": flag})
        assert flt.needs_events  # flags come from the events, not the index entry
        return flt.admits_entry(entry) and flt.admits(d)

    assert admits(flagged, "suspicious") and not admits(clean, "suspicious")
    assert admits(flagged, "empty-output") and not admits(flagged, "tool-redelivered")
    with pytest.raises(views.FilterError, match=r"flag='odd'.*'suspicious'.*no-tokens, empty-output"):
        views.RunFilter.from_query({"flag": "odd"})
    row = views.index_row("r2", entry, flagged)
    assert [f["name"] for f in row["flags"]] == ["no-tokens", "empty-output"] and row["flags"][0]["why"]
    assert views.index_row("r1", entry, clean)["flags"] == []
    view = views.run_view("r2", "calc", _bare("", usage=Usage(0, 0)))
    assert [f["name"] for f in view["flags"]] == ["no-tokens", "empty-output"]
    json.dumps(view)


def test_the_agent_page_shows_the_limits_that_bind_each_kind_of_tool_and_the_bundles_waits():
    """A Python tool runs outside the sandbox: its page shows its timeout, concurrency and retry, not Monty's
    limits; an agent tool its depth of sub-runs; the bundle its timers, questions and budgets."""
    from pathlib import Path

    from runtime.bundle import load_bundle
    from runtime.ui.agent import bundle_view

    view = bundle_view(load_bundle(Path(__file__).parents[2] / "bundles" / "shop"))
    limits = {t["name"]: t["limits"] for t in view["tools"]}
    retry = "3 attempt(s), backoff 0.2 s, on ConnectionError, TimeoutError"
    assert limits["lookup_order"] == {"timeout_s": 10.0, "concurrency": 4, "retry": retry}
    assert limits["researcher"] == {"max_depth": 4}
    assert limits["refund"]["max_duration"] == 2.0  # a script: its sandbox limits
    assert view["timers"] == [] and view["questions"] is None
    assert view["budgets"] == {"run_tokens": None, "agent_tokens_per_day": None, "on_exceeded": "fail"}
