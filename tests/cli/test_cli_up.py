"""One live `sa up` per store, and one way for every command to find it.

A second `sa up` on one machine once started a second nats-server on the first one's store, overwrote the
state file without a word, and deleted it when it stopped, so the first one (still running) could no longer
be found; `sa worker` ignored the state file while `sa host` beside it used it. Here: the store claim is a
real lock (two processes racing for it: one wins), the state file stays its writer's, commands say which
`sa up` they use (on stderr) and ignore a stale one with a note, and real `sa up`s on one store and on two.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from host_helpers import write_bundle

from runtime import running
from runtime.nats.server import EmbeddedNats

CLI = [sys.executable, "-c", "from runtime.cli import main; main()"]
DEAD_PID = 2**22 + 12345  # above Linux's pid_max default: no process has it


def _env(data: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
    env["XDG_DATA_HOME"] = str(data)
    return env


def _wait_for(log: Path, text: str, proc: subprocess.Popen[bytes], limit: float = 90) -> str:
    deadline = time.monotonic() + limit
    while text not in log.read_text():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return log.read_text()


CLAIMER = """
import json, sys
from pathlib import Path
from runtime.running import StoreTaken, claim_store, new_state
try:
    claim = claim_store(Path(sys.argv[1]), new_state(nats_url="nats://claimer"))
    print("won", flush=True)
except StoreTaken as e:
    print("lost", json.dumps(e.holder), flush=True)
