"""bundle.yaml validation and resolution: errors name the YAML path and say what is allowed."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from runtime.bundle import BundleError, load_bundle
from runtime.scripts.limits import Limits

ECHO = '''\
"""Echo the text back."""
from grail import Input

text: str = Input("text")

{"echo": text}
'''

ADD = '''\
"""Add an entry to the workspace."""
from grail import Input

title: str = Input("title")

{"writes": [{"path": "/data/" + title + ".txt", "content": title}], "message": "added " + title}
'''


def write_bundle(tmp: Path, body: str, tools: dict[str, str] | None = None) -> Path:
    for name, src in (tools or {}).items():
        (tmp / "tools").mkdir(exist_ok=True)
        (tmp / "tools" / name).write_text(src)
    f = tmp / "bundle.yaml"
    f.write_text(textwrap.dedent(body))
    return f


def problems(tmp: Path, body: str, tools: dict[str, str] | None = None) -> dict[str, str]:
    with pytest.raises(BundleError) as err:
        load_bundle(write_bundle(tmp, body, tools))
    return dict(err.value.problems)


def test_minimal_bundle_defaults(tmp_path: Path) -> None:
    b = load_bundle(write_bundle(tmp_path, "name: planner\nsystem_prompt: hi\n"))
    assert b.name == "planner" and b.system_prompt == "hi" and b.tools == {}
    assert b.limits == Limits.default() and b.uses_local_model
    assert b.data_provider.kind == "none" and b.deadline_s is None
    cfg = b.kernel_config()
    assert cfg.system_prompt == "hi" and cfg.max_turns == 20
    assert len(b.digest) == 16
    # the digest follows the content
    b2 = load_bundle(write_bundle(tmp_path, "name: planner\nsystem_prompt: hello\n"))
    assert b2.digest != b.digest


def test_unknown_keys_are_named_with_their_path(tmp_path: Path) -> None:
    got = problems(tmp_path, """\
        name: p
        modle: {}
        model: {adapter: hermes, temprature: 1}
        termination: {max_turn: 3}
    """)
    assert "unknown key" in got["modle"] and "'model'" in got["modle"]
    assert "did you mean 'temperature'" not in got["model.temprature"]  # sampling keys live under sampling
    assert "allowed keys" in got["model.temprature"]
    assert "did you mean 'max_turns'" in got["termination.max_turn"]


def test_value_errors_name_their_path(tmp_path: Path) -> None:
    got = problems(tmp_path, """\
        name: bad.name
        model: {adapter: nope, sampling: {temperatur: 0.1}}
        constraint: {strategy: regex}
        limits: {max_mmeory: 16mb}
        termination: {deadline: soon}
        data_provider: {type: database}
        policies:
          - sequential_dependncy: {a: [b]}
        workspace: "a/b"
    """)
    assert "'.'" in got["name"]
    assert "unknown adapter 'nope'" in got["model.adapter"] and "hermes" in got["model.adapter"]
    assert "did you mean 'temperature'" in got["model.sampling.temperatur"]
    assert "ebnf" in got["constraint.strategy"]
    assert "did you mean 'max_memory'" in got["limits.max_mmeory"]
    assert "deadline" in got["termination.deadline"]
    assert "none, static, workspace" in got["data_provider.type"]
    assert "did you mean 'sequential_dependency'" in got["policies[0].sequential_dependncy"]
    assert "workspace" in got["workspace"]


def test_error_message_lists_file_and_paths(tmp_path: Path) -> None:
    f = write_bundle(tmp_path, "name: p\nlimits: stirct\n")
    with pytest.raises(BundleError) as err:
        load_bundle(f)
    text = str(err.value)
    assert text.startswith(f"{f}: limits: ") and "did you mean 'strict'" in text


def test_bad_yaml_and_missing_name(tmp_path: Path) -> None:
    assert "name" in problems(tmp_path, "system_prompt: x\n")
    f = tmp_path / "bundle.yaml"
    f.write_text("name: [unclosed\n")
    with pytest.raises(BundleError, match="not valid YAML"):
        load_bundle(f)
    with pytest.raises(BundleError, match="cannot read"):
        load_bundle(tmp_path / "missing.yaml")


def test_tools_globs_entries_limits_and_output_models(tmp_path: Path) -> None:
    pytest.importorskip("runtime.tools")
    (tmp_path / "models_mod.py").write_text(
        "from pydantic import BaseModel\n"
        "class AddResult(BaseModel):\n    message: str\n    writes: list = []\n")
    b = load_bundle(write_bundle(tmp_path, """\
        name: ws
        limits: {max_duration: 3s, max_memory: 32mb}
        tools:
          - "tools/*.pym"
          - path: tools/add_entry.pym
            limits: {max_duration: 5s}
            output_model: models_mod:AddResult
            requires_approval: true
        output_models:
          EchoOut: {type: object, properties: {echo: {type: string}}, required: [echo]}
        data_provider: workspace
        workspace: notes
        termination: {terminal_tool: echo, deadline: 2m, max_turns: 5}
        policies:
          - read_before_write: {read_tools: [echo], write_tools: [add_entry], path_argument: title}
    """, {"echo.pym": ECHO, "add_entry.pym": ADD}))
    assert set(b.tools) == {"echo", "add_entry"}
    assert b.limits_for("echo").max_duration == 3.0
    add = b.tools["add_entry"]
    from runtime.tools import ScriptTool

    assert isinstance(add, ScriptTool)  # the tool object itself carries the bundle's settings: no wrapper
    assert (add.limits.max_duration, add.limits.max_memory) == (5.0, 32 * 1024**2)
    assert add.output_model.__name__ == "AddResult" and add.requires_approval
    assert b.output_model_for("echo") is None
    assert b.workspace == "notes" and b.data_provider.kind == "workspace" and b.deadline_s == 120.0
    cfg = b.kernel_config()
    assert cfg.terminal_tool == "echo" and cfg.requires_approval == frozenset({"add_entry"})
    assert {t.name for t in cfg.tools} == {"echo", "add_entry"} and len(cfg.policies) == 1


def test_tool_problems_are_bundle_errors(tmp_path: Path) -> None:
    pytest.importorskip("runtime.tools")
    got = problems(tmp_path, """\
        name: ws
        tools:
          - "nothing/*.pym"
          - path: tools/broken.pym
          - path: tools/echo.pym
            limits: {max_mmeory: 1mb}
            output_model: Nope
        termination: {terminal_tool: submit}
    """, {"broken.pym": "x = = 1\n", "echo.pym": ECHO})
    assert "matches no file" in got["tools[0]"]
    assert "broken.pym" in got["tools[1]"]
    assert "did you mean 'max_memory'" in got["tools[2].limits.max_mmeory"]
    assert "not an output model" in got["tools[2].output_model"]
    assert "'submit' is not a tool" in got["termination.terminal_tool"]


def test_an_output_model_that_does_not_import_says_which_module_and_why(tmp_path: Path) -> None:
    got = problems(tmp_path, """\
        name: ws
        tools:
          - path: tools/echo.pym
            output_model: no_such_module_here:Result
          - path: tools/echo2.pym
            output_model: pydantic:NoSuchModel
    """, {"echo.pym": ECHO, "echo2.pym": ECHO})
    assert "cannot import module 'no_such_module_here'" in got["tools[0].output_model"]
    assert "has no 'NoSuchModel'" in got["tools[1].output_model"]


def test_an_invalid_output_schema_is_refused_at_load_naming_the_file_the_field_and_the_fix(tmp_path: Path
                                                                                         ) -> None:
    """Issue 36 #7: `type: objekt` was accepted, and then every call of the tool failed its output check."""
    body = """\
        name: typed
        output_models:
          Report: {type: object, properties: {answer: {type: strin}}, required: answer}
        tools:
          - path: tools/echo.pym
            output_model: {type: objekt}
          - path: tools/echo2.pym
            output_model: {type: string, pattern: "("}
          - path: tools/echo3.pym
            output_model: Report
    """
    with pytest.raises(BundleError) as err:
        load_bundle(write_bundle(tmp_path, body, {"echo.pym": ECHO, "echo2.pym": ECHO, "echo3.pym": ECHO}))
    found = err.value.problems
    text = str(err.value)
    assert str(tmp_path / "bundle.yaml") in text
    assert ("tools[0].output_model", "not a valid JSON Schema: type: 'objekt' is not a JSON type (did you "
            "mean 'object'?); the types are array, boolean, integer, null, number, object, string") in found
    assert any(path == "tools[1].output_model" and "pattern: not a regular expression" in msg
               for path, msg in found)
    named = [msg for path, msg in found if path == "output_models.Report"]
    assert any("properties.answer.type: 'strin' is not a JSON type (did you mean 'string'?)" in m
               for m in named)
    assert any("required: expected array" in m for m in named)


