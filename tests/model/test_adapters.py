"""Model adapters: format -> parse round trips, tolerant parsing, typed coercion, rendering."""

from __future__ import annotations

import json

import pytest

from runtime.model.adapters import ADAPTERS, ParsedCall, UnknownAdapterError, get_adapter
from runtime.model.adapters.function_gemma import decode_value, encode_value
from runtime.types import Message, ToolCall, ToolSchema

WEATHER = ToolSchema(
    "get_weather",
    "Current weather for a city.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "City name"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city"],
    },
)
ENTRY = ToolSchema(
    "add_entry",
    "Add a journal entry.",
    {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "priority": {"type": "number"},
            "done": {"type": "boolean"},
            "meta": {"type": "object", "properties": {"n": {"type": "integer"}}},
        },
        "required": ["title"],
    },
)
TOOLS = [WEATHER, ENTRY]
TEXT_FAMILIES = ["qwen3", "hermes", "function_gemma"]

CALLS = [
    ("get_weather", {"city": "São Paulo, BR", "days": 3, "unit": "c"}),
    (
        "add_entry",
        {
            "title": 'a {tricky}, "quoted" <b>text</b>',
            "tags": ["x", "y z"],
            "priority": 2.5,
            "done": False,
            "meta": {"n": 7},
        },
    ),
]


def test_registry_knows_the_four_families_and_names_them_on_error() -> None:
    assert set(ADAPTERS) == {"qwen3", "hermes", "function_gemma", "openai"}
    assert get_adapter("qwen3").name == "qwen3"
    with pytest.raises(UnknownAdapterError) as err:
        get_adapter("llama9")
    assert "llama9" in str(err.value) and "function_gemma, hermes, openai, qwen3" in str(err.value)


@pytest.mark.parametrize("family", [*TEXT_FAMILIES, "openai"])
@pytest.mark.parametrize("name,arguments", CALLS)
def test_format_then_parse_gives_the_same_call(family: str, name: str, arguments: dict) -> None:
    adapter = get_adapter(family)
    reply = adapter.parse(adapter.format_call(name, arguments), None, TOOLS)
    assert reply.errors == []
    assert reply.calls == [ParsedCall(name, arguments)]
    assert reply.content == ""


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_several_calls_with_text_and_whitespace_around_them(family: str) -> None:
    adapter = get_adapter(family)
    first, second = (adapter.format_call(n, a) for n, a in CALLS)
    text = f"  Let me look that up.\n\n{first}\n   \n{second}\n  Done for now. "
    reply = adapter.parse(text, None, TOOLS)
    assert reply.errors == []
    assert [c.name for c in reply.calls] == ["get_weather", "add_entry"]
    assert reply.calls[1].arguments == CALLS[1][1]
    assert "Let me look that up." in reply.content and "Done for now." in reply.content
    assert "tool_call" not in reply.content and "function_call" not in reply.content


def test_qwen3_xml_values_are_typed_by_the_schema() -> None:
    text = (
        "<tool_call>\n<function=add_entry>\n<parameter=title>\n42\n</parameter>\n"
        '<parameter=tags>\n["a", "b"]\n</parameter>\n<parameter=priority>\n 3 \n</parameter>\n'
        '<parameter=done>\nTrue\n</parameter>\n<parameter=meta>\n{"n": "5"}\n</parameter>\n'
        "</function>\n</tool_call>"
    )
    (call,) = get_adapter("qwen3").parse(text, None, TOOLS).calls
    # the string stays a string even though it looks like a number; the rest follow their types
    assert call.arguments == {
        "title": "42",
        "tags": ["a", "b"],
        "priority": 3,
        "done": True,
        "meta": {"n": 5},
    }


