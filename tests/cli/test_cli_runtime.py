"""The runtime CLI end to end in real processes: `sa host` and `sa worker` on a real nats-server, then
`sa send --follow`, `sa runs`, `sa replay --verify`, and the exit codes for failure and bad usage; what a
new user meets first: `sa send` before any host, `sa up` on a folder of bundles and its start-up lines,
and the help text."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from host_helpers import calc_responder, write_bundle

from runtime import nats as bus
from runtime.nats.server import EmbeddedNats
from runtime.nats.subjects import TASKS
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

    waiting = sa("send", "nosuchagent", "hello", url=url)  # stored, and waits for a host that serves it
    assert waiting.returncode == 0 and waiting.stdout.startswith("run r")
    assert "no live host serves agent 'nosuchagent'" in waiting.stderr and "calc" in waiting.stderr

    missing = sa("replay", "rdoesnotexist", url=url)
    assert missing.returncode == 2 and "no events" in missing.stderr


def test_commands_without_a_server_say_what_to_do():
    out = sa("send", "calc", "hi", url=None)
    assert out.returncode == 2 and "sa up" in out.stderr and "NATS_URL" in out.stderr


# ---------------------------------------------------------------------------------------------------------
# what a new user hits first
# ---------------------------------------------------------------------------------------------------------


async def _streams(url: str) -> list[str]:
    nc = await bus.connect(url, name="test-streams")
    try:
        return sorted(info.config.name for info in await nc.jetstream().streams_info())
    finally:
        await nc.close()


async def _make_topology(url: str) -> None:
    nc = await bus.connect(url, name="test-topology")
    try:
        await bus.ensure_topology(nc.jetstream(), partitions=4)
    finally:
        await nc.close()


async def _tasks_stored(url: str) -> int:
    nc = await bus.connect(url, name="test-tasks")
    try:
        return (await nc.jetstream().stream_info(TASKS)).state.messages
    finally:
        await nc.close()


def test_send_before_any_host_exits_1_creates_nothing_and_wait_sends_once_a_host_made_the_streams():
    import anyio

    from runtime.commands import run_id_for

    server = bus.EmbeddedNats().start()  # a server of its own: no streams at all
    try:
        refused = sa("send", "calc", "compute: 1 + 1", url=server.url)
        assert refused.returncode == 1, refused.stderr
        assert "no host has created the TASKS stream yet: start `sa host` or `sa up`" in refused.stderr
        assert "Traceback" not in refused.stderr and refused.stdout == ""  # no run id: nothing was sent
        assert anyio.run(_streams, server.url) == []  # and nothing was created

        env = {k: v for k, v in os.environ.items() if k != "NATS_URL"}
        env.update(XDG_DATA_HOME="/nonexistent-sa-test", NATS_URL=server.url)
        argv = [*CLI, "send", "calc", "compute: 2 + 2", "--task-id", "w-1", "--wait", "120"]
        waiting = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert waiting.stderr is not None
            first = waiting.stderr.readline()  # it found no stream and says it waits
            assert "waiting up to 120 s" in first, first
            assert anyio.run(_streams, server.url) == []
            anyio.run(_make_topology, server.url)  # what a starting host does
            out, err = waiting.communicate(timeout=60)
        finally:
            if waiting.poll() is None:
                waiting.kill()
        assert waiting.returncode == 0, err
        assert out.split() == ["run", run_id_for("calc", "w-1")]
        assert anyio.run(_tasks_stored, server.url) == 1
    finally:
        server.stop()


def test_up_serves_a_folder_of_bundles_and_prints_one_line_per_process(tmp_path: Path):
    folder = tmp_path / "bundles"
    server = bus.EmbeddedNats().start()
    with ScriptedModelServer(responder=calc_responder) as model:
        for name in ("calc", "other"):
            write_bundle(folder, name, base_url=model.base_url)
        env = {**os.environ, "NATS_URL": server.url, "XDG_DATA_HOME": str(tmp_path / "data")}
        log = tmp_path / "up.log"
        up = subprocess.Popen([*CLI, "up", str(folder), "--workers", "1"], env=env, stdout=open(log, "wb"),
                              stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 90
            while "ready:" not in log.read_text():
                assert up.poll() is None and time.monotonic() < deadline, log.read_text()
                time.sleep(0.05)
            sent = sa("send", "other", "compute: 2 + 3", "--follow", url=server.url)  # the second bundle
            assert sent.returncode == 0, sent.stdout + sent.stderr
            assert "run.completed" in sent.stdout
        finally:
            up.send_signal(signal.SIGINT)
            up.wait(30)
            server.stop()
    text = log.read_text()
    start = text[:text.index("ready:")].splitlines()
    assert "acquired partition" not in text and "released partition" not in text, text
    assert [line.split()[0] for line in start if not line.startswith("sa worker")] == \
        ["nats", "workers", "state", "host"], text
    assert sum(line.startswith("sa worker") for line in start) == 1  # the worker process's own line
    (host_line,) = (line for line in start if line.startswith("host"))
    assert "agents.calc.tasks, agents.other.tasks" in host_line and "partitions 0-15 (16 of 16)" in host_line
    assert up.returncode == 0 and text.rstrip().endswith("stopped")


def test_up_names_a_folder_that_holds_no_bundle(tmp_path: Path):
    (tmp_path / "empty" / "notes").mkdir(parents=True)
    out = sa("up", str(tmp_path / "empty"), url="nats://127.0.0.1:9")
    assert out.returncode == 2
    assert "no bundle.yaml" in out.stderr and str(tmp_path / "empty") in out.stderr
    assert "cannot read the bundle" not in out.stderr


def test_bundle_arguments_expand_a_folder_of_bundle_folders(tmp_path: Path):
    from runtime.cli.where import expand_bundles

    for name in ("b", "a"):
        write_bundle(tmp_path / "many", name)
    (tmp_path / "many" / "README").write_text("not a bundle")
    (tmp_path / "many" / "drafts").mkdir()  # a subfolder without bundle.yaml is skipped
    one = write_bundle(tmp_path, "single")
    assert expand_bundles([tmp_path / "many"]) == [tmp_path / "many" / "a", tmp_path / "many" / "b"]
    assert expand_bundles([one, one.parent]) == [one, one.parent]  # a bundle or its folder: as given
    assert expand_bundles([tmp_path / "missing"]) == [tmp_path / "missing"]  # loading it says why
    repo = Path(__file__).parents[2]
    shipped = [repo / "bundles" / n for n in ("demo", "judge", "researcher", "shop")]
    assert expand_bundles([repo / "bundles"]) == shipped


def _command_paths(cmd, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    yield path
    for name, sub in getattr(cmd, "commands", {}).items():
        yield from _command_paths(sub, (*path, name))


def test_help_renders_plainly():
    import typer
    from typer.testing import CliRunner

    from runtime.cli import app

    runner = CliRunner()
    paths = list(_command_paths(typer.main.get_command(app)))
    assert ("send",) in paths and ("dlq", "replay") in paths and ("model", "serve") in paths
    for path in paths:
        shown = runner.invoke(app, [*path, "--help"], terminal_width=100)
        assert shown.exit_code == 0, (path, shown.output)
        text = shown.output
        assert "<bool>" not in text, (path, text)  # a flag takes no value
        assert not set(text) & set("╭╮╰╯│─"), (path, text)  # no boxes
        (help_line,) = (line.split() for line in text.splitlines() if line.split()[:1] == ["--help"])
        assert help_line == ["--help", "Show", "this", "message", "and", "exit."], (path, text)
    send = runner.invoke(app, ["send", "--help"], terminal_width=100).output
    follow = next(line for line in send.splitlines() if line.split()[:2] == ["-f,", "--follow"])
    assert "Stream the run's events" in follow  # the flag and its help on one line, no value type
    real = subprocess.run([*CLI, "--help"], capture_output=True, text=True, timeout=60)
    assert real.returncode == 0 and real.stdout.startswith("Usage: sa ") and "<bool>" not in real.stdout
    assert "  up " in real.stdout and "  send " in real.stdout
