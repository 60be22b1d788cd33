"""The npm reference file-system server (`@modelcontextprotocol/server-filesystem`, pinned, installed with npm
into `.venv-mcp/npm-filesystem` by `mcp_helpers.npm_server`) as a bundle's read-only tools, on a fleet: a
real nats-server, an in-process host and tool worker, the scripted model.

The bundle allows only the server's read tools: a run reads a file through it; its write tools are not the
agent's (a reply calling one is a parse error naming it: nothing is sent to any server, nothing written);
and a secret given to the server through `env:` as a `${NAME}` reference reaches the server process but
never an event, the replay, `sa tools` or the bundle's digest."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from control_helpers import sa
from host_helpers import SUBMIT, running_fleet
from mcp_helpers import npm_server

from runtime import events as ev
from runtime import nats as bus
from runtime.bundle import load_bundle
from runtime.commands import publish_task

pytestmark = pytest.mark.anyio

SECRET = "s3cr3t-fs-token-7d1e"  # a value no event may hold
READ_ONLY = ["read_text_file", "list_directory", "get_file_info", "search_files"]


def bundle(root: Path) -> tuple[Path, Path]:
    """A bundle whose agent reads the folder `files/` through the file-system server; and that folder."""
    files = root / "files"
    files.mkdir()
    (files / "note.txt").write_text("the meeting moved to Thursday\n")
    folder = root / "reader"
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    path = folder / "bundle.yaml"
    path.write_text(
        "name: reader\nsystem_prompt: You read files.\n"
        "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
        "tools: [tools/submit.pym]\ntermination: {terminal_tool: submit, max_turns: 4}\n"
        f"mcp:\n  fs:\n    command: {npm_server('filesystem')}\n    args: ['{files}']\n"
        "    env: {FS_TOKEN: '${SA_TEST_FS_SECRET}'}\n"
        f"    allow: {json.dumps(READ_ONLY)}\n")
    return path, files


def responder(body: dict[str, Any]) -> str:
    from runtime.testing import hermes_call, last_message

    last = last_message(body)
    if "<tool_response>" in last:
        return hermes_call("submit", {"answer": last[-300:]})
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    tool, _, arguments = task.partition(" ")
    return hermes_call(tool, json.loads(arguments))


def server_environments(command: Path) -> list[str]:
    """The environments of the running file-system server processes (as /proc shows them)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            if b"server-filesystem" in cmdline or str(command).encode() in cmdline:
                found.append(Path(f"/proc/{pid}/environ").read_bytes().decode(errors="replace"))
        except OSError:
            continue
    return found


async def test_the_npm_file_system_server_reads_a_file_its_write_tools_are_excluded_and_secrets_stay_out(
        nats_server, js, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SA_TEST_FS_SECRET", SECRET)
    await bus.ensure_topology(js)
    path, files = bundle(tmp_path)
    loaded = load_bundle(path)
    assert sorted(n for n in loaded.tools if n.startswith("fs_")) == sorted(f"fs_{n}" for n in READ_ONLY)
    monkeypatch.setenv("SA_TEST_FS_SECRET", "another-value")
    assert load_bundle(path).digest == loaded.digest  # the secret's value is in no version or digest
    monkeypatch.setenv("SA_TEST_FS_SECRET", SECRET)
    listed = await sa("nats://127.0.0.1:9", "tools", str(path), "--json")
    assert listed.code == 0, listed.err
    tools = {t["name"]: t for t in json.loads(listed.out)["bundles"][0]["tools"]}
    reader = tools["fs_read_text_file"]
    assert reader["server"] == "fs" and reader["effect"] == "repeatable"  # the server's readOnlyHint
    assert "fs_write_file" not in tools and "fs_edit_file" not in tools  # the allow list left them out
    assert SECRET not in listed.out

    note = files / "note.txt"
    async with running_fleet(nats_server.url, js, path, responder=responder) as env:
        read_id = await publish_task(js, "reader", f"fs_read_text_file {json.dumps({'path': str(note)})}")
        read = await env.wait_run(read_id)
        environments = server_environments(npm_server("filesystem"))  # while the worker's session is open
        write_id = await publish_task(
            js, "reader", f"fs_write_file {json.dumps({'path': str(files / 'new.txt'), 'content': 'x'})}")
        wrote = await env.wait_run(write_id)

    done = next(e for e in read if isinstance(e, ev.ToolCompleted) and e.tool == "fs_read_text_file")
    assert "the meeting moved to Thursday" in json.dumps(done.output)  # read through the real server
    assert isinstance(read[-1], ev.RunCompleted)
    replies = [e for e in wrote if isinstance(e, ev.ModelResponded)]
    assert replies and all(r.parse_error and "fs_write_file" in r.parse_error for r in replies), replies
    assert not [e for e in wrote if isinstance(e, ev.ToolCalled)]  # the model was told; nothing was sent
    assert isinstance(wrote[-1], ev.RunFailed)
    assert not (files / "new.txt").exists()  # nothing was written
    assert any(f"FS_TOKEN={SECRET}" in environ for environ in environments)  # the server got the secret ...
    for events in (read, wrote):  # ... and no event holds it
        assert not [e for e in events if SECRET in ev.to_json(e)]
    replayed = await sa(nats_server.url, "replay", read_id)
    assert replayed.code == 0, replayed.err
    assert "fs_read_text_file" in replayed.out and SECRET not in replayed.out