def test_a_valid_output_schema_still_loads_and_checks_results(tmp_path: Path) -> None:
    b = load_bundle(write_bundle(tmp_path, """\
        name: typed
        tools:
          - path: tools/echo.pym
            output_model: {type: object, properties: {echo: {type: string, pattern: "^a"}}, required: [echo],
                           $defs: {x: {type: [string, "null"]}}, additionalProperties: {$ref: "#/$defs/x"}}
    """, {"echo.pym": ECHO}))
    assert b.output_model_for("echo")["required"] == ["echo"]


def test_a_bundle_name_holding_the_instance_separator_is_refused_saying_why(tmp_path: Path) -> None:
    """Issue 36 #15: a bundle named `inv:x` was served, though `inv:x` is instance x of bundle inv."""
    got = problems(tmp_path, "name: inv:x\n")
    assert "holds ':', which separates an agent from its instance" in got["name"]
    assert "name the bundle without ':' (say 'inv') and send to 'inv:x'" in got["name"]


def test_a_data_provider_type_that_is_not_a_name_is_a_bundle_error(tmp_path: Path) -> None:
    got = problems(tmp_path, """\
        name: ok
        model: {adapter: hermes}
        data_provider: {type: [workspace]}
    """)
    assert "none, static, workspace" in got["data_provider.type"]


def test_questions_offer_ask_human_with_a_timeout_and_a_default(tmp_path: Path) -> None:
    b = load_bundle(write_bundle(tmp_path, "name: asker\nquestions: {timeout: 1h30m, default: null}\n"))
    cfg = b.kernel_config()
    assert [t.name for t in cfg.tools] == ["ask_human"] and cfg.questions is not None
    assert (cfg.questions.timeout_s, cfg.questions.default, cfg.questions.has_default) == (5400.0, None, True)
    plain = load_bundle(write_bundle(tmp_path, "name: asker\nquestions: {}\n")).kernel_config().questions
    assert plain is not None and plain.timeout_s is None and not plain.has_default
    assert load_bundle(write_bundle(tmp_path, "name: asker\n")).kernel_config().questions is None
    found = problems(tmp_path, "name: asker\nquestions: {timeout: soon}\n")
    assert "not a duration such as 90s, 30m, 4h or 2d" in found["questions.timeout"]
    assert "questions.urgency" in problems(tmp_path, "name: asker\nquestions: {urgency: 1}\n")
    found = problems(tmp_path, "name: asker\nquestions: {default: 'no'}\n")
    assert "set `timeout` too" in found["questions.default"]
