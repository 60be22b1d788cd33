"""Short runs fed from the caller's thread (`runtime.scripts.inline`): same results and notes as the async
pool, never the loop held past a slice, a slow script's attempt discarded unseen and run again in full."""

import asyncio
import os
import signal

import pytest

from runtime.scripts import get_pool, loads
from runtime.scripts.inline import INLINE_SLICE_S, Inline

pytestmark = pytest.mark.anyio

ADD = 'from grail import Input\na: int = Input("a")\nprint("adding", a)\n{"sum": a + 1}\n'


def counts() -> tuple[int, int, int]:
    pool = get_pool()
    return pool.inline.runs, pool.inline.discarded, pool.runs


@pytest.fixture
def roomy(monkeypatch):
    """A slice a loaded machine cannot overrun by chance, for tests of runs that must stay inline."""
    monkeypatch.setattr(get_pool().inline, "slice_s", 5.0)


async def test_a_fast_script_without_externals_runs_inline_with_every_note(roomy):
    notes = []
    before = counts()
    r = await loads(ADD, name="inline_add").run({"a": 2}, on_event=notes.append)
    assert r.output == {"sum": 3} and r.error is None
    assert counts() == (before[0] + 1, before[1], before[2])  # inline, kept, the async pool not asked
    assert [n.kind for n in notes] == ["started", "printed", "completed"]
    assert notes[0].worker_pid and notes[1].text == "adding 2\n"
    assert notes[0].ts <= notes[1].ts <= notes[2].ts  # its start when it began, not when it was reported
    assert notes[0].duration_ms <= notes[2].duration_ms


async def test_a_script_with_externals_keeps_the_async_pool():
    s = loads("from grail import external\n@external\nasync def twice(x: int) -> int: ...\nawait twice(4)\n",
              name="inline_ext")

    async def twice(x: int) -> int:
        return 2 * x

    before = counts()
    r = await s.run(externals={"twice": twice})
    assert r.output == 8
    assert counts() == (before[0], before[1], before[2] + 1)


async def test_a_slow_script_is_run_again_in_full_and_never_tried_inline_again():
    """Its attempt ran out of the slice (the sleep does not fit in it): discarded with what it printed, the
    run done again under its own limits; the second run goes straight to the async pool."""
    s = loads('import time\nprint("attempt")\ntime.sleep(0.05)\n"woke"\n', name="inline_sleepy")
    notes = []
    before = counts()
    r = await s.run(limits={"max_duration": "2s"}, on_event=notes.append)
    assert r.output == "woke", r.error
    assert [n.text for n in notes if n.kind == "printed"] == ["attempt\n"]  # the discarded one's: dropped
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1)
    r = await s.run(limits={"max_duration": "2s"})
    assert r.output == "woke"
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 2)


async def test_an_endless_loop_stops_at_its_own_limit_not_the_slice():
    s = loads('print("spinning")\nwhile True:\n    pass\n', name="inline_spin")
    before = counts()
    r = await s.run(limits={"max_duration": "300ms"})
    assert r.error is not None and (r.error.kind, r.error.detail) == ("limit", "duration")
    assert "300 ms" in r.error.message  # the script's limit is reported, never the slice's
    assert counts() == (before[0] + 1, before[1] + 1, before[2] + 1)


async def test_a_limit_within_the_slice_stands_inline():
    s = loads("while True:\n    pass\n", name="inline_tight")
    before = counts()
    r = await s.run(limits={"max_duration": "5ms"})
    assert r.error is not None and (r.error.kind, r.error.detail) == ("limit", "duration")
    assert "5 ms" in r.error.message
    assert counts() == (before[0] + 1, before[1], before[2])  # its own limit fits the slice: it stands


async def test_script_errors_are_the_same_values_inline(roomy):
    s = loads('from grail import Input\nn: int = Input("n")\nitems = [1, 2]\nitems[n]\n', name="inline_err")
    before = counts()
    r = await s.run({"n": 5})
    assert r.error is not None and r.error.kind == "execution" and r.error.line == 4, r.error
    assert "IndexError" in r.error.message
    assert counts()[0] == before[0] + 1


