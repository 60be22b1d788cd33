"""Running scripts in real Monty: results, every error kind, every limit, files, environ, events, outputs."""

import asyncio
import datetime
import decimal
import os
import signal
import textwrap
import threading

import pytest
from pydantic import BaseModel

from runtime.scripts import Limits, ScriptNote, loads, to_plain
from runtime.types import ERROR_KINDS

pytestmark = pytest.mark.anyio


def script(src: str, name: str = "t"):
    return loads(textwrap.dedent(src), name=name)


async def test_result_is_the_last_expression_with_inputs_and_defaults():
    s = script("""\
        from grail import Input
        a: int = Input("a")
        b: int = Input("b", default=10)
        c: list[int] | None = Input("c")
        {"sum": a + b, "c": c}
    """)
    r = await s.run({"a": 1})
    assert r.ok and r.output == {"sum": 11, "c": None}
    assert r.duration_ms > 0
    r = await s.run({"a": 1, "b": 2.0, "c": [1, 2]})  # an integral float for an int input is accepted
    assert r.output == {"sum": 3, "c": [1, 2]}


async def test_outputs_become_plain_json_data():
    s = script("""\
        import datetime, decimal
        from dataclasses import dataclass
        from pathlib import Path

        @dataclass
        class P:
            x: int
            when: object

        {
            "t": (1, 2), "s": {3, 1, 2}, "d": decimal.Decimal("1.50"), "dt": datetime.date(2020, 1, 2),
            "p": P(1, datetime.datetime(2020, 1, 2, 3, 4, 5)), "path": Path("/a/b"),
            "k": {(1, 2): "t", 3: "i"},
            "b": b"hi", "raw": b"\\xff\\x00", "big": 2 ** 70,
        }
    """)
    r = await s.run()
    assert r.ok, r.error
    assert r.output == {
        "t": [1, 2],
        "s": [1, 2, 3],
        "d": "1.50",
        "dt": "2020-01-02",
        "p": {"x": 1, "when": "2020-01-02T03:04:05"},
        "path": "/a/b",
        "k": {"[1,2]": "t", "3": "i"},
        "b": "hi",
        "raw": "base64:/wA=",
        "big": str(2**70),
    }


def test_to_plain_handles_host_values():
    assert to_plain({"x": {1, 2}, "y": decimal.Decimal("2"), "z": datetime.time(1, 2)}) == {
        "x": [1, 2],
        "y": "2",
        "z": "01:02:00",
    }


# ---- every error kind -------------------------------------------------------------------------------


async def test_parse_error():
    r = await script("x = (1 +\n", name="p").run()
    assert r.error.kind == "parse" and r.error.line == 1


async def test_check_error():
    r = await script("import enum\n").run()
    assert r.error.kind == "check" and r.error.line == 1 and "enum" in r.error.message


@pytest.mark.parametrize(
    ("inputs", "fragment"),
    [
        ({}, "missing required input 'n' (integer)"),
        ({"n": 1, "m": 2}, "unknown input 'm'"),
        ({"n": "5"}, 'input n: expected integer, got string "5"'),
        ({"n": 1, "nn": 2}, "did you mean 'n'"),
        ({"n": True}, "expected integer, got boolean"),
    ],
)
async def test_input_errors_before_anything_runs(inputs, fragment):
    events = []
    s = script('from grail import Input\nn: int = Input("n")\nprint("ran")\nn\n')
    r = await s.run(inputs, on_event=events.append)
    assert r.error.kind == "input", r.error
    assert fragment in r.error.message
    assert not any(e.kind == "printed" for e in events)


async def test_external_errors_missing_extra_and_raised():
    src = """\
        from grail import external
        @external
        async def fetch(url: str) -> str: ...
        await fetch("u")
    """
    s = script(src)
    r = await s.run()
    assert r.error.kind == "external" and "'fetch'" in r.error.message and r.error.line == 2
    r = await s.run(externals={"fetch": lambda u: u, "other": lambda: 1})
    assert r.error.kind == "external" and "'other'" in r.error.message

    async def boom(url):
        raise ValueError(f"bad url {url}")

    r = await s.run(externals={"fetch": boom})
    assert r.error.kind == "external" and r.error.line == 4
    assert "external function 'fetch' raised ValueError: bad url u" in r.error.message


