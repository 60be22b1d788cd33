"""Calling a model: everything between a kernel's `CallModel` effect and the events that record it.

- `adapters/`   one module per model family (qwen3, hermes, function_gemma, openai): the prompt format,
                the call syntax, its parser, and the pieces of the decoding constraint, as data
- `constraints` turns an adapter's description into an xgrammar constraint (strategies `ebnf`,
                `structural_tag`, `json_schema`) sent in vLLM's `structured_outputs`; compiles it to check it
- `dialects`    each model server's request fields for a constraint (vLLM, SGLang, llama.cpp, Ollama, TGI,
                LM Studio, OpenAI): translated into them, or refused at start naming what the server enforces
- `detect`      `model.server: auto`: which server it is, asked once at start by each server's cheap tell
- `ebnf`        the `ebnf` strategy's grammar text, derived by xgrammar in a child process (a host never
                imports xgrammar or torch)
- `schemas`     a tool's parameters schema shaped for decoding: closed for our grammars, strict (every
                function `"strict": true`) for the tools the server constrains itself
- `client`      `ModelClient`: one chat completion against any OpenAI-compatible server, with retries
- `sdk`         the openai SDK as the fallback transport (`SA_MODEL_HTTP=httpx`) and its HTTP client
- `connect`     `model_client(bundle)`: the `ModelClient` of a bundle's model (its server, name and key)
- `retries`     when a failed request is tried again and after how long (429/503: the server's Retry-After)
- `limits`      sharing a scarce endpoint: a fair queue (priority, then round robin across agents) in front
                of its permits, tokens per minute, an agent's daily token budget
- `reply`       what ends a streamed reply (a finish_reason or `[DONE]`; anything else was cut short), and a
                JSON completion sent for a streamed request read as the whole reply it is
- `step`        `ModelStep`: render, call, parse; the one model step of the run driver

    step = ModelStep(get_adapter("qwen3"), tools, DecodingConstraint("ebnf"))
    event = await step.call(ModelClient(base_url=url), effect, run_id)   # model.responded | .failed

Importing this package is cheap: xgrammar is imported only when a constraint is compiled or matched (an
`ebnf` grammar is derived in a child process unless this process has imported xgrammar already), and
openai only when a client name (`ModelClient`, `Completion`, `ModelError`) is first used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from runtime.model.adapters import ADAPTERS, UnknownAdapterError, get_adapter
from runtime.model.adapters.base import ModelAdapter, ParsedCall, ParsedReply
from runtime.model.constraints import (
    STRATEGIES,
    BuiltConstraint,
    ConstraintError,
    DecodingConstraint,
    Strategy,
    accepts,
    build_constraint,
    compile_constraint,
)
from runtime.model.step import ModelStep

if TYPE_CHECKING:
    from runtime.model.client import Completion, ModelClient, ModelError

_CLIENT_NAMES = ("Completion", "ModelClient", "ModelError")


def __getattr__(name: str) -> Any:
    """The client's names, imported on first use (the client imports openai, ~0.7 s)."""
    if name in _CLIENT_NAMES:
        return getattr(importlib.import_module("runtime.model.client"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ADAPTERS",
    "STRATEGIES",
    "BuiltConstraint",
    "Completion",
    "ConstraintError",
    "DecodingConstraint",
    "ModelAdapter",
    "ModelClient",
    "ModelError",
    "ModelStep",
    "ParsedCall",
    "ParsedReply",
    "Strategy",
    "UnknownAdapterError",
    "accepts",
    "build_constraint",
    "compile_constraint",
    "get_adapter",
]
