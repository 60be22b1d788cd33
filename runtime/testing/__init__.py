"""What users need to test their bundles: a scripted OpenAI-compatible model server over real HTTP and the
helpers that write its replies.

- `ScriptedModelServer`  serves scripted replies in order, or from a `Responder` keyed on the request
- `Reply`                one reply: `Reply.of_text`, `Reply.tool_call`, `Reply.tool_calls_of`, `Reply.error`,
                         `Reply.drop`; a plain `str` is a text reply
- `hermes_call`          the text of a tool call as the `hermes` adapter parses it (text-family models)
- `last_message`         the last message of a request: what a responder keys its reply on
- `Capacity`             a server that is full: 429 with `Retry-After` beyond so many requests at once

This repository's own fault rig (network namespaces, latency proxy, fleets of `sa` processes, the checker)
lives in `testbed/` beside the tests and benches, and is not part of the installed package.
"""

from runtime.testing.capacity import Capacity
from runtime.testing.scripted_model import Reply, Responder, ScriptedModelServer, hermes_call, last_message

__all__ = ["Capacity", "Reply", "Responder", "ScriptedModelServer", "hermes_call", "last_message"]