async def test_external_error_caught_by_script_is_fine():
    s = script("""\
        from grail import external
        @external
        def get(k: str) -> int: ...
        try:
            get("x")
        except KeyError as e:
            r = "caught " + str(e)
        r
    """)

    def get(k):
        raise KeyError(k)

    r = await s.run(externals={"get": get})
    assert r.ok and r.output.startswith("caught")


async def test_externals_are_wrapped_to_their_declared_form():
    s = script("""\
        from grail import external
        @external
        async def a(x: int) -> int: ...
        @external
        def b(x: int) -> int: ...
        [await a(1), b(2)]
    """)
    loop_thread = threading.get_ident()
    seen = {}

    def sync_for_async(x):  # sync implementation of an async declaration
        return x + 10

    async def async_for_sync(x):  # async implementation of a sync declaration: runs on the loop
        seen["thread"] = threading.get_ident()
        await asyncio.sleep(0)
        return x + 20

    r = await s.run(externals={"a": sync_for_async, "b": async_for_sync})
    assert r.output == [11, 22], r.error
    assert seen["thread"] == loop_thread


@pytest.mark.timeout(60)  # the old failure was a hang of the whole loop (the watchdog then ends the session)
async def test_a_plain_external_waiting_for_the_loop_never_holds_monty_while_the_loop_uses_its_sync_pool():
    """A `def` external is answered on the loop, never on Monty's thread: there, an implementation that
    waited for the loop held the thread that Monty's synchronous pool needs, and an inline run (or a
    session given back) on the loop meanwhile never returned. A sync implementation runs off the loop."""
    from runtime.scripts import get_pool

    s = script("""\
        from grail import external
        @external
        def record(x: int) -> int: ...
        @external
        def blocking(x: int) -> int: ...
        [record(1), blocking(2)]
    """)
    entered, release, unblocked = asyncio.Event(), asyncio.Event(), threading.Event()
    loop_thread = threading.get_ident()
    threads = {}

    async def record(x):  # as the runtime's record of an external call: it waits on the loop
        entered.set()
        await release.wait()
        return x + 10

    def blocking(x):  # a sync implementation that blocks until the loop lets it go
        threads["blocking"] = threading.get_ident()
        unblocked.wait(30)
        return x + 20

    async def unblock_when_called():
        while "blocking" not in threads:
            await asyncio.sleep(0.001)
        unblocked.set()  # the loop runs while the sync implementation blocks

    run = asyncio.ensure_future(s.run(externals={"record": record, "blocking": blocking}))
    await entered.wait()
    inline = await script("1 + 1").run()  # the synchronous pool, used from the loop meanwhile
    assert inline.output == 2 and get_pool().inline.runs > 0
    release.set()
    waker = asyncio.ensure_future(unblock_when_called())
    r = await run
    await waker
    assert r.output == [11, 22], r.error
    assert threads["blocking"] != loop_thread


async def test_external_returning_a_pydantic_model_is_converted():
    class Item(BaseModel):
        name: str

    s = script('from grail import external\n@external\ndef item() -> dict: ...\nitem()["name"]\n')
    r = await s.run(externals={"item": lambda: Item(name="x")})
    assert r.output == "x"


async def test_execution_error_points_at_the_users_line():
    s = script('''\
        """doc"""
        from grail import Input
        key: str = Input("key")

        def inner(d):
            return d[key]

        def outer():
            return inner({})

        outer()
    ''')
    r = await s.run({"key": "missing"})
    assert r.error.kind == "execution" and r.error.line == 6
    assert r.error.message.startswith("KeyError: missing")
    assert "line 11, in <module>: outer()" in r.error.message
    assert "line 9, in outer" in r.error.message


async def test_unsupported_construct_reaching_monty_is_a_check_error():
    # code built at run time slips past the static check: Monty's parser reports it as it runs
    r = await script('exec("def g():\\n    yield 1")\n').run()
    assert r.error.kind == "check" and "yield" in r.error.message


