"""Decoding constraints, proven with xgrammar's GrammarMatcher: valid calls in, invalid calls out."""

from __future__ import annotations

import json

import pytest

xgr = pytest.importorskip("xgrammar")

from runtime.model.adapters import get_adapter  # noqa: E402
from runtime.model.constraints import (  # noqa: E402
    STRATEGIES,
    BuiltConstraint,
    ConstraintError,
    DecodingConstraint,
    accepts,
    build_constraint,
    compile_constraint,
)
from runtime.types import ToolSchema  # noqa: E402

WEATHER = ToolSchema(
    "get_weather",
    "Current weather.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer"},
            "unit": {"type": "string", "enum": ["c", "f"]},
        },
        "required": ["city"],
    },
)
ENTRY = ToolSchema(
    "add_entry",
    "Add an entry.",
    {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "done": {"type": "boolean"},
        },
        "required": ["title", "done"],
    },
)
TOOLS = [WEATHER, ENTRY]
TEXT_FAMILIES = ["qwen3", "hermes", "function_gemma"]

VALID = [
    ("get_weather", {"city": "Paris"}),
    ("get_weather", {"city": "New York, <NY>", "days": 3, "unit": "f"}),
    ("add_entry", {"title": "buy {milk}", "tags": ["home", "x"], "done": False}),
]
INVALID = {
    "unknown tool": ("launch_rockets", {"city": "Paris"}),
    "missing required argument": ("add_entry", {"title": "t"}),
    "wrong type": ("get_weather", {"city": "Paris", "days": "three"}),
    "enum violation": ("get_weather", {"city": "Paris", "unit": "kelvin"}),
    "extra argument": ("get_weather", {"city": "Paris", "color": "red"}),
}


def strict_arguments(name: str, arguments: dict) -> dict:
    """The arguments as a model under a strict schema writes them: every property, null if not given."""
    tool = next((t for t in TOOLS if t.name == name), None)
    if tool is None:
        return arguments
    return {**{p: arguments.get(p) for p in tool.parameters["properties"]}, **arguments}


def render(family: str, strategy: str, name: str, arguments: dict) -> str:
    """The text a model would emit for this call under this adapter and strategy."""
    if family == "openai":
        return json.dumps([{"name": name, "parameters": strict_arguments(name, arguments)}])
    if strategy == "json_schema":
        return json.dumps({"name": name, "arguments": arguments})
    return get_adapter(family).format_call(name, arguments)


def joined(family: str, strategy: str, texts: list[str]) -> str:
    if family == "openai":
        return json.dumps([json.loads(t)[0] for t in texts])
    if strategy == "json_schema":
        return "[" + ", ".join(texts) + "]"
    return get_adapter(family).call_separator.join(texts)


COMBOS = [(f, s) for f in TEXT_FAMILIES for s in STRATEGIES] + [("openai", "json_schema")]


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str, bool], object]:
    """Every adapter x strategy x parallel constraint, compiled once for the module."""
    out = {}
    for family, strategy in COMBOS:
        for parallel in (False, True):
            built = build_constraint(get_adapter(family), TOOLS, DecodingConstraint(strategy, parallel))
            out[(family, strategy, parallel)] = compile_constraint(built)
    return out


@pytest.mark.parametrize("family,strategy", COMBOS)
@pytest.mark.parametrize("parallel", [False, True])
def test_valid_calls_are_accepted(compiled, family: str, strategy: str, parallel: bool) -> None:
    grammar = compiled[(family, strategy, parallel)]
    for name, arguments in VALID:
        text = render(family, strategy, name, arguments)
        assert accepts(grammar, text), text


@pytest.mark.parametrize("family,strategy", COMBOS)
@pytest.mark.parametrize("case", sorted(INVALID))
def test_invalid_calls_are_rejected(compiled, family: str, strategy: str, case: str) -> None:
    grammar = compiled[(family, strategy, False)]
    text = render(family, strategy, *INVALID[case])
    assert not accepts(grammar, text), f"{case}: {text}"


