"""Conformance with vLLM: every request body the runtime can send, checked offline by vLLM's own code.

Runs where vLLM is importable: `make conformance` builds `.venv-vllm` (vLLM installed without its GPU
dependencies, beside this project's CPU torch) and runs this file there. Elsewhere it is skipped. The
vLLM version checked against is pinned in `.ci/vllm-conformance.txt`.

The bodies are the real ones: each is sent by `ModelClient` to the scripted server and read back as
it arrived. For every adapter x strategy x parallel calls x tools sent to the API x streaming:

- vLLM's `ChatCompletionRequest` accepts the body, and no key in it is unknown to vLLM (vLLM ignores
  unknown keys and decodes unconstrained, with HTTP 200) or deprecated;
- the constraint passes `validate_xgrammar_grammar`, the check vLLM runs before accepting a request;
- where the tools go beside our own constraint (`tool_choice: auto`), vLLM leaves our constraint alone;
- where vLLM builds the constraint from the tools (the openai adapter), the structural tag its hermes
  and qwen3_coder tool parsers build compiles, takes a valid call and refuses an argument the tool
  does not declare: the strict tools pin the schemas.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here: `make conformance` runs this check")

import xgrammar as xgr  # noqa: E402
from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: E402
from vllm.tool_parsers.structural_tag_registry import (  # noqa: E402
    get_model_structural_tag,
    limit_to_single_tool_call,
    resolve_tool_strictness,
)
from vllm.tool_parsers.tool_strict_level import ToolStrictLevel  # noqa: E402
from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar  # noqa: E402

from runtime import events as ev  # noqa: E402
from runtime import kernel  # noqa: E402
from runtime.bundle import _SAMPLING_KEYS  # noqa: E402
from runtime.model import STRATEGIES, DecodingConstraint, ModelStep, accepts, get_adapter  # noqa: E402
from runtime.model.client import ModelClient  # noqa: E402
from runtime.testing import ScriptedModelServer  # noqa: E402
from runtime.types import Message, ToolCall, ToolSchema  # noqa: E402
from tests.model.dialect_bodies import Drain  # noqa: E402

PIN = Path(__file__).parents[2] / ".ci" / "vllm-conformance.txt"

PLAN = ToolSchema(
    "plan_trip",
    "Plan a trip.",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 40},
            "days": {"type": "integer", "minimum": 1},
            "unit": {"type": "string", "enum": ["c", "f"]},
            "stops": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {"name": {"type": "string"}, "hours": {"type": "number"}},
                    "required": ["name"],
                },
            },
        },
        "required": ["city"],
    },
)
SUBMIT = ToolSchema(
    "submit_result",
    "Finish with the answer.",
    {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]},
)
TOOLS = (PLAN, SUBMIT)
HISTORY = (
    Message("system", "You plan trips."),
    Message("user", "Two days in Oslo?"),
    Message("assistant", "Planning.", tool_calls=(ToolCall("r/1.0", "plan_trip", {"city": "Oslo"}),)),
    Message("tool", '{"ok": true}', tool_call_id="r/1.0", name="plan_trip"),
)
# every sampling key a bundle may set, with a value
SAMPLING = {
    "temperature": 0.2, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "max_tokens": 256, "seed": 7,
    "stop": ["</s>"], "presence_penalty": 0.1, "frequency_penalty": 0.1, "repetition_penalty": 1.05,
}


def combos() -> list[tuple[str, DecodingConstraint | None]]:
    out: list[tuple[str, DecodingConstraint | None]] = []
    for family in ("qwen3", "hermes", "function_gemma"):
        for strategy in STRATEGIES:
            for parallel in (False, True):
                for send_tools in (False, True):
                    if strategy == "json_schema" and send_tools:
                        continue  # refused when the bundle loads
                    out.append((family, DecodingConstraint(strategy, parallel, send_tools)))
    out += [("openai", DecodingConstraint("json_schema", parallel)) for parallel in (False, True)]
    out += [("openai", None)]  # no constraint: the tools still go to the API
    return out


def name_of(family: str, constraint: DecodingConstraint | None) -> str:
    if constraint is None:
        return f"{family}/no-constraint"
    flags = ["parallel"] * constraint.allow_parallel_calls + ["send-tools"] * constraint.send_tools_to_api
    return "/".join([family, constraint.strategy, *flags])


def bodies(family: str, constraint: DecodingConstraint | None,
           offered: tuple[ToolSchema, ...] = TOOLS) -> dict[str, dict[str, Any]]:
    """What the runtime puts on the wire for this combination, streaming and not, as the server saw it;
    `offered` fewer than the tools is a forced last turn (the prompt keeps every tool, the constraint or a
    named `tool_choice` narrows the call)."""
    step = ModelStep(get_adapter(family), TOOLS, constraint)
    effect = kernel.CallModel("r/2", 2, 1, HISTORY, HISTORY[-1:], 1, offered, SAMPLING, None)

    async def send() -> list[dict[str, Any]]:
        with ScriptedModelServer(responder=lambda body: "ok") as server:
            async with ModelClient(base_url=server.base_url, model="m", max_retries=0) as client:
                outcome = await step.call(client, effect, "r")
                assert not isinstance(outcome, ev.ModelFailed), outcome
                streamed = await step.call(client, effect, "r", stream=Drain())  # type: ignore[arg-type]
                assert not isinstance(streamed, ev.ModelFailed), streamed
            return list(server.requests)

    plain, streamed = anyio.run(send)
    return {"plain": plain, "stream": streamed}


def test_the_installed_vllm_is_the_pinned_one() -> None:
    (pinned,) = re.findall(r"^vllm==(\S+)", PIN.read_text(), re.MULTILINE)
    assert vllm.__version__ == pinned, f"vLLM {vllm.__version__} installed, {pinned} pinned: make conformance"


def test_the_bodies_cover_every_sampling_key_a_bundle_accepts() -> None:
    assert set(SAMPLING) == set(_SAMPLING_KEYS)


COMBOS = combos()


@pytest.mark.parametrize("family,constraint", COMBOS, ids=[name_of(*c) for c in COMBOS])
def test_vllm_accepts_every_body_and_its_constraint(
    family: str, constraint: DecodingConstraint | None
) -> None:
    for mode, body in bodies(family, constraint).items():
        where = f"{name_of(family, constraint)} ({mode})"
        try:
            request = ChatCompletionRequest.model_validate(body)
        except Exception as exc:
            pytest.fail(f"{where}: vLLM's request model refuses the body: {exc}\n{json.dumps(body)[:2000]}")
        fields = ChatCompletionRequest.model_fields
        known = set(fields) | {f.alias for f in fields.values() if f.alias}
        assert not set(body) - known, f"{where}: keys vLLM would ignore: {sorted(set(body) - known)}"
        deprecated = sorted(k for k in body if k in fields and fields[k].deprecated)
        assert not deprecated, f"{where}: deprecated in vLLM's request model: {deprecated}"
        params = request.to_sampling_params(max_tokens=256, default_sampling_params={})
        try:
            validate_xgrammar_grammar(params)
        except Exception as exc:
            pytest.fail(f"{where}: vLLM's xgrammar check refuses the constraint: {exc}")
        if constraint is not None and family != "openai":
            assert params.structured_outputs is not None, f"{where}: no constraint reached vLLM"
        if request.tools and request.tool_choice == "auto" and request.structured_outputs is not None:
            # vLLM adds its own tool-call tag only for strict tools; ours stays the only constraint
            tools = resolve_tool_strictness(request.tools, "auto", ToolStrictLevel.AUTO)
            assert tools is None, f"{where}: vLLM would combine its tool-call format with our constraint"


LAST_TURN = [c for c in COMBOS if c[1] is not None]


@pytest.mark.parametrize("family,constraint", LAST_TURN, ids=[name_of(*c) for c in LAST_TURN])
def test_vllm_accepts_the_forced_last_turns_body(family: str, constraint: DecodingConstraint) -> None:
    """The forced last turn offers only the terminal tool and keeps the prompt's tools (the prefix cache):
    vLLM takes its body, a named `tool_choice` included, and its narrowed constraint compiles."""
    for mode, body in bodies(family, constraint, offered=(SUBMIT,)).items():
        where = f"{name_of(family, constraint)} last turn ({mode})"
        request = ChatCompletionRequest.model_validate(body)
        params = request.to_sampling_params(max_tokens=256, default_sampling_params={})
        validate_xgrammar_grammar(params)
        if family == "openai":
            assert body["tool_choice"] == {"type": "function", "function": {"name": SUBMIT.name}}, where
            assert [t["function"]["name"] for t in body["tools"]] == [t.name for t in TOOLS], where
            tag = _api_tag("hermes", request)  # vLLM's own tag (hermes parser) for a named function compiles
            assert tag is not None, where
        else:
            assert params.structured_outputs is not None, f"{where}: no constraint reached vLLM"


def _api_tag(model: str, request: ChatCompletionRequest) -> Any:
    tag = get_model_structural_tag(model, request.tools, request.tool_choice or "auto", reasoning=False)
    if request.parallel_tool_calls is False:
        limit_to_single_tool_call(tag)
    return xgr.GrammarCompiler(xgr.TokenizerInfo([])).compile_structural_tag(json.dumps(tag.model_dump()))


@pytest.mark.parametrize("parser,family", [("hermes", "hermes"), ("qwen_3_coder", "qwen3")])
@pytest.mark.parametrize("constraint", [DecodingConstraint("json_schema"), None], ids=["required", "auto"])
def test_vllm_tool_parsers_pin_the_openai_adapters_arguments(
    parser: str, family: str, constraint: DecodingConstraint | None
) -> None:
    """The tag vLLM's tool parser builds from our strict tools: the real schema, not any JSON."""
    body = bodies("openai", constraint)["plain"]
    request = ChatCompletionRequest.model_validate(body)
    assert all(t.function.strict is True for t in request.tools or [])
    compiled = _api_tag(parser, request)
    syntax = get_adapter(family)  # the model family's native call syntax, as the parser reads it
    every = {"city": "Oslo", "days": 2, "unit": None, "stops": [{"name": "museum", "hours": None}]}
    assert accepts(compiled, syntax.format_call("plan_trip", every))
    refused = {
        "an undeclared argument": {**every, "color": "red"},
        "a missing argument": {k: v for k, v in every.items() if k != "days"},
        "a wrong type": {**every, "days": "two"},
        "a value outside the enum": {**every, "unit": "k"},
        "an undeclared nested argument": {**every, "stops": [{"name": "m", "hours": None, "x": 1}]},
    }
    for what, arguments in refused.items():
        assert not accepts(compiled, syntax.format_call("plan_trip", arguments)), f"{parser}: {what} passed"