async def test_output_errors_pydantic_model_and_json_schema():
    class Out(BaseModel):
        writes: list[dict[str, str]]
        message: str

    s = script('{"writes": 123, "message": "m"}\n')
    r = await s.run(output_model=Out)
    assert r.error.kind == "output" and "result.writes" in r.error.message and "Out" in r.error.message

    good = script('{"writes": [{"path": "a", "content": "b"}], "message": "m", "extra": 1}\n')
    r = await good.run(output_model=Out)
    assert r.ok and r.output == {"writes": [{"path": "a", "content": "b"}], "message": "m"}

    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 0}},
        "required": ["n"],
        "additionalProperties": False,
    }
    assert (await script('{"n": 3}\n').run(output_model=schema)).output == {"n": 3}
    r = await script('{"n": -1, "x": 1}\n').run(output_model=schema)
    assert r.error.kind == "output"
    assert "result.n: must be >= 0" in r.error.message and "result.x: unexpected property" in r.error.message
    r = await script("1\n").run(output_model={"type": "integer", "if": {}})
    assert r.error.kind == "output" and "cannot check" in r.error.message


async def test_output_model_can_be_any_type():
    assert (await script("[1, 2]\n").run(output_model=list[int])).output == [1, 2]
    assert (await script("['a']\n").run(output_model=list[int])).error.kind == "output"


async def _crash_the_sandbox_worker(on_event):
    """A run whose external kills the sandbox worker running it (SIGKILL, as the OOM killer would)."""
    pid: dict[str, int] = {}

    async def watch(note: ScriptNote) -> None:
        if note.kind == "started" and note.worker_pid:
            pid["worker"] = note.worker_pid
        await on_event(note)

    async def kill_my_worker() -> None:
        os.kill(pid["worker"], signal.SIGKILL)
        await asyncio.sleep(0.3)  # let the kill land before the sandbox resumes (not an assertion)

    s = script("from grail import external\n@external\nasync def k() -> None: ...\nawait k()\n1\n")
    return await s.run(externals={"k": kill_my_worker}, on_event=watch)


RUNS_BY_KIND = {
    "parse": lambda on_event: script("x = (1 +\n").run(on_event=on_event),
    "check": lambda on_event: script("import enum\n").run(on_event=on_event),
    "input": lambda on_event: script('from grail import Input\nn: int = Input("n")\nn\n').run(
        {"n": "five"}, on_event=on_event
    ),
    "external": lambda on_event: script(  # declared, but the host supplies no implementation
        "from grail import external\n@external\ndef f() -> int: ...\nf()\n"
    ).run(on_event=on_event),
    "execution": lambda on_event: script("1 / 0\n").run(on_event=on_event),
    "limit": lambda on_event: script("def f(n):\n    return f(n + 1)\nf(0)\n").run(
        limits="strict", on_event=on_event
    ),
    "output": lambda on_event: script('"text"\n').run(output_model=int, on_event=on_event),
    "crashed": _crash_the_sandbox_worker,
}


@pytest.mark.parametrize("kind", list(RUNS_BY_KIND))
async def test_every_sandbox_error_kind_comes_from_a_real_run(kind):
    """Each kind a run can report, produced by a real run in Monty, is a kind the wire schema knows, and
    the run's last note carries the very error the caller got. (`policy` and `timeout` come from the
    kernel and the worker, never from the sandbox.)"""
    notes: list[ScriptNote] = []

    async def observe(note: ScriptNote) -> None:
        notes.append(note)

    r = await RUNS_BY_KIND[kind](observe)
    assert r.error is not None and r.error.kind == kind, r.error
    assert r.error.kind in ERROR_KINDS
    assert (notes[0].kind, notes[-1].kind) == ("started", "failed")
    assert notes[-1].error == r.error


# ---- limits -----------------------------------------------------------------------------------------


async def test_infinite_loop_under_strict_is_limit_duration():
    endless = script("while True:\n    pass\n")
    finished: list[str] = []

    async def run(preset: str):
        result = await endless.run(limits=preset)
        finished.append(preset)
        return result

    strict, default = await asyncio.gather(run("strict"), run("default"))
    for r, budget in ((strict, "500 ms"), (default, "2 s")):
        assert (r.error.kind, r.error.detail) == ("limit", "duration")
        assert budget in r.error.message and "max_duration" in r.error.message
    # the strict budget stopped its loop while the same loop, started with it, still ran under default's
    assert finished == ["strict", "default"]


