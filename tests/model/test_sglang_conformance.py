"""Conformance with SGLang: every body the runtime sends in SGLang's dialect, checked offline by its code.

Runs where SGLang is importable: `make conformance` builds `.venv-sglang` (SGLang installed without its GPU
dependencies, beside this project's CPU torch and xgrammar; pins in `.ci/sglang-conformance.txt`) and runs
this file there. Elsewhere it is skipped.

For every text family x strategy x parallel calls x tools sent to the API x streaming, and the `openai`
adapter: SGLang's `ChatCompletionRequest` takes the body, no key in it is unknown to SGLang (unknown keys are
ignored there: unconstrained output), and the sampling parameters SGLang derives from it
(`to_sampling_params`, what its scheduler compiles) carry our constraint unchanged: the grammar as `ebnf`,
the structural tag and the JSON schema as theirs. For the `openai` adapter, the constraint SGLang's own tool
parser builds from the strict tools (`FunctionCallParser.get_structure_constraint`) takes a valid call and
refuses an undeclared argument.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

pytest.importorskip("sglang", reason="SGLang is not installed here: `make conformance` runs this check")

import xgrammar as xgr
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
from sglang.srt.function_call.function_call_parser import FunctionCallParser

from runtime.model import STRATEGIES, DecodingConstraint, accepts
from tests.model.dialect_bodies import SUBMIT, TOOLS, bodies


def combos() -> list[tuple[str, DecodingConstraint]]:
    out = []
    for family in ("qwen3", "hermes", "function_gemma"):
        for strategy in STRATEGIES:
            for parallel in (False, True):
                for send_tools in (False, True):
                    if strategy == "json_schema" and send_tools:
                        continue  # refused when the bundle loads
                    out.append((family, DecodingConstraint(strategy, parallel, send_tools)))  # type: ignore[arg-type]
    return out + [("openai", DecodingConstraint("json_schema", parallel)) for parallel in (False, True)]


COMBOS = combos()


def name_of(family: str, c: DecodingConstraint) -> str:
    return "/".join([family, c.strategy, *["parallel"] * c.allow_parallel_calls,
                     *["send-tools"] * c.send_tools_to_api])


def _sampling(body: dict[str, Any]) -> tuple[ChatCompletionRequest, dict[str, Any]]:
    request = ChatCompletionRequest.model_validate(json.loads(json.dumps(body)))
    return request, request.to_sampling_params(stop=[], model_generation_config={})


@pytest.mark.parametrize("family,constraint", COMBOS, ids=[name_of(*c) for c in COMBOS])
def test_sglang_takes_every_body_and_keeps_its_constraint(
    family: str, constraint: DecodingConstraint,
) -> None:
    for offered in (TOOLS, (SUBMIT,)):
        for mode, body in bodies("sglang", family, constraint, offered=offered).items():
            where = f"{name_of(family, constraint)} ({mode}, {len(offered)} tools offered)"
            fields = ChatCompletionRequest.model_fields
            known = set(fields) | {f.alias for f in fields.values() if f.alias}
            assert not set(body) - known, f"{where}: keys SGLang would ignore: {sorted(set(body) - known)}"
            request, params = _sampling(body)
            if family == "openai":
                assert request.tool_choice == "required" or offered != TOOLS, where
                assert all(t.function.strict for t in request.tools or []), where
                continue
            if constraint.strategy == "ebnf":
                assert params["ebnf"] == body["ebnf"] and "::=" in params["ebnf"], where
            elif constraint.strategy == "structural_tag":
                tag = json.loads(params["structural_tag"])
                assert tag["format"]["type"] == "triggered_tags", where
                xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_structural_tag(params["structural_tag"])
            else:
                schema = json.loads(params["json_schema"])
                assert schema == body["response_format"]["json_schema"]["schema"], where


@pytest.mark.parametrize("parser", ["hermes", "qwen25"])
def test_sglangs_tool_parser_pins_the_openai_adapters_arguments(parser: str) -> None:
    """The constraint SGLang's tool parser builds for `tool_choice: required` from our strict tools (its
    legacy structural tag: one structure per tool, begin + the tool's arguments schema + end)."""
    body = bodies("sglang", "openai", DecodingConstraint("json_schema"))["plain"]
    request = ChatCompletionRequest.model_validate(body)
    kind, value = FunctionCallParser(request.tools, parser).get_structure_constraint(
        "required", parallel_tool_calls=False)
    assert kind == "structural_tag" and hasattr(value, "structures"), (kind, value)
    items = [xgr.StructuralTagItem(begin=s.begin, schema=json.dumps(s.schema_), end=s.end)
             for s in value.structures]
    compiled = xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_structural_tag(items, value.triggers)
    (plan,) = [s for s in value.structures if "plan_trip" in s.begin]
    call = {"city": "Oslo", "days": 2, "unit": None}
    assert accepts(compiled, plan.begin + json.dumps(call) + plan.end), f"{parser}: refused a valid call"
    for what, arguments in {"an undeclared argument": {**call, "color": "red"},
                            "a wrong type": {**call, "days": "two"},
                            "a missing argument": {"city": "Oslo"}}.items():
        text = plan.begin + json.dumps(arguments) + plan.end
        assert not accepts(compiled, text), f"{parser}: {what} passed"
