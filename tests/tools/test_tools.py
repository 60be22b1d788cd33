"""Tools: the schema table, tool rules, ScriptTool, PythonTool, argument validation, discovery."""

import asyncio
import textwrap
from typing import Any, Literal

import pytest

from runtime.scripts import Limits, loads, schema_from_annotation
from runtime.tools import (
    LoadFailure,
    PythonTool,
    ScriptLoadError,
    ScriptTool,
    Tool,
    ToolContext,
    discover_tools,
    schema_from_inputs,
    tool_diagnostics,
)
from runtime.types import ToolSchema
from runtime.validate import unsupported_keywords, validate

# ---- the schema table: annotations -> JSON Schema ---------------------------------------------------


@pytest.mark.parametrize(
    ("annotation", "schema"),
    [
        ("str", {"type": "string"}),
        ("int", {"type": "integer"}),
        ("float", {"type": "number"}),
        ("bool", {"type": "boolean"}),
        ("list[int]", {"type": "array", "items": {"type": "integer"}}),
        ("List[str]", {"type": "array", "items": {"type": "string"}}),
        ("list", {"type": "array"}),
        ("list[list[float]]", {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}),
        ("dict[str, int]", {"type": "object", "additionalProperties": {"type": "integer"}}),
        (
            "Dict[str, list[str]]",
            {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "string"}}},
        ),
        ("dict[str, Any]", {"type": "object"}),
        ("str | None", {"type": ["string", "null"]}),
        ("Optional[int]", {"type": ["integer", "null"]}),
        ("list[str] | None", {"type": ["array", "null"], "items": {"type": "string"}}),
        ('Literal["a", "b"]', {"enum": ["a", "b"]}),
        ("Literal[1, 2, -3]", {"enum": [1, 2, -3]}),
        ('Optional[Literal["x"]]', {"enum": ["x", None]}),
        ("Any", {}),
        ("int | str", {"type": ["integer", "string"]}),
        (
            "Union[int, list[int]]",
            {"anyOf": [{"type": "integer"}, {"type": "array", "items": {"type": "integer"}}]},
        ),
        ("tuple[int, ...]", {"type": "array", "items": {"type": "integer"}}),
        (
            "tuple[int, str]",
            {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
        ),
        ("set[str]", {"type": "array", "items": {"type": "string"}, "uniqueItems": True}),
        ("typing.List[int]", {"type": "array", "items": {"type": "integer"}}),
        ("'int'", {"type": "integer"}),
    ],
)
def test_schema_table(annotation, schema):
    assert schema_from_annotation(annotation) == schema


@pytest.mark.parametrize(
    "annotation", ["bytes", "datetime", "dict[int, str]", "Callable[[int], int]", "MyModel", "list[int, str]"]
)
def test_unmappable_annotation_is_a_check_error_naming_the_line(annotation):
    s = loads(f'"""Doc."""\nfrom grail import Input\n\nx: {annotation} = Input("x")\n')
    assert not s.ok
    (d,) = [d for d in s.diagnostics if "x" in d.message]
    assert d.kind == "check" and d.line == 4
    assert "JSON Schema" in d.message or "dict[str" in d.message or "takes one" in d.message


def test_parameters_object_for_a_script():
    s = loads(
        textwrap.dedent('''\
        """Search notes."""
        from grail import Input
        from typing import Literal, Optional
        query: str = Input("query", description="what to look for")
        limit: int = Input("limit", default=10)
        kind: Literal["note", "task"] = Input("kind", default="note")
        tags: Optional[list[str]] = Input("tags")
        extra: Any = Input("extra")
        query
    ''')
    )
    assert s.parameters == {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "what to look for"},
            "limit": {"type": "integer", "default": 10},
            "kind": {"enum": ["note", "task"], "default": "note"},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}, "default": None},
            "extra": {"default": None},
        },
        "required": ["query"],
        "additionalProperties": False,
    }
    assert schema_from_inputs(s.inputs) == s.parameters


# ---- tool rules --------------------------------------------------------------------------------------


def test_tool_rules():
    assert tool_diagnostics("good_name-1", "Does a thing.") == []
    bad = tool_diagnostics("Bad Name", "x")
    assert bad and "^[a-z0-9_-]{1,64}$" in bad[0].message and "bad_name" in bad[0].message
    assert tool_diagnostics("a" * 65, "x")
    assert "no docstring" in tool_diagnostics("ok", "")[0].message
    long = tool_diagnostics("ok", "x" * 201)
    assert long and "201 characters" in long[0].message


