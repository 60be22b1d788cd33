"""The inspector's team pages in a real headless Chromium (Debian's `chromium`, driven by Playwright),
against a real fleet (NATS, host, worker, scripted model, `sa ui`'s app): a run's waterfall (bars on one
axis, parallel calls side by side, a hover that says how long and how many tokens, live until the run
ends), what the model saw at a turn (a thread's earlier runs included, a big payload fetched when asked,
a reply full of HTML shown as text), pending work (approve from it), the fleet (hosts, workers, queues,
dead letters replayed from it) and an agent's page.

Each step saves a screenshot under tests/artifacts/ui/ (git-ignored), as tests/ui/test_ui_browser.py does."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import test_ui_browser as base
from test_ui_browser import INJECTED, run_task, shot, wait_for_kind
from ui_helpers import ASKED, HOSTILE, Stack

from runtime import events as ev
from runtime.log import RunLog
from runtime.types import Message, Usage

browser = base.browser  # the same Chromium and pages (with their error check) as tests/ui/test_ui_browser.py
page = base.page


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("ui-team")).start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def runs(stack: Stack) -> dict[str, str]:
    first = stack.call(stack.client.start("calc", "compute: 6 * 7", thread="t-7"))
    stack.call(first.result(60))
    later = stack.call(stack.client.start("calc", "compute: 1 + 1", thread="t-7"))
    stack.call(later.result(60))
    return {"pair": run_task(stack, "pair: 2 + 3 | 10 * 4"), "hostile": run_task(stack, "hostile: show it"),
            "failing": run_task(stack, "compute: 1 / 0"), "first": first.run_id, "later": later.run_id}


def boxes(page: Any, selector: str) -> list[dict[str, float]]:
    return [page.locator(selector).nth(i).bounding_box() for i in range(page.locator(selector).count())]


def test_waterfall_page(stack: Stack, runs: dict[str, str], page: Any):
    pair = runs["pair"]
    page.goto(f"{stack.base}/runs/{pair}")
    page.wait_for_selector("body[data-status=completed]")
    page.click("#run-tabs a[data-tab=waterfall]")
    page.wait_for_selector("body[data-status=completed][data-spans]")
    assert page.url.endswith(f"/runs/{pair}/waterfall")
    kinds = page.eval_on_selector_all(".wf-row[data-kind]", "rs => rs.map(r => r.dataset.kind)")
    assert kinds[:3] == ["run", "turn", "model"] and kinds.count("tool") == 3 and kinds.count("script") == 3
    assert len(kinds) == int(page.get_attribute("body", "data-spans"))
    # turn 1's two calls: one row each, their bars overlapping in time (side by side on the axis)
    tools = boxes(page, ".wf-row[data-kind=tool] .wf-bar")[:2]
    assert tools[0]["y"] < tools[1]["y"]
    left, right = tools
    assert left["x"] < right["x"] + right["width"] and right["x"] < left["x"] + left["width"]
    run_bar = boxes(page, ".wf-row[data-kind=run] .wf-bar")[0]
    outside = [(kind, b) for kind, b in zip(kinds, boxes(page, ".wf-row[data-kind] .wf-bar"), strict=True)
               if b["x"] < run_bar["x"] - 1 or b["x"] + b["width"] > run_bar["x"] + run_bar["width"] + 1]
    assert not outside, (run_bar, outside)  # every span inside the run's
    # hover: how long, and for a model call how many tokens
    page.locator(".wf-row[data-kind=model] .wf-bar").first.hover()
    tip = page.locator("#tip")
    tip.wait_for(state="visible")
    text = tip.text_content()
    assert "lasts" in text and "tokens" in text and " in + " in text and "events#" in text.replace(" ", "")
    where = page.text_content("#breakdown")
    assert "wall time" in where and "model calls" in where and "tool calls" in where
    assert page.locator("#where-bar .where-part").count() >= 2
    assert page.evaluate("document.documentElement.scrollWidth") == 1400  # no label spills past the page
    page.locator(".wf-row[data-kind=model] .wf-bar").last.hover()  # the tip clear of turn 1's parallel calls
    assert "tokens" in page.text_content("#tip")
    shot(page, "23-waterfall")
    page.locator(".wf-row[data-kind=script] .wf-bar").first.hover()
    assert "worker" in page.text_content("#tip") and "in the sandbox" in page.text_content("#tip")
    shot(page, "24-waterfall-hover-sandbox")
    page.locator(".wf-row[data-kind=tool] .wf-bar").first.click()  # a bar opens its first event
    page.wait_for_selector(".event.target[data-kind='tool.called'] .detail")
    assert page.url.endswith("#seq-" + page.get_attribute(".event.target", "data-seq"))


def test_waterfall_follows_a_running_run(stack: Stack, page: Any):
    stack.gate.reset()
    held = run_task(stack, "hold: 6 * 7", wait=False)
    wait_for_kind(stack, held, "tool.completed")
    page.goto(f"{stack.base}/runs/{held}/waterfall")
    page.wait_for_selector("body[data-status=running]")
    assert page.is_visible("#live")
    assert page.locator(".wf-row[data-open='1']").count() >= 2  # the run and its open turn / model call
    assert page.locator(".wf-row[data-kind=run] .wf-bar.open").count() == 1
    shot(page, "25-waterfall-live")
    page.evaluate("window.__sameDocument = true")
    stack.gate.release()
    page.wait_for_selector("body[data-status=completed]")
    page.wait_for_selector("#live", state="hidden")
    assert page.locator(".wf-row[data-open='1']").count() == 0 and page.evaluate("window.__sameDocument")


def test_conversation_page(stack: Stack, runs: dict[str, str], page: Any):
    pair = runs["pair"]
    page.goto(f"{stack.base}/runs/{pair}/waterfall")
    page.click("#run-tabs a[data-tab=conversation]")
    page.wait_for_selector("body[data-turn='2']")  # the latest turn by default
    roles = page.eval_on_selector_all("#prompt .msg", "ms => ms.map(m => m.dataset.role)")
    assert roles == ["system", "user", "assistant", "tool", "tool"]
    assert page.text_content("#prompt .msg[data-role=system] .msg-text") == "You compute things with tools."
    assert page.locator("#prompt .msg[data-role=assistant] .msg-call").count() == 2
    assert '"value": 40' in page.text_content("#prompt .msg[data-index='4']")
    assert "prompt +" in page.text_content("#answer-usage") and "submit" in page.text_content("#answer")
    assert page.get_attribute("#system-source", "data-source") == "recorded"
    shot(page, "26-conversation-turn-2")

    page.click("#turns a[data-turn='1']")
    page.wait_for_selector("body[data-turn='1']")
    assert "turn=1" in page.url
    roles = page.eval_on_selector_all("#prompt .msg", "ms => ms.map(m => m.dataset.role)")
    assert roles == ["system", "user"]
    assert page.text_content("#prompt .msg[data-role=user] .msg-text") == "pair: 2 + 3 | 10 * 4"
    assert page.locator("#answer .msg[data-role=assistant] .msg-call").count() == 2  # what it answered
    page.click("#turns a[data-turn=all]")
    page.wait_for_selector("body[data-turn=all]")
    assert page.locator("#prompt .msg").count() == 7
    # a message links to the event it came from: the run's page opens it
    page.locator("#prompt .msg[data-index='4'] a.event-link").click()
    page.wait_for_selector(".event.target[data-kind='tool.completed'] .detail")
    assert '"value": 40' in page.text_content(".event.target .detail")

    # a thread's later run: the earlier run's exchange first, each message naming its run
    later, first = runs["later"], runs["first"]
    page.goto(f"{stack.base}/runs/{later}/conversation?turn=1")
    page.wait_for_selector("body[data-turn='1']")
    assert first in page.text_content("#thread-note")
    origins = page.eval_on_selector_all("#prompt .msg .origin a.mono", "as => as.map(a => a.textContent)")
    assert origins and set(origins) == {first}
    assert page.get_attribute("#system-source", "data-source") == "bundle"
    shot(page, "27-conversation-thread")


def test_conversation_shows_html_as_text_and_fetches_big_payloads(stack: Stack, runs: dict[str, str],
                                                                   page: Any):
    page.goto(f"{stack.base}/runs/{runs['hostile']}/conversation?turn=all")
    page.wait_for_selector("body[data-turn=all]")
    assert "<script>window.__pwned = 1</script>" in page.text_content("#prompt")
    assert page.evaluate("typeof window.__pwned") == "undefined" and page.evaluate(INJECTED) == 0
    assert HOSTILE[:20] in page.text_content("#prompt .msg[data-role=tool]")

    big = "z" * 300_000 + " the end"
    raw: list[ev.Event] = [
        ev.RunStarted(run_id="rbig-ui", input=big),
        ev.ModelRequested(run_id="rbig-ui", request_id="rbig-ui/1", turn=1,
                          messages=(Message("system", "be thorough"), Message("user", big))),
        ev.ModelResponded(run_id="rbig-ui", request_id="rbig-ui/1", turn=1, content="read it",
                          usage=Usage(9, 2)),
    ]
    events = [ev.stamp(e, seq=i, ts=1_700_000_000.0 + i, actor="calc") for i, e in enumerate(raw)]

    async def write() -> None:
        log = RunLog(stack.js)
        last = await log.create(events[0])  # type: ignore[arg-type]
        for e in events[1:]:
            last = await log.append(e, expect=last)
    stack.call(write())
    page.goto(f"{stack.base}/runs/rbig-ui/conversation?turn=1")
    page.wait_for_selector("body[data-turn='1']")
    task = page.locator("#prompt .msg[data-role=user]")
    assert "stored apart" in task.text_content() and "KiB in the object store" in task.text_content()
    shot(page, "28-conversation-stored-apart")
    task.locator("button.whole").click()
    page.wait_for_selector("#prompt .msg[data-role=user] pre.msg-text")
    text = page.locator("#prompt .msg[data-role=user] pre.msg-text")
    assert text.evaluate("p => p.textContent.length") == len(big) and text.text_content().endswith(" the end")
    system = page.locator("#prompt .msg[data-role=system]")
    system.locator("button.whole").click()
    page.wait_for_selector("#prompt .msg[data-role=system] pre.msg-text")
    assert page.text_content("#prompt .msg[data-role=system] pre.msg-text") == "be thorough"


def test_pending_page_says_what_is_stuck_and_decides_approvals(stack: Stack, page: Any):
    """Tasks for an agent no host serves, a call waiting for a person, a run waiting for the model: one
    page lists them with why; the call is approved from it, with edited arguments."""
    from runtime.commands import publish_task

    stack.gate.reset()
    held = stack.call(stack.client.start("calc", "hold: 5 * 5", instance="h1"))
    wait_for_kind(stack, held.run_id, "tool.completed")
    paid = stack.call(stack.client.start("calc", "pay: 250", instance="p1"))
    wait_for_kind(stack, paid.run_id, "approval.requested")
    stack.call(publish_task(stack.js, "ghostagent", "anyone there?"))
    try:
        page.goto(stack.base + "/pending")
        page.wait_for_selector("#stuck li[data-kind=agent-unserved]")
        assert "1 task(s) for ghostagent wait: no live host serves it" in page.text_content("#stuck")
        runs = page.locator(f"#runs-table tr[data-run='{held.run_id}']")
        assert runs.locator(".chip[data-what=model]").count() == 1  # the gate holds its model call
        row = page.locator(f"#approvals-table tr[data-run='{paid.run_id}']")
        assert "transfer" in row.text_content() and "finance" in row.text_content()
        waiting = page.locator(f"#runs-table tr[data-run='{paid.run_id}'] .chip[data-what=approval]")
        assert waiting.count() == 1
        shot(page, "29-pending")

        row.locator(".approval-args").fill('{"amount": 90}')
        row.locator(".approval-note").fill("capped from the pending page")
        before = page.get_attribute("body", "data-loaded")
        page.wait_for_function("b => document.body.dataset.loaded !== b", arg=before)  # a poll meanwhile...
        assert row.locator(".approval-args").input_value() == '{"amount": 90}'  # ...keeps what was typed
        row.locator(".approve").click()
        page.wait_for_selector(f"#approvals-table tr[data-run='{paid.run_id}']", state="detached")
        assert '{"sent": 90}' in stack.call(paid.result(60))["answer"]  # the edited arguments ran
        shot(page, "30-pending-approved")
    finally:
        stack.gate.release()


def test_pending_page_answers_a_question(stack: Stack, page: Any):
    """A run asking a person (`ask_human`) is listed with its question (shown as text) and answered from the
    pending page, one button per allowed answer; the run goes on with the answer. Another is answered from
    its own page, where the question waits in its call's lane."""
    asking = stack.call(stack.client.start("calc", "ask: ship?", instance="q1"))
    wait_for_kind(stack, asking.run_id, "question.asked")
    page.goto(stack.base + "/pending")
    row = page.locator(f"#questions-table tr[data-run='{asking.run_id}']")
    row.wait_for()
    assert ASKED in row.text_content()  # the markup is text, never run
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert row.locator(".answer-choice").all_text_contents() == ["yes", "no"]
    shot(page, "30a-pending-question")
    row.locator(".answer-choice", has_text="yes").click()
    page.wait_for_selector(f"#questions-table tr[data-run='{asking.run_id}']", state="detached")
    assert '{"answer": "yes"}' in stack.call(asking.result(60))["answer"]

    again = stack.call(stack.client.start("calc", "ask: ship now?", instance="q2"))  # and from the run's page
    wait_for_kind(stack, again.run_id, "question.asked")
    page.goto(stack.base + "/runs/" + again.run_id)
    box = page.locator(f".lane[data-call='{again.run_id}/1.0'] .question")
    box.wait_for()
    assert ASKED in box.text_content() and "waits for an answer" in box.text_content()
    assert page.evaluate("typeof window.__pwned") == "undefined"
    shot(page, "30b-run-question")
    box.locator(".answer-choice", has_text="no").click()
    assert '{"answer": "no"}' in stack.call(again.result(60))["answer"]