def test_qwen3_reads_an_object_or_array_written_as_a_python_literal() -> None:
    """Qwen3-Coder sometimes writes an object parameter as a Python literal; vLLM's parser reads it."""
    text = (
        "<tool_call>\n<function=add_entry>\n<parameter=title>\nt\n</parameter>\n"
        "<parameter=tags>\n('a', 'b')\n</parameter>\n"
        "<parameter=meta>\n{'n': 5, 'ok': True, 'none': None}\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    (call,) = get_adapter("qwen3").parse(text, None, TOOLS).calls
    assert call.arguments == {"title": "t", "tags": ["a", "b"], "meta": {"n": 5, "ok": True, "none": None}}


@pytest.mark.parametrize(
    "value",
    [
        "__import__('os').system('true')",  # not a literal: never evaluated
        "{1: 'a'}",  # no JSON form (key is not a string)
        "{'a', 'b'}",  # a set
        "{'n': 1e999}",  # not a finite number
        "[" * 5000 + "]" * 5000,  # nesting deeper than the parser allows
    ],
)
def test_a_python_literal_that_json_cannot_hold_stays_text(value: str) -> None:
    call = get_adapter("qwen3").format_call("add_entry", {"title": "t", "meta": value})
    (parsed,) = get_adapter("qwen3").parse(call, None, TOOLS).calls
    assert parsed.arguments["meta"] == value  # the tool's input check reports it


def test_type_names_that_are_not_json_schema_are_read_as_vllm_reads_them() -> None:
    tool = ToolSchema(
        "measure",
        "",
        {
            "type": "object",
            "properties": {
                "ratio": {"type": "float"},
                "count": {"type": "int"},
                "flag": {"type": "bool"},
                "opts": {"type": "dict"},
                "names": {"type": "list"},
                "label": {"type": "String"},
            },
        },
    )
    params = {"ratio": "0.5", "count": "3", "flag": "true", "opts": '{"a": 1}', "names": "['x']",
              "label": "7"}
    text = get_adapter("qwen3").format_call("measure", params)
    (call,) = get_adapter("qwen3").parse(text, None, [tool]).calls
    assert call.arguments == {
        "ratio": 0.5, "count": 3, "flag": True, "opts": {"a": 1}, "names": ["x"], "label": "7"}
    # the tool's own input check agrees on what those names mean
    from runtime.validate import validate

    assert validate(call.arguments, tool.parameters) == []


def test_a_null_for_an_optional_argument_is_dropped_as_not_given() -> None:
    """Under a strict schema every property is required and optional ones nullable: null means not given."""
    api = [{"function": {"name": "get_weather", "arguments": '{"city": "X", "days": null, "unit": null}'}}]
    (call,) = get_adapter("openai").parse("", api, TOOLS).calls
    assert call.arguments == {"city": "X"}
    # a required argument keeps its null (the tool's input check reports it), as does a nullable one
    nullable = ToolSchema("t", "", {"type": "object", "properties": {"a": {"type": ["string", "null"]},
                                                                     "b": {"type": "string"}},
                                    "required": ["b"]})
    api = [{"function": {"name": "t", "arguments": '{"a": null, "b": null}'}}]
    (call,) = get_adapter("openai").parse("", api, [nullable]).calls
    assert call.arguments == {"a": None, "b": None}


def test_qwen3_keeps_inner_newlines_and_strips_only_the_framing_ones() -> None:
    text = (
        "<tool_call>\n<function=add_entry>\n<parameter=title>\nline 1\n\nline 2\n</parameter>\n"
        "</function>\n</tool_call>"
    )
    (call,) = get_adapter("qwen3").parse(text, None, TOOLS).calls
    assert call.arguments["title"] == "line 1\n\nline 2"


def test_qwen3_accepts_a_call_without_the_tool_call_wrapper() -> None:
    text = "Sure.\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n</function>"
    reply = get_adapter("qwen3").parse(text, None, TOOLS)
    assert reply.calls == [ParsedCall("get_weather", {"city": "Oslo"})] and reply.content == "Sure."


def test_hermes_coerces_quoted_numbers_and_accepts_parameters_key() -> None:
    text = '<tool_call>{"name": "get_weather", "parameters": {"city": "Rome", "days": "4"}}</tool_call>'
    (call,) = get_adapter("hermes").parse(text, None, TOOLS).calls
    assert call.arguments == {"city": "Rome", "days": 4}


def test_hermes_reads_two_objects_in_one_block() -> None:
    text = (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n'
        '{"name": "get_weather", "arguments": {"city": "B"}}\n</tool_call>'
    )
    reply = get_adapter("hermes").parse(text, None, TOOLS)
    assert [c.arguments["city"] for c in reply.calls] == ["A", "B"]


def test_function_gemma_value_syntax_round_trips() -> None:
    value = {"s": "a,b}{<tag>", "n": -3, "f": 1.5, "b": True, "z": None, "l": [1, "x", {"k": []}]}
    assert decode_value(encode_value(value)) == value
    assert decode_value(" { a : <escape>x<escape> , b : [ 1 , 2 ] } ") == {"a": "x", "b": [1, 2]}


@pytest.mark.parametrize(
    "family,text,fragment",
    [
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>', "invalid JSON"),
        ("hermes", '<tool_call>{"name": "get_weather", "arguments": {"ci', "truncated"),
        ("hermes", '<tool_call>{"name": "fly", "arguments": {}}</tool_call>', "unknown tool 'fly'"),
        ("qwen3", "<tool_call>\n<function=get_weather>\n<parameter=city>\nPa", "truncated"),
        ("qwen3", "<tool_call>\n<function=fly>\n</function>\n</tool_call>", "unknown tool 'fly'"),
        ("function_gemma", "<start_function_call>call:get_weather{city:<escape>Pa", "truncated"),
        (
            "function_gemma",
            "<start_function_call>call:get_weather{city:}<end_function_call>",
            "bad arguments",
        ),
        ("function_gemma", "<start_function_call>call:fly{}<end_function_call>", "unknown tool 'fly'"),
        # nesting deeper than Python's parsers recurse is an error value too, never a RecursionError
        ("hermes", '<tool_call>{"name": "t", "arguments": ' + "[" * 5000 + "]" * 5000 + "}</tool_call>",
         "invalid JSON"),
        ("function_gemma", "<start_function_call>call:get_weather{city:" + "[" * 5000 + "]" * 5000
         + "}<end_function_call>", "bad arguments"),
    ],
)
def test_unparseable_calls_are_reported_not_raised(family: str, text: str, fragment: str) -> None:
    reply = get_adapter(family).parse(text, None, TOOLS)
    assert reply.calls == []
    assert len(reply.errors) == 1 and fragment in reply.errors[0]


def test_a_good_call_survives_next_to_a_bad_one() -> None:
    adapter = get_adapter("hermes")
    text = adapter.format_call("get_weather", {"city": "Bonn"}) + '\n<tool_call>{"name": "fly"}</tool_call>'
    reply = adapter.parse(text, None, TOOLS)
    assert reply.calls == [ParsedCall("get_weather", {"city": "Bonn"})] and "unknown tool" in reply.errors[0]


@pytest.mark.parametrize("family", [*TEXT_FAMILIES, "openai"])
def test_bare_json_calls_from_the_json_schema_strategy_parse_in_every_family(family: str) -> None:
    one = json.dumps({"name": "get_weather", "arguments": {"city": "Lima", "days": 2}})
    many = json.dumps(
        [
            {"name": "get_weather", "arguments": {"city": "A"}},
            {"name": "add_entry", "arguments": {"title": "t"}},
        ]
    )
    adapter = get_adapter(family)
    assert adapter.parse(one, None, TOOLS).calls == [ParsedCall("get_weather", {"city": "Lima", "days": 2})]
    assert [c.name for c in adapter.parse(many, None, TOOLS).calls] == ["get_weather", "add_entry"]


def test_api_tool_calls_are_parsed_and_coerced_for_any_family() -> None:
    api = [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "X", "days": "2"}'},
        },
        {"id": "c2", "type": "function", "function": {"name": "add_entry", "arguments": "{not json"}},
    ]
    reply = get_adapter("openai").parse("", api, TOOLS)
    assert reply.calls == [ParsedCall("get_weather", {"city": "X", "days": 2})]
    assert "not valid JSON" in reply.errors[0]
    reply = get_adapter("hermes").parse("thinking...", api[:1], TOOLS)
    assert reply.calls[0].arguments["days"] == 2 and reply.content == "thinking..."


