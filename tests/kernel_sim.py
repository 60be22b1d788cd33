"""Support for the kernel tests (a helper module, not collected): a synchronous runner with scripted
outcomes.

It plays the role the NATS host and `runtime.driver` plays for real (append what the kernel decided, or
the intent event, perform, append the outcome), with a fake clock, a scripted model and scripted tools,
and it records every `decide` so tests can check that replaying the log reproduces the same decisions.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime import events as ev
from runtime import kernel as k
from runtime.types import ToolCall, ToolResult, ToolSchema, Usage


def schema(name: str, **props: str) -> ToolSchema:
    return ToolSchema(
        name,
        f"the {name} tool",
        {"type": "object", "properties": {p: {"type": t} for p, t in props.items()}},
    )


@dataclass(frozen=True)
class Reply:
    """What the scripted model does for one request: fail, garble, or answer with content and calls."""

    content: str = ""
    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    fail: str | None = None
    garbled: str | None = None


ModelFn = Callable[[k.CallModel], Reply]
ToolFn = Callable[[ToolCall], ToolResult]
ApproverFn = Callable[[ToolCall], str | None]  # None grants, a string denies with that reason


def echo_tool(call: ToolCall) -> ToolResult:
    return ToolResult(output={"tool": call.name, **call.arguments})


@dataclass
class Sim:
    config: k.KernelConfig
    run_id: str = "run1"
    agent: str = "tester"
    clock: float = 1000.0
    tick: float = 1.0
    events: list[ev.Event] = field(default_factory=list)
    decisions: list[tuple[int, list[k.Decision]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.state = k.initial(self.config)

    def append(self, event: ev.Event) -> ev.Event:
        """Stamp `event` as a log would (next seq, the fake clock, the actor) and fold it."""
        self.clock += self.tick
        event = ev.stamp(event, seq=self.state.seq, ts=self.clock, actor=self.agent)
        self.state = k.evolve(self.state, event)
        self.events.append(event)
        return event

    def emit(self, cls: type[ev.Event], **fields: Any) -> ev.Event:
        """Append an event of this run built from `fields` (what the outside world sends, in tests)."""
        return self.append(cls(run_id=self.run_id, **fields))

    def start(self, text: str = "do the task", timeout_s: float | None = None) -> Sim:
        self.emit(ev.RunStarted, input=text, task_id="t1", timeout_s=timeout_s)
        return self

    def step(self, model: ModelFn, tool: ToolFn = echo_tool, approver: ApproverFn | None = None) -> bool:
        """One decide + perform round; False when decide returned nothing."""
        effects = k.decide(self.state)
        self.decisions.append((len(self.events), effects))
        for effect in effects:
            self.perform(effect, model, tool, approver)
        return bool(effects)

    def run(
        self,
        model: ModelFn,
        tool: ToolFn = echo_tool,
        approver: ApproverFn | None = None,
        max_steps: int = 500,
    ) -> Sim:
        for _ in range(max_steps):
            if not self.step(model, tool, approver):
                return self
        raise AssertionError("the run did not settle")

    def perform(self, effect: k.Decision, model: ModelFn, tool: ToolFn, approver: ApproverFn | None) -> None:
        match effect:
            case k.CallModel():
                self.emit(
                    ev.ModelRequested,
                    request_id=effect.id,
                    turn=effect.turn,
                    attempt=effect.attempt,
                    messages=effect.new_messages,
                    context_start=effect.context_start,
                    sampling=dict(effect.sampling),
                )
                reply = model(effect)
                if reply.fail is not None:
                    self.emit(ev.ModelFailed, request_id=effect.id, turn=effect.turn, error=reply.fail)
                elif reply.garbled is not None:
                    self.emit(
                        ev.ModelResponded,
                        request_id=effect.id,
                        turn=effect.turn,
                        text=reply.garbled,
                        parse_error="no closing tag",
                    )
                else:
                    calls = k.tool_calls(self.run_id, effect.turn, reply.calls)
                    self.emit(
                        ev.ModelResponded,
                        request_id=effect.id,
                        turn=effect.turn,
                        text=reply.content,
                        content=reply.content,
                        calls=calls,
                        usage=Usage(10, 5),
                        finish_reason="stop",
                    )
            case k.CallTools():
                for call in effect.calls:
                    self.emit(ev.ToolCalled, call=call)
                for call in effect.calls:
                    self.record_result(call, tool(call))
            case ev.ApprovalRequested():
                self.append(effect)
                if approver is not None:
                    verdict = approver(effect.call)
                    if verdict is None:
                        self.emit(ev.ApprovalGranted, call_id=effect.call.id, by="tester")
                    else:
                        self.emit(ev.ApprovalDenied, call_id=effect.call.id, reason=verdict, by="tester")
            case _:  # what the kernel settled on by itself
                self.append(effect)

    def record_result(self, call: ToolCall, result: ToolResult) -> None:
        self.append(ev.tool_outcome(self.run_id, call.id, call.name, result))

    def kinds(self) -> list[str]:
        return [ev.kind_of(e) for e in self.events]


def submit(answer: str, tool: str = "submit_result") -> Reply:
    """A reply that ends the run through its terminal tool (a run with one never ends on text)."""
    return Reply("", ((tool, {"answer": answer}),))


def script(*replies: Reply) -> ModelFn:
    """A model that answers requests with `replies` in order (the last one repeats)."""
    queue = list(replies)

    def model(_: k.CallModel) -> Reply:
        return queue.pop(0) if len(queue) > 1 else queue[0]

    return model
