"""The inspector in a real headless Chromium (Debian's `chromium`, driven by Playwright): the runs index and
its filters, a run's timeline with parallel calls side by side, expanding events, following a live run to
its end, forking from the page, escaping of a model reply full of HTML, the one-file export opened from
disk with no network, and the door: a DNS-rebound name gets nothing, a page of another origin cannot send
commands, and the inspector's own page opened by another name it was given can. One fleet (NATS, host,
worker, scripted model, `sa ui`'s app) serves the module.

Each step saves a screenshot under tests/artifacts/ui/ (git-ignored). The browser is required: without
/usr/bin/chromium these tests fail and say how to install it (`make browser`)."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from ui_helpers import HOSTILE, OTHER_NAME, Stack

from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.ui.export import export_run

CHROMIUM = Path("/usr/bin/chromium")
REBOUND = "rebound.test"  # an attacker's DNS name, rebound to 127.0.0.1 after its page loaded
ARTIFACTS = Path(__file__).parents[1] / "artifacts" / "ui"
TIMEOUT_MS = 30_000
# elements that exist only if the page parsed the reply as HTML (the page's own <b>s hold tool names)
INJECTED = ("document.querySelectorAll('main script, main img').length + "
            "[...document.querySelectorAll('main b')].filter(b => b.textContent === 'bold?').length")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    s = Stack(tmp_path_factory.mktemp("ui")).start()
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(f"the inspector's browser tests need Chromium at {CHROMIUM}: run `make browser` (it runs "
                    "`apt-get install -y chromium`), then run the tests again")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # root in a container: Chromium's sandbox needs user namespaces it may not have
        # names resolved to loopback: the inspector's other name, and a rebound attacker's
        rules = f"MAP {OTHER_NAME} 127.0.0.1, MAP {REBOUND} 127.0.0.1"
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox",
                                                                    f"--host-resolver-rules={rules}"])
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.sa_errors = errors  # a test that provokes an error on purpose takes it out of here
    try:
        yield page
    finally:
        context.close()
    assert not errors, f"the page logged errors: {errors}"


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def run_task(stack: Stack, text: str, *, wait: bool = True) -> str:
    run_id = stack.call(publish_task(stack.js, "calc", text))
    if wait:
        stack.call(stack.env.wait_run(run_id))
    return run_id


def wait_for_kind(stack: Stack, run_id: str, kind: str) -> None:
    async def until() -> None:
        async for event in RunLog(stack.js).follow(run_id):
            if event.__struct_config__.tag == kind:
                return
    stack.call(until())


def visible_runs(page: Any) -> set[str]:
    return set(page.eval_on_selector_all("#runs tbody tr[data-run]", "rows => rows.map(r => r.dataset.run)"))


def wait_reloaded(page: Any, before: str | None) -> None:
    page.wait_for_function("before => (document.body.dataset.loaded || before) !== before", arg=before)


# an instance name as long as a real deployment's (a customer id and a region): longer than its column
LONG_INSTANCE = "customer-7f3a9c2e-4b1d-4e8a-9f0c-2d6b8e1a5c3f-europe-west"


@pytest.fixture(scope="module")
def runs(stack: Stack) -> dict[str, str]:
    long = stack.call(publish_task(stack.js, "calc", "compute: 2 + 2", instance=LONG_INSTANCE))
    stack.call(stack.env.wait_run(long))
    return {"pair": run_task(stack, "pair: 2 + 3 | 10 * 4"), "hostile": run_task(stack, "hostile: show it"),
            "failing": run_task(stack, "compute: 1 / 0"), "empty": run_task(stack, "empty: say nothing"),
            "long": long}


def test_runs_index_filters(stack: Stack, runs: dict[str, str], page: Any):
    page.goto(stack.base + "/")
    page.wait_for_selector("#runs tbody tr[data-run]")
    assert visible_runs(page) >= set(runs.values())
    assert page.text_content("#count").endswith("run(s)")
    shot(page, "01-index")

    loaded = page.get_attribute("body", "data-loaded")
    page.select_option("select[name=tool]", "calculator")
    wait_reloaded(page, loaded)
    assert runs["pair"] in visible_runs(page) and runs["hostile"] not in visible_runs(page)
    assert "tool=calculator" in page.url
    shot(page, "02-index-tool-filter")

    loaded = page.get_attribute("body", "data-loaded")
    page.fill("input[name=q]", "10 * 4")
    page.click("button[type=submit]")
    wait_reloaded(page, loaded)
    assert visible_runs(page) == {runs["pair"]}
    shot(page, "03-index-search")

    loaded = page.get_attribute("body", "data-loaded")
    page.click("#reset")
    wait_reloaded(page, loaded)
    loaded = page.get_attribute("body", "data-loaded")
    page.select_option("select[name=error]", "execution")
    wait_reloaded(page, loaded)
    assert runs["failing"] in visible_runs(page) and runs["pair"] not in visible_runs(page)
    shot(page, "04-index-error-filter")

    # a shared link restores the filters
    page.goto(stack.base + "/?q=10+*+4&status=completed")
    page.wait_for_selector("#runs tbody tr[data-run]")
    assert visible_runs(page) == {runs["pair"]}
    assert page.input_value("input[name=q]") == "10 * 4"
    assert page.input_value("select[name=status]") == "completed"


def test_suspicious_runs_are_flagged_and_filterable(stack: Stack, runs: dict[str, str], page: Any):
    """A run that completed without a token and with an empty answer looks like any completed run by its
    status: its flags say otherwise, in the index (and its filter) and on its page."""
    empty = runs["empty"]
    page.goto(stack.base + "/")
    row = f"#runs tr[data-run='{empty}']"
    page.wait_for_selector(row)
    assert page.get_attribute(row, "data-flags") == "no-tokens empty-output"
    chips = page.locator(f"{row} .flag-chip")
    assert chips.all_text_contents() == ["⚑ no-tokens", "⚑ empty-output"]
    assert "without the model using a single token" in (chips.first.get_attribute("title") or "")
    assert page.get_attribute(f"#runs tr[data-run='{runs['pair']}']", "data-flags") == ""

    loaded = page.get_attribute("body", "data-loaded")
    page.select_option("select[name=flag]", "suspicious")
    wait_reloaded(page, loaded)
    assert empty in visible_runs(page) and runs["pair"] not in visible_runs(page)
    assert "flag=suspicious" in page.url
    shot(page, "19-index-suspicious")

    page.click(f"#runs a[href='/runs/{empty}']")
    page.wait_for_selector("body[data-status=completed]")
    assert page.eval_on_selector_all("#flags li", "ls => ls.map(l => l.dataset.flag)") == \
        ["no-tokens", "empty-output"]
    assert 'completed with an empty output: {"answer":""}' in page.text_content("#flags")
    shot(page, "20-run-page-flagged")
    page.goto(f"{stack.base}/runs/{runs['pair']}")
    page.wait_for_selector("body[data-status=completed]")
    assert page.locator("#flags").count() == 0

    page.goto(stack.base + "/?flag=empty-output")  # a shared link keeps the filter
    page.wait_for_selector(row)
    assert page.input_value("select[name=flag]") == "empty-output" and empty in visible_runs(page)


def test_the_index_table_stays_inside_the_page(stack: Stack, runs: dict[str, str], page: Any):
    """Long ids and agent names are cut short inside their column (the whole name is the cell's title),
    the table never makes the page wider than the window, and the header spans the page. Narrower than
    the table's minimum, the table scrolls inside its own box."""
    def geometry() -> dict[str, Any]:
        return page.evaluate("""() => {
          const box = (s) => document.querySelector(s).getBoundingClientRect();
          return {page: document.documentElement.scrollWidth, window: innerWidth,
                  header: box("header.top").width, main: box("main").right, wrap: box(".table-wrap").right,
                  table: box("#runs").width, wrapWidth: box(".table-wrap").width};
        }""")

    long = f"#runs tr[data-run='{runs['long']}']"
    for width, name in ((1400, "21-index-wide"), (1000, "22-index-narrow")):
        page.set_viewport_size({"width": width, "height": 800})
        page.goto(stack.base + "/")
        page.wait_for_selector(long)
        g = geometry()
        assert g["page"] == g["window"] == g["header"] == width, g
        assert g["wrap"] <= g["main"], g
        agent = page.locator(f"{long} td").nth(1)
        assert agent.get_attribute("title") == f"calc:{LONG_INSTANCE}"
        assert agent.evaluate("td => td.scrollWidth > td.clientWidth")  # cut short, not widening the column
        cells = [page.locator(f"{long} td").nth(i).bounding_box() for i in range(3)]
        assert cells[0]["x"] + cells[0]["width"] <= cells[1]["x"] and cells[1]["x"] + cells[1]["width"] <= \
            cells[2]["x"], cells
        shot(page, name)
    assert g["table"] > g["wrapWidth"]  # at 1000 px the table scrolls inside its box, the page does not
    page.set_viewport_size({"width": 1400, "height": 800})
    assert geometry()["table"] <= geometry()["wrapWidth"]

    page.set_viewport_size({"width": 1000, "height": 800})  # and the run page of that agent fits too
    page.goto(f"{stack.base}/runs/{runs['long']}")
    page.wait_for_selector("body[data-status=completed]")
    assert page.evaluate("document.documentElement.scrollWidth") == 1000


def test_run_page_turns_lanes_and_expanding(stack: Stack, runs: dict[str, str], page: Any):
    pair = runs["pair"]
    page.goto(stack.base + "/")
    page.click(f"#runs a[href='/runs/{pair}']")
    page.wait_for_selector("body[data-status=completed]")
    assert page.text_content("h1") == pair
    groups = page.eval_on_selector_all(".group", "gs => gs.map(g => g.dataset.turn)")
    assert groups == ["run", "1", "2", "run"]
    lanes = page.eval_on_selector_all(".group[data-turn='1'] .lane", "ls => ls.map(l => l.dataset.call)")
    assert lanes == [f"{pair}/1.0", f"{pair}/1.1"]
    # the two lanes sit side by side: same top, different left
    boxes = [page.locator(".group[data-turn='1'] .lane").nth(i).bounding_box() for i in range(2)]
    assert boxes[0]["y"] == boxes[1]["y"] and boxes[0]["x"] < boxes[1]["x"]
    assert "10 * 4" in page.text_content(".group[data-turn='1'] .lane:nth-child(2)")

    completed = page.locator(".group[data-turn='1'] .lane:nth-child(2) .event[data-kind='tool.completed']")
    completed.locator(".toggle").click()
    detail = completed.locator(".detail")
    assert '"value": 40' in detail.text_content()
    requested = page.locator(".event[data-kind='model.requested']").first
    requested.locator(".toggle").click()
    text = requested.locator(".detail").text_content()
    assert "prompt delta" in text and "pair: 2 + 3 | 10 * 4" in text and "You compute things" in text
    page.locator(".event[data-kind='model.responded']").first.locator(".toggle").click()
    assert "calculator" in page.locator(".event[data-kind='model.responded'] .detail").first.text_content()
    path = shot(page, "05-run-page-expanded")
    assert path.stat().st_size > 10_000

    failing = runs["failing"]
    page.goto(f"{stack.base}/runs/{failing}")
    page.wait_for_selector("body[data-status]")
    failed = page.locator(".event[data-kind='tool.failed']").first
    failed.locator(".toggle").click()
    assert "execution" in failed.locator(".detail").text_content()
    shot(page, "06-run-page-tool-error")


def test_following_a_live_run_to_its_end(stack: Stack, page: Any):
    stack.gate.reset()
    held = run_task(stack, "hold: 6 * 7", wait=False)
    wait_for_kind(stack, held, "tool.completed")  # now it waits for the gate: the page opens mid-run
    page.goto(f"{stack.base}/runs/{held}")
    page.wait_for_selector("body[data-status=running]")
    assert page.is_visible("#live")
    before = int(page.get_attribute("body", "data-events"))
    page.evaluate("window.__sameDocument = true")
    wait_followers(stack, 1)  # the page's live view is connected
    shot(page, "07-live-running")

    stack.gate.release()
    page.wait_for_selector("body[data-status=completed]")
    after = int(page.get_attribute("body", "data-events"))
    assert after > before and page.evaluate("window.__sameDocument") is True  # arrived live, no reload
    assert page.locator(".event[data-kind='run.completed']").count() == 1
    assert "released" in run_output(page)
    page.wait_for_selector("#live", state="hidden")
    shot(page, "08-live-completed")


def test_index_refreshes_while_a_run_is_running(stack: Stack, page: Any):
    stack.gate.reset()
    held = run_task(stack, "hold: 2 * 2", wait=False)
    wait_for_kind(stack, held, "tool.completed")
    page.goto(stack.base + "/")
    badge = f"#runs tr[data-run='{held}'] .badge"
    page.wait_for_selector(badge)
    assert page.text_content(badge) == "running"
    page.evaluate("window.__sameDocument = true")
    stack.gate.release()
    page.wait_for_function("badge => document.querySelector(badge).textContent === 'completed'", arg=badge)
    assert page.evaluate("window.__sameDocument") is True


def test_page_that_goes_away_releases_its_follower(stack: Stack, browser: Any):
    stack.gate.reset()
    held = run_task(stack, "hold: 1 + 2", wait=False)
    wait_for_kind(stack, held, "tool.completed")
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{stack.base}/runs/{held}")
    page.wait_for_selector("body[data-status=running]")
    wait_followers(stack, 1)
    context.close()
    wait_followers(stack, 0)  # the server saw the page go and closed its consumer
    stack.gate.release()
    stack.call(stack.env.wait_run(held))


def approvals(stack: Stack) -> list[dict[str, Any]]:
    answer = httpx.get(f"{stack.base}/api/approvals", params={"agent": "calc"}, timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.json()["approvals"]


def wait_followers(stack: Stack, n: int, timeout: float = 20.0) -> None:
    """Until the inspector has `n` live views open (fails the test after `timeout`)."""
    import anyio

    async def until() -> None:
        async with httpx.AsyncClient(base_url=stack.base) as client:
            with anyio.fail_after(timeout):
                while (await client.get("/api/health")).json()["followers"] != n:
                    await anyio.sleep(0.05)
    stack.call(until())


def test_fork_from_the_page(stack: Stack, runs: dict[str, str], page: Any):
    pair = runs["pair"]
    page.goto(f"{stack.base}/runs/{pair}")
    page.wait_for_selector("body[data-status=completed]")
    # a refused fork shows the server's message (the page offers only valid points; ask for seq 0 anyway)
    page.evaluate("forkAt(0, null)")
    page.wait_for_selector("#message.error")
    assert "fork" in page.text_content("#message") and "seq" in page.text_content("#message")
    assert page.sa_errors == ["Failed to load resource: the server responded with a status of 400 "
                              "(Bad Request)"]
    page.sa_errors.clear()
    shot(page, "09-fork-refused")

    target = page.locator(".group[data-turn='2'] .event[data-kind='model.requested']")
    seq = int(target.get_attribute("data-seq"))
    target.hover()
    target.locator(".fork").click()
    page.wait_for_url(lambda url: re.search(r"/runs/r[0-9a-f]+$", url) is not None and pair not in url)
    child = page.url.rsplit("/", 1)[-1]
    page.wait_for_selector("body[data-status=completed]")
    first = page.locator(".event").first
    assert first.get_attribute("data-kind") == "run.forked"
    tree = page.text_content("#fork-tree")
    assert pair in tree and child in tree and f"forked at seq {seq}" in tree
    assert page.locator("#fork-tree a", has_text=pair).count() == 1  # the parent is a link
    shot(page, "10-forked-run")

    # "what if the calculator had said 41": fork with another output for call 1.1
    page.goto(f"{stack.base}/runs/{pair}")
    page.wait_for_selector("body[data-status=completed]")
    outcome = page.locator(f".lane[data-call='{pair}/1.1'] .event[data-kind='tool.completed']")
    outcome.locator(".toggle").click()
    outcome.locator(".edit-open").click()
    outcome.locator(".edit-text").fill("{not json")
    outcome.locator(".edit-fork").click()
    assert "not JSON" in outcome.locator(".edit-problem").text_content() and pair in page.url
    outcome.locator(".edit-text").fill('{"expression": "10 * 4", "value": 41}')
    shot(page, "11-fork-with-another-output")
    outcome.locator(".edit-fork").click()
    page.wait_for_url(lambda url: pair not in url and child not in url and "/runs/r" in url)
    page.wait_for_selector("body[data-status=completed]")
    edited = page.locator(".lane[data-call$='/1.1'] .event[data-kind='tool.completed']")
    assert '"value":41' in edited.locator(".desc").text_content()
    page.locator(".event[data-kind='run.forked'] .toggle").click()
    assert '"value": 41' in page.locator(".event[data-kind='run.forked'] .detail").text_content()
    shot(page, "12-forked-with-edit")


def test_approve_deny_and_cancel_from_the_page(stack: Stack, page: Any):
    paid = run_task(stack, "pay: 250", wait=False)
    wait_for_kind(stack, paid, "approval.requested")
    assert [(a["tool"], a["arguments"], a["role"]) for a in approvals(stack) if a["run_id"] == paid] == \
        [("transfer", {"amount": 250}, "finance")]  # the calls waiting across runs, as `sa approvals`
    page.goto(f"{stack.base}/runs/{paid}")
    box = page.locator(".approval")
    box.wait_for()
    assert "waits for approval" in box.text_content() and "finance" in box.text_content()
    assert '"amount": 250' in box.locator(".approval-args").input_value()
    box.locator(".approval-args").fill('{"amount": 90}')
    box.locator(".approval-note").fill("capped at 90")
    shot(page, "15-approval-waiting")
    box.locator(".approve").click()
    page.wait_for_selector("body[data-status=completed]")
    assert '\\"sent\\": 90' in run_output(page)
    assert [a for a in approvals(stack) if a["run_id"] == paid] == []
    granted = page.locator(".event[data-kind='approval.granted']")
    granted.locator(".toggle").click()
    assert "capped at 90" in granted.locator(".detail").text_content()
    assert "sa ui (" in granted.locator(".detail").text_content()  # who: the inspector, and as whom

    refused = run_task(stack, "pay: 500", wait=False)
    wait_for_kind(stack, refused, "approval.requested")
    page.goto(f"{stack.base}/runs/{refused}")
    box = page.locator(".approval")
    box.locator(".deny").click()  # no reason: refused with what to do, nothing sent
    box.locator(".edit-problem").wait_for()
    assert "needs a reason" in box.locator(".edit-problem").text_content()
    page.sa_errors.clear()  # the 400 of that refusal
    box.locator(".deny-reason").fill("not this account")
    box.locator(".deny").click()
    page.wait_for_selector("body[data-status=completed]")
    assert "not this account" in run_output(page)

    stack.gate.reset()
    held = run_task(stack, "hold: 3 * 3", wait=False)
    wait_for_kind(stack, held, "tool.completed")
    page.goto(f"{stack.base}/runs/{held}")
    page.wait_for_selector("body[data-status=running]")
    page.click(".cancel-open")
    page.fill(".cancel-reason", "wrong numbers")
    page.click(".cancel-confirm")
    page.wait_for_selector("body[data-status=cancelled]")
    assert "wrong numbers" in run_output(page)
    assert page.locator(".cancel-open").count() == 0
    shot(page, "16-cancelled")
    stack.gate.release()


def test_a_reply_full_of_html_is_shown_as_text(stack: Stack, runs: dict[str, str], page: Any, tmp_path: Path):
    hostile = runs["hostile"]
    page.goto(f"{stack.base}/runs/{hostile}")
    page.wait_for_selector("body[data-status=completed]")
    for event in page.locator(".event").all():
        event.locator(".toggle").click()
    assert HOSTILE in run_output(page)
    reply = page.locator(".event[data-kind='model.responded'] .detail").text_content()
    assert "<script>window.__pwned = 1</script>" in reply
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate(INJECTED) == 0
    shot(page, "13-hostile-reply-as-text")

    page.goto(stack.base + "/?q=pwned")
    page.wait_for_selector(f"#runs tr[data-run='{hostile}']")
    assert "<script>" in page.text_content(f"#runs tr[data-run='{hostile}']")
    assert page.evaluate("typeof window.__pwned") == "undefined"

    # the one-file export: opened from disk, same page, no request leaves the file, nothing runs
    html = stack.call(export_run(stack.client, hostile))
    path = tmp_path / "run.html"
    path.write_text(html)
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(path.as_uri())
    page.wait_for_selector("body[data-status=completed]")
    assert page.text_content("h1") == hostile
    assert HOSTILE in run_output(page)
    assert page.locator(".event").count() > 3 and page.locator(".fork").count() == 0
    page.locator(".event[data-kind='model.responded'] .toggle").click()
    assert "<script>window.__pwned = 1</script>" in page.locator(".detail").first.text_content()
    assert page.evaluate("typeof window.__pwned") == "undefined"
    assert page.evaluate(INJECTED) == 0
    assert requests == [path.as_uri()], requests
    shot(page, "14-export-opened-from-disk")


@contextmanager
def elsewhere() -> Iterator[str]:
    """A page of another origin (a plain web server on another loopback port) for the block; its URL."""
    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b"<!doctype html><title>elsewhere</title><p>a page elsewhere"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def port_of(stack: Stack) -> str:
    return stack.base.rsplit(":", 1)[1]


def test_a_rebound_name_gets_nothing(stack: Stack, runs: dict[str, str], page: Any):
    """DNS rebinding: a page of the attacker's name whose address became 127.0.0.1 is, to the browser, its
    own origin, so its script could read the inspector's answers. The inspector answers none of them."""
    response = page.goto(f"http://{REBOUND}:{port_of(stack)}/runs/{runs['pair']}")
    assert response.status == 400
    assert f"not to the Host '{REBOUND}:{port_of(stack)}'" in page.text_content("body")
    assert f"--allow-host {REBOUND}" in page.text_content("body")
    shot(page, "17-rebound-name-refused")
    read = page.evaluate("fetch('/api/runs').then(r => r.status)")
    assert read == 400
    page.sa_errors.clear()  # the refused fetch


def test_a_page_of_another_origin_cannot_send_commands(stack: Stack, page: Any):
    """A page elsewhere posts a command the only way a browser lets it without a preflight (no-cors,
    text/plain): it reaches the inspector and is refused for its Origin. The same command from the
    inspector's own page, opened by the other name it was given, goes through."""
    stack.gate.reset()
    held = run_task(stack, "hold: 4 * 4", wait=False)
    wait_for_kind(stack, held, "tool.completed")
    with elsewhere() as other:
        page.goto(other)
        with page.expect_response(lambda r: r.url.endswith("/cancel")) as caught:
            sent = page.evaluate("""url => fetch(url, {
                method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"},
                body: JSON.stringify({reason: "from elsewhere"})}).then(() => "sent")""",
                f"{stack.base}/api/runs/{held}/cancel")
        page.goto("about:blank")  # off that origin before its server stops (a favicon fetch was reset once)
    assert sent == "sent" and caught.value.status == 403  # (it was 415, not JSON, before the Origin check)
    assert page.sa_errors == ["Failed to load resource: the server responded with a status of 403 "
                              "(Forbidden)"]
    page.sa_errors.clear()
    assert stack.call(stack.client.get(held).status()) == "running"

    page.goto(f"http://{OTHER_NAME}:{port_of(stack)}/runs/{held}")
    page.wait_for_selector("body[data-status=running]")
    page.click(".cancel-open")
    page.fill(".cancel-reason", "from the inspector's own page")
    page.click(".cancel-confirm")
    page.wait_for_selector("body[data-status=cancelled]")
    assert "from the inspector's own page" in run_output(page)
    shot(page, "18-own-page-by-another-name")
    stack.gate.release()


def run_output(page: Any) -> str:
    """The run's output box once the page rendered it (a loaded machine can take a while after the status)."""
    page.wait_for_selector("#run-output", timeout=90_000)
    return page.text_content("#run-output") or ""
