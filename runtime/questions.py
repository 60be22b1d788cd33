"""Questions to a person, the pure half: the built-in `ask_human(question, answer_schema)`.

A bundle with a `questions:` section offers `ask_human` to its model like any tool, but no worker runs it.
The kernel settles the call by itself, as it does a timer (`runtime.timers`): `question.asked` records the
question, the schema its answer must fit and when it times out (an instant computed here from the `ts` of
the latest event, so `sa replay --verify` reproduces it), and the call then waits, as a call waits for its
result, until `question.answered` gives it one: an operator's answer (`sa answer`, the client, the
inspector), or at the timeout the bundle's default. A timeout with no default fails the call (`timeout`),
so the model reads a clear error instead of waiting forever. A runner parks a run whose only pending work
is questions and timers (the host holds nothing for it); the answer, or the cluster's wake-up at the
timeout, folds it back.

Why answers are not validated here: the fold takes the log as it is. The schema check is made where an
answer enters (`runtime.validate`): the client checks an answer before it publishes it (refusing a bad one
with what is wrong, nothing recorded) and the host checks it again before recording it, so the log only
ever holds answers that fit. Everything here is pure: the clock reaches it only as an event's `ts`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runtime.events import QuestionAnswered, QuestionAsked, ToolFailed
from runtime.types import ToolCall, ToolError, ToolResult, ToolSchema

ASK_HUMAN = "ask_human"
MAX_QUESTION_CHARS = 4_000  # a question is read by a person on a page: longer is a document, not a question
TIMEOUT_BY = "timeout"  # the `by` of an answer the timeout gave (the bundle's default)

ASK_HUMAN_TOOL = ToolSchema(
    ASK_HUMAN,
    "Ask a person a question and wait for the answer, then continue with it. Use it when you need a "
    "decision or a fact only a person has. The wait is durable: it survives restarts and holds no "
    "resources. `answer_schema` (a JSON schema) says what form the answer must take; without one any "
    "JSON value is accepted (usually a string). Returns {\"answer\": ...}.",
    {"type": "object",
     "properties": {
         "question": {"type": "string", "description": "what to ask, in plain words"},
         "answer_schema": {"type": "object",
                           "description": "a JSON schema the answer must fit, e.g. {\"type\": \"string\", "
                                          "\"enum\": [\"yes\", \"no\"]}"}},
     "required": ["question"], "additionalProperties": False})


@dataclass(frozen=True)
class QuestionsConfig:
    """The bundle's `questions:`: how long a question waits (`timeout_s`, None: until answered or the
    task's deadline) and the answer it gets then (`default`, when `has_default`: a default may be null)."""

    timeout_s: float | None = None
    default: Any = None
    has_default: bool = False

    def __post_init__(self) -> None:
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ValueError(f"questions timeout must be positive, got {self.timeout_s}")


@dataclass(frozen=True)
class Open:
    """A question the kernel folded from `question.asked`: what its timeout does, and when; the schema its
    answer must fit; and, for a question a running call put (not `ask_human`), how the call goes on."""

    due: float | None
    timeout_s: float | None
    default: Any
    has_default: bool
    schema: dict[str, Any] | None = None
    resume: dict[str, Any] | None = None
    round: int = 0


def ask(run_id: str, call: ToolCall, now: float, cfg: QuestionsConfig) -> QuestionAsked | ToolFailed:
    """The `question.asked` of an `ask_human` call, due `cfg.timeout_s` after `now` (the latest event's
    `ts`), or the `tool.failed` its arguments earn (what the model reads, to ask again properly)."""
    args = call.arguments
    question, schema = args.get("question"), args.get("answer_schema")
    problem = None
    if not isinstance(question, str) or not question.strip():
        problem = "ask_human needs `question`, the question to ask as a non-empty string"
    elif len(question) > MAX_QUESTION_CHARS:
        problem = f"the question is {len(question)} characters long: ask in at most {MAX_QUESTION_CHARS}"
    elif schema is not None and not isinstance(schema, dict):
        problem = "`answer_schema` must be a JSON schema object such as {\"type\": \"string\"}, or left out"
    elif unknown := sorted(set(args) - {"question", "answer_schema"}):
        problem = f"ask_human takes `question` and `answer_schema`, not {', '.join(unknown)}"
    if problem is not None:
        return ToolFailed(run_id=run_id, call_id=call.id, tool=call.name, error=ToolError("input", problem))
    assert isinstance(question, str)
    due = now + cfg.timeout_s if cfg.timeout_s is not None else None
    return QuestionAsked(run_id=run_id, call_id=call.id, question=question.strip(), schema=schema,
                         due=due, timeout_s=cfg.timeout_s, default=cfg.default, has_default=cfg.has_default)


