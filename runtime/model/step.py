"""One model effect, performed: render the prompt, call the model, parse the reply into event fields.

Shared by the one run driver (`runtime.driver`) on a host and in one process: both turn a
`kernel.CallModel` into the same `model.requested` / `model.responded | model.failed` events, so the two
runners can never drift apart in what they record (and a run driven by either replays the same way).

    step = ModelStep(adapter, config.tools, constraint)          # once per agent: builds the constraint
    await append(step.requested(effect, run_id))                  # model.requested
    await append(await step.call(client, effect, run_id, timeout=left))   # model.responded | .failed

Failures are values: an unreachable model, an HTTP error after the client's retries, or the deadline
passing during the call all come back as a `ModelFailed` event, never as an exception; so does a spent
budget whose bundle says fail (`error_kind` `budget_exceeded`: the kernel then ends the run).

An `Admission` says what the call shares (`runtime.model.limits`): its place in the endpoint's queue
(`ticket`: the run's actor and priority), the agent's daily budget (checked before the call, charged after
it), and who hears of every wait (`on_throttle`: the host records `model.throttled`).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import anyio

from runtime import events as ev
from runtime import kernel
from runtime.model.adapters.base import ModelAdapter
from runtime.model.constraints import DecodingConstraint, build_constraint, prepare_constraints
from runtime.model.dialects import DEFAULT, translate, with_sampling
from runtime.model.limits import BudgetExceeded, DailyBudget, OnThrottle, Ticket
from runtime.model.schemas import api_tools
from runtime.types import ToolSchema

if TYPE_CHECKING:  # the client imports openai (~0.7 s): a runner that only folds events never pays for it
    from runtime.model.client import ModelClient
    from runtime.streaming import RequestStream


@dataclass(frozen=True)
class Admission:
    """What one model call shares with the others (see the module docstring)."""

    ticket: Ticket = field(default_factory=Ticket)
    budget: DailyBudget | None = None
    on_throttle: OnThrottle | None = None


class ModelStep:
    """The adapter, the decoding constraint and the request extras of one agent's tool set."""

    def __init__(self, adapter: ModelAdapter, tools: Sequence[ToolSchema],
                 constraint: DecodingConstraint | None = None, *,
                 narrowed: Sequence[Sequence[ToolSchema]] = (), keep_prompt: bool = True,
                 dialect: str = DEFAULT) -> None:
        """`dialect`: the request dialect of the server (`runtime.model.dialects`): the constraint goes in
        the fields that server enforces, or a DialectError says at once that it cannot.
        `narrowed`: the fewer tools some turns will offer (`for_config`: the forced last turn's), whose
        steps are built now, with this one's grammar in the same xgrammar child, never on a task's path.
        `keep_prompt`: those turns keep this step's prompt (see `_narrowed_step`); False lists only the
        tools they offer (`KernelConfig.last_turn_prompt` "narrowed")."""
        if constraint is not None and narrowed:
            prepare_constraints((adapter, t, constraint) for t in [tools, *narrowed])
        self.adapter = adapter
        self.keep_prompt = keep_prompt
        self.constraint = constraint
        self.dialect = dialect
        self.extras: dict[str, Any] = {}
        self.constraint_digest = ""
        self.tools = tuple(tools)
        self.prompt_tools = self.tools  # the tools the prompt describes (see `_narrowed_step`)
        self._narrowed: dict[tuple[str, ...], ModelStep] = {}
        if constraint is not None:
            built = build_constraint(adapter, list(tools), constraint)  # a bad constraint fails here
            self.extras, self.constraint_digest = translate(dialect, built, adapter), built.digest
        elif adapter.native_tool_calls and tools:
            self.extras = {"tools": api_tools(tools, strict=True)}  # the server constrains strict tools
        for fewer in narrowed:
            if tuple(fewer) != self.tools:
                self._narrowed[tuple(t.name for t in fewer)] = self._narrowed_step(fewer)

    @classmethod
    def for_config(cls, adapter: ModelAdapter, config: kernel.KernelConfig,
                   constraint: DecodingConstraint | None = None, *, dialect: str = DEFAULT) -> ModelStep:
        """The step of an agent's whole life: its tools, and the forced last turn's fewer ones, built now."""
        return cls(adapter, config.tools, constraint, narrowed=[config.offered(config.max_turns)],
                   keep_prompt=config.last_turn_prompt == "same", dialect=dialect)

    def _for(self, effect: kernel.CallModel) -> ModelStep:
        """This step, or the one for the fewer tools the kernel offers on a forced last turn (built once)."""
        if effect.tools is self.tools or effect.tools == self.tools:
            return self
        key = tuple(t.name for t in effect.tools)
        if key not in self._narrowed:
            self._narrowed[key] = self._narrowed_step(effect.tools)
        return self._narrowed[key]

    def _narrowed_step(self, tools: Sequence[ToolSchema]) -> ModelStep:
        """The step for a narrowed tool set that keeps this step's prompt: the same tools in the prompt (and
        in `tools=`), the narrowing done by the decoding constraint alone, or for the openai family by a named
        `tool_choice`. Why: the tools are at the very start of the prompt, so offering fewer of them would
        change the prompt's first tokens and make the server recompute the whole context (its prefix cache
        missed) on the forced last turn; the constraint already lets the model write nothing else."""
        narrowed = ModelStep(self.adapter, tools, self.constraint, dialect=self.dialect)
        if not self.keep_prompt or not self._narrows_by_constraint(narrowed):
            return narrowed  # nothing else enforces the narrowing: the prompt says it
        narrowed.prompt_tools = self.prompt_tools
        if "tools" in self.extras:
            narrowed.extras = {**narrowed.extras, "tools": self.extras["tools"]}
            if self.adapter.native_tool_calls:
                narrowed.extras["tool_choice"] = {"type": "function", "function": {"name": tools[0].name}}
                narrowed.extras.pop("parallel_tool_calls", None)
        return narrowed

    def _narrows_by_constraint(self, narrowed: ModelStep) -> bool:
        if self.adapter.native_tool_calls:
            return len(narrowed.tools) == 1  # a named tool_choice forces one function
        return self.constraint is not None

    def requested(self, effect: kernel.CallModel, run_id: str,
                  client: ModelClient | None = None) -> ev.ModelRequested:
        """The `model.requested` event recording this effect (unstamped); with `client`, who serves it."""
        step = self._for(effect)
        return ev.ModelRequested(
            run_id=run_id, request_id=effect.id, turn=effect.turn, attempt=effect.attempt,
            messages=effect.new_messages, context_start=effect.context_start,
            constraint_digest=step.constraint_digest, sampling=dict(effect.sampling),
            tools=() if step is self else tuple(t.name for t in step.tools),
            provider=client.provider if client is not None else "",
            server=f"{client.server[0]}:{client.server[1]}" if client is not None else "",
            dialect=self.dialect, unconstrained=self.constraint is None)

    async def call(
        self, client: ModelClient, effect: kernel.CallModel, run_id: str, *, timeout: float | None = None,
        stream: RequestStream | None = None, admission: Admission | None = None,
    ) -> ev.ModelResponded | ev.ModelFailed:
        """Perform the call; return the event recording its outcome (unstamped).

        `timeout` is the time left before the task's deadline (None: no deadline). With `stream`, the reply
        is asked for as SSE and each fragment is published as it arrives (`runtime.streaming`); what is
        recorded is the same either way.
        """
        via_api = self.constraint is not None and self.constraint.send_tools_to_api
        step = self._for(effect)
        messages = self.adapter.render(list(effect.messages), list(step.prompt_tools), tools_via_api=via_api)
        if step.prompt_tools is not step.tools and not self.adapter.native_tool_calls:
            messages = _with_last_turn_note(messages, step.tools)
        ids: dict[str, Any] = {"run_id": run_id, "request_id": effect.id, "turn": effect.turn}
        scope = anyio.fail_after(max(timeout, 0.0)) if timeout is not None else nullcontext()
        sampling, extras = with_sampling(self.dialect, dict(effect.sampling), step.extras)
        budget, waited = admission.budget if admission is not None else None, 0.0
        if admission is not None:
            extras = {**extras, "ticket": admission.ticket, "on_throttle": admission.on_throttle}
        try:
            with scope:
                if budget is not None:
                    waited = await budget.admit(admission.on_throttle if admission is not None else None)
                if stream is None:
                    completion = await client.complete(messages, **sampling, **extras)
                else:
                    try:
                        completion = await client.complete(
                            messages, stream=True, on_text=stream.on_text, on_tool_call=stream.on_tool_call,
                            on_attempt=stream.retrying, **sampling, **extras)
                    finally:
                        with anyio.CancelScope(shield=True):
                            await stream.done()
        except TimeoutError:
            return ev.ModelFailed(
                **ids, error="the task's deadline passed during the model call", error_kind="timeout")
        except BudgetExceeded as exc:
            return ev.ModelFailed(**ids, error=str(exc), error_kind=BudgetExceeded.kind)
        except Exception as exc:  # an unreachable model is a value for the kernel to count, not a crash
            return ev.ModelFailed(**ids, error=str(exc) or type(exc).__name__, error_kind=type(exc).__name__)
        if budget is not None:
            budget.spend(completion.usage)
        reply = self.adapter.parse(completion.text, completion.tool_calls, list(effect.tools))
        calls = kernel.tool_calls(run_id, effect.turn, [(c.name, c.arguments) for c in reply.calls])
        return ev.ModelResponded(
            **ids,
            text=completion.text or "",
            content=reply.content,
            calls=() if reply.errors else calls,
            usage=completion.usage,
            finish_reason=completion.finish_reason or "",
            latency_ms=completion.latency_ms,
            parse_error="; ".join(reply.errors) if reply.errors else None,
            model=completion.model,
            response_id=completion.id,
            queued_ms=completion.queued_ms + waited * 1000.0,
        )


def _with_last_turn_note(messages: list[dict[str, Any]], tools: Sequence[ToolSchema]) -> list[dict[str, Any]]:
    """The forced last turn's prompt, told at its end which tools remain. Why: the prompt keeps every tool
    at its start (the server's prefix cache), so without a word the model would read a list of tools it may
    no longer call while the constraint lets it write only the terminal one; the end of the prompt is new in
    this request anyway, so saying it there costs no cached prefix. (For SmolLM2-135M this was not enough:
    it still filled the terminal call worse than with the narrowed prompt, `last_turn_prompt: narrowed`.)
    Added to the last user message (the tool results) when there is one: some chat templates refuse two
    user messages in a row."""
    names = ", ".join(t.name for t in tools)
    note = f"This is the last turn: only {names} can be called now."
    last = messages[-1] if messages else None
    if last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        return [*messages[:-1], {**last, "content": f"{last['content']}\n\n{note}"}]
    return [*messages, {"role": "user", "content": note}]


__all__ = ["Admission", "ModelStep"]