def test_script_tool_refuses_scripts_that_break_the_rules():
    with pytest.raises(ScriptLoadError) as info:
        ScriptTool(loads('"""Doc."""\n1\n', name="Bad Name"))
    assert info.value.error.kind == "check" and "^[a-z0-9_-]{1,64}$" in info.value.error.message
    with pytest.raises(ScriptLoadError) as info:
        ScriptTool(loads('"""Doc."""\nimport enum\n', name="bad"))
    assert info.value.failure.diagnostics[0].line == 2


# ---- ScriptTool --------------------------------------------------------------------------------------

CALC = (
    '"""Add two numbers."""\nfrom grail import Input\na: int = Input("a")\n'
    'b: int = Input("b", default=1)\na + b\n'
)


@pytest.mark.anyio
async def test_script_tool_schema_and_execute():
    tool = ScriptTool(loads(CALC, name="add"), limits="strict")
    assert isinstance(tool, Tool)
    assert tool.schema == ToolSchema("add", "Add two numbers.", tool.script.parameters)
    assert tool.schema.to_openai()["function"]["name"] == "add"
    assert tool.limits == Limits.strict() and tool.output_model is None and len(tool.content_hash) == 16
    assert (await tool.execute({"a": 2}, ToolContext())).output == 3
    assert (await tool.execute({"a": 2, "b": 5})).output == 7


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"a": 1, "c": 2}, "unknown input 'c'"),
        ({"a": "x"}, "expected integer"),
        ({}, "missing required input 'a'"),
        ([1], "must be a JSON object"),
    ],
)
async def test_arguments_are_validated_before_execution(arguments, fragment):
    tool = ScriptTool(loads(CALC, name="add"))
    r = await tool.execute(arguments, ToolContext())
    assert r.error.kind == "input" and fragment in r.error.message


@pytest.mark.anyio
async def test_context_supplies_files_environ_limits_externals_and_tags_events():
    src = textwrap.dedent('''\
        """Read a note and ask."""
        from grail import external
        import os
        @external
        async def ask(q: str) -> str: ...
        text = open("/w/a.txt").read()
        [text, os.getenv("MODE"), await ask(text)]
    ''')
    tool = ScriptTool(loads(src, name="reader"))
    events = []

    async def ask(q):
        return q.upper()

    ctx = ToolContext(
        run_id="r1",
        agent="a",
        call_id="r1/0.0",
        files={"/w/a.txt": "hi"},
        environ={"MODE": "x"},
        externals={"ask": ask},
        on_event=events.append,
    )
    r = await tool.execute({}, ctx)
    assert r.output == ["hi", "x", "HI"]
    assert events and all(e.call_id == "r1/0.0" for e in events)
    loop = ScriptTool(loads('"""Loop."""\nwhile True:\n    pass\n', name="loop"))
    r = await loop.execute({}, ToolContext(limits=Limits(max_duration="200ms")))
    assert (r.error.kind, r.error.detail) == ("limit", "duration") and "200 ms" in r.error.message


@pytest.mark.anyio
async def test_script_tool_output_model():
    from pydantic import BaseModel

    class Out(BaseModel):
        value: int

    tool = ScriptTool(loads('"""Value."""\n{"value": "nope"}\n', name="v"), output_model=Out)
    assert (await tool.execute({})).error.kind == "output"


# ---- PythonTool --------------------------------------------------------------------------------------


def lookup(
    city: str,
    days: int = 3,
    units: Literal["c", "f"] = "c",
    tags: list[str] | None = None,
    context: ToolContext | None = None,
) -> dict[str, Any]:
    """Look up the weather forecast for a city.

    Args:
        city: the city name
        days: how many days ahead
    """
    return {
        "city": city,
        "days": days,
        "units": units,
        "tags": tags,
        "agent": context.agent if context else None,
    }


async def async_tool(x: float, context: ToolContext) -> float:
    """Double a number."""
    await asyncio.sleep(0)
    return x * 2


def test_python_tool_schema_from_hints_and_docstring():
    tool = PythonTool(lookup)
    assert tool.schema.name == "lookup"
    assert tool.schema.description == "Look up the weather forecast for a city."
    assert tool.schema.parameters == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "the city name"},
            "days": {"type": "integer", "description": "how many days ahead", "default": 3},
            "units": {"enum": ["c", "f"], "default": "c"},
            "tags": {"type": ["array", "null"], "items": {"type": "string"}, "default": None},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


