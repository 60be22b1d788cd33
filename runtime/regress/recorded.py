"""What a recorded run did that its regression may serve again: each tool call with its outcome, each verdict
on an approval and each answer to a question, found by a canonical key.

    matcher = Matcher(ignore={"search": {"request_id"}})      # per tool: argument keys that do not count
    matcher = Matcher(compare={"search": PymCompare.load("same_query.pym")})   # or a .pym says when
    recorded = Recorded(source.events, matcher)
    hit = await recorded.take_call("lookup_order", {"order_id": "A17"})   # the recorded call and its outcome

Why canonical JSON equality: a candidate that makes the call the source made must find it whatever order the
model wrote the arguments in (`{"a": 1, "b": 2}` is `{"b": 2, "a": 1}`), and a value that means the same as
JSON (1 and 1.0) must match; anything more lenient is a per-tool decision, never a guess: keys to leave out
(`ignore`), or a `.pym` function that says whether two calls' arguments ask the same (`PymCompare`: inputs
`recorded` and `candidate`, the two argument objects; it ends with True or False). Equal canonical JSON is a
match whatever the function would say; the function is asked only of the tool's unserved recorded calls that
are not equal, in order, and a function that fails is a no (logged).

Each recorded call is served once, in the order the source made it: a candidate that makes the same call twice
where the source made it once gets the recorded outcome the first time only. The second call is one the world
was never asked, so it follows the tool's rule (`runtime.regress.ports`), as a stateful tool (a refund) would
have answered it otherwise. A call whose outcome the source never recorded (the run ended while it was out)
is not served.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
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


log = logging.getLogger("runtime.regress")


class PymCompare:
    """A `.pym` function deciding whether a candidate's arguments ask what recorded ones asked (see the module
    docstring); pure and sandboxed like any script."""

    def __init__(self, script: Any, name: str) -> None:
        self.script, self.name = script, name

    @classmethod
    def load(cls, path: str | Path) -> PymCompare:
        from runtime.regress.sets import RegressError
        from runtime.scripts import load

        try:
            script = load(path)
        except OSError as e:
            raise RegressError(f"the matcher {path} cannot be read: {e}") from None
        problems = [d.message for d in script.diagnostics]
        if set(script.inputs) != {"recorded", "candidate"}:
            problems.append(f"it declares the inputs {sorted(script.inputs)}, not recorded and candidate")
        if script.externals:
            problems.append("it declares externals: a matcher is pure")
        if problems:
            raise RegressError(f"the matcher {path} cannot be used: {'; '.join(problems)}")
        return cls(script, Path(path).stem)

    async def same(self, recorded: Any, candidate: Any) -> bool:
        result = await self.script.run({"recorded": recorded, "candidate": candidate})
        if result.error is not None or not isinstance(result.output, bool):
            log.warning("matcher %s: %s", self.name, result.error.message if result.error else
                        f"returned {result.output!r}, not True or False")
            return False
        return result.output


@dataclass(frozen=True)
class Matcher:
    """When a candidate's call is the source's: same tool, arguments equal as canonical JSON, with the
    argument keys `ignore[tool]` left out for that tool (an id or a timestamp the model makes up anew), or
    what `compare[tool]` says of two calls that are not equal so."""

    ignore: Mapping[str, frozenset[str]] = field(default_factory=dict)
    compare: Mapping[str, PymCompare] = field(default_factory=dict)

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

    async def take_call(self, tool: str, arguments: Any) -> RecordedCall | None:
        """The first unserved recorded call equal to this one (or, for a tool with a `.pym` matcher, the first
        it calls the same), or None."""
        hit: RecordedCall | None = _take(self.calls, self.matcher.key(tool, arguments))
        compare = self.matcher.compare.get(tool)
        if hit is not None or compare is None:
            return hit
        waiting = sorted((c for queue in self.calls.values() for c in queue if c.call.name == tool),
                         key=lambda c: c.outcome.seq)
        for candidate in waiting:
            if await compare.same(candidate.call.arguments, arguments):
                self.calls[self.matcher.key(tool, candidate.call.arguments)].remove(candidate)
                return candidate
        return None

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


__all__ = ["Matcher", "PymCompare", "Recorded", "RecordedCall", "Reply", "Verdict", "canonical",
           "question_key"]
