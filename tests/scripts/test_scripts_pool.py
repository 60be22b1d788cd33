"""The process-wide sandbox pool: crashes are contained and reported, loops may change, exit is clean."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from runtime.scripts import SandboxPool, diagnose, get_pool, loads, probe

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.anyio


async def test_crashed_worker_is_replaced_and_reported():
    pool = get_pool()
    before = pool.crashes
    pid: dict[str, int] = {}

    def on_event(e):
        if e.kind == "started" and e.worker_pid:
            pid["worker"] = e.worker_pid

    async def kill_my_worker() -> None:
        os.kill(pid["worker"], signal.SIGKILL)
        await asyncio.sleep(0.3)

    s = loads(
        "from grail import external\n@external\nasync def k() -> None: ...\nawait k()\n1\n", name="victim"
    )
    r = await s.run(externals={"k": kill_my_worker}, on_event=on_event)
    assert r.error.kind == "crashed", r.error
    assert "replaced" in r.error.message
    assert pool.crashes == before + 1
    # the host is fine and the next run gets a fresh worker
    again: dict[str, int] = {}
    r2 = await loads("1 + 1\n").run(on_event=lambda e: again.setdefault("pid", e.worker_pid or 0))
    assert r2.output == 2
    assert again["pid"] != pid["worker"]


async def test_probe_finds_what_only_montys_parser_rejects():
    ok = loads('"""Doc."""\nx = [i for i in range(3)]\nx\n')
    assert await probe(ok) == []
    assert await diagnose(ok) == []
    # the probe must not run the code
    printed = loads('print("side effect")\nwhile True:\n    pass\n')
    assert await probe(printed) == []


def test_runs_from_separate_event_loops_share_the_pool():
    s = loads("6 * 7\n")
    assert asyncio.run(s.run()).output == 42
    assert asyncio.run(s.run()).output == 42


EXIT_SCRIPT = textwrap.dedent("""
    import asyncio
    from runtime.scripts import loads

    async def main():
        rs = await asyncio.gather(*(loads("1 + 1\\n").run() for _ in range(4)))
        assert all(r.output == 2 for r in rs)
        print("ok")

    asyncio.run(main())
    # no explicit shutdown: the atexit hook must close the pool without the AsyncMonty abort
""")


def test_process_exits_cleanly_without_explicit_shutdown():
    for _ in range(6):
        proc = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
        assert proc.stdout.strip() == "ok"


async def test_cancelled_run_leaves_the_pool_usable():
    s = loads("while True:\n    pass\n")
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(s.run(limits="permissive"), 0.2)
    assert (await loads("3\n").run()).output == 3


async def test_typecheck_against_declaration_stubs_reports_lines_and_is_cached():
    from runtime.scripts import load, typecheck

    src = (
        '"""Typed."""\nfrom grail import Input, external\n\nn: int = Input("n")\n\n'
        '@external\ndef label(x: int) -> str: ...\n\ny: str = n + 1\nlabel("a")\n'
    )
    s = loads(src, name="typed")
    found = await typecheck(s)
    assert [(d.kind, d.line) for d in found] == [("check", 9), ("check", 10)]
    assert "not assignable to `str`" in found[0].message
    assert await typecheck(loads(src, name="typed")) == found  # cached by content hash
    for path in (
        "agents/calculator.pym",
        "agents/summarize.pym",
        "agents/workspace/list_entries.pym",
        "agents/workspace/add_entry.pym",
    ):
        assert await diagnose(load(ROOT / path), types=True) == [], path


LIMITS = {"max_memory": 32 * 1024 * 1024, "max_feed_duration_secs": 5.0}
FRESH = "try:\n    leftover\n    r = 'touched'\nexcept NameError:\n    r = 'fresh'\nleftover = 1\nr\n"


async def _run(pool: SandboxPool, name: str, code: str = FRESH) -> tuple[object, int | None]:
    async with pool.session(script_name=name, limits=LIMITS) as s:
        return await s.feed_run(code), s.worker_pid


async def test_a_warm_pool_has_the_next_session_ready_and_untouched():
    pool = SandboxPool(max_processes=2)
    try:
        async with pool.warm():
            first, _ = await _run(pool, "a.pym")
            await pool.settled()  # the worker's cue: the job's outcome is out
            second, _ = await _run(pool, "a.pym")
            assert (first, second) == ("fresh", "fresh")  # the ready session is new, not the last one reused
            assert pool.ready_runs == 1
            await pool.settled()
            other, _ = await _run(pool, "b.pym")  # another tool's script name: a session of its own
            assert other == "fresh" and pool.ready_runs == 1
        async with pool.session(script_name="a.pym", limits=LIMITS):  # outside `warm`: nothing kept
            pass
        await pool.settled()
        assert pool.ready_runs == 1
    finally:
        await pool.close()


async def test_a_ready_session_is_not_used_once_its_process_died():
    pool = SandboxPool(max_processes=2)
    try:
        async with pool.warm():
            await _run(pool, "a.pym")
            await pool.settled()
            warm = pool._warm
            assert warm is not None and warm.spare is not None
            os.kill(warm.spare[2].worker_pid, signal.SIGKILL)
            await asyncio.sleep(0.2)  # let the kill land (the order under test: killed, then asked)
            output, _ = await _run(pool, "a.pym")
            assert output == "fresh" and pool.ready_runs == 0  # not reported as a crash of this run
    finally:
        await pool.close()


async def test_a_one_process_pool_gives_its_ready_session_up_to_another_tool():
    """The spare holds the only process: a run of another script must close it first, not wait for it."""
    pool = SandboxPool(max_processes=1)
    try:
        async with pool.warm():
            for name in ("a.pym", "b.pym", "a.pym", "a.pym"):
                with anyio.fail_after(30):  # a hang guard, not a speed check
                    output, _ = await _run(pool, name, "1 + 1\n")
                assert output == 2
                await pool.settled()
            assert pool.ready_runs == 1
            with anyio.fail_after(30):  # two runs at once while a spare waits
                results = await asyncio.gather(_run(pool, "b.pym", "2\n"), _run(pool, "c.pym", "3\n"))
            assert [r for r, _ in results] == [2, 3]
            await pool.settled()
            with anyio.fail_after(30):  # a run before the last one was settled: its checkout, not a spare's
                assert (await _run(pool, "a.pym", "4\n"))[0] == 4
                assert (await _run(pool, "b.pym", "5\n"))[0] == 5
    finally:
        await pool.close()
