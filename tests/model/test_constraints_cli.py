"""`sa constraint`: the printed payload is what the runtime sends, and xgrammar enforces it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from runtime.cli.app import app

xgr = pytest.importorskip("xgrammar")

AGENTS = Path(__file__).resolve().parents[2] / "agents"
runner = CliRunner()


def run(*args: str):
    return runner.invoke(app, ["constraint", *args])


def matches(compiled, text: str) -> bool:
    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_terminated()


@pytest.mark.skipif(
    not (AGENTS / "calculator.pym").exists(), reason="the shipped agents/ tools are not present"
)
def test_qwen3_ebnf_payload_for_the_shipped_agents_compiles_and_enforces_calls() -> None:
    result = run(str(AGENTS), "--adapter", "qwen3", "--strategy", "ebnf")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert list(payload) == ["structured_outputs"] and list(payload["structured_outputs"]) == ["grammar"]
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)
    compiled = compiler.compile_grammar(payload["structured_outputs"]["grammar"])
    call = (
        "<tool_call>\n<function=calculator>\n<parameter=expression>\n2 * (3 + 4)\n</parameter>\n"
        "{}</function>\n</tool_call>"
    )
    assert matches(compiled, call.format(""))
    assert matches(compiled, call.format("<parameter=precision>\n4\n</parameter>\n"))
    assert not matches(compiled, call.format("<parameter=precision>\nfour\n</parameter>\n"))  # wrong type
    assert not matches(compiled, call.replace("calculator", "rm_rf"))  # unknown tool
    assert not matches(compiled, call.format("")[:-12])  # truncated


def test_json_tool_files_and_every_strategy(tmp_path: Path) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "ping",
                "description": "p",
                "parameters": {"type": "object", "properties": {"n": {"type": "integer"}}},
            },
        }
    ]
    path = tmp_path / "tools.json"
    path.write_text(json.dumps(tools))
    tagged = json.loads(run(str(path), "-a", "hermes", "-s", "structural_tag", "--parallel").stdout)
    assert json.loads(tagged["structured_outputs"]["structural_tag"])["format"]["stop_after_first"] is False
    schema = json.loads(run(str(path), "-a", "function_gemma", "-s", "json_schema").stdout)
    assert schema["structured_outputs"]["json"]["properties"]["name"] == {"const": "ping"}
    native = json.loads(run(str(path), "-a", "openai", "-s", "json_schema").stdout)
    assert native["tool_choice"] == "required" and "structured_outputs" not in native
    sent = json.loads(run(str(path), "-a", "qwen3", "-s", "ebnf", "--send-tools").stdout)
    assert sent["tool_choice"] == "auto" and "grammar" in sent["structured_outputs"]


def test_bad_requests_exit_2_with_a_message(tmp_path: Path) -> None:
    path = tmp_path / "tools.json"
    path.write_text(json.dumps([{"name": "ping", "parameters": {}}]))
    unknown = run(str(path), "--adapter", "gpt9")
    assert (
        unknown.exit_code == 2 and "known adapters: function_gemma, hermes, openai, qwen3" in unknown.output
    )
    wrong = run(str(path), "--adapter", "openai", "--strategy", "ebnf")
    assert wrong.exit_code == 2 and "only supports strategy json_schema" in wrong.output
    strategy = run(str(path), "--strategy", "regex")
    assert strategy.exit_code == 2 and "unknown strategy 'regex'" in strategy.output