def opened(ev: QuestionAsked) -> Open:
    return Open(due=ev.due, timeout_s=ev.timeout_s, default=ev.default, has_default=ev.has_default,
                schema=ev.schema, resume=ev.resume, round=ev.round)


# ── questions a running call puts ──────────────────────────────────────────────────────────────────────
# A tool call that cannot go on without a person asks through the same `question.asked` as `ask_human`,
# with a `resume` saying what the answer does: a call whose outcome is in doubt (its worker died mid-call,
# the tool may not be repeated, and the bundle says `in_doubt: ask`) is re-called or failed; an MCP server's
# request for input gets the answer in the call's next round. Either way the answer never becomes the call's
# result by itself: the call goes out again (`Turn.resumed`), or fails.

RECALL = "recall"  # the answer that sends an in-doubt call out again
FAILED = "failed"  # the answer that treats it as failed
IN_DOUBT_SCHEMA: dict[str, Any] = {"type": "string", "enum": [RECALL, FAILED]}


def in_doubt_question(message: str) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The question, answer schema and resume of a call in doubt whose bundle says `in_doubt: ask`."""
    question = (f"{message} Did it happen? Answer {RECALL!r} to call it again, or {FAILED!r} to treat it as "
                "failed (the model is told it may or may not have happened).")
    return question, dict(IN_DOUBT_SCHEMA), {"kind": "in_doubt", "message": message}


def elicit_resume(key: str, request_state: str | None) -> dict[str, Any]:
    """The resume of an MCP server's request for input (`elicitation/create` in an input-required result):
    the answer goes back under `key`, with the server's opaque `request_state`, in the call's next round."""
    return {"kind": "elicit", "key": key, "request_state": request_state}


def resumed(ev: QuestionAnswered, q: Open, call: ToolCall) -> ToolResult | dict[str, Any]:
    """What the answer to a question a running call put does: the call's result (a failure), or what its
    next round carries (`{"kind": "recall"}`, or the answer for the server: `input_responses` and
    `request_state`)."""
    resume = q.resume or {}
    if resume.get("kind") == "elicit":
        return {"kind": "elicit", "request_state": resume.get("request_state"),
                "input_responses": {str(resume.get("key")): {"action": "accept", "content": ev.answer}}}
    if ev.answer == RECALL:
        return {"kind": RECALL}
    message = str(resume.get("message") or f"the call to {call.name} may or may not have happened")
    return ToolResult(error=ToolError("in_doubt", f"{message} A person chose to treat it as failed "
                                                  f"(answered {ev.answer!r}): it may or may not have "
                                                  "happened; check its effect before calling it again."))


def timed_out(run_id: str, call: ToolCall, q: Open, now: float) -> QuestionAnswered | ToolFailed | None:
    """What the timeout gives question `call` at `now`, if it has passed: the default answer, or a
    `timeout` error when the bundle names none. None while the question may still be answered."""
    if q.due is None or now < q.due:
        return None
    if q.has_default:
        return QuestionAnswered(run_id=run_id, call_id=call.id, answer=q.default, by=TIMEOUT_BY)
    return ToolFailed(run_id=run_id, call_id=call.id, tool=call.name,
                      error=ToolError("timeout", f"nobody answered within {q.timeout_s:g} s and no default "
                                                 "answer is configured: go on without the answer"))


def answer_output(ev: QuestionAnswered, q: Open | None) -> dict[str, Any]:
    """What an answered `ask_human` call returns to the model: the answer, and whether it was the
    default given at the timeout rather than a person's."""
    if ev.by == TIMEOUT_BY:
        waited = f" within {q.timeout_s:g} s" if q is not None and q.timeout_s is not None else ""
        return {"answer": ev.answer, "note": f"nobody answered{waited}: this is the default answer"}
    return {"answer": ev.answer}


def wake_at(q: Open, deadline: float | None) -> float | None:
    """When a parked run must wake for question `q` without an answer: its timeout or the task's
    deadline, whichever is first; None if only an answer can wake it."""
    times = [t for t in (q.due, deadline) if t is not None]
    return min(times) if times else None


__all__ = ["ASK_HUMAN", "ASK_HUMAN_TOOL", "FAILED", "IN_DOUBT_SCHEMA", "MAX_QUESTION_CHARS", "RECALL",
           "TIMEOUT_BY", "Open", "QuestionsConfig", "answer_output", "ask", "elicit_resume",
           "in_doubt_question", "opened", "resumed", "timed_out", "wake_at"]
