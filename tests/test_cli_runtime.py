"""The runtime CLI end to end in real processes: `sa host` and `sa worker` on a real nats-server, then
`sa send --follow`, `sa runs`, `sa replay --verify`, and the exit codes for failure and bad usage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_helpers import calc_responder, write_bundle

from runtime.nats.server import EmbeddedNats
from runtime.testing import ScriptedModelServer

CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]


def sa(*args: str, url: str | None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    env["XDG_DATA_HOME"] = "/nonexistent-sa-test"  # never pick up a developer's running `sa up`
    if url:
        env["NATS_URL"] = url
    return subprocess.run([*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def services(nats_server: EmbeddedNats, tmp_path: Path) -> Iterator[str]:
    with ScriptedModelServer(responder=calc_responder) as server:
        bundle = write_bundle(tmp_path, base_url=server.base_url)
        env = {**os.environ, "NATS_URL": nats_server.url}
        procs, logs = [], []
        for i, args in enumerate((["host", str(bundle)], ["worker", "--bundle", str(bundle)])):
            log = tmp_path / f"p{i}.log"
            logs.append(log)
            procs.append(subprocess.Popen([*CLI, *args], env=env, stdout=open(log, "wb"),
                                          stderr=subprocess.STDOUT))
        try:
            for log, ready in zip(logs, ("sa host: serving", "serving"), strict=True):
                deadline = time.monotonic() + 60
                while ready not in log.read_text():
                    assert time.monotonic() < deadline, log.read_text()
                    time.sleep(0.05)
            yield nats_server.url
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(20)
        assert "stopped" in logs[0].read_text()  # SIGTERM stops the host cleanly


def test_send_follow_runs_and_replay_verify(services: str):
    url = services
    sent = sa("send", "calc", "compute: 6 * 7", "--follow", url=url)
    assert sent.returncode == 0, sent.stdout + sent.stderr
    run_id = sent.stdout.split()[1]
    assert run_id.startswith("r") and "completed" in sent.stdout and "tool.completed" in sent.stdout
    assert "calculator" in sent.stdout

    as_json = sa("send", "calc", "compute: 1 + 1", "--follow", "--json", url=url)
    lines = [json.loads(x) for x in as_json.stdout.splitlines()]
    assert as_json.returncode == 0 and lines[0]["run_id"] and lines[-1]["kind"] == "run.completed"
    assert lines[-1]["output"] == {"answer": "2"}

    listed = sa("runs", "calc", url=url)
    assert listed.returncode == 0 and run_id in listed.stdout and "completed" in listed.stdout
    listed_json = json.loads(sa("runs", "--json", url=url).stdout)
    assert {r["run_id"] for r in listed_json} >= {run_id, lines[0]["run_id"]}

    replayed = sa("replay", run_id, "--verify", url=url)
    assert replayed.returncode == 0, replayed.stdout + replayed.stderr
    assert "model.responded" in replayed.stdout and "script.completed" in replayed.stdout
    assert "verified: the kernel reproduces all" in replayed.stdout
    events = [json.loads(x) for x in sa("replay", run_id, "--json", url=url).stdout.splitlines()]
    assert events[0]["kind"] == "run.started" and events[-1]["kind"] == "run.completed"

    failed = sa("send", "nosuchagent", "hello", "--follow", url=url)
    assert failed.returncode == 1 and "unknown_agent" in failed.stdout

    missing = sa("replay", "rdoesnotexist", url=url)
    assert missing.returncode == 2 and "no events" in missing.stderr


def test_commands_without_a_server_say_what_to_do():
    out = sa("send", "calc", "hi", url=None)
    assert out.returncode == 2 and "sa up" in out.stderr and "NATS_URL" in out.stderr
