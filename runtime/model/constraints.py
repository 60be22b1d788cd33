"""Decoding constraints: force the model to write valid tool calls, in its own native syntax.

    constraint = DecodingConstraint(strategy="ebnf", allow_parallel_calls=False)
    built = build_constraint(get_adapter("qwen3"), tools, constraint)
    built.request_extras()   # -> {"extra_body": {"structured_outputs": {"grammar": "..."}}}
    compile_constraint(built)   # xgrammar compiles it once; a bad constraint fails here, at startup

Three strategies, named by what the model may write:

- `ebnf`: nothing but tool calls (one, or one or more with `allow_parallel_calls`). Sent as
  `{"grammar": <xgrammar EBNF>}`. The model must call a tool, so agents end through a terminal
  tool such as `submit_result`.
- `structural_tag`: free prose, and whenever the model starts a call (the family's trigger, e.g.
  `<tool_call>`), that call must be complete and valid. Sent as `{"structural_tag": "<json text>"}`.
  A reply with no call is a final answer for an agent without a terminal tool; with one, the kernel
  tells the model to call it and asks again (`runtime.kernel`, `no_terminal_call`).
- `json_schema`: one JSON document `{"name": ..., "arguments": {...}}` (an array of them with
  `allow_parallel_calls`). Sent as `{"json": <schema>}`. Every adapter parses this form.

In every strategy the arguments are typed by the tool's JSON schema inside the constraint (xgrammar
derives those sub-grammars), and an argument the schema does not declare is rejected.

The payload goes in vLLM's current field, `extra_body={"structured_outputs": {...}}`. The old
`guided_*` fields were removed in vLLM 0.12 and are silently ignored there, which means unconstrained
output with HTTP 200: this module never emits them.

With `send_tools_to_api` (and always for the `openai` adapter) the request also carries `tools=`.

- Text families send `tool_choice="auto"` plus our grammar, so vLLM's tool parser turns the native
  calls into `tool_calls`. The tools are not marked strict: our grammar already types every argument,
  and a strict tool would make vLLM 0.33 offer its own call format beside ours (its tool-call tag OR
  our grammar), which ignores our one-call limit.
- The `openai` adapter sends `tool_choice="required"` and no `structured_outputs`: the server builds
  the constraint from `tools` (vLLM replaces any `structured_outputs` for a forced call). The server
  enforces the argument schemas only for functions marked `"strict": true` (vLLM 0.33's hermes and
  qwen3_coder tool parsers otherwise take the arguments as any JSON), so every function is sent strict,
  with its schema in strict form (`runtime.model.schemas`). `payload` then holds the equivalent JSON
  schema of the calls, so the bundle can still be compile-checked.

xgrammar (which imports torch, about 2.5 s and 220 MB) is imported only inside the functions that need it,
and the `ebnf` strategy's grammar text is derived by it in a short-lived child process
(`runtime.model.ebnf`), so a host never holds it. It is in the `model` extra: without it the `ebnf` strategy
and compile checks raise ConstraintError naming the pip command, while `structural_tag` and `json_schema`
payloads are built without it (the server compiles them).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args

import msgspec

from runtime.model.adapters.base import ModelAdapter
from runtime.model.schemas import api_tools, closed_schema, strict_schema
from runtime.types import ToolSchema, digest_of

if TYPE_CHECKING:
    import xgrammar

#: the decoding strategies, the one list of their names (bundle.yaml's `constraint.strategy` uses it too)
Strategy = Literal["ebnf", "structural_tag", "json_schema"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


class ConstraintError(ValueError):
    """A constraint that cannot be built or does not compile: a bundle error, reported at startup."""


class DecodingConstraint(msgspec.Struct, frozen=True):
    """How the model's output is constrained (see the module docstring for what each strategy allows)."""

    strategy: Strategy = "ebnf"
    allow_parallel_calls: bool = False
    send_tools_to_api: bool = False

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConstraintError(f"unknown strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")