async def test_memory_bomb_is_limit_memory():
    r = await script("x = [0] * 10_000_000\nlen(x)\n").run(limits=Limits.strict())
    assert (r.error.kind, r.error.detail, r.error.line) == ("limit", "memory", 1)
    r = await script('s = "ab"\nwhile True:\n    s = s + s\n').run(limits="strict")
    assert (r.error.kind, r.error.detail, r.error.line) == ("limit", "memory", 3)


async def test_deep_recursion_is_limit_recursion():
    r = await script("def f(n):\n    return f(n + 1)\nf(0)\n").run(limits="strict")
    assert (r.error.kind, r.error.detail, r.error.line) == ("limit", "recursion", 2)
    assert "120" in r.error.message


async def test_recursion_within_the_limit_works():
    r = await script("def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\nf(100)\n").run(limits="strict")
    assert r.output == 100


async def test_too_many_host_calls_is_limit_suspensions():
    s = script(
        "from grail import external\n@external\ndef g(i: int) -> int: ...\nfor i in range(50):\n    g(i)\n"
    )
    r = await s.run(externals={"g": lambda i: i}, limits={"max_suspensions": 10})
    assert (r.error.kind, r.error.detail, r.error.line) == ("limit", "suspensions", 5)
    # file operations count too
    files = {f"/d/{i}.txt": "x" for i in range(20)}
    r = await script('import os\n[open("/d/" + n).read() for n in os.listdir("/d")]\n').run(
        files=files, limits={"max_suspensions": 10}
    )
    assert (r.error.kind, r.error.detail) == ("limit", "suspensions")


async def test_large_result_is_limit_output():
    r = await script('"x" * 5000\n').run(limits={"max_output": "1kb"})
    assert (r.error.kind, r.error.detail) == ("limit", "output")
    assert "1 KB" in r.error.message
    assert (await script('"x" * 500\n').run(limits={"max_output": "1kb"})).ok


async def test_sleeping_counts_against_duration():
    r = await script("import time\ntime.sleep(2)\n1\n").run(limits="strict")
    assert (r.error.kind, r.error.detail) == ("limit", "duration")


async def test_host_time_in_externals_is_not_sandbox_time():
    async def slow():
        await asyncio.sleep(0.6)
        return 1

    s = script("from grail import external\n@external\nasync def slow() -> int: ...\nawait slow()\n")
    r = await s.run(externals={"slow": slow}, limits="strict")
    assert r.output == 1


# ---- files and environ ------------------------------------------------------------------------------


FILES = {
    "/data/notes.txt": "line1\nline2\n",
    "/data/sub/a.json": '{"k": 1}',
    "/data/img.bin": b"\x00\x01",
}


async def test_virtual_files_open_pathlib_listdir():
    s = script("""\
        import json, os
        from pathlib import Path
        with open("/data/notes.txt") as f:
            lines = [ln.strip() for ln in f]
        {
            "open": lines,
            "pathlib": json.loads(Path("/data/sub/a.json").read_text()),
            "bytes": open("/data/img.bin", "rb").read(),
            "listdir": sorted(os.listdir("/data")),
            "exists": [os.path.exists("/data/sub"), os.path.isdir("/data/sub"),
                       os.path.exists("/x")],
            "glob": [str(p) for p in Path("/data").glob("**/*.json")],
        }
    """)
    r = await s.run(files=FILES)
    assert r.ok, r.error
    assert r.output == {
        "open": ["line1", "line2"],
        "pathlib": {"k": 1},
        "bytes": "\x00\x01",
        "listdir": ["img.bin", "notes.txt", "sub"],
        "exists": [True, True, False],
        "glob": ["/data/sub/a.json"],
    }


@pytest.mark.parametrize(
    "write",
    [
        'open("/data/notes.txt", "w").write("x")',
        'open("/data/new.txt", "a").write("x")',
        'Path("/data/new.txt").write_text("x")',
        'os.remove("/data/notes.txt")',
        'os.mkdir("/data/d2")',
        'Path("/data/notes.txt").rename("/data/n2.txt")',
    ],
)
async def test_filesystem_is_read_only(write):
    s = script(f"import os\nfrom pathlib import Path\n{write}\n")
    r = await s.run(files=dict(FILES))
    assert r.error.kind == "execution" and r.error.line == 3, r.error
    assert "PermissionError" in r.error.message and "Read-only" in r.error.message
    assert "return the changes" in r.error.message