def test_a_zero_slice_or_externals_are_never_inline():
    assert not Inline(slice_s=0, max_processes=1, max_checkouts_per_worker=None).eligible("a:1", False)
    one = Inline(slice_s=INLINE_SLICE_S, max_processes=1, max_checkouts_per_worker=None)
    assert one.eligible("a:1", False) and not one.eligible("a:1", True)


FRESH = "try:\n    leftover\n    r = 'touched'\nexcept NameError:\n    r = 'fresh'\nleftover = 1\nr\n"


async def test_settle_readies_the_next_session_untouched(roomy):
    """After `settle` (a worker's cue: the outcome is out) the next run of the script finds its session
    checked out already, and no script has run in it; another script's run does not take it."""
    pool = get_pool()
    s = loads(FRESH, name="inline_fresh")
    assert (await s.run()).output == "fresh"
    pool.settle()  # deferred: what the loop has ready (a worker's job ack) goes first
    assert pool.inline._state().spare is None
    await asyncio.sleep(0)
    assert pool.inline._state().spare is not None
    ready = pool.inline.ready_runs
    assert (await s.run()).output == "fresh"  # the spare: new, not the last run's session
    assert pool.inline.ready_runs == ready + 1
    await pool.settled()
    assert (await loads(FRESH, name="inline_other").run()).output == "fresh"  # another script: its own
    assert pool.inline.ready_runs == ready + 1
    assert (await s.run()).output == "fresh"  # not settled since: checked out for itself
    assert pool.inline.ready_runs == ready + 1


async def test_a_spare_whose_process_died_is_not_used(roomy):
    pool = get_pool()
    s = loads(FRESH, name="inline_victim")
    await s.run()
    await pool.settled()
    spare = pool.inline._state().spare
    assert spare is not None
    os.kill(spare[1].worker_pid, signal.SIGKILL)
    await asyncio.sleep(0.2)  # let the kill land (the order under test: killed, then asked)
    ready, crashes = pool.inline.ready_runs, pool.crashes
    r = await s.run()
    assert r.output == "fresh" and r.error is None  # not reported as a crash of this run
    assert (pool.inline.ready_runs, pool.crashes) == (ready, crashes)


async def test_with_every_process_held_elsewhere_a_run_goes_to_the_async_pool_and_no_spare_is_awaited(roomy):
    """The synchronous pool's checkout blocks the event loop's thread: when no process is free (held by
    other code in the process) a run waits a bounded time, then goes to the async pool; `settle` gives
    up the spare and does not try again at every job."""
    pool, inline = get_pool(), get_pool().inline
    s = loads(FRESH, name="inline_starved")
    assert (await s.run()).output == "fresh"  # the inline pool is up
    inline.close_spare()  # this thread holds nothing now
    held = []
    try:
        while True:  # every process the inline pool may have, held here
            session = inline._pool().checkout(script_name="hog.py", limits=HOG_LIMITS)
            try:
                session.__enter__()
            except TimeoutError:
                break
            held.append(session)
        assert held
        runs, starved, async_runs = inline.runs, inline.starved, pool.runs
        r = await s.run()
        assert r.output == "fresh" and r.error is None
        assert (inline.runs, inline.starved, pool.runs) == (runs, starved + 1, async_runs + 1)
        inline.settle()
        assert inline._state().spare is None and inline.starved == starved + 2
        inline.settle()  # within `STARVED_S`: not tried again
        assert inline.starved == starved + 2
    finally:
        for session in held:
            session.__exit__(None, None, None)
        inline._no_spare_until = 0.0
    assert (await s.run()).output == "fresh" and inline.runs == runs + 1  # inline again


HOG_LIMITS = {"max_memory": 100_000_000, "max_feed_duration_secs": 1.0}
