"""Model adapters: one per model family (prompt format, call syntax, parser, constraint pieces).

    adapter = get_adapter("qwen3")
    messages = adapter.render(history, tools)
    reply = adapter.parse(completion.text, completion.tool_calls, tools)

`base` holds the contract every family implements, `arguments` the coercion of argument values by the
tool's schema, and one module per family the rest. Importing this package is cheap: nothing here
imports xgrammar, torch or openai.
"""

from __future__ import annotations

from runtime.model.adapters.base import ModelAdapter, ParsedCall, ParsedReply
from runtime.model.adapters.function_gemma import FunctionGemmaAdapter
from runtime.model.adapters.hermes import HermesAdapter
from runtime.model.adapters.openai import OpenAIAdapter
from runtime.model.adapters.qwen3 import Qwen3Adapter

ADAPTERS: dict[str, type[ModelAdapter]] = {
    cls.name: cls for cls in (Qwen3Adapter, HermesAdapter, FunctionGemmaAdapter, OpenAIAdapter)
}


class UnknownAdapterError(ValueError):
    """A bundle or command named a model family this runtime does not know."""


def get_adapter(name: str) -> ModelAdapter:
    """The adapter for a family name; an unknown name lists the known ones."""
    try:
        return ADAPTERS[name]()
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise UnknownAdapterError(f"unknown model adapter {name!r}; known adapters: {known}") from None


__all__ = ["ADAPTERS", "ModelAdapter", "ParsedCall", "ParsedReply", "UnknownAdapterError", "get_adapter"]
