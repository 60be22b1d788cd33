"""MCP servers as tools of a bundle (`runtime.tools.mcp`, `runtime.bundle.mcp`), against real servers: the
reference `mcp-server-time` and `mcp-server-git` from PyPI, each in its own environment, and a counting server
of ours. Loading a bundle lists the server's tools; the chosen ones get the bundle's names and closed schemas;
a call's result is a value."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from mcp_helpers import PYTHON, calls, counter_server, real_server

from runtime.bundle import BundleError, load_bundle
from runtime.tools.mcp import McpTool
from runtime.ui.agent import tool_view
from runtime.validate import validate

pytestmark = pytest.mark.anyio

SUBMIT = '''\
"""Finish the task with its answer."""
from grail import Input

answer: str = Input("answer", description="the final answer")

{"answer": answer}
'''


def write(root: Path, mcp: str, name: str = "clock") -> Path:
    (root / "tools").mkdir(parents=True, exist_ok=True)
    (root / "tools" / "submit.pym").write_text(SUBMIT)
    path = root / "bundle.yaml"
    path.write_text(f"name: {name}\nsystem_prompt: You tell the time.\n"
                    "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1', name: scripted}\n"
                    "tools: [tools/submit.pym]\ntermination: {terminal_tool: submit}\n" + mcp)
    return path


def time_server(allow: str = "[get_current_time]", more: str = "") -> str:
    exe = real_server("time")
    return (f"mcp:\n  time:\n    command: {exe}\n    args: [--local-timezone, UTC]\n    allow: {allow}\n"
            + more)


async def test_a_real_servers_tools_are_the_bundles_named_closed_and_callable(tmp_path: Path) -> None:
    bundle = load_bundle(write(tmp_path, time_server()))
    assert sorted(bundle.tools) == ["submit", "time_get_current_time"]  # convert_time was not allowed
    tool = bundle.tools["time_get_current_time"]
    assert isinstance(tool, McpTool) and tool.remote == "get_current_time" and tool.repeatable  # readOnlyHint
    params = tool.schema.parameters
    assert params["additionalProperties"] is False and params["required"] == ["timezone"]
    assert "title" not in params and "title" not in params["properties"]["timezone"]
    assert validate({"timezone": "UTC", "extra": 1}, params)  # an invented argument is refused
    schema_names = [s.name for s in bundle.kernel_config().tools]
    assert "time_get_current_time" in schema_names  # offered to the model, like any tool
    view = tool_view("time_get_current_time", tool, bundle)  # as the inspector shows it
    assert (view["kind"], view["server"], view["remote"], view["effect"]) == (
        "mcp", "time", "get_current_time", "repeatable")
    assert view["output_schema"]["properties"]["timezone"]["type"] == "string"  # the server's outputSchema
    result = await tool.execute({"timezone": "Europe/Paris"})
    assert result.error is None and isinstance(result.output, dict), result
    assert result.output["timezone"] == "Europe/Paris" and "datetime" in result.output  # structuredContent
    failed = await tool.execute({"timezone": "Nowhere/Atlantis"})
    assert failed.error is not None and failed.error.kind == "external", failed
    assert "Nowhere/Atlantis" in failed.error.message  # the server's own text, for the model
    wrong = await tool.execute({"zone": "UTC"})
    assert wrong.error is not None and wrong.error.kind == "input"  # checked before the server is asked


async def test_the_tool_list_is_pinned_into_the_tool_version_and_the_bundle_digest(tmp_path: Path) -> None:
    one = load_bundle(write(tmp_path / "a", time_server()))
    both = load_bundle(write(tmp_path / "b", time_server("[get_current_time, convert_time]")))
    again = load_bundle(write(tmp_path / "c", time_server()))
    name = "time_get_current_time"
    assert one.tools[name].content_hash == again.tools[name].content_hash == both.tools[name].content_hash
    assert one.digest == again.digest != both.digest
    changed = McpTool(one.tools[name].server, {**one.tools[name].listed, "description": "Another text."},  # type: ignore[union-attr]
                      name=name)
    assert changed.content_hash != one.tools[name].content_hash  # a server that changed is a new version


def test_a_missing_server_is_a_bundle_error_naming_it(tmp_path: Path) -> None:
    path = write(tmp_path, "mcp:\n  ghost:\n    command: no-such-mcp-server-here\n")
    with pytest.raises(BundleError) as e:
        load_bundle(path)
    text = str(e.value)
    assert "mcp.ghost" in text and "MCP server 'ghost'" in text, text
    assert "'no-such-mcp-server-here' was not found" in text, text


def test_a_server_that_exits_at_start_is_a_bundle_error_saying_so(tmp_path: Path) -> None:
    path = write(tmp_path, f"mcp:\n  broken:\n    command: {PYTHON}\n    args: [-c, 'raise SystemExit(2)']\n"
                           "    connect_timeout: 20s\n")
    with pytest.raises(BundleError) as e:
        load_bundle(path)
    assert "MCP server 'broken'" in str(e.value) and "cannot be reached" in str(e.value), str(e.value)


def test_bad_choices_are_problems_listing_what_the_server_has(tmp_path: Path) -> None:
    path = write(tmp_path, time_server("[get_current_time, get_weather]", "    prefix: ''\n"
                                       "    rename: {convert_time: submit}\n"
                                       "    deny: [convert_time]\n"))
    with pytest.raises(BundleError) as e:
        load_bundle(path)
    text = str(e.value)
    assert "mcp.time.allow" in text and "has no tool 'get_weather' (it has: convert_time, get_current_time)" \
        in text, text
    collide = write(tmp_path / "c", time_server("[convert_time]", "    rename: {convert_time: submit}\n"))
    with pytest.raises(BundleError) as e:
        load_bundle(collide)
    assert "two tools are named 'submit'" in str(e.value), str(e.value)


def test_env_references_are_resolved_on_connect_and_never_stored(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    script, count = counter_server(tmp_path)
    mcp = (f"mcp:\n  counter:\n    command: {PYTHON}\n    args: [{script}]\n"
           "    env: {COUNT_FILE: '${SA_TEST_COUNT_FILE}'}\n")
    path = write(tmp_path / "b", mcp)
    monkeypatch.delenv("SA_TEST_COUNT_FILE", raising=False)
    with pytest.raises(BundleError) as e:
        load_bundle(path)
    assert "${SA_TEST_COUNT_FILE}, which is not set" in str(e.value), str(e.value)
    monkeypatch.setenv("SA_TEST_COUNT_FILE", str(count))
    bundle = load_bundle(path)
    assert {"counter_bump", "counter_peek", "counter_refuse"} <= set(bundle.tools)
    tool = bundle.tools["counter_bump"]
    assert isinstance(tool, McpTool) and not tool.repeatable  # no hints: a call may not be repeated
    assert tool.server.env == (("COUNT_FILE", "${SA_TEST_COUNT_FILE}"),)  # the reference, not the value
    assert str(count) not in repr(tool.listed) and calls(count) == []  # listing is no call


async def test_a_real_git_server_answers_about_a_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "hello.txt").write_text("hi\n")
    exe = real_server("git")
    bundle = load_bundle(write(tmp_path / "b", f"mcp:\n  git:\n    command: {exe}\n"
                                              f"    args: [--repository, {repo}]\n    allow: [git_status]\n"))
    tool = bundle.tools["git_git_status"]
    result = await tool.execute({"repo_path": str(repo)})
    assert result.error is None, result
    assert "hello.txt" in str(result.output)  # the untracked file, as git itself reports it


def test_sa_tools_lists_a_bundles_mcp_tools_and_sa_check_names_a_missing_server(tmp_path: Path) -> None:
    from tests.cli.test_cli_tools import sa

    script, count = counter_server(tmp_path)
    counter = (f"  counter:\n    command: {PYTHON}\n    args: [{script}]\n"
               f"    env: {{COUNT_FILE: '{count}'}}\n    allow: [bump, peek]\n    in_doubt: ask\n")
    path = write(tmp_path / "ok", time_server("[get_current_time, convert_time]", counter))
    listed = sa("tools", str(path), "--json")
    assert listed.returncode == 0, listed.stderr
    tools = {t["name"]: t for t in json.loads(listed.stdout)["bundles"][0]["tools"]}
    assert (tools["counter_bump"]["effect"], tools["counter_bump"]["in_doubt"]) == ("once", "ask")
    assert (tools["counter_peek"]["effect"], tools["counter_peek"]["in_doubt"]) == ("repeatable", None)
    assert tools["time_convert_time"]["kind"] == "mcp" and tools["time_convert_time"]["server"] == "time"
    assert tools["time_get_current_time"]["effect"] == "repeatable"  # the server's readOnlyHint
    assert tools["submit"]["kind"] == "script"
    assert tools["time_get_current_time"]["parameters"]["additionalProperties"] is False
    missing = write(tmp_path / "bad", "mcp:\n  ghost:\n    command: no-such-mcp-server-here\n")
    checked = sa("check", str(missing))
    assert checked.returncode == 1
    assert "mcp.ghost: MCP server 'ghost' (no-such-mcp-server-here) cannot be reached: the command " \
           "'no-such-mcp-server-here' was not found" in checked.stdout, checked.stdout


async def test_a_streamable_http_server_gets_its_headers_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    import anyio

    script, count = counter_server(tmp_path)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "COUNT_FILE": str(count), "MCP_PORT": str(port)}
    server = subprocess.Popen([PYTHON, str(script)], env=env, stderr=subprocess.DEVNULL)
    try:
        with anyio.fail_after(30):
            while True:  # until it listens
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    await anyio.sleep(0.1)
        monkeypatch.setenv("SA_TEST_TOKEN", "s3cret-value")
        path = write(tmp_path / "b", f"mcp:\n  remote:\n    url: http://127.0.0.1:{port}/mcp\n"
                                     "    headers: {X-Token: '${SA_TEST_TOKEN}'}\n    allow: [token, bump]\n")
        bundle = load_bundle(path)
        assert "s3cret-value" not in path.read_text() + repr(bundle.tools["remote_token"])
        got = await bundle.tools["remote_token"].execute({})
        assert got.error is None and got.output == {"result": "s3cret-value"}, got  # sent, never stored
        bumped = await bundle.tools["remote_bump"].execute({"note": "over http"})
        assert bumped.output == {"count": 2, "note": "over http"}, bumped
    finally:
        server.terminate()
        server.wait(10)


def test_a_host_leaves_out_a_bundle_whose_server_cannot_be_reached_and_serves_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from runtime.host import load_agents

    good = write(tmp_path / "good", "", name="good")
    ghost = write(tmp_path / "ghost", "mcp:\n  ghost:\n    command: no-such-mcp-server-here\n", name="ghost")
    with caplog.at_level("ERROR", logger="runtime.host"):
        agents = load_agents([good, ghost])
    assert list(agents) == ["good"]
    assert "MCP server 'ghost'" in caplog.text and "was not found" in caplog.text, caplog.text
    with pytest.raises(BundleError, match="MCP server 'ghost'"):
        load_agents([ghost])  # nothing left to serve: the error itself
    broken = write(tmp_path / "broken", "mcp:\n  ghost:\n    command: no-such-mcp-server-here\n"
                                        "bogus_key: 1\n", name="broken")
    with pytest.raises(BundleError):
        load_agents([good, broken])  # another problem beside it: refused as every bad bundle is


async def test_a_result_bigger_than_max_result_is_a_limit_failure(tmp_path: Path) -> None:
    script, count = counter_server(tmp_path)
    path = write(tmp_path / "b", f"mcp:\n  counter:\n    command: {PYTHON}\n    args: [{script}]\n"
                                 f"    env: {{COUNT_FILE: '{count}'}}\n    allow: [bump]\n"
                                 "    max_result: 30b\n")
    bump = load_bundle(path).tools["counter_bump"]
    small = await bump.execute({"note": "ok"})
    big = await bump.execute({"note": "a note longer than thirty bytes in all"})
    assert small.error is None and small.output == {"count": 1, "note": "ok"}, small
    assert big.error is not None and (big.error.kind, big.error.detail) == ("limit", "output"), big
    assert "more than the server's max_result of 30 bytes" in big.error.message
    bad = write(tmp_path / "c", f"mcp:\n  counter:\n    command: {PYTHON}\n    args: [{script}]\n"
                                "    max_result: lots\n")
    with pytest.raises(BundleError, match=r"mcp\.counter\.max_result"):
        load_bundle(bad)


def test_a_server_listing_an_invalid_input_schema_is_a_bundle_error_naming_the_tool(tmp_path: Path) -> None:
    from mcp_helpers import garbage_server

    path = write(tmp_path, f"mcp:\n  junk:\n    command: {PYTHON}\n    args: [{garbage_server(tmp_path)}]\n"
                           "    env: {BAD_SCHEMA: '1'}\n")
    with pytest.raises(BundleError) as e:
        load_bundle(path)
    assert "junk's tool 'weird' lists an input schema" in str(e.value), str(e.value)
    assert "'bogus' is not a JSON type" in str(e.value)