def test_fleet_page_and_dead_letter_replay(stack: Stack, runs: dict[str, str], page: Any):
    from runtime.jobs import ToolJob
    from runtime.worker.dlq import copy_to_dlq

    pair = runs["pair"]
    dead = ToolJob(run_id=pair, actor="calc", call_id=f"{pair}/1.0", tool="calculator",
                   arguments={"expression": "2 + 3"})
    stack.call(copy_to_dlq(stack.js, subject=dead.subject, data=dead.encode(), stream_seq=777, deliveries=5,
                           reason="delivered 5 times to tool workers, none finished it"))
    page.goto(stack.base + "/fleet")
    letter = page.locator("#letters-table tbody tr")
    letter.first.wait_for()
    assert "none finished it" in letter.first.text_content() and pair in letter.first.text_content()
    host = page.locator("#hosts-table tbody tr")
    assert host.count() == 1 and "calc" in host.text_content() and "ago" in host.text_content()
    assert host.locator("a[href='/agents/calc']").count() == 1
    assert "calculator" in page.text_content("#workers-table")
    assert "TOOLS" in page.text_content("#queues-table")
    assert page.locator("#partitions-table tbody tr").count() == 2
    before = page.get_attribute("body", "data-loaded")
    page.wait_for_function("b => document.body.dataset.loaded !== b", arg=before)  # it polls
    shot(page, "31-fleet")
    letter.first.locator("button.replay").click()
    page.wait_for_selector("#message.info")
    assert "sent back to the workers" in page.text_content("#message")
    page.wait_for_selector("#letters-table tbody tr", state="detached")
    assert "no dead letter" in page.text_content("#dead-letters")
    shot(page, "32-fleet-replayed")


