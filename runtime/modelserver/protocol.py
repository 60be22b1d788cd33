"""The request format we accept: OpenAI chat completions plus vLLM's `structured_outputs`, validated strictly.

vLLM logs unknown fields and answers 200 with unconstrained output, so a client still sending the removed
`guided_json` gets plausible-looking garbage. This server is the runtime's stand-in for vLLM, so it accepts
the same current format but turns every such mistake into a 400 that names the problem: removed `guided_*`
keys, two constraint keys, a misspelt key inside `structured_outputs`, an unknown top-level field.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator


class RequestError(Exception):
    """A client mistake: carries the HTTP status and an OpenAI-style error body."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = {400: "BadRequestError", 404: "NotFoundError", 503: "ServiceUnavailableError"}
        return {
            "error": {
                "message": self.message,
                "type": kind.get(self.status, "InvalidRequestError"),
                "param": self.param,
                "code": self.status,
            }
        }


CONSTRAINT_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")

# vLLM <= 0.11 request fields, removed in v0.12.0; each maps to its structured_outputs key.
REMOVED_GUIDED_KEYS = {
    "guided_json": "structured_outputs.json",
    "guided_regex": "structured_outputs.regex",
    "guided_choice": "structured_outputs.choice",
    "guided_grammar": "structured_outputs.grammar",
    "guided_whitespace_pattern": "structured_outputs.whitespace_pattern",
    "guided_decoding_backend": "nothing (the backend is chosen by the server)",
}

# OpenAI/vLLM fields that clients (the openai SDK among them) send routinely and that do not change
# decoding here; accepted and ignored rather than rejected.
IGNORED_FIELDS = frozenset({"user", "metadata", "store", "parallel_tool_calls", "service_tier"})


class StructuredOutputs(BaseModel):
    """vLLM's `StructuredOutputsParams`: exactly one constraint key, plus options."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def set_keys(self) -> list[str]:
        values = {
            "json": self.json_,
            "regex": self.regex,
            "choice": self.choice,
            "grammar": self.grammar,
            "json_object": self.json_object or None,
            "structural_tag": self.structural_tag,
        }
        return [k for k in CONSTRAINT_KEYS if values[k] is not None]


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = "response"
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI `response_format`, plus vLLM's structural_tag variants (new `format`, legacy `structures`)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    format: dict[str, Any] | None = None
    structures: list[dict[str, Any]] | None = None
    triggers: list[str] | None = None


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The fields of `POST /v1/chat/completions` this server understands."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = 1
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logprobs: bool = False
    ignore_eos: bool = False  # vLLM extra: generate until max_tokens

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        stops = [v] if isinstance(v, str) else v
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        return stops

    @property
    def stop_strings(self) -> list[str]:
        return list(self.stop or [])  # a str `stop` is normalised to a list by the validator

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def _first_error(err: ValidationError) -> str:
    parts = []
    for e in err.errors()[:3]:
        loc = ".".join(str(p) for p in e["loc"]) or "body"
        msg = "unknown field (not accepted by this server)" if e["type"] == "extra_forbidden" else e["msg"]
        parts.append(f"{loc}: {msg}")
    return "; ".join(parts)


def parse_chat_request(raw: bytes) -> ChatCompletionRequest:
    """Decode and validate a request body, raising `RequestError` with a message a person can act on."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(f"request body is not valid JSON: {e}") from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    for key, instead in REMOVED_GUIDED_KEYS.items():
        if key in body:
            raise RequestError(
                f"`{key}` was removed in vLLM 0.12 and is not accepted here; use {instead} instead",
                param=key,
            )
    for key in IGNORED_FIELDS:
        body.pop(key, None)
    try:
        req = ChatCompletionRequest.model_validate(body)
    except ValidationError as e:
        raise RequestError(f"invalid request: {_first_error(e)}") from None
    _check_semantics(req)
    return req


def _check_semantics(req: ChatCompletionRequest) -> None:
    if req.n != 1:
        raise RequestError("only n=1 is supported", param="n")
    if req.logprobs:
        raise RequestError("logprobs are not supported by this server", param="logprobs")
    if req.frequency_penalty or req.presence_penalty:
        raise RequestError("frequency_penalty and presence_penalty are not supported (use 0)")
    if req.tool_choice not in (None, "auto", "none"):
        raise RequestError(
            "tool_choice 'required' or a named function is not supported here; constrain the call with "
            "structured_outputs (json or structural_tag) instead",
            param="tool_choice",
        )
    so = req.structured_outputs
    if so is not None:
        keys = so.set_keys()
        if len(keys) != 1:
            found = ", ".join(keys) if keys else "none"
            raise RequestError(
                f"structured_outputs needs exactly one of {', '.join(CONSTRAINT_KEYS)}; found {found}",
                param="structured_outputs",
            )
        if so.whitespace_pattern is not None:
            raise RequestError(
                "structured_outputs.whitespace_pattern is not supported by the xgrammar backend",
                param="structured_outputs.whitespace_pattern",
            )
    rf = req.response_format
    if rf is not None and rf.type != "text":
        if so is not None:
            raise RequestError(
                "give either response_format or structured_outputs, not both", param="response_format"
            )
        if rf.type == "json_schema" and (rf.json_schema is None or rf.json_schema.schema_ is None):
            raise RequestError(
                "response_format json_schema needs json_schema.schema", param="response_format"
            )
        if rf.type == "structural_tag" and rf.format is None and rf.structures is None:
            raise RequestError(
                "response_format structural_tag needs `format` or `structures`", param="response_format"
            )
    for i, m in enumerate(req.messages):
        if not isinstance(m.get("role"), str):
            raise RequestError(f"messages[{i}] has no role", param=f"messages.{i}.role")
