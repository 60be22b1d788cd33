"""Each model server gets the constraint in the fields it enforces, or the bundle is refused at start.

The bodies are the real ones (`tests/model/dialect_bodies.py`: sent through `ModelStep` and `ModelClient` to
the scripted server). Checked here, offline:

- the default dialect (vLLM) sends exactly the extras it always sent;
- every other server's body carries its own fields and nothing of vLLM's (`structured_outputs`, which those
  servers ignore without a word);
- the translated JSON schemas, grammars and tags, compiled by xgrammar, accept valid calls and refuse invalid
  ones, on the forced last turn too;
- each body against that server's published request schema: TGI's through `huggingface_hub`'s
  `ChatCompletionInput` (generated from TGI's OpenAPI spec; installed here); OpenAI's through the `openai`
  SDK's `CompletionCreateParams`; Ollama and LM Studio take OpenAI's `response_format` (their documented
  OpenAI-compatible routes), checked against the SDK's `ResponseFormatJSONSchema` and against the request
  fields their documentation lists (their OpenAI-compatibility pages; not installable as request models:
  Ollama's is Go, LM Studio's closed; the `ollama` package types Ollama's native `/api/chat`, not this route);
  llama.cpp's fields against its server's documented `response_format: {type: json_object, schema}` and
  `max_tokens` (its request model is C++; llama-cpp-python, whose server takes the same, builds from source
  for 16 minutes: not here). SGLang's own request model checks its bodies in `make conformance`
  (tests/model/test_sglang_conformance.py);
- a pair a server cannot enforce is refused at bundle load, naming the server, the strategy and what it
  can enforce; `strategy: none` runs unconstrained and every `model.requested` says so;
- `model.server: auto` asks the server once which one it is (each server's tell answered by the scripted
  server's `routes`), and the host records the dialect on every `model.requested`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from pydantic import TypeAdapter

from runtime import events as ev
from runtime import kernel
from runtime.bundle import BundleError, load_bundle
from runtime.model import (
    STRATEGIES,
    DecodingConstraint,
    ModelStep,
    accepts,
    build_constraint,
    compile_constraint,
    get_adapter,
)
from runtime.model.client import ModelClient
from runtime.model.constraints import load_xgrammar
from runtime.model.detect import detect
from runtime.model.dialects import DIALECTS, DialectError, enforced, refusal, table
from runtime.testing import ScriptedModelServer
from tests.model.dialect_bodies import INVALID_CALLS, SUBMIT, TOOLS, VALID_CALLS, bodies, dumps

FAMILIES = ("qwen3", "hermes", "function_gemma")


def _combos() -> list[tuple[str, str, DecodingConstraint]]:
    """(dialect, family, constraint) for every pair a server enforces, but vLLM's (its own conformance)."""
    out = []
    for dialect in DIALECTS:
        if dialect == "vllm":
            continue
        for family in (*FAMILIES, "openai"):
            for strategy in enforced(dialect, get_adapter(family)):
                for parallel in (False, True):
                    out.append((dialect, family, DecodingConstraint(strategy, parallel)))  # type: ignore[arg-type]
    return out


COMBOS = _combos()


def _id(combo: tuple[str, str, DecodingConstraint]) -> str:
    dialect, family, c = combo
    return f"{dialect}/{family}/{c.strategy}" + "/parallel" * c.allow_parallel_calls


def _compiler() -> Any:
    xgr = load_xgrammar("tests")
    return xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def _matches(compiled: Any, text: str) -> bool:
    return accepts(compiled, text)


# ---- the default is vLLM, byte for byte -------------------------------------------------------------

@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_the_default_dialect_sends_the_extras_it_always_sent(family: str, strategy: str) -> None:
    constraint = DecodingConstraint(strategy)  # type: ignore[arg-type]
    adapter = get_adapter(family)
    assert ModelStep(adapter, TOOLS, constraint).extras == build_constraint(adapter, TOOLS, constraint).extras
    assert "structured_outputs" in ModelStep(adapter, TOOLS, constraint).extras["extra_body"]


def test_a_bundle_without_server_speaks_vllm(tmp_path: Path) -> None:
    (tmp_path / "bundle.yaml").write_text("name: a\n")
    assert load_bundle(tmp_path / "bundle.yaml").spec.model.server == "vllm"


# ---- each server's own fields --------------------------------------------------------------------

