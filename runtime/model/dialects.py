"""Model-server dialects: the request fields through which each server enforces a decoding constraint.

    extras = translate("sglang", build_constraint(adapter, tools, constraint))   # or DialectError
    refusal("llamacpp", adapter, constraint)   # -> the message a bundle is refused with, or None

Why: a constraint only holds if the server reads the field it is sent in. vLLM reads `structured_outputs`;
every other server ignores that key without a word (HTTP 200, unconstrained output), so a bundle pointed at
one would run unconstrained while everything says it is constrained. So each endpoint has a declared
dialect (bundle.yaml `model.server`, or `auto`: asked once at start, `runtime.model.detect`), and each
(dialect, strategy) is either translated into the fields that server enforces, or refused at start with a
message naming the server, the strategy and the strategies it can enforce. Nothing is sent to be dropped.

What each server takes (its own request model is the reference; `make conformance` checks vLLM's and
SGLang's offline, tests/model/test_dialects.py the others' published schemas):

- `vllm`: `structured_outputs` {grammar | structural_tag | json}, as `runtime.model.constraints` builds it.
- `sglang`: the grammar in its top-level `ebnf` field (xgrammar EBNF: SGLang's default grammar backend is
  xgrammar), a structural tag as `response_format: {type: structural_tag, format}` (xgrammar's own form,
  which SGLang's request model takes), a JSON schema as `response_format: {type: json_schema, ...}`.
- `llamacpp` (llama.cpp's `llama-server` and llama-cpp-python's server): JSON schema only, as
  `response_format: {type: json_object, schema}`, the form both servers read. llama.cpp also takes a GBNF
  `grammar`, but our `ebnf` grammar is xgrammar's EBNF, which uses constructs GBNF lacks (lookahead
  assertions, xgrammar's built-in tag dispatch), and no GBNF parser is available offline to check a
  translation; so `ebnf` and `structural_tag` are refused there, not translated unchecked.
- `ollama`: JSON schema only (its OpenAI route turns `response_format: {type: json_schema}` into `format`).
- `tgi`: JSON schema only, `response_format: {type: json_schema, json_schema: {name, schema}}`.
- `lmstudio`: JSON schema only, `response_format: {type: json_schema, json_schema: {name, strict, schema}}`.
- `openai`: its own models write no other family's syntax: only the `openai` adapter (strict tools,
  `tool_choice: required`), whose arguments the API enforces.

The `openai` adapter (the server parses the calls) is accepted where the server builds the constraint from
strict tools and `tool_choice: required`: vLLM (checked by `make conformance`), SGLang and OpenAI (their
documented behaviour). llama-cpp-python's server answers `required` with HTTP 500, Ollama's OpenAI route
long had no `tool_choice`, and for TGI and LM Studio the enforcement of a forced call is not checked here:
refused.

`vllm` is the default: a bundle that names no server sends the very bytes it always sent.
"""

from __future__ import annotations

import json
from typing import Any, Literal, cast, get_args

from runtime.model.adapters.base import ModelAdapter
from runtime.model.constraints import (
    STRATEGIES,
    BuiltConstraint,
    ConstraintError,
    DecodingConstraint,
    Strategy,
)

#: what bundle.yaml's `model.server` may say: a dialect, or `auto` (asked once, at start); one flat Literal,
#: so that a wrong value is one problem at its YAML path
Server = Literal["vllm", "sglang", "llamacpp", "ollama", "tgi", "lmstudio", "openai", "auto"]
SERVERS: tuple[str, ...] = get_args(Server)
#: the request dialects, the one list of their names
DIALECTS: tuple[str, ...] = tuple(s for s in SERVERS if s != "auto")
DEFAULT = "vllm"

#: how a message names each server
TITLES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "ollama": "Ollama", "tgi": "TGI",
          "lmstudio": "LM Studio", "openai": "OpenAI"}

# the strategies each server enforces for a text family (the adapter parses the calls from text)
_TEXT: dict[str, tuple[str, ...]] = {
    "vllm": STRATEGIES,
    "sglang": STRATEGIES,
    "llamacpp": ("json_schema",),
    "ollama": ("json_schema",),
    "tgi": ("json_schema",),
    "lmstudio": ("json_schema",),
    "openai": (),
}
# the servers that build the constraint of a forced call from strict tools (the `openai` adapter)
_NATIVE = frozenset({"vllm", "sglang", "openai"})
# the name a translated JSON schema goes by (`response_format.json_schema.name`, OpenAI's [a-zA-Z0-9_-]{1,64})
SCHEMA_NAME = "tool_calls"


class DialectError(ConstraintError):
    """A constraint the bundle's server cannot enforce: refused at start (a bundle error)."""


def enforced(dialect: str, adapter: ModelAdapter) -> tuple[str, ...]:
    """The strategies `dialect`'s server enforces for this adapter."""
    if adapter.native_tool_calls:
        return ("json_schema",) if dialect in _NATIVE else ()
    return _TEXT[dialect]


