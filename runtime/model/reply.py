"""A whole streamed reply, told from a cut one, whatever shape the server sent it in.

Why this needs saying: a stream is read chunk by chunk, and a stream that stops early looks, up to where it
stops, exactly like a short reply. Read naively, a connection closed after two chunks becomes a "complete"
reply whose half-written tool call (`add({})`) runs, or whose cut text (`sum=`) becomes a run's output;
and a server that ignores `"stream": true` and answers one `application/json` completion (several
OpenAI-compatible servers and proxies do) holds no server-sent event at all, so its reply, tool calls
included, reads as empty. Both then complete a run with the wrong output and exit 0.

What counts as the end of a streamed reply (both readers, `runtime.model.wire` and the SDK path in
`runtime.model.client`, record it in a `StreamEnd`; the client decides):

- a chunk with a `finish_reason` ends the reply (vLLM sends it, then a usage chunk when asked, then
  `data: [DONE]`; some servers never send `[DONE]`: their reply is whole at its `finish_reason`);
- `data: [DONE]` ends it too (a server that sends no `finish_reason` but says it is done);
- a body that ends with neither was cut: `StreamCut`, which the client retries like a connection error
  (so does a connection dropped in the middle of the body), and records as `model.failed` after its retries;
- an `application/json` body is one whole chat completion: `completion_chunk` turns it into the single
  chunk that carries all of it, so the client reads it as it reads any stream (and a streaming consumer
  sees the whole reply as one fragment). A JSON body that is not a chat completion fails the call, saying
  what the server sent, instead of passing for an empty reply.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec


class StreamCut(Exception):
    """A streamed reply ended before its end: neither a `finish_reason` nor `data: [DONE]` came, or the
    connection dropped in the middle of the body. Retryable: the next attempt may well arrive whole."""


class BrokenStream(StreamCut):
    """A server-sent event whose data is not JSON: the stream cannot be read on, so the attempt failed.
    Retryable as a stream cut short is (a proxy that garbled one response may not garble the next)."""


class TooSlow(Exception):
    """An attempt that did not finish within the client's timeout (`model.timeout`) as a whole: a server
    that trickles a token now and then never trips a read timeout, so the whole reply is bounded too."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"the whole reply did not arrive within model.timeout ({seconds:g} s)")
        self.seconds = seconds


class NotACompletion(ValueError):
    """A JSON body, sent for a streamed request, that is not a chat completion."""


@dataclass
class StreamEnd:
    """How a streamed response ended, as its reader saw it.

    `content_type` is None until the response's headers arrive (so a failure before then is a failure to
    reach the server, one after it a reply cut short); `done` is set once `data: [DONE]` arrives, or once a
    JSON body was read whole.
    """

    content_type: str | None = None
    done: bool = False

    def finish(self, finish_reason: str, chunks: int) -> str:
        """The reply's finish reason once its body has ended; `StreamCut` if it ended before its end."""
        if finish_reason:
            return finish_reason
        if self.done:
            return "stop"  # whole, and the server said no more (as a non-streamed reply without one reads)
        sent = "" if self.content_type is None or is_event_stream(self.content_type) else (
            f" (the server sent Content-Type {self.content_type!r}, not an event stream)")
        raise StreamCut(f"the stream ended after {chunks} chunk{'s' if chunks != 1 else ''} with neither a "
                        f"finish_reason nor data: [DONE]{sent}")


def is_json(content_type: str) -> bool:
    """Whether a Content-Type names a JSON body (`application/json`, any parameters, or a `+json` type)."""
    mime = content_type.partition(";")[0].strip().lower()
    return mime == "application/json" or mime.endswith("+json")


def is_event_stream(content_type: str) -> bool:
    return content_type.partition(";")[0].strip().lower() == "text/event-stream"


class _Function(msgspec.Struct):
    name: str = ""
    arguments: str = ""


class _ToolCall(msgspec.Struct):
    function: _Function
    id: str | None = None


class _Message(msgspec.Struct):
    content: str | None = None
    tool_calls: list[_ToolCall] | None = None


class _Choice(msgspec.Struct):
    message: _Message
    finish_reason: str | None = None


class _Usage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class _Completion(msgspec.Struct):
    """The fields of a chat completion a reply is made of; `choices` is required (without it the JSON is
    something else, an error object for instance)."""

    choices: list[_Choice]
    id: str | None = None
    model: str | None = None
    usage: _Usage | None = None


_completion = msgspec.json.Decoder(_Completion)


def completion_chunk(body: bytes) -> dict[str, Any]:
    """A whole JSON chat completion as the one stream chunk that carries all of it: the first choice's
    content and tool calls as its delta (each call with the `index` a streamed call has), its
    `finish_reason`, and the completion's usage, id and model. `NotACompletion` says what the server sent
    when the body is anything else."""
    try:
        reply = _completion.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise NotACompletion(f"the server answered a streamed request with a JSON body that is not a chat "
                             f"completion ({exc}): {_excerpt(body)}") from exc
    if not reply.choices:
        raise NotACompletion(f"the server answered a streamed request with a chat completion without "
                             f"choices: {_excerpt(body)}")
    choice = reply.choices[0]
    delta: dict[str, Any] = {"role": "assistant", "content": choice.message.content}
    if choice.message.tool_calls:
        delta["tool_calls"] = [
            {"index": index, "id": call.id or "", "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
            for index, call in enumerate(choice.message.tool_calls)]
    usage = None if reply.usage is None else {
        "prompt_tokens": reply.usage.prompt_tokens, "completion_tokens": reply.usage.completion_tokens}
    return {"id": reply.id, "model": reply.model, "usage": usage,
            "choices": [{"index": 0, "delta": delta, "finish_reason": choice.finish_reason}]}


def _excerpt(body: bytes, limit: int = 300) -> str:
    text = body.decode(errors="replace").strip()
    return text if len(text) <= limit else text[:limit] + f"... ({len(body)} bytes)"


__all__ = ["BrokenStream", "NotACompletion", "StreamCut", "StreamEnd", "TooSlow", "completion_chunk",
           "is_event_stream", "is_json"]
