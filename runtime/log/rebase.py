"""A run's events re-addressed to another run: every id they carry re-derived (`kernel.rebase_id`).

What a fork's copied prefix (`RunLog.copy_prefix`) and a diff between a fork and its source
(`runtime.client.diff`) need: the same facts under the new run's ids, so the new run folds to exactly the
state the source had.
"""

from __future__ import annotations

from typing import Any

import msgspec

from runtime import events as ev
from runtime import kernel
from runtime.types import Message, ToolCall


def rebased(event: ev.Event, old_run: str, new_run: str) -> ev.Event:
    """`event` re-addressed from `old_run` to `new_run`, with every id it carries re-derived."""
    changes: dict[str, Any] = {"run_id": new_run, "ref": None}
    for name in event.__struct_fields__:
        value = getattr(event, name)
        if name in ("request_id", "call_id"):
            changes[name] = kernel.rebase_id(value, old_run, new_run)
        elif name == "call":
            changes[name] = _rebased_call(value, old_run, new_run)
        elif name == "calls":
            changes[name] = tuple(_rebased_call(c, old_run, new_run) for c in value)
        elif name == "messages":
            changes[name] = tuple(_rebased_message(m, old_run, new_run) for m in value)
    return msgspec.structs.replace(event, **changes)


def _rebased_call(call: ToolCall, old_run: str, new_run: str) -> ToolCall:
    return ToolCall(kernel.rebase_id(call.id, old_run, new_run), call.name, call.arguments)


def _rebased_message(message: Message, old_run: str, new_run: str) -> Message:
    if not message.tool_calls and message.tool_call_id is None:
        return message
    return msgspec.structs.replace(
        message, tool_calls=tuple(_rebased_call(c, old_run, new_run) for c in message.tool_calls),
        tool_call_id=(kernel.rebase_id(message.tool_call_id, old_run, new_run)
                      if message.tool_call_id is not None else None))


__all__ = ["rebased"]