def test_schedules_page_links_a_schedule_to_its_runs(stack: Stack, page: Any):
    """A schedule firing every second: the page lists it with its runs (their fires and statuses), says
    when it is paused, and a run's link opens that run's page."""
    stack.call(stack.client.schedules.add("every-second", "calc", "compute: 1 + 1", every="1s"))
    try:
        page.goto(stack.base + "/schedules")
        row = page.locator("#schedules-table tr[data-schedule='every-second']")
        row.wait_for()
        rows = "#schedules-table tr[data-schedule='every-second']"
        page.wait_for_function(f"() => document.querySelectorAll(\"{rows} .schedule-runs li\").length >= 2")
        assert "every 1s" in row.text_content() and "compute: 1 + 1" in row.text_content()
        assert row.locator("a[href='/agents/calc']").count() == 1
        stack.call(stack.client.schedules.pause("every-second"))
        page.wait_for_function(f"() => document.querySelector(\"{rows}\").textContent.includes('paused')")
        shot(page, "35-schedules")
        first = row.locator(".schedule-runs li").first
        run_id = first.get_attribute("data-run")
        assert run_id and "fire " in first.text_content()
        first.locator("a").click()
        page.wait_for_url(f"**/runs/{run_id}")
        page.wait_for_selector("body[data-status=completed]")
        assert run_id in page.text_content("body") and "compute: 1 + 1" in page.text_content("body")
    finally:
        stack.call(stack.client.schedules.delete("every-second"))


