"""`sa tools`, `sa check`, `sa run` as real processes: exit codes, JSON, error kinds and lines."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
AGENTS = ROOT / "agents"


def sa(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", "from runtime.cli import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.fixture
def scripts(tmp_path: Path) -> Path:
    files = {
        "loop.pym": '"""Loop."""\nwhile True:\n    pass\n',
        "bomb.pym": '"""Bomb."""\nx = [0] * 50_000_000\nlen(x)\n',
        "deep.pym": '"""Deep."""\ndef f(n):\n    return f(n + 1)\n\nf(0)\n',
        "broken.pym": '"""Broken."""\nfrom grail import Input\nx: int = Input("x")\ny = (x +\n',
        "hostile.pym": '"""Hostile."""\nimport os\nopen("/etc/passwd").read()\n',
        "boom.pym": '"""Boom."""\nfrom grail import Input\nn: int = Input("n")\n\nresult = 10 // n\nresult\n',
        "envfile.pym": '"""Env and files."""\nimport os\n[os.getenv("MODE"), open("/data/in.txt").read()]\n',
    }
    for name, src in files.items():
        (tmp_path / name).write_text(src)
    return tmp_path


def test_tools_json_prints_the_schemas_of_the_shipped_agents():
    proc = sa("tools", str(AGENTS), "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["errors"] == []
    by_name = {t["function"]["name"]: t["function"] for t in data["tools"]}
    assert set(by_name) == {"calculator", "list_entries", "add_entry", "summarize"}
    calc = by_name["calculator"]
    assert calc["parameters"]["required"] == ["expression"]
    assert calc["parameters"]["properties"]["precision"] == {
        "type": "integer",
        "description": "significant digits of a non-integer result",
        "default": 10,
    }
    assert calc["parameters"]["additionalProperties"] is False
    assert by_name["list_entries"]["parameters"]["properties"]["query"]["type"] == ["string", "null"]
    assert all(1 <= len(t["description"]) <= 200 for t in by_name.values())


def test_tools_table_and_load_errors_exit_1(scripts):
    proc = sa("tools", str(AGENTS))
    assert proc.returncode == 0 and "calculator" in proc.stdout
    proc = sa("tools", str(scripts))
    assert proc.returncode == 1
    assert f"{scripts / 'broken.pym'}:4" in proc.stderr and "failed to load" in proc.stderr
    proc = sa("tools", str(scripts), "--json")
    assert proc.returncode == 1
    errors = json.loads(proc.stdout)["errors"]
    assert [(e["kind"], e["line"]) for e in errors] == [("parse", 4)]


def test_check_exit_codes_and_file_line(scripts):
    assert sa("check", str(AGENTS)).returncode == 0
    proc = sa("check", str(scripts / "broken.pym"), str(scripts / "loop.pym"))
    assert proc.returncode == 1
    assert proc.stdout.startswith(f"{scripts / 'broken.pym'}:4:")
    proc = sa("check", str(scripts), "--json")
    diags = json.loads(proc.stdout)["diagnostics"]
    assert proc.returncode == 1 and [d["line"] for d in diags] == [4]
    (scripts / "typed.pym").write_text(
        '"""Typed."""\nfrom grail import Input\nn: int = Input("n")\ny: str = n\n'
    )
    assert sa("check", str(scripts / "typed.pym")).returncode == 0
    proc = sa("check", "--types", str(scripts / "typed.pym"), str(AGENTS))
    assert proc.returncode == 1 and proc.stdout.startswith(f"{scripts / 'typed.pym'}:4:")


def test_check_validates_a_bundle_offline_as_a_host_would(tmp_path: Path):
    """Issue 36 #6: `sa check` said "all clean" (exit 0) for a bundle folder with misspelt keys and a
    terminal tool that does not exist, and read a bundle.yaml as Python."""
    bundle = tmp_path / "typo"
    (bundle / "tools").mkdir(parents=True)
    (bundle / "tools" / "echo.pym").write_text('"""Echo."""\nfrom grail import Input\n'
                                               't: str = Input("t")\nt\n')
    (bundle / "bundle.yaml").write_text(
        "name: typo\nsytem_prompt: hi\nmax_turn: 3\n"
        "model: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1'}\n"
        "constraint: {strategy: json_schema}\ntools: [tools/echo.pym]\n"
        "termination: {terminal_tool: ecko}\n"
        "output_models: {R: {type: objekt}}\n")
    for target in (bundle, bundle / "bundle.yaml"):
        proc = sa("check", str(target))
        assert proc.returncode == 1, proc.stdout + proc.stderr
        lines = proc.stdout.splitlines()
        where = str(bundle / "bundle.yaml")
        assert f"{where}: sytem_prompt: unknown key (did you mean 'system_prompt'?)" in proc.stdout
        assert f"{where}: max_turn: unknown key (did you mean 'termination.max_turns'?)" in proc.stdout
        assert (f"{where}: termination.terminal_tool: 'ecko' is not a tool of this bundle (did you mean "
                "'echo'?); tools: echo") in lines
        assert f"{where}: output_models.R: not a valid JSON Schema: type: 'objekt'" in proc.stdout
        assert "with problems" in proc.stderr and "parse error" not in proc.stdout
    (bundle / "bundle.yaml").write_text(
        "name: typo\nsystem_prompt: hi\nmodel: {adapter: hermes, base_url: 'http://127.0.0.1:9/v1'}\n"
        "constraint: {strategy: json_schema}\ntools: [tools/echo.pym]\n"
        "termination: {terminal_tool: echo}\n")
    proc = sa("check", str(bundle), str(AGENTS / "calculator.pym"), "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["bundles"] == [{"bundle": str(bundle / "bundle.yaml"), "problems": [], "warnings": []}]
    assert report["checked"] == [str(AGENTS / "calculator.pym")]


def test_run_prints_the_result():
    proc = sa("run", str(AGENTS / "calculator.pym"), "--input", "expression=2 * (3 + 4)")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == {"expression": "2 * (3 + 4)", "value": 14}
    proc = sa("run", str(AGENTS / "calculator.pym"), "-i", "expression=1 / 3", "-i", "precision=3", "--json")
    data = json.loads(proc.stdout)
    assert data["output"]["value"] == 0.333 and data["duration_ms"] > 0


@pytest.mark.parametrize(
    ("name", "args", "kind", "detail", "line"),
    [
        ("broken.pym", [], "parse", None, 4),
        ("loop.pym", ["--limits", "strict"], "limit", "duration", None),
        ("bomb.pym", ["--limits", "strict"], "limit", "memory", 2),
        ("deep.pym", ["--limits", "strict"], "limit", "recursion", 3),
        ("hostile.pym", [], "execution", None, 3),
        ("boom.pym", ["-i", "n=0"], "execution", None, 5),
        ("boom.pym", ["-i", "n=zero"], "input", None, None),
        ("boom.pym", ["-i", "m=1"], "input", None, None),
        ("loop.pym", ["--limits", '{"max_duration": "200ms"}'], "limit", "duration", None),
    ],
)
def test_run_errors_exit_2_with_kind_and_line(scripts, name, args, kind, detail, line):
    proc = sa("run", str(scripts / name), *args, "--json")
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    error = json.loads(proc.stdout)["error"]
    assert set(error) == {"kind", "message", "line", "detail"}
    assert (error["kind"], error["detail"], error["line"]) == (kind, detail, line), error


def test_run_error_without_json_goes_to_stderr(scripts):
    proc = sa("run", str(scripts / "boom.pym"), "-i", "n=0")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"{scripts / 'boom.pym'}:5: execution error: ZeroDivisionError")


def test_run_with_files_env_and_externals(scripts, tmp_path):
    data = tmp_path / "in.txt"
    data.write_text("payload")
    proc = sa("run", str(scripts / "envfile.pym"), "--file", f"/data/in.txt={data}", "--env", "MODE=test")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == ["test", "payload"]

    ws = tmp_path / "ws" / "notes"
    ws.mkdir(parents=True)
    (ws / "a.md").write_text("# Alpha\n\nfirst note\n")
    proc = sa(
        "run",
        str(AGENTS / "summarize.pym"),
        "--file",
        f"/data={tmp_path / 'ws'}",
        "-i",
        "path=/data/notes/a.md",
        "--external",
        'ask_llm="A short note."',
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["output"] == {
        "path": "/data/notes/a.md",
        "summary": "A short note.",
        "words": 3,
    }
    proc = sa("run", str(AGENTS / "summarize.pym"), "-i", "path=/x", "--json")
    assert proc.returncode == 2 and json.loads(proc.stdout)["error"]["kind"] == "external"


def test_run_command_line_problems_exit_1(scripts):
    proc = sa("run", str(scripts / "nope.pym"))
    assert proc.returncode == 1 and "cannot read" in proc.stderr
    proc = sa("run", str(scripts / "loop.pym"), "--limits", '{"max_mmeory": 1}')
    assert proc.returncode == 1 and "did you mean 'max_memory'" in proc.stderr
    proc = sa("run", str(scripts / "boom.pym"), "--input", "novalue")
    assert proc.returncode == 1 and "NAME=VALUE" in proc.stderr


def test_script_prints_go_to_stderr(tmp_path):
    (tmp_path / "p.pym").write_text('"""Print."""\nprint("hello from the sandbox")\n7\n')
    proc = sa("run", str(tmp_path / "p.pym"), "--json")
    assert proc.returncode == 0
    assert json.loads(proc.stdout)["output"] == 7
    assert "hello from the sandbox" in proc.stderr


def test_tools_of_a_bundle_are_every_tool_it_offers_its_model() -> None:
    """`sa tools BUNDLE_DIR` lists what a host offers the model, Python and agent tools included (it used to
    list only the folder's .pym scripts), and a broken bundle is an error naming it."""
    shop = Path(__file__).parents[2] / "bundles" / "shop"
    out = sa("tools", str(shop), "--json")
    assert out.returncode == 0, out.stderr
    listed = {t["name"]: t["kind"] for t in json.loads(out.stdout)["bundles"][0]["tools"]}
    assert listed == {"final_answer": "script", "refund": "script", "summarize": "script",
                      "lookup_order": "python", "researcher": "agent"}
    table = sa("tools", str(shop))
    assert table.returncode == 0 and "lookup_order" in table.stdout and "agent" in table.stdout


def test_tools_of_a_broken_bundle_is_an_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "bundle.yaml").write_text("name: b\nsytem_prompt: x\n")
    out = sa("tools", str(tmp_path))
    assert out.returncode == 1 and str(tmp_path) in out.stderr and "system_prompt" in out.stderr
