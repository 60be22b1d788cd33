"""Sharing the model endpoint, piece by piece: the fair queue, a gate over local permits, the daily budget,
the client's throttle waits (against the scripted server over real HTTP, made full by `Capacity`), the
kernel's budgets, the bundle's sections and the task's priority. Orders and counts, never elapsed time."""

from __future__ import annotations

import email.utils
import textwrap
import time
from pathlib import Path

import anyio
import msgspec
import pytest
from host_helpers import write_bundle

from runtime import events as ev
from runtime import kernel as k
from runtime.agent import Agent
from runtime.bundle import BundleError, load_bundle
from runtime.commands import BadCommand, decode
from runtime.model.client import ModelClient, ModelError
from runtime.model.limits import (
    BudgetExceeded,
    DailyBudget,
    FairQueue,
    LocalGate,
    LocalTokens,
    Throttle,
    Ticket,
    Waiter,
)
from runtime.model.retries import retry_after
from runtime.testing import Capacity, Reply, ScriptedModelServer
from runtime.types import Usage

USER = [{"role": "user", "content": "hi"}]


# ── the fair queue ──────────────────────────────────────────────────────────────────────────────────────


def test_the_queue_serves_the_highest_priority_first_then_flows_in_turn():
    queue = FairQueue()
    # flow a floods (4 calls), b and c ask once each, all at priority 5; one urgent call comes last
    for flow, n in (("a", 4), ("b", 1), ("c", 1)):
        for _ in range(n):
            queue.push(Waiter(Ticket(flow, 5)))
    urgent = Waiter(Ticket("z", 9))
    queue.push(urgent)
    assert len(queue) == 7 and queue.waiting(5) == 6 and queue.waiting(9) == 1
    order = []
    while (w := queue.pop()) is not None:
        order.append(w.flow)
    assert order == ["z", "a", "b", "c", "a", "a", "a"]  # a's flood takes one turn per round
    assert len(queue) == 0 and queue.waiting(5) == 0


def test_a_waiter_that_gives_up_leaves_the_queue():
    queue = FairQueue()
    a, b = Waiter(Ticket("a")), Waiter(Ticket("b"))
    queue.push(a)
    queue.push(b)
    queue.remove(a)
    queue.remove(a)  # twice: nothing more happens
    assert queue.pop() is b and queue.pop() is None and len(queue) == 0


# ── a gate over local permits ─────────────────────────────────────────────────────────────────────────────


@pytest.mark.anyio
async def test_a_local_gate_never_lets_more_than_its_limit_in_and_grants_in_queue_order():
    gate = LocalGate(2)
    inside, peak, served = 0, 0, []
    release = anyio.Event()

    async def call(flow: str, priority: int) -> None:
        nonlocal inside, peak
        async with gate.slot(Ticket(flow, priority)):
            inside += 1
            peak = max(peak, inside)
            served.append(flow)
            await release.wait()
            inside -= 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first", 1)
        tg.start_soon(call, "second", 1)
        while gate.stats.held < 2:
            await anyio.sleep(0)
        for name in ("low-a", "low-b"):
            tg.start_soon(call, name, 1)
        tg.start_soon(call, "high", 9)
        while len(gate.queue) < 3:
            await anyio.sleep(0)
        release.set()
    assert peak == 2 and served[:2] == ["first", "second"] and served[2] == "high"
    assert gate.stats.granted == 5 and gate.stats.held == 0 and gate.stats.by_priority == {1: 4, 9: 1}


@pytest.mark.anyio
async def test_a_cancelled_waiter_keeps_no_permit():
    gate = LocalGate(1)
    permit = await gate.acquire(Ticket("holder"))
    with anyio.move_on_after(0.01):
        await gate.acquire(Ticket("impatient"))  # waits, then gives up
    assert len(gate.queue) == 0
    gate.release(permit)
    again = await gate.acquire(Ticket("next"))  # the permit is free again, not lost to the cancelled one
    gate.release(again)
    assert gate.stats.held == 0


@pytest.mark.anyio
async def test_a_permit_of_an_abandoned_request_goes_back_only_after_a_while():
    """A request given up on mid-flight may still run at the server: its permit is held a little longer."""
    gate = LocalGate(1)
    with anyio.move_on_after(0.01):
        async with gate.slot(Ticket("a")):
            await anyio.sleep(1)  # the request, cancelled
    assert gate.stats.held == 1  # not yet back
    permit = await gate.acquire(Ticket("b"))  # back after the hold (ABANDONED_HOLD_S)
    gate.release(permit)
    assert gate.stats.held == 0 and gate.stats.granted == 2