@pytest.mark.anyio
async def test_python_tool_execute_sync_async_and_errors():
    tool = PythonTool(lookup)
    r = await tool.execute({"city": "Oslo"}, ToolContext(agent="planner"))
    assert r.output == {"city": "Oslo", "days": 3, "units": "c", "tags": None, "agent": "planner"}
    assert (await tool.execute({"city": "Oslo", "units": "k"}, ToolContext())).error.kind == "input"
    doubler = PythonTool(async_tool, name="double")
    assert (await doubler.execute({"x": 2}, ToolContext())).output == 4.0

    def broken(n: int) -> int:
        """Always fails."""
        raise ValueError(f"bad {n}")

    r = await PythonTool(broken).execute({"n": 1}, ToolContext())
    assert r.error.kind == "execution" and r.error.message == "ValueError: bad 1"


def test_python_tool_rejects_what_it_cannot_describe():
    def nodoc(x: int) -> int:
        return x

    with pytest.raises(ValueError, match="docstring"):
        PythonTool(nodoc)

    def untyped(x):
        """Doc."""

    with pytest.raises(TypeError, match="no type annotation"):
        PythonTool(untyped)

    def star(*xs: int):
        """Doc."""

    with pytest.raises(TypeError, match="cannot be described"):
        PythonTool(star)
    with pytest.raises(ValueError, match="invalid"):
        PythonTool(lookup, name="Look Up")


# ---- discovery ---------------------------------------------------------------------------------------


def test_discover_tools_returns_tools_and_every_failure(tmp_path):
    (tmp_path / "good.pym").write_text(CALC)
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "other.pym").write_text('"""Other."""\n1\n')
    (sub / "broken.pym").write_text('"""Broken."""\nx = (\n')
    (sub / "Bad Name.pym").write_text('"""Doc."""\n1\n')
    (sub / "nodoc.pym").write_text("1\n")
    dup = tmp_path / "dup"
    dup.mkdir()
    (dup / "good.pym").write_text(CALC)
    (tmp_path / "notes.txt").write_text("not a script")

    tools, failures = discover_tools(
        [tmp_path, tmp_path / "missing.pym", str(tmp_path / "*.none")], limits="strict"
    )
    assert sorted(t.name for t in tools) == ["good", "nodoc", "other"]  # no docstring: a warning, loads
    assert all(t.limits == Limits.strict() for t in tools)
    assert all(isinstance(f, LoadFailure) for f in failures)
    by_path = {f.path.rsplit("/", 1)[-1]: f for f in failures}
    assert by_path["broken.pym"].error.kind == "parse" and by_path["broken.pym"].error.line == 2
    assert "^[a-z0-9_-]" in by_path["Bad Name.pym"].error.message
    assert "nodoc.pym" not in by_path
    assert "already used" in by_path["good.pym"].error.message
    assert "no such file" in by_path["missing.pym"].error.message
    assert "no .pym files match" in by_path["*.none"].error.message
    assert len(failures) == 5
    assert str(by_path["broken.pym"]).startswith(str(sub / "broken.pym") + ":2")


def test_discover_tools_with_globs_and_files(tmp_path):
    (tmp_path / "a.pym").write_text(CALC)
    (tmp_path / "b.pym").write_text(CALC.replace("Add two", "Add"))
    tools, failures = discover_tools(str(tmp_path / "*.pym"))
    assert [t.name for t in tools] == ["a", "b"] and failures == []
    tools, failures = discover_tools([tmp_path / "a.pym", tmp_path / "a.pym"])
    assert [t.name for t in tools] == ["a"] and failures == []


def test_shipped_agents_all_load():
    tools, failures = discover_tools(["agents"])
    assert failures == []
    assert {t.name for t in tools} >= {"calculator", "list_entries", "add_entry", "summarize"}


# ---- the JSON Schema validator -----------------------------------------------------------------------


def test_validator_paths_and_keywords():
    schema = {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 2},
            "n": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "ref": {"$ref": "#/$defs/pos"},
        },
        "required": ["tags"],
        "additionalProperties": False,
        "$defs": {"pos": {"type": "number", "exclusiveMinimum": 0}},
    }
    assert validate({"tags": ["a"], "n": None, "ref": 1}, schema) == []
    errors = validate({"tags": ["a", 3, "c"], "n": "x", "ref": 0, "zz": 1}, schema)
    assert "tags: must have at most 2 items, got 3" in errors
    assert "tags[1]: expected string, got integer 3" in errors
    assert any(e.startswith("n: does not match any allowed form") for e in errors)
    assert "ref: must be > 0, got 0" in errors
    assert any(e.startswith("zz: unexpected property") for e in errors)
    assert validate({}, schema) == ["tags: missing required property"]
    assert unsupported_keywords({"type": "object", "properties": {"a": {"if": {}}}}) == ["#/properties/a: if"]
    assert validate(True, {"type": "integer"}) == ["expected integer, got boolean true"]
