"""Where `sa send` reads a task from, and a task too big for one NATS message.

`sa send AGENT --file F` (and `-` for standard input) once did not exist (`-` was sent as the text "-"),
and a 5 MB task died with nats-py's raw MaxPayloadError. Now the text comes from the file or the pipe,
and an input over the payload threshold is stored in the payload object store with the task carrying a
reference the host reads back: the run starts with the whole input, which the model receives."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import anyio
import pytest
from host_helpers import running_host, running_worker, write_bundle

from runtime import events as ev
from runtime import nats as bus
from runtime.client import Client
from runtime.testing import ScriptedModelServer, hermes_call, last_message
from testbed.fleet import CLI

pytestmark = pytest.mark.anyio


def measuring_model(body: dict[str, Any]) -> str:
    """Submits how long the task it was given is, and how it ends."""
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    if "<tool_response>" in last_message(body):
        return "done"
    return hermes_call("submit", {"answer": f"{len(task)} chars ending {task[-12:]!r}"})


@pytest.fixture
async def topo(js):
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    return js


async def sa(url: str, *args: str, stdin: bytes | None = None) -> tuple[int, str, str]:
    env = {**os.environ, "NATS_URL": url, "XDG_DATA_HOME": "/nonexistent-sa"}
    proc = await anyio.run_process([*CLI, *args], input=stdin, env=env, check=False)
    return proc.returncode, proc.stdout.decode(), proc.stderr.decode()


async def test_a_task_from_a_file_or_stdin_and_one_bigger_than_a_message(nats_server, topo, tmp_path: Path):
    url = nats_server.url
    big = ("lorem ipsum " * 500_000)[:5_000_000] + "[THE END]"  # 5 MB: five times NATS's max_payload
    (tmp_path / "big.txt").write_text(big)
    (tmp_path / "small.txt").write_text("from a file\n")
    bundle = write_bundle(tmp_path, "calc", tools=())
    with ScriptedModelServer(responder=measuring_model) as model:
        async with running_host(url, [bundle], model), running_worker(url, [bundle]):
            from_big = await sa(url, "send", "calc", "--file", str(tmp_path / "big.txt"), "--follow",
                                "--json")
            from_file = await sa(url, "send", "calc", "--file", str(tmp_path / "small.txt"), "--json")
            from_stdin = await sa(url, "send", "calc", "-", "--json", stdin=b"from a pipe")
            from_stdin_file = await sa(url, "send", "calc", "--file", "-", "--json", stdin=b"piped too")
            async with await Client.connect(url) as client:
                runs = [client.get(json.loads(r[1].splitlines()[0])["run_id"])
                        for r in (from_big, from_file, from_stdin, from_stdin_file)]
                outputs = [await h.result(timeout=60) for h in runs]
                started = [(await h.replay())[0] for h in runs]
    for code, out, err in (from_big, from_file, from_stdin, from_stdin_file):
        assert code == 0 and "Traceback" not in err, (out[-500:], err)
    assert [s.input for s in started if isinstance(s, ev.RunStarted)] == [
        big, "from a file\n", "from a pipe", "piped too"]
    assert outputs[0] == {"answer": f"{len(big)} chars ending {big[-12:]!r}"}  # the model got all of it
    assert json.loads(from_big[1].splitlines()[-1])["kind"] == "run.completed"


async def test_no_task_text_or_two_of_them_is_bad_usage(nats_server, topo, tmp_path: Path):
    (tmp_path / "t.txt").write_text("x")
    (tmp_path / "binary").write_bytes(b"\xff\xfe\x00")
    (tmp_path / "nul.txt").write_bytes(b"text\x00cut here")  # UTF-8, but NUL is not text
    for args, says in ((["send", "calc"], "give the task as text"),
                       (["send", "calc", "text", "--file", str(tmp_path / "t.txt")], "one of them"),
                       (["send", "calc", "--file", str(tmp_path / "missing.txt")], "cannot read the task"),
                       (["send", "calc", "--file", str(tmp_path / "binary")], "not UTF-8 text"),
                       (["send", "calc", "--file", str(tmp_path / "nul.txt")], "NUL character (0x00) at "
                                                                               "character 4"),
                       (["send", "calc", "-"], "the task is empty")):
        code, out, err = await sa(nats_server.url, *args, stdin=b"")
        assert code == 2 and says in err and out == "", (args, err)