@pytest.mark.parametrize("combo", COMBOS, ids=[_id(c) for c in COMBOS])
def test_each_server_gets_the_constraint_in_its_own_fields(
    combo: tuple[str, str, DecodingConstraint],
) -> None:
    dialect, family, constraint = combo
    for mode, body in bodies(dialect, family, constraint).items():
        where = f"{_id(combo)} ({mode})"
        assert "structured_outputs" not in body, f"{where}: vLLM's field, which {dialect} ignores"
        assert not [k for k in body if k.startswith("guided_")], where
        rf = body.get("response_format")
        if family == "openai":
            assert body["tool_choice"] == "required" and all(t["function"]["strict"] for t in body["tools"])
            assert rf is None, where
        elif dialect == "sglang" and constraint.strategy == "ebnf":
            assert "::=" in body["ebnf"] and rf is None, where
        elif dialect == "sglang" and constraint.strategy == "structural_tag":
            assert rf["type"] == "structural_tag" and rf["format"]["type"] == "triggered_tags", where
        elif dialect == "llamacpp":
            assert rf["type"] == "json_object" and rf["schema"]["anyOf"], where
        else:
            assert rf["type"] == "json_schema" and rf["json_schema"]["name"] == "tool_calls", where
            assert rf["json_schema"]["schema"]["anyOf"], where
            assert rf["json_schema"].get("strict") is (True if dialect == "lmstudio" else None), where
        if dialect in ("tgi", "ollama", "llamacpp", "lmstudio"):
            assert body["max_tokens"] == 256 and "max_completion_tokens" not in body, where
        else:
            assert body["max_completion_tokens"] == 256 and "max_tokens" not in body, where


# ---- the translated constraints hold ---------------------------------------------------------------

def _schema_of(dialect: str, body: dict[str, Any]) -> Any:
    rf = body["response_format"]
    return rf["schema"] if dialect == "llamacpp" else rf["json_schema"]["schema"]


JSON_DIALECTS = [d for d in DIALECTS if "json_schema" in enforced(d, get_adapter("hermes"))]


@pytest.mark.parametrize("dialect", JSON_DIALECTS)
def test_the_translated_schemas_accept_valid_calls_and_refuse_invalid_ones(dialect: str) -> None:
    compiler = _compiler()
    for parallel in (False, True):
        body = bodies(dialect, "hermes", DecodingConstraint("json_schema", parallel))["plain"]
        schema = _schema_of(dialect, body) if dialect != "vllm" else body["structured_outputs"]["json"]
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=True)
        for call in VALID_CALLS:
            assert _matches(compiled, dumps(call)), f"{dialect}: refused {call}"
        two = _matches(compiled, dumps(VALID_CALLS[:2]))
        assert two is parallel, f"{dialect}: two calls, parallel {parallel}"
        for what, call in INVALID_CALLS.items():
            assert not _matches(compiled, dumps(call)), f"{dialect}: {what} passed"
    last = bodies(dialect, "hermes", DecodingConstraint("json_schema"), offered=(SUBMIT,))["plain"]
    narrowed = _schema_of(dialect, last) if dialect != "vllm" else last["structured_outputs"]["json"]
    compiled = compiler.compile_json_schema(json.dumps(narrowed), any_whitespace=True)
    assert _matches(compiled, dumps(VALID_CALLS[2]))
    assert not _matches(compiled, dumps(VALID_CALLS[0])), f"{dialect}: the forced last turn took another tool"


@pytest.mark.parametrize("family", FAMILIES)
def test_sglangs_grammar_and_tag_hold_calls_to_the_tools(family: str) -> None:
    compiler, syntax = _compiler(), get_adapter(family)
    good = syntax.format_call("plan_trip", {"city": "Oslo", "days": 2})
    bad = syntax.format_call("book_hotel", {"city": "Oslo"})
    ebnf = compiler.compile_grammar(bodies("sglang", family, DecodingConstraint("ebnf"))["plain"]["ebnf"])
    assert _matches(ebnf, good) and not _matches(ebnf, bad) and not _matches(ebnf, "just prose")
    rf = bodies("sglang", family, DecodingConstraint("structural_tag"))["plain"]["response_format"]
    tag = compiler.compile_structural_tag(json.dumps(rf))
    assert _matches(tag, good) and _matches(tag, "just prose") and not _matches(tag, bad)


# ---- published request schemas ---------------------------------------------------------------------

# the request fields each server's OpenAI-compatible chat route documents (those our bodies may carry)
OLLAMA_FIELDS = {"model", "messages", "frequency_penalty", "presence_penalty", "response_format", "seed",
                 "stop", "stream", "stream_options", "temperature", "top_p", "max_tokens", "tools"}
LMSTUDIO_FIELDS = {"model", "messages", "top_p", "top_k", "temperature", "max_tokens", "stream", "stop",
                   "presence_penalty", "frequency_penalty", "logit_bias", "repeat_penalty", "seed",
                   "response_format", "tools", "tool_choice", "stream_options"}
