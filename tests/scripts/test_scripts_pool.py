"""The process-wide sandbox pool: crashes are contained and reported, loops may change, exit is clean."""

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from runtime.scripts import diagnose, get_pool, loads, probe

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