def test_agent_page(stack: Stack, runs: dict[str, str], page: Any):
    page.goto(f"{stack.base}/runs/{runs['failing']}")
    page.wait_for_selector("body[data-status]")
    page.click("#overview a[href='/agents/calc']")
    page.wait_for_selector("body[data-agent=calc]")
    assert page.text_content("#system-prompt") == "You compute things with tools."
    cards = page.eval_on_selector_all("#tools .tool-card", "cs => cs.map(c => c.dataset.tool)")
    assert sorted(cards) == ["calculator", "submit", "transfer"]
    transfer = page.locator(".tool-card[data-tool=transfer]")
    assert "waits for a person when amount > 100, role finance" in transfer.text_content()
    assert '"amount"' in transfer.locator(".input-schema").text_content()
    assert "terminal" in page.text_content(".tool-card[data-tool=submit] h3")
    assert "scripted" in page.text_content("#model") and "ebnf" in page.text_content("#constraint")
    assert page.locator("#hosts-table tbody tr").count() == 1  # which host owns this agent
    assert page.locator("#chart .chart-col").count() >= 1
    kinds = page.eval_on_selector_all("#kinds-chart .chart-col", "cs => cs.map(c => +c.dataset.n)")
    assert sum(kinds) >= 1  # the failing run's `execution` error, in its bar
    assert page.locator("#errors-table tr[data-error=execution]").count() == 1
    assert page.locator(f"#agent-runs tr[data-run='{runs['failing']}']").count() == 1
    shot(page, "33-agent")