class BuiltConstraint(msgspec.Struct, frozen=True):
    """A constraint made concrete for one adapter and tool set.

    `payload` is the `structured_outputs` object; `extras` are the exact keyword arguments for
    `ModelClient.complete` (what goes on the wire); `digest` keys the compile cache and is recorded in
    `model.requested` events.
    """

    adapter: str
    constraint: DecodingConstraint
    tool_names: tuple[str, ...]
    payload: dict[str, Any]
    extras: dict[str, Any]
    digest: str

    @property
    def kind(self) -> str:
        """Which `structured_outputs` key the payload uses: grammar, json or structural_tag."""
        return next(iter(self.payload))

    def request_extras(self) -> dict[str, Any]:
        """Keyword arguments for `ModelClient.complete`: a copy of `extras` that callers may mutate."""
        return json.loads(json.dumps(self.extras))


_built: dict[str, BuiltConstraint] = {}
_built_lock = threading.Lock()


def build_constraint(
    adapter: ModelAdapter, tools: Sequence[ToolSchema], constraint: DecodingConstraint
) -> BuiltConstraint:
    """The request payload for these tools; cached by digest (adapter, constraint, tools)."""
    tools = list(tools)
    digest = digest_of(
        {
            "adapter": adapter.name,
            "constraint": msgspec.to_builtins(constraint),
            "tools": [t.to_openai() for t in tools],
        }
    )
    with _built_lock:
        cached = _built.get(digest)
    if cached is not None:
        return cached
    built = _build(adapter, tools, constraint, digest)
    with _built_lock:
        _built[digest] = built
    return built


def _build(
    adapter: ModelAdapter, tools: list[ToolSchema], constraint: DecodingConstraint, digest: str
) -> BuiltConstraint:
    where = f"{adapter.name}/{constraint.strategy}"
    if not tools:
        raise ConstraintError(f"{where}: no tools to constrain calls to")
    _check_names(adapter, tools, where)
    parallel = constraint.allow_parallel_calls
    extras: dict[str, Any] = {}
    payload: dict[str, Any]
    if adapter.native_tool_calls:
        if constraint.strategy != "json_schema":
            raise ConstraintError(
                f"{where}: the openai adapter only supports strategy json_schema (the server builds "
                "the constraint from `tools`); use a text family (qwen3, hermes, function_gemma) for "
                "ebnf or structural_tag"
            )
        payload = {"json": _api_calls_schema(tools, parallel)}
        extras = {
            "tools": api_tools(tools, strict=True),
            "tool_choice": "required",
            "parallel_tool_calls": parallel,
        }
        return BuiltConstraint(
            adapter.name, constraint, tuple(t.name for t in tools), payload, extras, digest
        )

    if constraint.strategy == "json_schema":
        if constraint.send_tools_to_api:
            raise ConstraintError(
                f"{where}: send_tools_to_api needs the model's native call syntax (ebnf or structural_tag); "
                "with json_schema the server's tool parser would find no calls"
            )
        payload = {"json": _json_calls_schema(tools, parallel)}
    else:
        tags = adapter.call_tags(tools)
        if constraint.strategy == "structural_tag":
            fmt = {
                "type": "triggered_tags",
                "triggers": [adapter.call_trigger],
                "tags": tags,
                "at_least_one": False,
                "stop_after_first": not parallel,
            }
            payload = {
                "structural_tag": json.dumps({"type": "structural_tag", "format": fmt}, ensure_ascii=False)
            }
        else:
            payload = {"grammar": _ebnf_from_tag(_calls_only_document(adapter, tags, parallel), where)}
    extras["extra_body"] = {"structured_outputs": payload}
    if constraint.send_tools_to_api:
        extras["tools"] = api_tools(tools, strict=False)
        extras["tool_choice"] = "auto"
    return BuiltConstraint(adapter.name, constraint, tuple(t.name for t in tools), payload, extras, digest)