async def test_missing_file_lists_available_files():
    r = await script('open("/data/nope.txt").read()\n').run(files=FILES)
    assert r.error.kind == "execution" and "FileNotFoundError" in r.error.message
    assert "/data/notes.txt" in r.error.message


async def test_relative_file_paths_live_under_root():
    r = await script('open("/notes/a.txt").read()\n').run(files={"notes/a.txt": "hi"})
    assert r.output == "hi"


async def test_environ():
    s = script('import os\n[os.getenv("MODE"), os.getenv("NOPE", "dflt"), dict(os.environ)]\n')
    r = await s.run(environ={"MODE": "test", "HOME": "/w"})
    assert r.output == ["test", "dflt", {"MODE": "test", "HOME": "/w"}]
    r = await s.run()
    assert r.output == [None, "dflt", {}]


# ---- events -----------------------------------------------------------------------------------------


async def test_events_start_print_complete_in_order_with_durations():
    events: list[ScriptNote] = []
    s = script('print("hello")\nimport sys\nprint("err", file=sys.stderr)\n42\n', name="ev")
    r = await s.run(on_event=events.append)
    assert r.output == 42
    kinds = [e.kind for e in events]
    assert kinds[0] == "started" and kinds[-1] == "completed"
    printed = [(e.stream, e.text) for e in events if e.kind == "printed"]
    assert "".join(t for _, t in printed) == "hello\nerr\n"
    assert {s for s, _ in printed} == {"stdout", "stderr"}
    assert all(e.script == "ev" for e in events)
    assert events[0].worker_pid and events[-1].output_bytes == 2
    assert events[-1].duration_ms >= events[0].duration_ms


async def test_error_event_and_async_callback():
    seen: list[ScriptNote] = []

    async def on_event(e: ScriptNote) -> None:
        await asyncio.sleep(0)
        seen.append(e)

    r = await script('print("before")\n1 / 0\n').run(on_event=on_event)
    assert r.error.kind == "execution"
    assert [e.kind for e in seen] == ["started", "printed", "failed"]
    assert seen[-1].error == r.error and seen[1].text == "before\n"


async def test_failing_callback_does_not_break_the_run():
    def bad(_e):
        raise RuntimeError("observer bug")

    assert (await script("1 + 1\n").run(on_event=bad)).output == 2


async def test_input_error_still_reports_start_and_error_events():
    events = []
    s = script('from grail import Input\nn: int = Input("n")\nn\n')
    await s.run({}, on_event=events.append)
    assert [e.kind for e in events] == ["started", "failed"]


async def test_concurrent_runs_are_isolated():
    s = script('from grail import Input\nn: int = Input("n")\nimport os\n[n * n, os.getenv("N")]\n')
    results = await asyncio.gather(*(s.run({"n": i}, environ={"N": str(i)}) for i in range(8)))
    assert [r.output for r in results] == [[i * i, str(i)] for i in range(8)]


class HostOnlyError(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (KeyError("x"), "KeyError: 'x'"),
        (HostOnlyError("custom"), "HostOnlyError: custom"),
        (ValueError(), "ValueError"),
    ],
)
async def test_external_failures_of_any_exception_type_are_kind_external(exc, shown):
    s = script('from grail import external\n@external\ndef get(k: str) -> int: ...\nget("x")\n')

    def get(k):
        raise exc

    r = await s.run(externals={"get": get})
    assert r.error.kind == "external" and r.error.line == 4
    assert f"external function 'get' raised {shown}" in r.error.message


def test_items_of_several_types_are_checked_not_crashed_on():
    """`list[str | None]` gives `items: {type: [string, null]}`: a list of types, checked item by item."""
    from runtime.validate import validate

    schema = {"type": "array", "items": {"type": ["string", "null"]}}
    assert validate(["a", None], schema) == []
    errors = validate(["a", 3], schema)
    assert len(errors) == 1 and "[1]" in errors[0]
