"""Which part of a long conversation goes into the next model request.

A pure function of the conversation and one number, so the kernel can record the choice as a single
integer (`context_start` in `model.requested`) and a replay can rebuild the exact prompt without
storing it: events stay small and grow linearly with the conversation.

The sliding window keeps, always:
* the pinned head — the system prompt and the first user message (the task): without them the model
  forgets what it is doing;
* whole exchanges — an assistant message that made tool calls is never separated from the tool messages
  answering it. OpenAI-style servers reject a `tool` message whose call is missing, and a model that sees
  a result without its call misreads it.

So the window is a soft bound: when the cut would land inside an exchange, it moves back to the
assistant message that opened it, keeping the newest results complete rather than the count exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.types import Message


def pinned_count(messages: Sequence[Message]) -> int:
    """How many leading messages are always sent: everything up to and including the first user message."""
    for i, message in enumerate(messages):
        if message.role == "user":
            return i + 1
    return len(messages)


def window_start(messages: Sequence[Message], max_messages: int | None) -> int:
    """The index of the first non-pinned message to send; the prompt is `head + messages[start:]`.

    `max_messages` counts non-pinned messages (at least 1: the newest message is always sent); None (or
    a conversation that fits) sends everything.
    """
    head = pinned_count(messages)
    if max_messages is None or len(messages) - head <= max_messages:
        return head
    start = max(head, len(messages) - max(max_messages, 1))
    while start > head and messages[start].role == "tool":
        start -= 1  # inside an exchange: back up to the assistant message that made the calls
    return start


UNFINISHED = ("Error [cancelled]: this call did not finish: the run ended before it did (interrupted by a "
              "newer task, cancelled, or failed)")


def continued(messages: Sequence[Message]) -> tuple[Message, ...]:
    """The part of a finished run's conversation that the next run of its thread starts from: without
    the system prompt (the next run has its own, from its bundle), and with a result for every call of a
    trailing exchange that never got one (a run interrupted or cancelled mid-turn): a server rejects a
    call without its result, and the model should know the step was not done rather than not see it."""
    out = [m for m in messages if m.role != "system"]
    answered = {m.tool_call_id for m in out if m.role == "tool"}
    last = next((m for m in reversed(out) if m.role == "assistant" and m.tool_calls), None)
    if last is not None:
        out += [Message("tool", UNFINISHED, tool_call_id=c.id, name=c.name)
                for c in last.tool_calls if c.id not in answered]
    return tuple(out)


SUMMARY_HEAD = "Summary of the conversation so far:\n"


def summary_message(summary: str) -> Message:
    """How a thread's summary enters the conversation: as its first user message, so it is pinned (always
    sent, whatever the window) like a task."""
    return Message("user", SUMMARY_HEAD + summary)


def summary_cut(messages: Sequence[Message], keep: int) -> int:
    """How many leading messages a summary replaces so that about the newest `keep` stay as they are; the
    cut never separates tool results from the call that asked for them (it moves back to that call)."""
    cut = max(0, len(messages) - keep)
    while cut > 0 and messages[cut].role == "tool":
        cut -= 1
    return cut


def select(messages: Sequence[Message], max_messages: int | None) -> tuple[tuple[Message, ...], int]:
    """The messages to send and the `context_start` that explains the choice."""
    start = window_start(messages, max_messages)
    return tuple(messages[: pinned_count(messages)]) + tuple(messages[start:]), start