def test_plain_answer_has_no_calls_and_no_errors() -> None:
    for family in ADAPTERS:
        reply = get_adapter(family).parse("The answer is 4.", None, TOOLS)
        assert reply.content == "The answer is 4." and reply.calls == [] and reply.errors == []


HISTORY = [
    Message("system", "You are helpful."),
    Message("user", "Weather in Oslo and Bergen?"),
    Message(
        "assistant",
        "Checking.",
        tool_calls=(
            ToolCall("r/1.0", "get_weather", {"city": "Oslo"}),
            ToolCall("r/1.1", "get_weather", {"city": "Bergen"}),
        ),
    ),
    Message("tool", '{"temp": 3}', tool_call_id="r/1.0", name="get_weather"),
    Message("tool", '{"temp": 5}', tool_call_id="r/1.1", name="get_weather"),
    Message("user", "Thanks"),
]


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_text_families_render_tools_into_the_system_prompt_and_calls_as_text(family: str) -> None:
    adapter = get_adapter(family)
    out = adapter.render(HISTORY, TOOLS)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "user"]
    assert out[0]["content"].startswith("You are helpful.")
    assert "get_weather" in out[0]["content"] and "add_entry" in out[0]["content"]
    # the assistant turn replays both calls in native syntax, and they parse back
    replay = adapter.parse(out[2]["content"], None, TOOLS)
    assert [c.arguments["city"] for c in replay.calls] == ["Oslo", "Bergen"]
    # the two results are one user turn, in order
    assert out[3]["content"].index("3") < out[3]["content"].index("5")
    assert all(set(m) == {"role", "content"} for m in out)


