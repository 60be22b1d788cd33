"""What a recorded run did that its regression may serve again: each tool call with its outcome, each verdict
on an approval and each answer to a question, found by a canonical key.

    matcher = Matcher(ignore={"search": {"request_id"}})      # per tool: argument keys that do not count
    recorded = Recorded(source.events, matcher)
    hit = recorded.take_call("lookup_order", {"order_id": "A17"})   # the recorded call and its outcome

Why canonical JSON equality: a candidate that makes the call the source made must find it whatever order the
model wrote the arguments in (`{"a": 1, "b": 2}` is `{"b": 2, "a": 1}`), and a value that means the same as
JSON (1 and 1.0) must match; anything more lenient is a per-tool decision (`ignore`), never a guess.

Each recorded call is served once, in the order the source made it: a candidate that makes the same call twice
where the source made it once gets the recorded outcome the first time only. The second call is one the world
was never asked, so it follows the tool's rule (`runtime.regress.ports`), as a stateful tool (a refund) would
have answered it otherwise. A call whose outcome the source never recorded (the run ended while it was out)
is not served.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime import events as ev
from runtime.types import ToolCall


def canonical(value: Any, ignore: frozenset[str] | set[str] = frozenset()) -> str:
    """`value` as canonical JSON (keys sorted, no spaces, a float that is an integer written as one), with the
    top-level keys in `ignore` left out."""
    if isinstance(value, Mapping) and ignore:
        value = {k: v for k, v in value.items() if k not in ignore}
    return json.dumps(_normal(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def _normal(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _normal(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_normal(v) for v in value]
    return value


@dataclass(frozen=True)
class Matcher:
    """When a candidate's call is the source's: same tool, arguments equal as canonical JSON, with the
    argument keys `ignore[tool]` left out for that tool (an id or a timestamp the model makes up anew)."""

    ignore: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def key(self, tool: str, arguments: Any) -> str:
        return f"{tool}\n{canonical(arguments, self.ignore.get(tool, frozenset()))}"


@dataclass(frozen=True)
class RecordedCall:
    """One call the source made (as sent: an approver's edit applied) and how it ended there."""

    call: ToolCall
    outcome: ev.ToolCompleted | ev.ToolFailed


Verdict = ev.ApprovalGranted | ev.ApprovalDenied
Reply = ev.QuestionAnswered | ev.ToolFailed


class Recorded:
    """The source run's calls, verdicts and answers, each taken at most once (see the module docstring)."""

    def __init__(self, events: Sequence[ev.Event], matcher: Matcher) -> None:
        self.matcher = matcher
        self.calls: dict[str, deque[RecordedCall]] = defaultdict(deque)
        self.verdicts: dict[str, deque[Verdict]] = defaultdict(deque)
        self.answers: dict[str, deque[Reply]] = defaultdict(deque)
        called: dict[str, ToolCall] = {}
        asked_for: dict[str, ToolCall] = {}  # call id -> the call an approval was asked for
        questions: dict[str, str] = {}  # call id -> the question's key
        for e in events:  # as written: an outcome carries its script run (`_notes` serves it again)
            if isinstance(e, ev.ToolCalled):
                called[e.call.id] = e.call
            elif isinstance(e, ev.ApprovalRequested):
                asked_for[e.call.id] = e.call
            elif isinstance(e, ev.ApprovalGranted | ev.ApprovalDenied) and e.call_id in asked_for:
                call = asked_for.pop(e.call_id)
                self.verdicts[matcher.key(call.name, call.arguments)].append(e)
            elif isinstance(e, ev.QuestionAsked):
                questions[e.call_id] = question_key(e.question, e.schema)
            elif isinstance(e, ev.QuestionAnswered) and e.call_id in questions:
                self.answers[questions.pop(e.call_id)].append(e)
            elif isinstance(e, ev.ToolCompleted | ev.ToolFailed):
                if e.call_id in questions:  # a question that failed (a bad answer, the timeout's error)
                    self.answers[questions.pop(e.call_id)].append(e)  # type: ignore[arg-type]
                elif e.call_id in called:
                    call = called.pop(e.call_id)
                    self.calls[matcher.key(call.name, call.arguments)].append(RecordedCall(call, e))

    def take_call(self, tool: str, arguments: Any) -> RecordedCall | None:
        """The first unserved recorded call equal to this one, or None."""
        return _take(self.calls, self.matcher.key(tool, arguments))

    def take_verdict(self, call: ToolCall) -> Verdict | None:
        """The verdict the source's approver gave a call equal to `call`, or None."""
        return _take(self.verdicts, self.matcher.key(call.name, call.arguments))

    def take_answer(self, question: str, schema: dict[str, Any] | None) -> Reply | None:
        """The answer (or the failure) the source recorded for the same question, or None."""
        return _take(self.answers, question_key(question, schema))


def question_key(question: str, schema: dict[str, Any] | None) -> str:
    return f"{question}\n{canonical(schema)}"


def _take(table: dict[str, deque[Any]], key: str) -> Any:
    queue = table.get(key)
    return queue.popleft() if queue else None


__all__ = ["Matcher", "Recorded", "RecordedCall", "Reply", "Verdict", "canonical", "question_key"]