def _check_names(adapter: ModelAdapter, tools: list[ToolSchema], where: str) -> None:
    seen: set[str] = set()
    for tool in tools:
        if not _NAME.match(tool.name):
            raise ConstraintError(f"{where}: tool name {tool.name!r} must match {_NAME.pattern}")
        if tool.name in seen:
            raise ConstraintError(f"{where}: tool {tool.name!r} is declared twice")
        seen.add(tool.name)
        if not isinstance(tool.parameters, dict):
            raise ConstraintError(f"{where}: tool {tool.name!r} parameters must be a JSON schema object")
        pattern = adapter.parameter_name_pattern
        if pattern is not None:
            for param in tool.parameters.get("properties") or {}:
                if not re.match(pattern, param):
                    raise ConstraintError(
                        f"{where}: tool {tool.name!r} parameter {param!r} cannot be written in "
                        f"{adapter.name}'s call syntax (must match {pattern})"
                    )


def _json_calls_schema(tools: list[ToolSchema], parallel: bool) -> dict[str, Any]:
    """`{"name": <const>, "arguments": <tool schema>}` for any tool; an array of them when parallel."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": closed_schema(t.parameters)},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    one = variants[0] if len(variants) == 1 else {"anyOf": variants}
    if not parallel:
        return one
    return {"anyOf": [one, {"type": "array", "items": one, "minItems": 1}]}


def _api_calls_schema(tools: list[ToolSchema], parallel: bool) -> dict[str, Any]:
    """The calls a server may return for `tool_choice="required"` and strict tools, as vLLM's JSON form
    of them: an array of `{name, parameters}`, each `parameters` the tool's strict schema."""
    variants = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.name]},
                "parameters": strict_schema(t.parameters),
            },
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    if not parallel:
        schema["maxItems"] = 1
    return schema


def _require_model(what: str) -> None:
    """Raise a ConstraintError saying how to install xgrammar unless it is importable (found without
    importing it: it is in the `model` extra, because it requires torch; hosts and workers install
    without it)."""
    from runtime.extras import MissingExtra, require

    try:
        require("model", what)
    except MissingExtra as exc:
        raise ConstraintError(str(exc)) from None


def load_xgrammar(what: str) -> Any:
    """The xgrammar module, or a ConstraintError saying how to install it."""
    _require_model(what)
    import xgrammar

    return xgrammar


# ---- the ebnf strategy's grammar text ---------------------------------------------------------

#: structural-tag document -> (derived, EBNF text or xgrammar's error): derived once per process
_ebnf_texts: dict[str, tuple[bool, str]] = {}
_ebnf_lock = threading.Lock()


def _calls_only_document(adapter: ModelAdapter, tags: list[dict[str, Any]], parallel: bool) -> str:
    """The structural tag of the ebnf strategy (nothing but calls), as the JSON text xgrammar reads."""
    fmt = {
        "type": "tags_with_separator",
        "tags": tags,
        "separator": adapter.call_separator,
        "at_least_one": True,
        "stop_after_first": not parallel,
    }
    return json.dumps({"type": "structural_tag", "format": fmt})


def _derive(docs: list[str], where: str) -> None:
    """Derive the grammars of `docs` (one child process for all of them, see `runtime.model.ebnf`)."""
    from runtime.model.ebnf import derive

    what = f"{where}: deriving the grammar of the ebnf strategy (xgrammar)"
    _require_model(what)
    try:
        results = derive(docs)
    except RuntimeError as exc:
        raise ConstraintError(f"{what}: {exc}") from None
    with _ebnf_lock:
        _ebnf_texts.update(zip(docs, results, strict=True))


def _ebnf_from_tag(doc: str, where: str) -> str:
    """EBNF text for a calls-only structural tag, written by xgrammar (typed argument rules)."""
    with _ebnf_lock:
        found = _ebnf_texts.get(doc)
    if found is None:
        _derive([doc], where)
        with _ebnf_lock:
            found = _ebnf_texts[doc]
    ok, text = found
    if not ok:
        raise ConstraintError(f"{where}: xgrammar could not build the grammar: {text}")
    return text