LLAMACPP_FIELDS = {"model", "messages", "temperature", "top_p", "top_k", "min_p", "max_tokens", "stop",
                   "seed", "stream", "stream_options", "response_format", "grammar", "json_schema", "tools",
                   "tool_choice", "presence_penalty", "frequency_penalty", "parallel_tool_calls"}


def test_tgis_published_request_model_takes_its_bodies() -> None:
    """TGI's request model as `huggingface_hub` generates it from TGI's OpenAPI spec."""
    from huggingface_hub import ChatCompletionInput

    fields = set(ChatCompletionInput.__dataclass_fields__)
    for parallel in (False, True):
        for mode, body in bodies("tgi", "hermes", DecodingConstraint("json_schema", parallel)).items():
            assert not set(body) - fields, f"{mode}: keys TGI does not know: {sorted(set(body) - fields)}"
            request = TypeAdapter(ChatCompletionInput).validate_python(body)
            assert request.response_format.type == "json_schema"
            sent = body["response_format"]["json_schema"]["schema"]
            assert request.response_format.json_schema.schema == sent


def _openai_request(body: dict[str, Any]) -> Any:
    from openai.types.chat.completion_create_params import (
        CompletionCreateParamsNonStreaming,
        CompletionCreateParamsStreaming,
    )

    kind = CompletionCreateParamsStreaming if body.get("stream") else CompletionCreateParamsNonStreaming
    return TypeAdapter(kind).validate_python(body)


def test_openais_request_schema_takes_its_bodies() -> None:
    from openai.types.chat.completion_create_params import CompletionCreateParamsNonStreaming

    known = set(CompletionCreateParamsNonStreaming.__annotations__)
    for parallel in (False, True):
        for mode, body in bodies("openai", "openai", DecodingConstraint("json_schema", parallel)).items():
            assert not set(body) - known, f"{mode}: {sorted(set(body) - known)}"
            _openai_request(body)
            assert body["parallel_tool_calls"] is parallel


@pytest.mark.parametrize("dialect,fields", [("ollama", OLLAMA_FIELDS), ("lmstudio", LMSTUDIO_FIELDS)])
def test_ollama_and_lm_studio_take_openais_response_format(dialect: str, fields: set[str]) -> None:
    from openai.types.shared_params import ResponseFormatJSONSchema

    for mode, body in bodies(dialect, "hermes", DecodingConstraint("json_schema")).items():
        assert not set(body) - fields, f"{dialect} ({mode}): undocumented {sorted(set(body) - fields)}"
        TypeAdapter(ResponseFormatJSONSchema).validate_python(body["response_format"])
        _openai_request(body)


def test_llamacpps_documented_fields_take_its_bodies() -> None:
    for mode, body in bodies("llamacpp", "hermes", DecodingConstraint("json_schema")).items():
        assert not set(body) - LLAMACPP_FIELDS, f"{mode}: {sorted(set(body) - LLAMACPP_FIELDS)}"
        assert set(body["response_format"]) == {"type", "schema"}


# ---- refused, by name ------------------------------------------------------------------------------

def test_a_server_that_cannot_enforce_a_strategy_is_named_with_what_it_can() -> None:
    why = refusal("llamacpp", get_adapter("hermes"), DecodingConstraint("ebnf"))
    assert why is not None
    assert "llama.cpp" in why and "strategy ebnf" in why and "it can enforce: json_schema" in why
    assert "strategy: none" in why
    why = refusal("ollama", get_adapter("openai"), DecodingConstraint("json_schema"))
    assert why is not None and "Ollama" in why and "text family" in why
    why = refusal("openai", get_adapter("qwen3"), DecodingConstraint("json_schema"))
    assert why is not None and "OpenAI" in why and "use adapter openai" in why
    with pytest.raises(DialectError, match="TGI cannot enforce strategy structural_tag"):
        ModelStep(get_adapter("hermes"), TOOLS, DecodingConstraint("structural_tag"), dialect="tgi")


def _bundle(tmp: Path, model: str, constraint: str) -> Path:
    (tmp / "tools").mkdir(parents=True, exist_ok=True)
    (tmp / "tools" / "submit_result.pym").write_text(
        'def main(answer: str) -> dict:\n    """Finish."""\n    return {"answer": answer}\n')
    (tmp / "bundle.yaml").write_text(
        f"name: d\nmodel: {model}\nconstraint: {constraint}\ntools: ['tools/*.pym']\n"
        "termination: {terminal_tool: submit_result}\n")
    return tmp / "bundle.yaml"