def test_function_gemma_declares_tools_with_its_control_tokens() -> None:
    out = get_adapter("function_gemma").render([Message("user", "hi")], [WEATHER])
    system = out[0]["content"]
    assert "<start_function_declaration>declaration:get_weather{" in system
    assert "type:<escape>STRING<escape>" in system and system.endswith("<end_function_declaration>")
    results = get_adapter("function_gemma").render(HISTORY, TOOLS)[3]["content"]
    assert results.startswith("<start_function_response>response:get_weather{temp:3}")


def test_native_rendering_for_openai_and_when_tools_go_to_the_api() -> None:
    for adapter, via_api in [(get_adapter("openai"), False), (get_adapter("qwen3"), True)]:
        out = adapter.render(HISTORY, TOOLS, tools_via_api=via_api)
        assert out[0] == {"role": "system", "content": "You are helpful."}
        assert out[2]["tool_calls"][1]["function"] == {
            "name": "get_weather",
            "arguments": '{"city": "Bergen"}',
        }
        assert out[3] == {
            "role": "tool",
            "content": '{"temp": 3}',
            "tool_call_id": "r/1.0",
            "name": "get_weather",
        }


def test_tools_without_a_system_message_get_one() -> None:
    out = get_adapter("hermes").render([Message("user", "hi")], [WEATHER])
    assert (
        out[0]["role"] == "system"
        and "<tools>" in out[0]["content"]
        and out[1] == {"role": "user", "content": "hi"}
    )


def test_the_tools_text_is_written_once_per_tool_set_and_never_reused_for_another() -> None:
    adapter = get_adapter("hermes")
    written: list[list[str]] = []
    original = adapter.tools_prompt

    def counting(tools: list[ToolSchema]) -> str:
        written.append([t.name for t in tools])
        return original(tools)

    adapter.tools_prompt = counting  # type: ignore[method-assign]
    first = (ToolSchema("alpha", "A.", {"type": "object"}),)
    other = (ToolSchema("beta", "B.", {"type": "object"}),)
    chat = [Message("system", "Be brief."), Message("user", "hi")]
    one, two = adapter.render(chat, first), adapter.render(chat, first)
    three = adapter.render(chat, other)
    assert one == two and written == [["alpha"], ["beta"]]
    assert '"alpha"' in one[0]["content"]
    assert '"beta"' in three[0]["content"] and '"alpha"' not in three[0]["content"]
