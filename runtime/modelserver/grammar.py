"""The server side of decoding constraints: a request's `structured_outputs` or `response_format` turned
into an xgrammar `CompiledGrammar`, cached by content. (The client side, which builds those fields from a
model family's call syntax, is `runtime.model.constraints`.)

A constraint is first reduced to a `Constraint` value (kind + canonical text + options) so that two requests
asking for the same thing in different spellings (`structured_outputs.json` as a dict or as text,
`response_format` json_schema) share one compiled grammar. Compiling against the real 49k-token vocabulary
costs 80–300 ms, far more than decoding a short tool call's mask overhead, so agents that resend the same
tool schemas every turn must hit the cache.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Literal

from runtime.modelserver.protocol import ChatCompletionRequest, RequestError

Kind = Literal["json", "json_object", "regex", "grammar", "lark", "structural_tag", "structural_tag_legacy"]


@dataclass(frozen=True)
class Constraint:
    """What to enforce, in a canonical form whose hash is the cache key."""

    kind: Kind
    text: str
    any_whitespace: bool = True

    @property
    def key(self) -> str:
        raw = f"{self.kind}\0{int(self.any_whitespace)}\0{self.text}".encode()
        return hashlib.sha256(raw).hexdigest()


def _canonical_json(value: Any) -> str:
    """Compact JSON text. Key order is kept: xgrammar emits properties in schema order, so it is meaning."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _close_objects(schema: Any) -> Any:
    """vLLM's `disable_additional_properties`: every object schema without the key gets it set to false."""
    if isinstance(schema, dict):
        out = {k: _close_objects(v) for k, v in schema.items()}
        if (out.get("type") == "object" or "properties" in out) and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_close_objects(v) for v in schema]
    return schema


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise RequestError(f"{what} is not valid JSON: {e}") from None


def _structural(value: Any) -> Constraint:
    """A structural tag: the new `{"type": "structural_tag", "format": ...}` or the legacy structures form."""
    if not isinstance(value, dict):
        raise RequestError("structural_tag must be a JSON object")
    if "structures" in value:
        return Constraint("structural_tag_legacy", _canonical_json(value))
    return Constraint("structural_tag", _canonical_json(value))


def _is_ebnf(grammar: str) -> bool:
    """vLLM's rule: a grammar with no `::=` line is Lark."""
    return any("::=" in line for line in grammar.splitlines())


def constraint_for(req: ChatCompletionRequest) -> Constraint | None:
    """The request's constraint, or None for free text. Assumes `parse_chat_request` validated it."""
    so = req.structured_outputs
    if so is not None:
        ws = not so.disable_any_whitespace
        if so.json_ is not None:
            schema = (
                _load_json(so.json_, "structured_outputs.json") if isinstance(so.json_, str) else so.json_
            )
            if so.disable_additional_properties:
                schema = _close_objects(schema)
            return Constraint("json", _canonical_json(schema), ws)
        if so.json_object:
            return Constraint("json_object", "", ws)
        if so.regex is not None:
            return Constraint("regex", so.regex)
        if so.choice is not None:
            if not so.choice:
                raise RequestError("structured_outputs.choice must list at least one option")
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in so.choice)
            return Constraint("grammar", f"root ::= {alternatives}")
        if so.grammar is not None:
            return Constraint("grammar" if _is_ebnf(so.grammar) else "lark", so.grammar)
        if so.structural_tag is not None:
            return _structural(_load_json(so.structural_tag, "structured_outputs.structural_tag"))
    rf = req.response_format
    if rf is not None:
        if rf.type == "json_object":
            return Constraint("json_object", "")
        if rf.type == "json_schema" and rf.json_schema is not None:
            return Constraint("json", _canonical_json(rf.json_schema.schema_))
        if rf.type == "structural_tag":
            return _structural(rf.model_dump(exclude_none=True))
    return None


_XGR_PREFIX = re.compile(r"^\[[\d:]+\]\s*\S+:\d+:\s*")


def _clean(err: Exception) -> str:
    """xgrammar's C++ errors start with a timestamp and a source path; keep only the message."""
    return _XGR_PREFIX.sub("", str(err).strip())


class GrammarCache:
    """Compiles constraints for one tokenizer and keeps the most recent `max_entries` by content hash.

    Thread-safe: HTTP handlers compile in worker threads while the generation thread decodes.
    """

    def __init__(self, tokenizer_info: Any, *, max_entries: int = 64, max_threads: int = 2,
                 any_whitespace: bool = False) -> None:
        """`any_whitespace` is the server-wide rule for JSON constraints, as vLLM's engine-level
        `structured_outputs_config.disable_any_whitespace` (inverted) is for its xgrammar backend: off by
        default here, because with free whitespace a small model can run away in it (`"name"\n\n:\n\n`
        until `max_tokens`). Off means JSON with no whitespace between tokens, vLLM's separators `,` and
        `:`; a request's `structured_outputs.disable_any_whitespace` can only tighten the rule."""
        import xgrammar as xgr

        self._compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads, cache_enabled=False)
        self.any_whitespace = any_whitespace
        self._entries: OrderedDict[str, Any] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self.last_compile_seconds = 0.0
        self.hits = 0
        self.misses = 0

    def compile(self, c: Constraint) -> Any:
        """The compiled grammar for `c`; a grammar that does not compile is the client's error (400)."""
        key = c.key
        with self._lock:
            hit = self._entries.get(key)
            if hit is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return hit
        started = time.perf_counter()
        try:
            compiled = self._compile(c)
        except RequestError:
            raise
        except Exception as e:  # xgrammar raises RuntimeError/ValueError subclasses with C++ messages
            raise RequestError(f"the {c.kind} constraint does not compile: {_clean(e)}") from None
        with self._lock:
            self.last_compile_seconds = time.perf_counter() - started
            self.misses += 1
            self._entries[key] = compiled
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
        return compiled

    def _compile(self, c: Constraint) -> Any:
        import xgrammar as xgr

        comp = self._compiler
        free = c.any_whitespace and self.any_whitespace
        separators = None if free else (",", ":")  # as vLLM with disable_any_whitespace
        if c.kind == "json":
            return comp.compile_json_schema(c.text, any_whitespace=free, separators=separators)
        if c.kind == "json_object":  # as vLLM: any JSON *object*, not any JSON value
            return comp.compile_json_schema('{"type": "object"}', any_whitespace=free, separators=separators)
        if c.kind == "regex":
            return comp.compile_regex(c.text)
        if c.kind == "grammar":
            return comp.compile_grammar(c.text)
        if c.kind == "lark":
            return comp.compile_lark(c.text)
        if c.kind == "structural_tag":
            return comp.compile_structural_tag(c.text)
        legacy = json.loads(c.text)
        items = [
            xgr.StructuralTagItem(begin=s["begin"], schema=s.get("schema", {}), end=s["end"])
            for s in legacy["structures"]
        ]
        return comp.compile_structural_tag(items, legacy.get("triggers") or [])