@pytest.mark.anyio
async def test_a_spent_minute_of_tokens_holds_calls_until_the_next_minute():
    readings = [59.9, 59.9, 59.9]  # the first call, its charge, the second call's first look; then 60.0
    looks: list[float] = []

    def clock() -> float:
        looks.append(readings.pop(0) if readings else 60.0)
        return looks[-1]

    gate = LocalGate(4, tokens_per_minute=10, clock=clock)
    async with gate.slot(Ticket("a")):
        pass
    gate.spent(Usage(8, 4))  # minute 0: 12 of 10 tokens
    async with gate.slot(Ticket("a")):  # minute 0 is spent: it waits, looks again in minute 1, goes on
        pass
    assert looks == [59.9, 59.9, 59.9, 60.0]
    assert gate.tokens is not None and gate.tokens.used(gate._minute_key(59.9)) == 12


# ── the daily budget ─────────────────────────────────────────────────────────────────────────────────────


@pytest.mark.anyio
async def test_a_spent_daily_budget_fails_naming_it():
    budget = DailyBudget("writer", 100, LocalTokens())
    await budget.admit()  # room: it returns
    budget.spend(Usage(90, 20))
    with pytest.raises(BudgetExceeded, match=r"writer's token budget of 100 per day is spent \(110 used\)"):
        await budget.admit()


@pytest.mark.anyio
async def test_a_budget_that_waits_goes_on_in_the_next_window_and_says_so_once():
    budget = DailyBudget("writer", 10, LocalTokens(), wait=True, window_s=1.0)
    budget.spend(Usage(10, 0))
    told: list[Throttle] = []
    await budget.admit(told.append)
    assert len(told) == 1 and told[0].status == 0 and "agent_tokens_per_day" in told[0].reason
    assert budget.used() == 0  # a new window


# ── the client: throttle waits and the limiter ───────────────────────────────────────────────────────────


def client_for(server: ScriptedModelServer, **options) -> ModelClient:
    return ModelClient(base_url=server.base_url, model="m", backoff_base=0.001, backoff_max=0.01, **options)


@pytest.mark.anyio
async def test_a_429_is_retried_after_its_retry_after_and_reported():
    script = [Reply.error(429, "full", retry_after=0.2), Reply.error(503, "busy"), "ok"]
    told: list[Throttle] = []
    with ScriptedModelServer(script) as server:
        async with client_for(server, max_retries=0, throttle_retries=2) as client:
            completion = await client.complete(USER, on_throttle=told.append)
    assert completion.text == "ok" and completion.attempts == 3
    assert [(t.status, t.retry_after, t.attempt) for t in told] == [(429, 0.2, 1), (503, None, 2)]
    assert 0.2 <= told[0].wait_s <= 0.24  # what the server asked, plus at most a fifth


@pytest.mark.anyio
async def test_throttled_answers_have_their_own_count_and_a_bounded_wait():
    with ScriptedModelServer([Reply.error(429, "full", retry_after=100)] * 2) as server:
        async with client_for(server, max_retries=5, throttle_retries=1, retry_after_max=0.05) as client:
            told: list[Throttle] = []
            with pytest.raises(ModelError, match="HTTP 429 after 2 attempts") as err:
                await client.complete(USER, on_throttle=told.append)
    assert err.value.retryable and len(told) == 1
    assert told[0].retry_after == 100 and told[0].wait_s <= 0.05 * 1.2  # bounded by retry_after_max


def test_retry_after_reads_seconds_and_http_dates():
    assert retry_after("1.5") == 1.5 and retry_after(None) is None and retry_after("soon") is None
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= (retry_after(later) or 0) <= 31


@pytest.mark.anyio
async def test_a_client_with_a_limiter_never_has_more_in_flight_than_its_permits():
    capacity = Capacity(3)
    slow = lambda body: Reply.of_text("ok", delay=0.02)  # noqa: E731
    with ScriptedModelServer(responder=slow, capacity=capacity) as server:
        async with client_for(server, max_retries=0) as client:
            client.limiter = LocalGate(3)
            completions = []

            async def one() -> None:
                completions.append(await client.complete(USER, ticket=Ticket("a")))

            async with anyio.create_task_group() as tg:
                for _ in range(12):
                    tg.start_soon(one)
    assert len(completions) == 12 and capacity.peak <= 3 and capacity.refused == 0
    assert any(c.queued_ms > 0 for c in completions)  # the 4th and later waited for a permit


# ── the kernel's budgets ────────────────────────────────────────────────────────────────────────────────


def stamped(state: k.State, event: ev.Event) -> k.State:
    return k.evolve(state, ev.stamp(event, seq=state.seq, ts=1.0, actor="a"))


def started(config: k.KernelConfig) -> k.State:
    return stamped(k.initial(config), ev.RunStarted(run_id="r", input="go"))