@pytest.mark.parametrize("family,strategy", COMBOS)
def test_truncated_call_is_rejected(compiled, family: str, strategy: str) -> None:
    grammar = compiled[(family, strategy, False)]
    text = render(family, strategy, *VALID[1])
    for cut in (1, 5, len(text) // 2):
        assert not accepts(grammar, text[:-cut]), text[:-cut]


@pytest.mark.parametrize("family,strategy", COMBOS)
def test_several_calls_only_when_parallel_calls_are_allowed(compiled, family: str, strategy: str) -> None:
    texts = [render(family, strategy, n, a) for n, a in VALID[:2]]
    both = joined(family, strategy, texts)
    assert accepts(compiled[(family, strategy, True)], both), both
    assert not accepts(compiled[(family, strategy, False)], both), both


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_prose_is_free_under_structural_tag_and_forbidden_under_ebnf(compiled, family: str) -> None:
    call = render(family, "structural_tag", *VALID[0])
    tagged, ebnf = compiled[(family, "structural_tag", False)], compiled[(family, "ebnf", False)]
    assert accepts(tagged, "The answer is 42.")  # a final answer needs no call
    assert accepts(tagged, "Let me check. " + call)
    assert not accepts(ebnf, "The answer is 42.")
    assert not accepts(ebnf, "Let me check. " + call)
    # once the trigger is written, the call must be valid
    assert not accepts(tagged, "Let me check. " + render(family, "structural_tag", *INVALID["unknown tool"]))


def test_qwen3_string_values_may_hold_markup_but_integers_only_digits(compiled) -> None:
    grammar = compiled[("qwen3", "ebnf", False)]
    adapter = get_adapter("qwen3")
    assert accepts(grammar, adapter.format_call("get_weather", {"city": "a < b && </c>"}))
    assert not accepts(grammar, adapter.format_call("get_weather", {"city": "x", "days": 2.5}))


def test_function_gemma_strings_cannot_contain_the_escape_token(compiled) -> None:
    grammar = compiled[("function_gemma", "ebnf", False)]
    ok = "<start_function_call>call:get_weather{city:<escape>a<esc<escap b<escape>}<end_function_call>"
    bad = "<start_function_call>call:get_weather{city:<escape>a<escape>b<escape>}<end_function_call>"
    assert accepts(grammar, ok) and not accepts(grammar, bad)


# ---- request shape --------------------------------------------------------------------------


def _keys(value: object) -> list[str]:
    if isinstance(value, dict):
        return [k for key, v in value.items() for k in (key, *_keys(v))]
    if isinstance(value, list):
        return [k for v in value for k in _keys(v)]
    return []


@pytest.mark.parametrize("family,strategy", COMBOS)
def test_request_extras_use_structured_outputs_and_never_guided_keys(family: str, strategy: str) -> None:
    extras = build_constraint(get_adapter(family), TOOLS, DecodingConstraint(strategy)).request_extras()
    assert not [k for k in _keys(extras) if k.startswith("guided_")]
    if family == "openai":
        # vLLM derives (and would overwrite) the constraint itself from tools + tool_choice=required
        assert (
            set(extras) == {"tools", "tool_choice", "parallel_tool_calls"}
            and extras["tool_choice"] == "required"
        )
        return
    assert set(extras) == {"extra_body"}
    (payload,) = extras["extra_body"].values()
    key = {"ebnf": "grammar", "json_schema": "json", "structural_tag": "structural_tag"}[strategy]
    assert list(payload) == [key]
    if strategy == "structural_tag":
        assert isinstance(payload[key], str) and json.loads(payload[key])["type"] == "structural_tag"
    if strategy == "ebnf":
        assert "::=" in payload[key]  # otherwise vLLM would take it for Lark


def test_send_tools_to_api_adds_tools_with_auto_choice_next_to_the_grammar() -> None:
    extras = build_constraint(
        get_adapter("hermes"), TOOLS, DecodingConstraint("structural_tag", send_tools_to_api=True)
    ).request_extras()
    assert extras["tool_choice"] == "auto" and [t["function"]["name"] for t in extras["tools"]] == [
        "get_weather",
        "add_entry",
    ]
    assert "structural_tag" in extras["extra_body"]["structured_outputs"]


def test_build_is_cached_by_digest_and_the_digest_tracks_the_tools() -> None:
    adapter = get_adapter("qwen3")
    a = build_constraint(adapter, TOOLS, DecodingConstraint())
    assert build_constraint(adapter, list(TOOLS), DecodingConstraint()) is a
    b = build_constraint(adapter, TOOLS[:1], DecodingConstraint())
    c = build_constraint(adapter, TOOLS, DecodingConstraint(allow_parallel_calls=True))
    assert len({a.digest, b.digest, c.digest}) == 3
    assert compile_constraint(a) is compile_constraint(a)


@pytest.mark.parametrize(
    "family,tools,constraint,fragment",
    [
        ("qwen3", [], DecodingConstraint(), "no tools"),
        ("openai", TOOLS, DecodingConstraint("ebnf"), "only supports strategy json_schema"),
        ("hermes", TOOLS, DecodingConstraint("json_schema", send_tools_to_api=True), "send_tools_to_api"),
        ("hermes", [WEATHER, WEATHER], DecodingConstraint(), "declared twice"),
        ("hermes", [ToolSchema("bad name", "", {})], DecodingConstraint(), "tool name"),
        (
            "qwen3",
            [ToolSchema("t", "", {"properties": {"a-b": {}}})],
            DecodingConstraint(),
            "parameter 'a-b'",
        ),
    ],
)
def test_unbuildable_constraints_raise_a_clear_error(family, tools, constraint, fragment) -> None:
    with pytest.raises(ConstraintError, match=fragment):
        build_constraint(get_adapter(family), tools, constraint)


def test_unknown_strategy_is_rejected() -> None:
    with pytest.raises(ConstraintError, match="unknown strategy 'regex'"):
        DecodingConstraint("regex")  # type: ignore[arg-type]


def test_a_payload_xgrammar_cannot_compile_is_a_constraint_error() -> None:
    broken = BuiltConstraint(
        "hermes", DecodingConstraint(), ("t",), {"grammar": "root ::= undefined_rule"}, {}, "broken"
    )
    with pytest.raises(ConstraintError, match="hermes/ebnf: xgrammar failed to compile"):
        compile_constraint(broken)


def test_token_level_masks_with_a_real_vocabulary() -> None:
    """With a tokenizer, the compiled grammar masks tokens: only tokens continuing a valid call pass."""
    vocab = [
        "<tool_call>",
        "\n",
        '{"name": "get_weather", "arguments": ',
        '{"city": "',
        "Paris",
        '"}',
        "}",
        "</tool_call>",
        "hello",
        "<|eos|>",
    ]
    info = xgr.TokenizerInfo(vocab, stop_token_ids=[len(vocab) - 1])
    grammar = compile_constraint(build_constraint(get_adapter("hermes"), TOOLS, DecodingConstraint()), info)
    matcher = xgr.GrammarMatcher(grammar)
    assert not matcher.accept_token(vocab.index("hello"))
    for token in [
        "<tool_call>",
        "\n",
        '{"name": "get_weather", "arguments": ',
        '{"city": "',
        "Paris",
        '"}',
        "}",
        "\n",
        "</tool_call>",
    ]:
        assert matcher.accept_token(vocab.index(token)), token
    assert matcher.accept_token(len(vocab) - 1) and matcher.is_terminated()