def test_a_bundle_whose_server_cannot_enforce_its_strategy_is_refused_at_load(tmp_path: Path) -> None:
    with pytest.raises(BundleError) as err:
        load_bundle(_bundle(tmp_path, "{adapter: hermes, base_url: 'http://h:1/v1', server: llamacpp}",
                            "{strategy: ebnf}"))
    problems = dict(err.value.problems)
    assert "llama.cpp cannot enforce strategy ebnf" in problems["model.server"]
    assert "json_schema" in problems["model.server"]
    with pytest.raises(BundleError) as err:
        load_bundle(_bundle(tmp_path, "{adapter: hermes, server: vlm}", "{strategy: ebnf}"))
    assert "model.server" in dict(err.value.problems)
    ok = load_bundle(_bundle(tmp_path, "{adapter: hermes, server: llamacpp}", "{strategy: json_schema}"))
    assert ok.spec.model.server == "llamacpp"


def test_strategy_none_runs_unconstrained_and_every_request_says_so(tmp_path: Path) -> None:
    bundle = load_bundle(_bundle(tmp_path, "{adapter: hermes, server: ollama}", "{strategy: none}"))
    assert bundle.decoding_constraint() is None
    step = ModelStep.for_config(get_adapter("hermes"), bundle.kernel_config(), None, dialect="ollama")
    effect = kernel.CallModel("r/1", 1, 0, (), (), 0, TOOLS, {}, None)
    requested = step.requested(effect, "r")
    assert requested.unconstrained is True and requested.dialect == "ollama"
    constrained = ModelStep(get_adapter("hermes"), TOOLS, DecodingConstraint("json_schema"), dialect="ollama")
    assert constrained.requested(effect, "r").unconstrained is False


def test_an_old_model_requested_event_decodes_without_the_new_fields() -> None:
    import msgspec

    event = ev.stamp(ev.ModelRequested(run_id="r", request_id="r/1", turn=1), seq=1, actor="a")
    raw = msgspec.msgpack.decode(ev.encode(event))
    del raw["dialect"], raw["unconstrained"]
    old = ev.decode(msgspec.msgpack.encode(raw))
    assert isinstance(old, ev.ModelRequested) and old.dialect == "" and old.unconstrained is False


# ---- detection -------------------------------------------------------------------------------------

TELLS: dict[str, dict[str, Any]] = {
    "llamacpp": {"/props": {"default_generation_settings": {}, "total_slots": 1}},
    "ollama": {"/api/version": {"version": "0.12.0"}},
    "lmstudio": {"/api/v1/models": {"models": []}},
    "tgi": {"/info": {"model_id": "m", "version": "3.3.0"}},
    "sglang": {"/get_server_info": {"version": "0.5.23"}},
    "vllm": {"/version": {"version": "0.33.0"}},
}


@pytest.mark.parametrize("dialect", sorted(TELLS))
def test_auto_asks_the_server_which_it_is(dialect: str) -> None:
    with ScriptedModelServer(routes=TELLS[dialect]) as server:
        found, evidence = detect(server.base_url)
    assert found == dialect, evidence


def test_an_older_lm_studio_is_told_by_its_v0_route() -> None:
    with ScriptedModelServer(routes={"/api/v0/models": {"object": "list", "data": []}}) as server:
        assert detect(server.base_url)[0] == "lmstudio"


def test_llama_cpp_pythons_server_is_told_by_its_model_list() -> None:
    with ScriptedModelServer(routes={"/v1/models": {"object": "list", "data": [
            {"id": "x.gguf", "object": "model", "owned_by": "me", "permissions": []}]}}) as server:
        assert detect(server.base_url)[0] == "llamacpp"


def test_a_server_without_a_tell_is_an_error_that_says_to_set_the_server() -> None:
    with ScriptedModelServer() as server, pytest.raises(DialectError, match=r"set model\.server"):
        detect(server.base_url)


def test_auto_at_host_start_refuses_what_the_server_cannot_enforce_and_records_what_it_speaks(
    tmp_path: Path,
) -> None:
    from runtime.host import build_agent

    with ScriptedModelServer(["ok"], routes=TELLS["llamacpp"]) as server:
        url = server.base_url
        refused = load_bundle(_bundle(tmp_path / "a", f"{{adapter: hermes, base_url: '{url}', server: auto}}",
                                      "{strategy: ebnf}"))
        with pytest.raises(DialectError, match=r"llama\.cpp cannot enforce strategy ebnf"):
            build_agent(refused)
        model = f"{{adapter: hermes, base_url: '{url}', server: auto}}"
        served = build_agent(load_bundle(_bundle(tmp_path / "b", model, "{strategy: json_schema}")))
        assert served.step.dialect == "llamacpp"
        effect = kernel.CallModel("r/1", 1, 0, (), (), 0, served.config.tools, {"max_tokens": 9}, None)

        async def call() -> None:
            async with ModelClient(base_url=url, model="m", max_retries=0) as client:
                assert served.step.requested(effect, "r", client).dialect == "llamacpp"
                await served.step.call(client, effect, "r")

        anyio.run(call)
        await_body = server.requests[-1]
    assert await_body["response_format"]["type"] == "json_object" and await_body["max_tokens"] == 9