def prepare_constraints(
    wanted: Iterable[tuple[ModelAdapter, Sequence[ToolSchema], DecodingConstraint | None]],
) -> None:
    """Derive the grammars of several (adapter, tools, constraint) at once, so a process that will build
    them (a host: every bundle's full tool set and its forced last turn's) pays for one xgrammar child, at
    start, and never one on a task's path. One that cannot be built is skipped here: `build_constraint`
    reports its error."""
    docs: list[str] = []
    where = ""
    for adapter, tool_set, constraint in wanted:
        if constraint is None or constraint.strategy != "ebnf" or adapter.native_tool_calls:
            continue
        tools = list(tool_set)
        try:
            _check_names(adapter, tools, f"{adapter.name}/{constraint.strategy}")
            doc = _calls_only_document(adapter, adapter.call_tags(tools), constraint.allow_parallel_calls)
        except Exception:  # reported by build_constraint, with its own message
            continue
        if not tools:
            continue
        with _ebnf_lock:
            known = doc in _ebnf_texts
        if not known and doc not in docs:
            docs.append(doc)
            where = where or f"{adapter.name}/{constraint.strategy}"
    if docs:
        _derive(docs, where)


# ---- compiling --------------------------------------------------------------------------------

_compiled: dict[tuple[str, int], Any] = {}
_compilers: dict[int, tuple[Any, Any]] = {}  # id(tokenizer_info) -> (tokenizer_info, compiler)
_compile_lock = threading.Lock()
_empty_tokenizer: Any = None


def _compiler(tokenizer_info: Any) -> tuple[int, Any]:
    xgr = load_xgrammar("compiling a decoding constraint (xgrammar)")

    global _empty_tokenizer
    if tokenizer_info is None:
        if _empty_tokenizer is None:
            _empty_tokenizer = xgr.TokenizerInfo([])
        tokenizer_info = _empty_tokenizer
    key = id(tokenizer_info)
    entry = _compilers.get(key)
    if entry is None:
        # keep a reference to the tokenizer so its id cannot be reused while cached
        entry = (tokenizer_info, xgr.GrammarCompiler(tokenizer_info, max_threads=2, cache_enabled=False))
        _compilers[key] = entry
    return key, entry[1]


def compile_constraint(built: BuiltConstraint, tokenizer_info: xgrammar.TokenizerInfo | None = None) -> Any:
    """Compile the payload with xgrammar, once per (digest, tokenizer); raise ConstraintError if it fails.

    Without a tokenizer an empty vocabulary is used: enough to prove the constraint compiles and to
    match strings (`accepts`); pass the model's `TokenizerInfo` to get token masks.
    """
    with _compile_lock:
        key, compiler = _compiler(tokenizer_info)
        cached = _compiled.get((built.digest, key))
        if cached is not None:
            return cached
        where = f"{built.adapter}/{built.constraint.strategy}"
        try:
            if built.kind == "grammar":
                compiled = compiler.compile_grammar(built.payload["grammar"])
            elif built.kind == "json":
                compiled = compiler.compile_json_schema(
                    json.dumps(built.payload["json"]), any_whitespace=True
                )
            elif built.kind == "structural_tag":
                compiled = compiler.compile_structural_tag(built.payload["structural_tag"])
            else:  # pragma: no cover - build_constraint only makes the three kinds above
                raise ConstraintError(f"{where}: unknown payload kind {built.kind!r}")
        except ConstraintError:
            raise
        except Exception as exc:
            raise ConstraintError(f"{where}: xgrammar failed to compile the constraint: {exc}") from exc
        _compiled[(built.digest, key)] = compiled
        return compiled


def accepts(compiled: Any, text: str) -> bool:
    """Whether `text` is a complete output the compiled constraint allows (string level; for tests/CLI)."""
    xgr = load_xgrammar("matching text against a constraint (xgrammar)")

    matcher = xgr.GrammarMatcher(compiled, terminate_without_stop_token=True)
    return bool(matcher.accept_string(text)) and matcher.is_terminated()
