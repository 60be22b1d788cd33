"""Shared test configuration. anyio's own pytest plugin runs async tests (pytest-anyio on PyPI is empty)."""

import asyncio
import signal
import sys
import threading
from types import FrameType
from typing import Any, TextIO

import pytest
import pytest_timeout


@pytest.fixture
def anyio_backend() -> str:
    # nats-py uses asyncio primitives directly, so only the asyncio backend is meaningful here.
    return "asyncio"


@pytest.fixture(autouse=True)
def _servers_asked_again() -> None:
    """`model.server: auto` remembers per URL which server answered; the ports tests' servers get are
    reused, so a URL asked about in one test may be another kind of server in the next."""
    from runtime.model import detect

    detect.forget()


# Real nats-server fixtures (`nats_server`, `nc`, `js`) for the runtime's integration tests.
pytest_plugins = ["nats_fixtures"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="also run the large fault-injection soak (tests marked `soak`)")
    parser.addoption("--live-servers", action="store_true", default=False,
                     help="run only the checks against live model servers other than vLLM (tests marked "
                          "`live_server`; `make llamacpp` runs them), which `make test` leaves out")
    parser.addoption("--fault-beds", action="store_true", default=False,
                     help="run only the fault beds (tests marked `fault_bed`: kills, pauses, partitions and "
                          "power loss on real clusters: `make faults`), which `make test` leaves out")
    parser.addoption("--fault-seed", type=int, default=None,
                     help="seed of the fault-injection schedule (default: random; every run prints its seed)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    live, beds = config.getoption("--live-servers"), config.getoption("--fault-beds")
    # separate runs: live servers (their own environment, minutes of CPU model time), and the fault beds
    # (minutes of whole clusters killed, paused, cut off and powered down), so `make test` stays short
    keep = [item for item in items
            if ("live_server" in item.keywords) == live and ("fault_bed" in item.keywords) == beds]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
    if config.getoption("--soak"):
        return
    skip = pytest.mark.skip(reason="a soak: run with --soak")
    for item in items:
        if "soak" in item.keywords:
            item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> bool | None:
    """pytest-timeout's signal method, plus every asyncio task's stack when it fires, and a watchdog.

    The default report of a hung async test is the event loop's `epoll` call, which says nothing about what
    was awaited; the stacks of the loop's tasks (written to the test's captured stderr, shown with its
    failure) name the await that never returned. A signal is only handled between bytecodes, so a loop
    blocked inside a call into native code would never see it: if the test is still running
    `WATCHDOG_GRACE_S` later, pytest-timeout's thread method prints every thread's stack and ends the
    session (CI fails at once, saying where, instead of at its own limit).
    """
    if settings.method != "signal" or threading.current_thread() is not threading.main_thread():
        return None  # pytest-timeout's own thread method

    def on_timeout(signum: int, frame: FrameType | None) -> None:
        _print_tasks(sys.stderr)
        pytest.fail(f"Timeout (>{settings.timeout:.0f}s) from pytest-timeout: the awaits of every task "
                    f"still running are in this test's captured stderr", pytrace=True)

    watchdog = threading.Timer(settings.timeout + WATCHDOG_GRACE_S, pytest_timeout.timeout_timer,
                               (item, settings))
    watchdog.daemon = True
    watchdog.name = f"timeout watchdog {item.nodeid}"

    def cancel() -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, signal.SIG_DFL)
        watchdog.cancel()

    item.cancel_timeout = cancel  # type: ignore[attr-defined]  # what pytest-timeout's cancel hook calls
    signal.signal(signal.SIGALRM, on_timeout)
    signal.setitimer(signal.ITIMER_REAL, settings.timeout)
    watchdog.start()
    return True


WATCHDOG_GRACE_S = 120.0


def _print_tasks(out: TextIO) -> None:
    try:
        tasks = asyncio.all_tasks()
    except RuntimeError:  # no loop running: the hang is in synchronous code, its frame is in the report
        return
    print(f"--- {len(tasks)} asyncio tasks at the timeout, each from its coroutine to its await ---",
          file=out)
    for task in tasks:
        print(f"{task.get_name()}:", file=out)
        awaited: Any = task.get_coro()
        while awaited is not None:  # Task.print_stack stops at the task's own coroutine; follow the awaits
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                print(f"  {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}", file=out)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
