"""A fleet of real `sa` processes and the scripted model that drives it: what the fault-injection suite
(tests/system/test_faults.py) and the reliability benchmark (bench/faults.py) both run, so the two measure the
same thing.

    model = StepModel()                                 # responder for ScriptedModelServer
    task = step_task(i, steps=3, spin=20_000, delay_ms=150)
    host = SaProcess("host0", ["host", bundle], url, log, ready="sa host: serving")
    host.start(); host.wait_ready(); ...; host.kill9(); host.start(); host.wait_ready(); host.stop()

A `step_task` run makes `steps` calls of the `step` tool (`testbed.scripts.APPEND_LINE`, one
workspace write each), then calls `submit`; every model request is recorded with its arrival time, the
run's index and how many steps it had done, so a test can tell a repeated request for a recorded step.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.testing import Reply, hermes_call

ROOT = Path(__file__).resolve().parent.parent

CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]
_TASK = re.compile(r"fault (\d+) steps (\d+) spin (\d+) delay (\d+)")


def step_task(index: int, *, steps: int, spin: int, delay_ms: int) -> str:
    """The task text `StepModel` answers: run `index`, `steps` step calls, each reply `delay_ms` late."""
    return f"fault {index} steps {steps} spin {spin} delay {delay_ms}"


@dataclass
class StepModel:
    """Replies keyed on the conversation (safe for many runs at once); every request recorded."""

    requests: list[tuple[float, int, int]] = field(default_factory=list)  # (arrival, run index, step)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, body: dict[str, Any]) -> Reply:
        task = next(m["content"] for m in body["messages"] if m["role"] == "user")
        match = _TASK.search(task)
        if match is None:
            raise ValueError(f"not a step task: {task!r} (make it with step_task)")
        i, steps, spin, delay_ms = (int(x) for x in match.groups())
        done = sum("<tool_response>" in str(m.get("content")) for m in body["messages"])
        with self.lock:
            self.requests.append((time.time(), i, done))
        if done < steps:
            text = hermes_call("step", {"file": f"r{i}.txt", "line": f"{i}:{done}", "spin": spin})
        else:
            text = hermes_call("submit", {"answer": f"{i} wrote {done}"})
        return Reply.of_text(text, delay=delay_ms / 1000)


class SaProcess:
    """A restartable `sa` process with one log file across its lives."""

    def __init__(self, name: str, args: list[str], url: str, log: Path, ready: str,
                 prefix: list[str] | None = None) -> None:
        self.name, self.args, self.url, self.log, self.ready = name, args, url, log, ready
        self.prefix = prefix or []  # e.g. `ip netns exec NS`: run it on a machine of `testbed.netns`
        self.proc: subprocess.Popen[bytes] | None = None
        self.lives = 0
        self.id = ""  # a host's lease id, from its ready line

    def start(self) -> None:
        self.lives += 1
        with open(self.log, "a") as f:
            f.write(f"=== life {self.lives} ===\n")
        out = open(self.log, "ab")  # the child keeps its own copy of the descriptor
        # one log record per line (rich wraps at 80 columns off a terminal): a run id can be grepped for
        env = {**os.environ, "NATS_URL": self.url, "SA_SANDBOX_WORKERS": "1", "COLUMNS": "400"}
        self.proc = subprocess.Popen([*self.prefix, *CLI, *self.args], env=env, stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Block until this life printed its ready line; a process that exits first is an error."""
        deadline = time.monotonic() + timeout
        while True:
            text = self.log.read_text(errors="replace")
            life = text.rsplit(f"=== life {self.lives} ===", 1)[-1]
            if self.ready in life:
                m = re.search(r" as (\S+);", life)
                self.id = m.group(1) if m else ""
                return
            if self.proc is None or self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} did not start:\n{life[-3000:]}")
            time.sleep(0.05)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_all(procs: list[SaProcess], timeout: float = 90.0) -> None:
    """Start every process at once, then wait for each one's ready line (blocking: from async code, run it
    in a thread)."""
    for p in procs:
        p.start()
    for p in procs:
        p.wait_ready(timeout)




def scripted_server_process(tmp: Path, module: str, path: Path) -> tuple[subprocess.Popen[bytes], str]:
    """`runtime.testing.ScriptedModelServer` answering with `module.responder` (a module found in `path`),
    in a process of its own so the process measuring is charged none of its CPU; returns the process and
    the server's base URL (its caller stops the process)."""
    ready = tmp / "model.url"
    paths = f"sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(path)!r})"
    code = (f"import sys, time; {paths}\n"
            f"from {module} import responder\nfrom runtime.testing import ScriptedModelServer\n"
            "s = ScriptedModelServer(responder=responder, record=False).start()\n"
            f"open({str(ready)!r}, 'w').write(s.base_url)\ntime.sleep(10**6)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL)
    while not ready.exists() or not ready.read_text():
        if proc.poll() is not None:
            raise RuntimeError("the scripted model server did not start")
        time.sleep(0.05)
    return proc, ready.read_text()


__all__ = ["CLI", "SaProcess", "StepModel", "scripted_server_process", "start_all", "step_task"]