sys.stdin.read()  # hold the claim until the test closes stdin
"""


def test_two_processes_racing_for_one_store_cannot_both_win(tmp_path: Path):
    store = tmp_path / "store"
    procs = [subprocess.Popen([sys.executable, "-c", CLAIMER, str(store)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        said = {p.pid: p.stdout.readline().split(" ", 1) for p in procs}  # type: ignore[union-attr]
    finally:
        for p in procs:
            p.stdin.close()  # type: ignore[union-attr]
            p.wait(30)
    (winner,) = (pid for pid, words in said.items() if words[0].strip() == "won")
    (loser,) = (words for pid, words in said.items() if pid != winner)
    holder = json.loads(loser[1])
    assert holder["pid"] == winner and holder["nats_url"] == "nats://claimer"
    # both processes are gone: their claims went with them, so the store can be claimed again
    claim = running.claim_store(store, running.new_state())
    claim.release()


def test_a_store_claim_names_its_holder_and_ends_with_release(tmp_path: Path):
    first = running.claim_store(tmp_path, running.new_state(nats_url="nats://127.0.0.1:4999"))
    try:
        with pytest.raises(running.StoreTaken) as taken:
            running.claim_store(tmp_path, running.new_state())
        assert taken.value.holder["pid"] == os.getpid()
        assert "nats://127.0.0.1:4999" in str(taken.value) and str(tmp_path) in str(taken.value)
    finally:
        first.release()
    running.claim_store(tmp_path, running.new_state()).release()


def test_the_state_file_stays_its_writers_and_a_stale_one_is_ignored(monkeypatch, tmp_path: Path):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    monkeypatch.delenv("NATS_URL", raising=False)
    first = running.new_state(nats_url="nats://127.0.0.1:1111")
    second = running.new_state(nats_url="nats://127.0.0.1:2222")
    assert running.write_state(first) is None
    kept = running.write_state(second)  # a live sa up holds it: not overwritten
    assert kept is not None and kept["token"] == first["token"]
    assert not running.remove_state(second["token"])  # not the second one's to remove
    assert json.loads(running.state_file().read_text())["token"] == first["token"]

    notes: list[str] = []
    assert running.find_nats(note=notes.append) == "nats://127.0.0.1:1111"
    assert notes and notes[0].startswith("using the sa up started at ") and f"pid {os.getpid()}" in notes[0]
    assert "nats://127.0.0.1:1111" in notes[0]
    assert running.find_nats("nats://given:1") == "nats://given:1"  # a URL given comes first
    monkeypatch.setenv("NATS_URL", "nats://env:2")
    assert running.find_nats() == "nats://env:2"
    monkeypatch.delenv("NATS_URL")

    assert running.remove_state(first["token"]) and not running.state_file().exists()
    running.state_file().write_text(json.dumps({**first, "pid": DEAD_PID}))  # an sa up that was killed
    notes.clear()
    assert running.find_nats(note=notes.append) is None
    assert notes == [f"ignoring {running.state_file()}: the sa up that wrote it (pid {DEAD_PID}) is gone"]
    assert running.write_state(second) is None  # a stale file is no one's: overwritten


def test_every_command_finds_nats_through_the_state_file_the_same_way(nats_server: EmbeddedNats,
                                                                       tmp_path: Path):
    """`sa worker` once said "no NATS server" beside a running `sa up` while `sa host` found it."""
    import anyio

    from runtime import nats as bus

    async def topology() -> None:  # what the sa up's host made
        nc = await bus.connect(nats_server.url, name="test-topology")
        try:
            await bus.ensure_topology(nc.jetstream(), partitions=4)
        finally:
            await nc.close()

    anyio.run(topology)
    data = tmp_path / "data"
    (data / "structured-agents").mkdir(parents=True)
    state = running.new_state(nats_url=nats_server.url)
    state["pid"] = os.getpid()  # this test stands for the running sa up
    (data / "structured-agents" / "up.json").write_text(json.dumps(state))
    bundle = write_bundle(tmp_path, "calc")
    log = tmp_path / "worker.log"
    worker = subprocess.Popen([*CLI, "worker", "--bundle", str(bundle)], env=_env(data),
                              stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    try:
        text = _wait_for(log, "serving", worker)
    finally:
        worker.terminate()
        worker.wait(30)
    assert "sa worker: using the sa up started at " in text
    assert f"pid {os.getpid()}, {nats_server.url}" in text

    (data / "structured-agents" / "up.json").write_text(json.dumps({**state, "pid": DEAD_PID}))
    stale = subprocess.run([*CLI, "send", "calc", "hi"], env=_env(data), capture_output=True, text=True,
                           timeout=60)
    assert stale.returncode == 2 and stale.stdout == ""
    assert f"the sa up that wrote it (pid {DEAD_PID}) is gone" in stale.stderr
    assert "no NATS server" in stale.stderr


def _up(bundle: Path, store: Path, data: Path, log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([*CLI, "up", str(bundle), "--store", str(store), "--workers", "0"],
                            env=_env(data), stdout=open(log, "wb"), stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    proc.wait(60)


def test_one_sa_up_per_store_and_the_state_file_stays_the_first_ones(tmp_path: Path):
    data, bundle = tmp_path / "data", write_bundle(tmp_path, "calc")
    state_path = data / "structured-agents" / "up.json"
    first = _up(bundle, tmp_path / "s1", data, tmp_path / "up1.log")
    try:
        _wait_for(tmp_path / "up1.log", "ready:", first)
        state = json.loads(state_path.read_text())
        assert state["pid"] == first.pid and state["store"] == str(tmp_path / "s1")

        refused = subprocess.run([*CLI, "up", str(bundle), "--store", str(tmp_path / "s1"), "--workers", "0"],
                                 env=_env(data), capture_output=True, text=True, timeout=60)
        assert refused.returncode == 1, refused.stderr
        for named in (f"pid {first.pid}", state["nats_url"], str(tmp_path / "s1"), "--store DIR"):
            assert named in refused.stderr, (named, refused.stderr)
        assert "ready:" not in refused.stderr
        assert json.loads(state_path.read_text()) == state  # untouched

        listed = subprocess.run([*CLI, "runs"], env=_env(data), capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "sa runs: using the sa up started at " in listed.stderr
        assert f"pid {first.pid}, {state['nats_url']}" in listed.stderr and "using" not in listed.stdout

        second = _up(bundle, tmp_path / "s2", data, tmp_path / "up2.log")
        try:
            text = _wait_for(tmp_path / "up2.log", "ready:", second)
        finally:
            _stop(second)
        assert "is kept for the sa up started at" in text and f"pid {first.pid}" in text
        assert second.returncode == 0
        assert json.loads(state_path.read_text()) == state  # the second one neither took it nor removed it
    finally:
        _stop(first)
    assert first.returncode == 0 and not state_path.exists()  # its own: removed