def test_a_run_over_its_token_budget_fails_at_its_next_model_call():
    state = started(k.KernelConfig(token_budget=100))
    assert isinstance(k.decide(state)[0], k.CallModel)
    state = stamped(state, ev.ModelRequested(run_id="r", request_id="r/1", turn=1))
    state = stamped(state, ev.ModelThrottled(run_id="r", request_id="r/1", turn=1, status=429, wait_s=1.0))
    state = stamped(state, ev.ModelResponded(run_id="r", request_id="r/1", turn=1, text="x", content="x",
                                             calls=(ev.ToolCall("r/1.0", "t", {}),), usage=Usage(90, 20)))
    assert state.turn is not None and state.turn.attempt == 0  # a throttle is not a call of its own
    state = stamped(state, ev.ToolCompleted(run_id="r", call_id="r/1.0", tool="t", output=1))
    state = stamped(state, ev.TurnCompleted(run_id="r", turn=1, calls_ok=1))
    decided = k.decide(state)
    assert decided == [ev.RunFailed(run_id="r", reason="budget_exceeded",
                                    detail="the run's token budget of 100 is spent (110 tokens used)")]


def test_a_budget_reported_spent_ends_the_run_with_its_words():
    state = started(k.KernelConfig())
    state = stamped(state, ev.ModelRequested(run_id="r", request_id="r/1", turn=1))
    state = stamped(state, ev.ModelFailed(run_id="r", request_id="r/1", turn=1,
                                          error="agent a's budget is spent", error_kind="budget_exceeded"))
    assert k.decide(state) == [ev.RunFailed(run_id="r", reason="budget_exceeded",
                                            detail="agent a's budget is spent")]


# ── the bundle's sections, the task's priority ───────────────────────────────────────────────────────────


def bundle_file(tmp: Path, body: str) -> Path:
    f = tmp / "bundle.yaml"
    f.write_text("name: b\n" + textwrap.dedent(body))
    return f


def test_the_sections_resolve(tmp_path: Path):
    bundle = load_bundle(bundle_file(tmp_path, """\
        endpoint: {max_in_flight: 32, tokens_per_minute: 1000, retry_after_max: 2m, throttle_retries: 3}
        budgets: {run_tokens: 500, agent_tokens_per_day: 10000, on_exceeded: wait}
        priority: 8
        """))
    assert bundle.endpoint is not None and bundle.endpoint.max_in_flight == 32
    assert bundle.endpoint.retry_after_max == 120.0 and bundle.endpoint.limited
    assert bundle.budgets.on_exceeded == "wait" and bundle.kernel_config().token_budget == 500
    assert bundle.priority == 8
    assert load_bundle(bundle_file(tmp_path, "")).priority == ev.DEFAULT_PRIORITY


def test_bad_settings_name_their_path(tmp_path: Path):
    with pytest.raises(BundleError) as err:
        load_bundle(bundle_file(tmp_path, """\
            endpoint: {max_in_flight: 0, retry_after_max: soon}
            budgets: {run_tokens: -1, on_exceeded: pause}
            priority: 12
            """))
    text = str(err.value)
    for path in ("endpoint.max_in_flight", "endpoint.retry_after_max", "budgets.on_exceeded", "priority"):
        assert path in text, text


def test_a_task_priority_outside_0_to_9_is_refused():
    assert decode("a", b'{"input": "x", "priority": 9}').command.priority == 9  # type: ignore[union-attr]
    with pytest.raises(BadCommand, match="priority") as refused:
        decode("a", b'{"input": "x", "priority": 12}')
    # issue 36: it read "invalid command 'task': Expected `int` <= 9": the field, its range and its meaning
    assert str(refused.value) == ("invalid command 'task': priority must be an integer from 0 to 9: 9 is the "
                                  "most urgent (served first), 0 the least; left out, the agent's bundle's "
                                  "`priority:`, else 5; got 12")
    packed = msgspec.msgpack.encode({"kind": "task", "agent": "a", "input": "x", "priority": "high"})
    with pytest.raises(BadCommand, match=r"priority must be an integer from 0 to 9.*; got 'high'"):
        decode("a", packed)
    with pytest.raises(msgspec.ValidationError):
        msgspec.json.decode(b'{"kind": "task", "agent": "a", "input": "x", "priority": -1}', type=ev.Task)


# ── in process: the same throttle events ─────────────────────────────────────────────────────────────────


@pytest.mark.anyio
async def test_an_agent_in_process_records_throttles_too(tmp_path: Path):
    with ScriptedModelServer([Reply.error(429, "full", retry_after=0), "the answer"]) as server:
        bundle = write_bundle(tmp_path, base_url=server.base_url, extra="endpoint: {max_in_flight: 1}\n",
                              terminal=None)  # a text reply ends a run that has no terminal tool
        async with Agent.from_bundle(bundle) as agent:
            outcome = await agent.run("hello")
    assert outcome.output == "the answer"
    throttled = [e for e in outcome.events if isinstance(e, ev.ModelThrottled)]
    assert len(throttled) == 1 and throttled[0].status == 429 and throttled[0].retry_after == 0
    assert sum(isinstance(e, ev.ModelRequested) for e in outcome.events) == 1