def refusal(dialect: str, adapter: ModelAdapter, constraint: DecodingConstraint | None) -> str | None:
    """Why `dialect`'s server cannot enforce this constraint (None: it can; a constraint of None runs
    unconstrained, said so by the bundle, and every server can do that)."""
    if dialect not in DIALECTS:
        return f"unknown model server {dialect!r}; known: {', '.join(SERVERS)}"
    if constraint is None:
        return None
    can = enforced(dialect, adapter)
    if constraint.strategy in can:
        if constraint.send_tools_to_api and dialect not in ("vllm", "sglang"):
            return (f"{TITLES[dialect]} cannot take send_tools_to_api beside our constraint; drop "
                    "constraint.send_tools_to_api")
        return None
    title = TITLES[dialect]
    what = (f"the {adapter.name} adapter (the server parses the calls)" if adapter.native_tool_calls
            else f"the {adapter.name} adapter")
    if can:
        offer = f"it can enforce: {', '.join(can)}"
    elif adapter.native_tool_calls:
        offer = "it can enforce none for this adapter: use a text family (qwen3, hermes, function_gemma)"
    else:
        offer = "it can enforce none for this adapter" + (": use adapter openai" * (dialect in _NATIVE))
    return (f"{title} cannot enforce strategy {constraint.strategy} with {what}; {offer}; or set "
            "`constraint: {strategy: none}` to run unconstrained, recorded on every model request")


def translate(dialect: str, built: BuiltConstraint, adapter: ModelAdapter) -> dict[str, Any]:
    """The request extras (`ModelClient.complete`'s keyword arguments) that make `dialect`'s server enforce
    `built`; raises DialectError for a pair `refusal` refuses."""
    why = refusal(dialect, adapter, built.constraint)
    if why is not None:
        raise DialectError(f"{built.adapter}/{built.constraint.strategy}: {why}")
    extras = built.request_extras()
    if dialect == "vllm" or adapter.native_tool_calls:
        return extras  # vLLM's own fields; a forced call (`tools`, `tool_choice`) is the same everywhere
    extras.pop("extra_body", None)
    kind, value = next(iter(built.payload.items()))
    if dialect == "sglang":
        if kind == "grammar":
            extras["extra_body"] = {"ebnf": value}
        elif kind == "structural_tag":
            extras["response_format"] = json.loads(value)  # {"type": "structural_tag", "format": {...}}
        else:
            extras["response_format"] = _json_schema_format(value)
    elif dialect == "llamacpp":
        extras["response_format"] = {"type": "json_object", "schema": value}
    elif dialect == "lmstudio":
        extras["response_format"] = _json_schema_format(value, strict=True)
    else:  # ollama, tgi
        extras["response_format"] = _json_schema_format(value)
    return extras


def with_sampling(dialect: str, sampling: dict[str, Any], extras: dict[str, Any]
                  ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The sampling and extras of one request in `dialect`. The client sends a bundle's `max_tokens` as
    `max_completion_tokens` (vLLM and OpenAI deprecate the old name); TGI, Ollama, llama.cpp and LM Studio
    read only `max_tokens`, so there it goes by that name (not dropped: a dropped limit is a reply without
    end)."""
    if dialect not in _OLD_MAX_TOKENS or "max_tokens" not in sampling:
        return sampling, extras
    rest = dict(sampling)
    limit = rest.pop("max_tokens")
    return rest, {**extras, "extra_body": {**(extras.get("extra_body") or {}), "max_tokens": limit}}


_OLD_MAX_TOKENS = frozenset({"tgi", "ollama", "llamacpp", "lmstudio"})


def _json_schema_format(schema: Any, *, strict: bool | None = None) -> dict[str, Any]:
    inner: dict[str, Any] = {"name": SCHEMA_NAME}
    if strict is not None:
        inner["strict"] = strict
    inner["schema"] = schema
    return {"type": "json_schema", "json_schema": inner}


def table() -> list[tuple[str, str, str, str]]:
    """(server, adapter kind, strategy, verdict) for every pair: the docs' table, from the code. The verdict
    is `enforced` (sent in the server's native fields: vLLM's, or strict tools the server builds the
    constraint from), `translated` (into the fields that server enforces) or `refused` (at start)."""
    from runtime.model.adapters import get_adapter

    rows = []
    for dialect in DIALECTS:
        for adapter in (get_adapter("hermes"), get_adapter("openai")):
            strategies = ("json_schema",) if adapter.native_tool_calls else STRATEGIES
            for strategy in strategies:
                refused = refusal(dialect, adapter, DecodingConstraint(cast(Strategy, strategy)))
                kind = "server parses calls" if adapter.native_tool_calls else "text family"
                verdict = ("refused" if refused else
                           "enforced" if dialect == "vllm" or adapter.native_tool_calls else "translated")
                rows.append((dialect, kind, strategy, verdict))
    return rows


__all__ = ["DEFAULT", "DIALECTS", "SERVERS", "TITLES", "DialectError", "Server", "enforced", "refusal",
           "table", "translate", "with_sampling"]