def test_a_host_leaves_out_a_bundle_its_server_cannot_enforce_and_serves_the_others(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Declared (`model.server: llamacpp` with `ebnf`) or found at start (`auto`): that bundle is left out
    with the refusal in the log, the host serves the rest; with nothing left, the refusal itself."""
    from runtime.host import load_agents

    with ScriptedModelServer(["ok"], routes=TELLS["llamacpp"]) as server:
        url = server.base_url
        good = _bundle(tmp_path / "good", f"{{adapter: hermes, base_url: '{url}', server: llamacpp}}",
                       "{strategy: json_schema}")
        declared = _bundle(tmp_path / "declared", f"{{adapter: hermes, base_url: '{url}', server: llamacpp}}",
                           "{strategy: ebnf}")
        found = _bundle(tmp_path / "found", f"{{adapter: hermes, base_url: '{url}', server: auto}}",
                        "{strategy: structural_tag}")
        for path, name in ((good, "good"), (declared, "declared"), (found, "found")):
            path.write_text(path.read_text().replace("name: d\n", f"name: {name}\n"))
        with caplog.at_level("ERROR", logger="runtime.host"):
            agents = load_agents([good, declared, found])
        assert list(agents) == ["good"]
        assert "llama.cpp cannot enforce strategy ebnf" in caplog.text
        assert "llama.cpp cannot enforce strategy structural_tag" in caplog.text
        with pytest.raises(BundleError, match=r"llama\.cpp cannot enforce strategy ebnf"):
            load_agents([declared])  # nothing left to serve: the refusal itself
        with pytest.raises(DialectError, match=r"cannot enforce strategy structural_tag"):
            load_agents([found])
    typo = _bundle(tmp_path / "typo", "{adapter: hermes, server: llamacpp}", "{strategy: ebnf}")
    typo.write_text(typo.read_text() + "bogus_key: 1\n")
    with pytest.raises(BundleError):
        load_agents([good, typo])  # a problem of the bundle itself beside it: the host stops, as before


def test_the_docs_table_is_the_codes() -> None:
    """docs/how-to/connect-model-server.md's table says what `refusal` does, cell by cell."""
    text = (Path(__file__).parents[2] / "docs" / "how-to" / "connect-model-server.md").read_text()
    for dialect, kind, strategy, verdict in table():
        row = f"| `{dialect}` | {kind} | `{strategy}` | {verdict}"
        assert row in text, f"the docs table lacks or contradicts: {row}"


def test_the_compiled_constraint_of_every_translated_step_builds() -> None:
    """Every enforced (dialect, family, strategy) builds a step whose digest compiles (the bundle check)."""
    for dialect, family, constraint in COMBOS:
        step = ModelStep(get_adapter(family), TOOLS, constraint, dialect=dialect)
        built = build_constraint(get_adapter(family), TOOLS, constraint)
        assert step.constraint_digest == built.digest
        compile_constraint(built)


def test_an_agent_in_one_process_speaks_its_servers_dialect(tmp_path: Path) -> None:
    """The in-process driver builds its step in the bundle's dialect, as a host does: SGLang gets its own
    `ebnf` field, never vLLM's `structured_outputs`; unconstrained it runs anywhere."""
    from runtime.agent import Agent

    client = ModelClient(base_url="http://127.0.0.1:9/v1", model="m")
    sglang = _bundle(tmp_path / "a", "{adapter: hermes, server: sglang}", "{strategy: ebnf}")
    agent = Agent(load_bundle(sglang), client=client)
    assert agent.dialect == "sglang"
    step = ModelStep.for_config(agent.adapter, agent.config, agent.constraint, dialect=agent.dialect)
    assert "ebnf" in step.extras.get("extra_body", {}) and "structured_outputs" not in str(step.extras)
    unconstrained = _bundle(tmp_path / "b", "{adapter: hermes, server: sglang}", "{strategy: none}")
    agent = Agent(load_bundle(unconstrained), client=client)
    assert agent.constraint is None
