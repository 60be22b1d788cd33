"""Tool schemas in strict form: what the openai adapter sends so the server enforces the argument schemas."""

from __future__ import annotations

import json
from typing import Any

import xgrammar as xgr

from runtime.model.adapters import get_adapter
from runtime.model.constraints import DecodingConstraint, build_constraint
from runtime.model.schemas import api_tools, strict_schema
from runtime.model.step import ModelStep
from runtime.types import ToolSchema

PLAN = ToolSchema(
    "plan_trip",
    "Plan a trip.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "days": {"type": "integer", "minimum": 1},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "ratio": {"type": "float"},
            "stops": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "hours": {"type": "int"}},
                    "required": ["name"],
                },
            },
            "notes": {"type": ["string", "null"]},
            "extra": {"type": "object"},
        },
        "required": ["city"],
    },
)


def objects_with_properties(schema: Any) -> list[dict[str, Any]]:
    """Every sub-schema that declares `properties`, depth first."""
    found: list[dict[str, Any]] = []
    if isinstance(schema, dict):
        if isinstance(schema.get("properties"), dict):
            found.append(schema)
        for value in schema.values():
            found.extend(objects_with_properties(value))
    elif isinstance(schema, list):
        for value in schema:
            found.extend(objects_with_properties(value))
    return found


def test_strict_schema_is_closed_and_lists_every_property_as_required() -> None:
    """OpenAI's strict mode rules for structure: every object closed, every property required."""
    schema = strict_schema(PLAN.parameters)
    objects = objects_with_properties(schema)
    assert len(objects) == 2  # the parameters and the items of `stops`
    for obj in objects:
        assert obj["additionalProperties"] is False
        assert obj["required"] == list(obj["properties"])
    assert schema["properties"]["extra"] == {"type": ["object", "null"]}  # a free-form object stays free
    assert PLAN.parameters["required"] == ["city"]  # the tool's own schema is not touched


def test_optional_properties_become_nullable_and_required_ones_stay_as_declared() -> None:
    props = strict_schema(PLAN.parameters)["properties"]
    assert props["city"] == {"type": "string", "maxLength": 40}
    assert props["days"] == {"type": ["integer", "null"], "minimum": 1}
    assert props["unit"] == {"anyOf": [{"type": "string", "enum": ["c", "f"]}, {"type": "null"}]}
    assert props["notes"] == {"type": ["string", "null"]}  # already nullable: unchanged
    assert props["stops"]["type"] == ["array", "null"]
    item = props["stops"]["items"]
    assert item["properties"]["name"] == {"type": "string"}
    assert item["properties"]["hours"] == {"type": ["integer", "null"]}


def test_type_names_that_are_not_json_schema_are_renamed() -> None:
    props = strict_schema(PLAN.parameters)["properties"]
    assert props["ratio"] == {"type": ["number", "null"]}


def test_the_openai_adapter_sends_every_function_strict() -> None:
    built = build_constraint(get_adapter("openai"), [PLAN], DecodingConstraint("json_schema"))
    (tool,) = built.request_extras()["tools"]
    assert tool["function"]["strict"] is True
    assert tool["function"]["parameters"] == strict_schema(PLAN.parameters)
    # without a constraint the openai adapter still sends its tools, strict
    (tool,) = ModelStep(get_adapter("openai"), [PLAN]).extras["tools"]
    assert tool["function"]["strict"] is True


def test_text_families_sending_tools_to_the_api_do_not_mark_them_strict() -> None:
    """Our own grammar types the arguments there; a strict tool would make vLLM add its own call format."""
    constraint = DecodingConstraint("ebnf", send_tools_to_api=True)
    built = build_constraint(get_adapter("hermes"), [PLAN], constraint)
    assert built.request_extras()["tools"] == api_tools([PLAN], strict=False) == [PLAN.to_openai()]



def test_the_strict_schema_compiles_and_admits_calls_with_nulls_for_what_is_not_given() -> None:
    from runtime.model.constraints import accepts

    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_json_schema(
        json.dumps(strict_schema(PLAN.parameters)), any_whitespace=False
    )
    full = {"city": "Oslo", "days": None, "unit": None, "ratio": 0.5, "stops": [{"name": "a", "hours": None}],
            "notes": None, "extra": {"any": [1]}}
    assert accepts(compiled, json.dumps(full))
    missing = {k: v for k, v in full.items() if k != "days"}
    assert not accepts(compiled, json.dumps(missing))  # strict: every key
    assert not accepts(compiled, json.dumps({**full, "city": None}))  # required
    assert not accepts(compiled, json.dumps({**full, "more": 1}))  # closed
