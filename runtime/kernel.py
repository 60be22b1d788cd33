"""The agent kernel: a pure state machine in the Decider shape.

    state     = initial(config)                 # before any event
    state     = evolve(state, event)            # fold one event; pure, never mutates its inputs
    decisions = decide(state)                   # what must happen next; pure

The kernel does no I/O, reads no clock, draws no random number and calls no model. Ids are built from
the run id and counters, deadlines compare against the `ts` the runner stamped on events. That is what
lets a crashed host rebuild a run from its events alone, and `sa replay --verify` prove a log.
It is one file, longer than the rest, on purpose: `evolve` and `decide` keep each other's invariants (the
recovery contract below), and a rule is checked by reading both halves side by side; the pure rules of its
built-in calls (timers, questions) live in modules of their own.

`decide` returns two kinds of values. Where the next fact follows from the state alone (deny a call,
ask for approval, end a turn, complete, fail) it returns that fact as the event itself, unstamped: the
runner appends it as is, and `verify` compares it with the log event for event. Where the next fact
needs the world, it returns one of the two I/O effects, and the runner records what came back:

    CallModel ─▶ model.requested, then model.responded | model.failed      (runtime.model's step)
    CallTools ─▶ tool.called, tool.completed | tool.failed (+ its script)  (a worker or Tool.execute)

How a run flows:

    run.started ─▶ CallModel ─▶ per call: tool.failed            (unknown tool, policy, approval denied)
                                          approval.requested      (then a person: granted | denied,
                                                                   or the rule's timeout verdict)
                                          CallTools
                 ─▶ turn.completed   (the tool results join the conversation, in call order)
                 ─▶ run.completed | run.failed | the next CallModel

A fork (`runtime.client.fork`) starts with `run.forked`, a `run.started` that also names its source; it folds
the same way (with the fork's own system prompt when an edit gave one), so the copied events that follow
put the kernel exactly where the source was.

Threads: a run in a thread starts from the conversation its thread's previous run ended with. The kernel
does not read that run's log: the runner folds it (`runtime.log.threads`) and passes the result to
`initial` as a `Conversation`, and `run.started` names it by reference (`previous_run`, `previous_seq`).
`evolve` checks the two agree, so a run can never silently fold against the wrong history. Those
messages count as recorded (they are in the previous run's log), so the first `model.requested` of the
run stores only the new task: a thread's storage grows with its new messages, never with its history.
A run that starts a long thread from a summary has it in `run.started` (`summary` replaces the first
`summarised` earlier messages).

A run ends on: a successful call of the configured terminal tool (its output is the run's output); for
a run without a terminal tool, a model reply with no tool calls (its text is the output); `max_turns`
turns, the task's deadline (the latest event's `ts` is past `run.started.ts + timeout_s`),
`max_consecutive_errors` errors in a row (a failed model call, an unparseable reply, a turn whose calls
all failed, or a reply in text where a terminal call was required), a token budget spent
(`budget_exceeded`), or `run.cancelled`.

A reply in text where a terminal tool is configured: the run must end with what the terminal tool
returns (its output is checked against the tool's output model), so a reply without calls is not an
ending but a model error, handled as an unparseable reply is: recorded as the model gave it, the model
is told that a call of the terminal tool is required (a user message, recorded in the next
`model.requested`), and the turn counts as an error. A model that keeps answering in text runs into
`max_consecutive_errors` or `max_turns`, and the run then fails `no_terminal_call`, naming the tool. Why
in the kernel: any server that ignores the decoding constraint (a `structural_tag` strategy, a server
without structured outputs) can answer in text, and no runner may complete such a run with a string
where a typed answer was promised. Logs of runs without a terminal tool fold exactly as before.

Budgets: the run's own (`KernelConfig.token_budget`: the tokens its model replies counted) is checked
before each model call, from the folded usage. A budget the kernel cannot see (an agent's tokens per day,
counted across the fleet) reaches it as a fact: the runner records `model.failed` with `error_kind`
`budget_exceeded` and the budget named in `error`, and the run fails with that detail. Either way the
ending is the kernel's decision, so `verify` checks it. `model.throttled` (a call held back by a 429/503 or
a budget, then retried) only explains a wait: it changes nothing here.

Approvals: a call waits for a person when its tool's rule applies (`KernelConfig.approval_rule`: the
bundle's `approval` rules, `runtime.approval_policy`, or `requires_approval`). An approver may grant it with
edited arguments, and the call then runs (and is checked by the policies) with those. A rule with a
timeout has its verdict decided from timestamps like the deadline: `decide` returns it once an event's
`ts` is past `approval.requested.ts + timeout_s`; since time passing appends nothing, a runner with nothing
else to do wakes at `next_timer(state)` and appends what `expire(state, now)` returns.

Timers: a call of a timer tool (`KernelConfig.timers`, `runtime.timers`: `sleep`, `wait_until`) runs on no
worker. `decide` settles it as `timer.started`, due at a time computed from its arguments and the `ts` of
the latest event (so `verify` decides the same), or as `tool.failed` for bad arguments or a wait past the
deadline; the call then waits for `timer.fired`, which gives it its result, as a tool call waits for its
outcome. Time passing appends nothing here either: a runner with nothing else to do (`sleeping_until`)
parks the run until the instant, and records `timer.fired` when woken.

Questions: a call of `ask_human` (`KernelConfig.questions`, `runtime.questions`) runs on no worker either.
`decide` settles it as `question.asked` (its timeout's instant computed from the latest event's `ts`), or as
`tool.failed` for bad arguments; the call then waits for `question.answered`, whose answer (checked by the
runner against the question's schema) is its result. Past the timeout `decide` (and `expire`) give the
default the question recorded, or a `timeout` error. A runner with nothing else to do (`parked_until`)
parks the run until the answer, the timeout or the deadline.

Final-turn forcing: with a terminal tool configured (and `force_terminal_on_last_turn`, the default),
the request for the last turn `max_turns` allows offers only the terminal tool (`CallModel.tools`), so
a constrained decoder can only answer; a call of another tool in that turn is denied (`policy`).

Recovery contract (what a runner may rely on):

1. `decide` returns only PENDING work: decisions whose event is not in the log yet. It is a function
   of the state, so after a crash a runner folds the run's events, calls `decide`, and performs what it
   returns. The list is empty exactly when the run is over or waits for an approver, a timer or an answer.
2. An effect's intent event does not make it done. After `model.requested` without a reply, `decide`
   returns the same `CallModel` (same id; `new_messages` is then empty, because those messages are
   already recorded). After `tool.called` without a result, the call is in the next `CallTools` again.
   A call with a result, or a model request with a reply, is never returned again: a recovered run
   re-issues only unanswered work and never duplicates an answered model call or a completed tool.
3. Effect ids are deterministic: `<run>/<turn>` for a model call (`<run>/<turn>#<n>` for the n-th retry
   after `model.failed`), `<run>/<turn>.<i>` for the i-th tool call of a turn. Runners use them as the
   Nats-Msg-Id of the work they send out, so a re-issued effect is deduplicated by JetStream. What keeps
   a run from being written twice (two endings, say) is not an id but the log: every append expects the
   run's last sequence, so of two racing writers only the first lands (`runtime.log`).
4. Folding is idempotent where delivery is not: an event whose `seq` is below the next expected one is
   a duplicate and changes nothing; a second result for the same call, a reply to a stale request or
   a second approval decision changes nothing. A gap in `seq`, or an event no log stamped, is an
   `EvolveError`.
5. Runners that perform several decisions of one `decide` may do so concurrently; they must append the
   events one at a time, each with the next `seq`.

Tool policies (runtime.policies) are checked by `decide` just before a call would be dispatched. With
`max_concurrent_tools == 1` the calls of a turn run one after another and call i is checked against the
results of calls 0..i-1, as if executed sequentially. With more concurrency, every call of a turn is
checked against the policy state at the moment the model replied, so the verdict never depends on
which concurrent call happened to finish first (and a recovered run reaches the same verdicts).

This module is over 500 lines because it is one concept: the state, its fold and its decisions read
together, and splitting them would make the recovery contract above span files.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Literal, TypeAlias, TypeVar, get_args

from runtime import history, questions, timers
from runtime.approval_policy import ApprovalRule, rule_for
from runtime.events import (
    ApprovalDenied,
    ApprovalGranted,
    ApprovalRequested,
    Event,
    ModelFailed,
    ModelRequested,
    ModelResponded,
    QuestionAnswered,
    QuestionAsked,
    RunCancelled,
    RunCompleted,
    RunFailed,
    RunForked,
    RunStarted,
    TimerFired,
    TimerStarted,
    ToolCalled,
    ToolCompleted,
    ToolFailed,
    TurnCompleted,
    tool_result,
)
from runtime.policies import ToolPolicy, check_all, initial_all, update_all
from runtime.types import Message, ToolCall, ToolError, ToolResult, ToolSchema, Usage


class EvolveError(ValueError):
    """An event that cannot belong to this run's log (a gap in `seq`, another run, nothing started)."""


# ── configuration ─────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class KernelConfig:
    """Everything that shapes a run besides its events: comes from the bundle, fixed for the run."""

    system_prompt: str = ""
    tools: tuple[ToolSchema, ...] = ()
    terminal_tool: str | None = None
    max_turns: int = 20
    max_consecutive_errors: int = 3
    max_concurrent_tools: int = 4
    history_window: int | None = None  # non-pinned messages per request; None sends the whole history
    policies: tuple[ToolPolicy, ...] = ()
    requires_approval: frozenset[str] = frozenset()  # tools whose every call waits for an approver
    approvals: tuple[ApprovalRule, ...] = ()  # conditional rules, timeouts, roles (runtime.approval_policy)
    sampling: Mapping[str, Any] = field(default_factory=dict)  # temperature, max_tokens, ... (sent as is)
    # The last turn `max_turns` allows offers only the terminal tool: a run that used its budget on other
    # calls ends with an answer instead of `max_turns`. No effect without a terminal tool.
    force_terminal_on_last_turn: bool = True
    # How a runner writes that forced turn's prompt (the kernel only chooses the tools it offers): "same"
    # keeps every tool in the prompt and lets the decoding constraint narrow the call, so the model server's
    # prefix cache still holds (`runtime.model.step`); "narrowed" lists only the offered tools, which a very
    # small model needs to fill the terminal call well (the demo's SmolLM2-135M) at the cost of that cache.
    last_turn_prompt: Literal["same", "narrowed"] = "same"
    # The run's token budget (prompt + completion tokens of its model replies): spent, the next model call
    # is not made and the run fails `budget_exceeded`. None: no budget.
    token_budget: int | None = None
    # tools among `tools` that are durable timers (`runtime.timers`): the kernel settles their calls itself
    timers: frozenset[str] = frozenset()
    # the bundle's `questions:` (`runtime.questions`): `ask_human` is among `tools`, settled by the kernel
    questions: questions.QuestionsConfig | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "policies", tuple(self.policies))
        object.__setattr__(self, "requires_approval", frozenset(self.requires_approval))
        object.__setattr__(self, "approvals", tuple(self.approvals))
        object.__setattr__(self, "timers", frozenset(self.timers))
        for name in ("max_turns", "max_consecutive_errors", "max_concurrent_tools"):
            if getattr(self, name) < 1:
                raise ValueError(f"KernelConfig.{name} must be at least 1, got {getattr(self, name)}")
        if self.token_budget is not None and self.token_budget < 1:
            raise ValueError(f"KernelConfig.token_budget must be None or at least 1, got {self.token_budget}")
        if self.history_window is not None and self.history_window < 1:
            raise ValueError(
                f"KernelConfig.history_window must be None or at least 1, got {self.history_window}"
            )
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError(f"KernelConfig.tools has duplicate names: {sorted(names)}")
        if self.terminal_tool is not None and self.terminal_tool not in names:
            raise ValueError(f"terminal_tool {self.terminal_tool!r} is not among the tools {names}")
        unknown = sorted(t for t in self.timers if t not in timers.TIMER_TOOLS or t not in names)
        if unknown:
            raise ValueError(f"KernelConfig.timers {unknown}: a timer is one of {sorted(timers.TIMER_TOOLS)} "
                             "and is among the tools")
        if self.questions is not None and questions.ASK_HUMAN not in names:
            raise ValueError(f"KernelConfig.questions is set but {questions.ASK_HUMAN} is not among the "
                             "tools")

    @property
    def tool_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.tools)

    def approval_rule(self, call: ToolCall) -> ApprovalRule | None:
        """The rule that makes `call` wait for an approver, or None: a matching rule of `approvals`
        first, else an unconditional one for a tool in `requires_approval`."""
        rule = rule_for(self.approvals, call)
        if rule is None and call.name in self.requires_approval:
            rule = ApprovalRule(call.name)
        return rule

    def offered(self, turn: int) -> tuple[ToolSchema, ...]:
        """The tools the model may call in `turn`: all of them, except on a forced last turn, where only
        the terminal tool remains (a grammar-constrained decoder then cannot emit anything else)."""
        if self.force_terminal_on_last_turn and self.terminal_tool is not None and turn >= self.max_turns:
            return tuple(t for t in self.tools if t.name == self.terminal_tool)
        return self.tools


# ── effects ───────────────────────────────────────────────────────────────────────────────────────────


@dataclass(frozen=True)
class CallModel:
    """Ask the model. `messages` is the prompt to send (pinned head + window); `new_messages` is what the
    runner records in `model.requested` (only the messages added since the previous request). `tools` is
    what this request offers: the config's tools, or only the terminal tool on a forced last turn."""

    id: str
    turn: int
    attempt: int
    messages: tuple[Message, ...]
    new_messages: tuple[Message, ...]
    context_start: int
    tools: tuple[ToolSchema, ...]
    sampling: Mapping[str, Any]
    deadline: float | None


@dataclass(frozen=True)
class CallTools:
    """Execute these calls, at most `max_concurrent` at a time; each call's id is its dedup id."""

    id: str
    calls: tuple[ToolCall, ...]
    max_concurrent: int
    deadline: float | None


# The facts `decide` settles on its own: the runner appends them as they are (the log stamps them).
# An approval verdict is one only when its approval's timeout passed (`expire`); a person's is an input.
Decided: TypeAlias = (ToolFailed | ApprovalRequested | ApprovalGranted | ApprovalDenied | TimerStarted
                      | QuestionAsked | QuestionAnswered | TurnCompleted | RunCompleted | RunFailed)
Effect: TypeAlias = CallModel | CallTools
Decision: TypeAlias = Effect | Decided

DECIDED_TYPES: tuple[type[Decided], ...] = get_args(Decided)


def model_request_id(run_id: str, turn: int, attempt: int = 0) -> str:
    return f"{run_id}/{turn}" if attempt == 0 else f"{run_id}/{turn}#{attempt}"


def tool_call_id(run_id: str, turn: int, index: int) -> str:
    return f"{run_id}/{turn}.{index}"


def rebase_id(effect_id: str, old_run: str, new_run: str) -> str:
    """The id `effect_id` (a model request or tool call id of `old_run`) would have in `new_run`: what a
    copy of a run's log (a fork) re-derives, so no id in the new run names the old one."""
    prefix = f"{old_run}/"
    if not effect_id.startswith(prefix):
        raise ValueError(f"id {effect_id!r} does not belong to run {old_run!r}")
    return f"{new_run}/{effect_id[len(prefix):]}"


def tool_calls(run_id: str, turn: int, parsed: Iterable[tuple[str, dict[str, Any]]]) -> tuple[ToolCall, ...]:
    """The model's parsed calls with their deterministic ids: what a runner puts in `model.responded`."""
    return tuple(
        ToolCall(tool_call_id(run_id, turn, i), name, dict(args)) for i, (name, args) in enumerate(parsed)
    )


# ── state ─────────────────────────────────────────────────────────────────────────────────────────────

BUDGET_EXCEEDED = "budget_exceeded"  # a run's ending, and the `model.failed` kind that reports a spent budget
NO_TERMINAL_CALL = "no_terminal_call"  # a run's ending: text where its terminal tool had to be called

Status = Literal["new", "running", "completed", "failed", "cancelled"]
TERMINAL: frozenset[str] = frozenset({"completed", "failed", "cancelled"})  # the statuses of a run that ended


_R = TypeVar("_R", "State", "Turn")
_FIELDS: dict[type, frozenset[str]] = {}


def replace(obj: _R, /, **changes: Any) -> _R:
    """`dataclasses.replace` for the kernel's `State` and `Turn`, without running `__init__` again.

    Why: a host folds every event it appends, and `dataclasses.replace` (a generic call of `__init__`
    with every field) was a twentieth of a busy host's CPU. These two classes have no `__post_init__`
    and nothing derived, so copying the instance dict and overriding the changed fields gives the same
    object; an unknown field name is still an error, as with `dataclasses.replace`.
    """
    cls = type(obj)
    known = _FIELDS.get(cls)
    if known is None:
        known = _FIELDS[cls] = frozenset(f.name for f in fields(cls))
    if not changes.keys() <= known:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(changes.keys() - known)}")
    new = object.__new__(cls)
    new.__dict__.update(obj.__dict__)
    new.__dict__.update(changes)
    return new


@dataclass(frozen=True)
class Turn:
    """One model reply and the calls it made, from the first request until `turn.completed`."""

    number: int
    attempt: int = 0  # failed model attempts so far
    requested: bool = False  # `model.requested` recorded for the current attempt
    responded: bool = False
    content: str = ""
    calls: tuple[ToolCall, ...] = ()
    parse_error: str | None = None
    # a reply with no calls where the run ends only through the terminal tool: a model error, not an ending
    missed_terminal: bool = False
    called: frozenset[str] = frozenset()
    results: Mapping[str, ToolResult] = field(default_factory=dict)  # call id -> result (copy on write)
    approvals_requested: frozenset[str] = frozenset()
    approvals: Mapping[str, str | None] = field(default_factory=dict)  # call id -> None granted | reason
    # call id -> (when its approval times out, the verdict then, the timeout): from `approval.requested`
    approval_timeouts: Mapping[str, tuple[float, str, float]] = field(default_factory=dict)
    edited: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # call id -> approved arguments
    timers: Mapping[str, float] = field(default_factory=dict)  # call id -> when its timer is due
    questions: Mapping[str, questions.Open] = field(default_factory=dict)  # call id -> its open question
    # call id -> (round, what it carries): a call a person's answer sent out again (`questions.resumed`)
    resumed: Mapping[str, tuple[int, Mapping[str, Any]]] = field(default_factory=dict)
    policy_snapshot: tuple[Any, ...] = ()  # policy states when the model replied

    def call(self, call_id: str) -> ToolCall | None:
        return next((c for c in self.calls if c.id == call_id), None)

    @property
    def resolved(self) -> bool:
        return self.responded and all(c.id in self.results for c in self.calls)


@dataclass(frozen=True)
class Conversation:
    """What a thread's run continues from: the messages of run `run_id` folded from its events with seq
    below `seq` (system prompt and any unfinished exchange removed: `history.continued`)."""

    run_id: str
    seq: int
    messages: tuple[Message, ...] = ()


@dataclass(frozen=True)
class State:
    """A run as folded from its events. Never mutated: `evolve` returns a new one."""

    config: KernelConfig
    status: Status = "new"
    run_id: str = ""
    actor: str = ""  # the actor key that owns the run (`bundle` or `bundle:instance`)
    seq: int = 0  # the seq the next event must carry
    ts: float = 0.0  # the latest event's timestamp
    deadline: float | None = None
    messages: tuple[Message, ...] = ()  # the whole conversation
    recorded: int = 0  # how many of `messages` are already in some `model.requested`
    turns: int = 0  # turns completed
    turn: Turn | None = None  # the open turn
    last: Turn | None = None  # the latest completed turn
    consecutive_errors: int = 0
    policy_states: tuple[Any, ...] = ()
    usage: Usage = field(default_factory=Usage)
    output: Any = None
    reason: str | None = None
    conversation: Conversation | None = None  # the thread's earlier messages, given to `initial`
    exceeded: str | None = None  # a budget the runner reported spent (`model.failed` budget_exceeded)

    @property
    def done(self) -> bool:
        return self.status in TERMINAL


def initial(config: KernelConfig, conversation: Conversation | None = None) -> State:
    """The state before any event. The task enters through `run.started`, so that folding a run's log
    needs nothing but the bundle's config and the events, plus, for a run in a thread, the conversation
    its `run.started` names (read by the runner from the previous run's log)."""
    return State(config=config, policy_states=initial_all(config.policies), conversation=conversation)


def fold(config: KernelConfig, events: Iterable[Event], conversation: Conversation | None = None) -> State:
    state = initial(config, conversation)
    for ev in events:
        state = evolve(state, ev)
    return state


# ── evolve ────────────────────────────────────────────────────────────────────────────────────────────


def evolve(state: State, ev: Event) -> State:
    """The state after one event. Pure; see the module docstring for what is ignored and what raises."""
    if ev.seq < 0:
        raise EvolveError(f"{type(ev).__name__} has no seq: append it through the run log (or events.stamp)")
    if ev.seq < state.seq:
        return state  # redelivered duplicate
    if ev.seq > state.seq:
        raise EvolveError(f"event {ev.seq} arrived but the run expects seq {state.seq}: the log has a gap")
    if state.status == "new" and not isinstance(ev, RunStarted):  # a fork's run.forked is a run.started
        raise EvolveError(f"{type(ev).__name__} before run.started")
    if state.status != "new" and ev.run_id != state.run_id:
        raise EvolveError(f"event of run {ev.run_id!r} folded into run {state.run_id!r}")
    state = replace(state, seq=ev.seq + 1, ts=ev.ts)
    if state.done:
        return state  # late events after the end explain, they do not change the outcome
    return _apply(state, ev)


def _apply(state: State, ev: Event) -> State:
    """One event's effect on a running run's state: a dispatch, one small function per kind of event."""
    match ev:
        case RunStarted():
            return _started(state, ev)
        case ModelRequested():
            turn = _turn_for_model(state, ev.request_id)
            if turn is None:
                return state
            return replace(state, turn=replace(turn, requested=True), recorded=len(state.messages))
        case ModelFailed():
            return _model_failed(state, ev)
        case ModelResponded():
            return _responded(state, ev)
        case ToolCalled():
            return _tool_called(state, ev)
        case ToolCompleted() | ToolFailed():
            return _result(state, ev.call_id, tool_result(ev))
        case ApprovalRequested():
            return _approval_requested(state, ev)
        case ApprovalGranted() | ApprovalDenied():
            return _approval_decided(state, ev)
        case TimerStarted():
            return _timer_started(state, ev)
        case TimerFired():
            return _timer_fired(state, ev)
        case QuestionAsked() | QuestionAnswered():
            return _question(state, ev)
        case TurnCompleted():
            return _turn_completed(state, ev)
        case RunCompleted() | RunFailed() | RunCancelled():
            return _ended(state, ev)
        case _:
            return state  # script.* (old logs) explain a call; its outcome arrives as tool.completed/failed


def _started(state: State, ev: RunStarted) -> State:
    if state.status != "new":
        return state
    system = state.config.system_prompt
    if isinstance(ev, RunForked) and ev.system_prompt is not None:
        system = ev.system_prompt  # a fork that goes on with another system prompt
    head = (Message("system", system),) if system else ()
    deadline = ev.ts + ev.timeout_s if ev.timeout_s is not None else None
    earlier = _earlier(state, ev)
    return replace(
        state,
        status="running",
        run_id=ev.run_id,
        actor=ev.actor,
        deadline=deadline,
        messages=(*head, *earlier, Message("user", ev.input)),
        recorded=len(head) + len(earlier) if earlier else 0,
    )


def _model_failed(state: State, ev: ModelFailed) -> State:
    turn = _turn_for_model(state, ev.request_id)
    if turn is None:
        return state
    return replace(
        state,
        turn=replace(turn, attempt=turn.attempt + 1, requested=False),
        consecutive_errors=state.consecutive_errors + 1,
        exceeded=ev.error if ev.error_kind == BUDGET_EXCEEDED else state.exceeded,
    )


def _tool_called(state: State, ev: ToolCalled) -> State:
    turn = state.turn
    if turn is None or turn.call(ev.call.id) is None:
        return state
    return replace(state, turn=replace(turn, called=turn.called | {ev.call.id}))


def _approval_requested(state: State, ev: ApprovalRequested) -> State:
    turn = state.turn
    if turn is None or turn.call(ev.call.id) is None:
        return state
    timeouts = turn.approval_timeouts
    if ev.timeout_s is not None:
        timeouts = {**timeouts, ev.call.id: (ev.ts + ev.timeout_s, ev.on_timeout, ev.timeout_s)}
    requested = turn.approvals_requested | {ev.call.id}
    return replace(state, turn=replace(turn, approvals_requested=requested, approval_timeouts=timeouts))


def _approval_decided(state: State, ev: ApprovalGranted | ApprovalDenied) -> State:
    turn = state.turn
    if turn is None or turn.call(ev.call_id) is None or ev.call_id in turn.approvals:
        return state
    verdict = None if isinstance(ev, ApprovalGranted) else (ev.reason or "no reason given")
    edited = turn.edited
    if isinstance(ev, ApprovalGranted) and ev.arguments is not None:
        edited = {**edited, ev.call_id: dict(ev.arguments)}
    return replace(state, turn=replace(turn, approvals={**turn.approvals, ev.call_id: verdict},
                                       edited=edited))


def _timer_started(state: State, ev: TimerStarted) -> State:
    turn = state.turn
    if turn is None or turn.call(ev.call_id) is None or ev.call_id in turn.timers or \
            ev.call_id in turn.results:
        return state
    return replace(state, turn=replace(turn, timers={**turn.timers, ev.call_id: ev.due}))


def _timer_fired(state: State, ev: TimerFired) -> State:
    """A timer's call gets its result; a wake for a timer that never started, or fired already, is nothing."""
    turn = state.turn
    if turn is None or ev.call_id not in turn.timers:
        return state
    return _result(state, ev.call_id, ToolResult(output=timers.fired_output(turn.timers[ev.call_id], ev.ts)))


def _question(state: State, ev: QuestionAsked | QuestionAnswered) -> State:
    """A question opens (once, for a call with no result), or its answer becomes the call's result; an
    answer to a question never asked, or answered already, is nothing. A question a running call put
    (`resume`) opens only from the call's current round (a late report of an earlier round is nothing), and
    its answer fails the call or sends it out again one round up (`questions.resumed`)."""
    turn = state.turn
    if turn is None or (call := turn.call(ev.call_id)) is None or ev.call_id in turn.results:
        return state
    if isinstance(ev, QuestionAsked):
        current = turn.resumed[ev.call_id][0] if ev.call_id in turn.resumed else 0
        if ev.call_id in turn.questions or (ev.resume is not None and ev.round != current):
            return state
        opened = {**turn.questions, ev.call_id: questions.opened(ev)}
        return replace(state, turn=replace(turn, questions=opened))
    if ev.call_id not in turn.questions:
        return state
    q = turn.questions[ev.call_id]
    if q.resume is None:
        return _result(state, ev.call_id, ToolResult(output=questions.answer_output(ev, q)))
    then = questions.resumed(ev, q, call)
    if isinstance(then, ToolResult):
        return _result(state, ev.call_id, then)
    left = {k: v for k, v in turn.questions.items() if k != ev.call_id}
    resumed = {**turn.resumed, ev.call_id: (q.round + 1, then)}
    return replace(state, turn=replace(turn, questions=left, resumed=resumed))


def _ended(state: State, ev: RunCompleted | RunFailed | RunCancelled) -> State:
    if isinstance(ev, RunCompleted):
        return replace(state, status="completed", output=ev.output)
    if isinstance(ev, RunFailed):
        return replace(state, status="failed", reason=f"{ev.reason}: {ev.detail}" if ev.detail else ev.reason)
    return replace(state, status="cancelled", reason=ev.reason or "cancelled")


def _earlier(state: State, ev: RunStarted) -> tuple[Message, ...]:
    """The thread's earlier messages `ev` refers to: they must be the conversation the runner gave."""
    conv = state.conversation
    if ev.previous_run is None:
        if conv is not None:
            raise EvolveError(f"run {ev.run_id} continues no conversation, but was folded with run "
                              f"{conv.run_id}'s: fold it without one")
        return ()
    if conv is None or conv.run_id != ev.previous_run or conv.seq != ev.previous_seq:
        given = f"run {conv.run_id} up to seq {conv.seq}" if conv is not None else "none"
        raise EvolveError(f"run {ev.run_id} continues run {ev.previous_run} up to seq {ev.previous_seq}, but "
                          f"the conversation given is {given}: read it with runtime.log.threads.conversation")
    if ev.summary is None:
        return conv.messages
    return (history.summary_message(ev.summary), *conv.messages[ev.summarised:])


def _turn_for_model(state: State, request_id: str) -> Turn | None:
    """The open turn if `request_id` is its current model request and it has no reply yet."""
    turn = state.turn or Turn(number=state.turns + 1)
    if turn.responded or request_id != model_request_id(state.run_id, turn.number, turn.attempt):
        return None
    return turn


def _responded(state: State, ev: ModelResponded) -> State:
    turn = _turn_for_model(state, ev.request_id)
    if turn is None:
        return state
    if ev.parse_error is not None:
        said = Message("assistant", ev.text)
        told = Message(
            "user",
            f"Error [parse]: your reply could not be read as tool calls: {ev.parse_error}. "
            "Reply again with valid tool calls.",
        )
        turn = replace(turn, responded=True, content=ev.text, parse_error=ev.parse_error)
        messages = (*state.messages, said, told)
    elif not ev.calls and state.config.terminal_tool is not None:
        text = ev.content or ev.text
        turn = replace(turn, responded=True, content=text, missed_terminal=True)
        messages = (*state.messages, Message("assistant", text), _terminal_required(state.config))
    else:
        turn = replace(
            turn, responded=True, content=ev.content, calls=ev.calls, policy_snapshot=state.policy_states
        )
        messages = (*state.messages, Message("assistant", ev.content, tool_calls=ev.calls))
    usage = Usage(
        state.usage.prompt_tokens + ev.usage.prompt_tokens,
        state.usage.completion_tokens + ev.usage.completion_tokens,
    )
    return replace(state, turn=turn, messages=messages, usage=usage)


def _terminal_required(cfg: KernelConfig) -> Message:
    """What the model is told after a reply in text when the run ends only through the terminal tool."""
    return Message(
        "user",
        f"Error [{NO_TERMINAL_CALL}]: a reply without a tool call does not finish this task. Call the tool "
        f"{cfg.terminal_tool} with your answer.",
    )


def _result(state: State, call_id: str, result: ToolResult) -> State:
    turn = state.turn
    call = turn.call(call_id) if turn is not None else None
    if turn is None or call is None or call_id in turn.results:
        return state  # unknown, stale or second result: changes nothing
    policies = update_all(state.config.policies, state.policy_states, call, result)
    return replace(
        state, turn=replace(turn, results={**turn.results, call_id: result}), policy_states=policies
    )


def _turn_completed(state: State, ev: TurnCompleted) -> State:
    turn = state.turn
    if turn is None or turn.number != ev.turn or not turn.resolved:
        return state
    replies = tuple(
        Message("tool", turn.results[c.id].for_model(), tool_call_id=c.id, name=c.name) for c in turn.calls
    )
    errors = state.consecutive_errors
    if turn.parse_error is not None or turn.missed_terminal or \
            (turn.calls and not any(turn.results[c.id].ok for c in turn.calls)):
        errors += 1
    elif turn.calls:
        errors = 0
    return replace(
        state,
        messages=state.messages + replies,
        turns=state.turns + 1,
        turn=None,
        last=turn,
        consecutive_errors=errors,
    )


# ── decide ────────────────────────────────────────────────────────────────────────────────────────────


def decide(state: State) -> list[Decision]:
    """The pending decisions of this state (see the recovery contract in the module docstring)."""
    if state.status != "running":
        return []
    cfg, run = state.config, state.run_id
    turn = state.turn
    if turn is None and state.last is not None:
        finished = _finished(cfg, state.last)
        if finished is not None:
            return [RunCompleted(run_id=run, output=finished[0])]
    if state.deadline is not None and state.ts >= state.deadline:
        return [RunFailed(run_id=run, reason="deadline",
                          detail=f"the task's deadline passed at {state.deadline:.3f}")]
    if state.exceeded is not None:
        return [RunFailed(run_id=run, reason=BUDGET_EXCEEDED, detail=state.exceeded)]
    if turn is None or not turn.responded:
        spent = state.usage.prompt_tokens + state.usage.completion_tokens
        if cfg.token_budget is not None and spent >= cfg.token_budget:
            return [RunFailed(run_id=run, reason=BUDGET_EXCEEDED,
                              detail=f"the run's token budget of {cfg.token_budget:,} is spent ({spent:,} "
                                     "tokens used)")]
        if (state.consecutive_errors >= cfg.max_consecutive_errors or state.turns >= cfg.max_turns) and \
                state.last is not None and state.last.missed_terminal:
            return [_no_terminal_call(state, state.last)]
        if state.consecutive_errors >= cfg.max_consecutive_errors:
            return [RunFailed(
                run_id=run, reason="consecutive_errors",
                detail=f"{state.consecutive_errors} errors in a row (limit {cfg.max_consecutive_errors})")]
        if state.turns >= cfg.max_turns:
            return [RunFailed(run_id=run, reason="max_turns", detail=f"no result after {state.turns} turns")]
        return [_call_model(state, turn or Turn(number=state.turns + 1))]
    return _decide_calls(state, turn)


def _finished(cfg: KernelConfig, last: Turn) -> tuple[Any] | None:
    """(output,) when the completed turn ends the run: a successful terminal call, or a plain answer when
    there is no terminal tool."""
    if last.parse_error is not None or last.missed_terminal:
        return None
    if not last.calls:
        return (last.content,)
    for call in last.calls:
        if call.name == cfg.terminal_tool and last.results[call.id].ok:
            return (last.results[call.id].output,)
    return None


def _no_terminal_call(state: State, last: Turn) -> RunFailed:
    """The ending of a run whose budget of errors or turns ran out on a reply in text where a call of the
    terminal tool was required: it names the tool, the budget and what the model said last."""
    cfg = state.config
    if state.consecutive_errors >= cfg.max_consecutive_errors:
        spent = f"{state.consecutive_errors} errors in a row (limit {cfg.max_consecutive_errors})"
    else:
        spent = f"{state.turns} turns (limit {cfg.max_turns})"
    said = last.content if len(last.content) <= 200 else last.content[:197] + "..."
    return RunFailed(run_id=state.run_id, reason=NO_TERMINAL_CALL,
                     detail=f"the model replied in text instead of calling the terminal tool "
                            f"{cfg.terminal_tool!r}, {spent}; its last reply: {said!r}")


def _call_model(state: State, turn: Turn) -> CallModel:
    cfg = state.config
    prompt, start = history.select(state.messages, cfg.history_window)
    return CallModel(
        id=model_request_id(state.run_id, turn.number, turn.attempt),
        turn=turn.number,
        attempt=turn.attempt,
        messages=prompt,
        new_messages=state.messages[state.recorded :],
        context_start=start,
        tools=cfg.offered(turn.number),
        sampling=dict(cfg.sampling),
        deadline=state.deadline,
    )


def _decide_calls(state: State, turn: Turn) -> list[Decision]:
    cfg, run = state.config, state.run_id
    sequential = cfg.max_concurrent_tools == 1
    pending = [c for c in turn.calls if c.id not in turn.results]
    if not pending:
        ok = sum(1 for c in turn.calls if turn.results[c.id].ok)
        return [TurnCompleted(run_id=run, turn=turn.number, calls_ok=ok, calls_failed=len(turn.calls) - ok)]
    if sequential:
        pending = pending[:1]  # call i is decided only once calls 0..i-1 have their results
    policy_states = state.policy_states if sequential else turn.policy_snapshot
    decisions: list[Decision] = []
    dispatch: list[ToolCall] = []
    for call in pending:
        if call.id in turn.edited:  # an approver edited the arguments: the call runs (and is checked) so
            call = ToolCall(call.id, call.name, dict(turn.edited[call.id]))
        denial = _denial(cfg, turn, policy_states, call)
        rule = cfg.approval_rule(call) if denial is None and call.id not in turn.approvals else None
        if denial is not None:
            decisions.append(ToolFailed(run_id=run, call_id=call.id, tool=call.name, error=denial))
        elif rule is not None:
            if call.id not in turn.approvals_requested:
                decisions.append(_approval_request(cfg, run, call, rule))
            elif (verdict := _timed_out(run, turn, call.id, state.ts)) is not None:
                decisions.append(verdict)
        elif call.name in cfg.timers:
            if call.id not in turn.timers:  # started: it waits for `timer.fired`, as a call for its result
                decisions.append(_start_timer(state, call))
        elif call.name == questions.ASK_HUMAN and cfg.questions is not None:
            if (asked := _ask(state, turn, call, cfg.questions)) is not None:
                decisions.append(asked)
        elif call.id in turn.questions:
            pass  # the call put a question to a person: it waits for the answer, then goes out again
        else:
            dispatch.append(call)
    if dispatch:
        decisions.append(
            CallTools(
                id=f"{run}/{turn.number}/tools",
                calls=tuple(dispatch),
                max_concurrent=cfg.max_concurrent_tools,
                deadline=state.deadline,
            )
        )
    return decisions


def _start_timer(state: State, call: ToolCall) -> TimerStarted | ToolFailed:
    """A timer call's `timer.started`, due at a time computed from its arguments and the latest event's
    `ts` (so a replay decides the same), or the error its arguments earn (`runtime.timers.due_of`)."""
    due = timers.due_of(call, state.ts, state.deadline)
    if isinstance(due, ToolError):
        return ToolFailed(run_id=state.run_id, call_id=call.id, tool=call.name, error=due)
    return TimerStarted(run_id=state.run_id, call_id=call.id, tool=call.name, due=due)


def _ask(state: State, turn: Turn, call: ToolCall, cfg: questions.QuestionsConfig) -> Decided | None:
    """An `ask_human` call's `question.asked` (or the error its arguments earn); once asked, what its
    timeout gives when the latest event's `ts` is past it; else None: it waits for `question.answered`."""
    if call.id not in turn.questions:
        return questions.ask(state.run_id, call, state.ts, cfg)
    return questions.timed_out(state.run_id, call, turn.questions[call.id], state.ts)


def _approval_request(cfg: KernelConfig, run: str, call: ToolCall, rule: ApprovalRule) -> ApprovalRequested:
    schema = next((t for t in cfg.tools if t.name == call.name), None)
    return ApprovalRequested(
        run_id=run, call=call, condition=rule.when.describe() if rule.when is not None else "",
        parameters=dict(schema.parameters) if schema is not None else {}, role=rule.role,
        timeout_s=rule.timeout_s, on_timeout=rule.on_timeout)


def _timed_out(run: str, turn: Turn, call_id: str, now: float) -> ApprovalGranted | ApprovalDenied | None:
    """The verdict of `call_id`'s approval if its timeout has passed at `now` and nobody decided."""
    if call_id in turn.approvals or call_id in turn.results or call_id not in turn.approval_timeouts:
        return None
    at, verdict, timeout = turn.approval_timeouts[call_id]
    if now < at:
        return None
    if verdict == "approve":
        return ApprovalGranted(run_id=run, call_id=call_id, by="timeout",
                               note=f"no decision within {timeout:g} s: approved by the approval policy")
    return ApprovalDenied(run_id=run, call_id=call_id, by="timeout",
                          reason=f"no decision within {timeout:g} s: denied by the approval policy")


def pending_approvals(state: State) -> tuple[ToolCall, ...]:
    """The calls of the open turn that wait for a person: approval requested, no verdict, no result."""
    turn = state.turn
    if state.status != "running" or turn is None:
        return ()
    return tuple(c for c in turn.calls if c.id in turn.approvals_requested and c.id not in turn.approvals
                 and c.id not in turn.results)


def pending_timers(state: State) -> tuple[tuple[str, float], ...]:
    """The open turn's timers that started and have not fired, as (call id, due), soonest first; empty
    once the run is over. A run whose only pending work is these sleeps (`sleeping_until`)."""
    turn = state.turn
    if state.status != "running" or turn is None:
        return ()
    return tuple(sorted(((c, due) for c, due in turn.timers.items() if c not in turn.results),
                        key=lambda t: (t[1], t[0])))


def pending_questions(state: State) -> tuple[tuple[ToolCall, questions.Open], ...]:
    """The open turn's questions asked and not answered (no result), in call order; empty once the run is
    over. A run whose only pending work is these and timers is parked (`parked_until`)."""
    turn = state.turn
    if state.status != "running" or turn is None:
        return ()
    return tuple((c, turn.questions[c.id]) for c in turn.calls
                 if c.id in turn.questions and c.id not in turn.results)


def approval_wake(state: State, call_id: str) -> float | None:
    """When a run waiting for a verdict on `call_id` must wake without one: the approval rule's timeout or
    the task's deadline, whichever is first; None if only a verdict can wake it."""
    turn = state.turn
    timeout = turn.approval_timeouts.get(call_id) if turn is not None else None
    times = [t for t in (timeout[0] if timeout else None, state.deadline) if t is not None]
    return min(times) if times else None


def parked_until(state: State) -> float | None:
    """If all the run waits for is timers, questions and approvals (no decision pending, every other call
    answered): when it must wake by itself, the first timer, question or approval timeout, or the deadline
    while a person is waited for; `inf` if only a person's answer or verdict can wake it. Else None."""
    asks, approvals = pending_questions(state), pending_approvals(state)
    if not asks and not approvals:
        return sleeping_until(state)
    if decide(state):
        return None  # a call still out is in `decide`'s CallTools until its result arrives
    times = [questions.wake_at(q, state.deadline) for _, q in asks]
    times += [approval_wake(state, c.id) for c in approvals]
    times += [due for _, due in pending_timers(state)]
    return min((t for t in times if t is not None), default=float("inf"))


def sleeping_until(state: State) -> float | None:
    """When the run wakes, if all it waits for is timers (no decision pending, no approval, every other
    call answered): the first timer's due time. Else None."""
    timers_ = pending_timers(state)
    if not timers_ or decide(state) or pending_approvals(state):
        return None  # a call still out is in `decide`'s CallTools until its result arrives
    return timers_[0][1]


def next_timer(state: State) -> float | None:
    """When time alone next settles something: the run's deadline, the first approval or question timeout
    (an event timestamp, or None). A runner with nothing else to do wakes then and asks `expire`."""
    times = [state.deadline] if state.deadline is not None else []
    turn = state.turn
    if turn is not None:
        times += [turn.approval_timeouts[c.id][0] for c in pending_approvals(state)
                  if c.id in turn.approval_timeouts]
        times += [q.due for _, q in pending_questions(state) if q.due is not None]
    return min(times, default=None)


Verdict: TypeAlias = ApprovalGranted | ApprovalDenied | QuestionAnswered | ToolFailed


def expire(state: State, now: float) -> list[Verdict]:
    """The verdicts whose approval or question timed out by `now` (a time the runner read from its clock,
    since no event arrived to carry it): what the runner appends, stamped with that time, when it wakes at
    `next_timer`. Pure: the same verdicts `decide` returns once an event's `ts` is past the timeout."""
    turn = state.turn
    if turn is None or state.status != "running":
        return []
    verdicts: list[Verdict | None] = [
        _timed_out(state.run_id, turn, c.id, now) for c in pending_approvals(state)]
    verdicts += [questions.timed_out(state.run_id, c, q, now) for c, q in pending_questions(state)]
    return [v for v in verdicts if v is not None]


def _denial(cfg: KernelConfig, turn: Turn, policy_states: Sequence[Any], call: ToolCall) -> ToolError | None:
    verdict = turn.approvals.get(call.id)
    if verdict is not None:
        return ToolError("policy", f"approval for {call.name} was denied: {verdict}", detail="approval")
    if call.name not in cfg.tool_names:
        known = ", ".join(sorted(cfg.tool_names)) or "none"
        return ToolError("input", f"unknown tool {call.name!r}; available tools: {known}")
    offered = cfg.offered(turn.number)
    if offered is not cfg.tools and all(t.name != call.name for t in offered):
        return ToolError(
            "policy",
            f"{call.name} is not available in the last turn ({turn.number} of {cfg.max_turns}); "
            f"call {cfg.terminal_tool} with your answer",
            detail="last_turn",
        )
    reason = check_all(cfg.policies, tuple(policy_states), call)
    if reason is not None:
        return ToolError("policy", reason)
    return None


__all__ = [
    "BUDGET_EXCEEDED",
    "DECIDED_TYPES",
    "NO_TERMINAL_CALL",
    "TERMINAL",
    "CallModel",
    "CallTools",
    "Conversation",
    "Decided",
    "Decision",
    "Effect",
    "EvolveError",
    "KernelConfig",
    "State",
    "Turn",
    "approval_wake",
    "decide",
    "evolve",
    "expire",
    "fold",
    "initial",
    "model_request_id",
    "next_timer",
    "parked_until",
    "pending_approvals",
    "pending_questions",
    "pending_timers",
    "rebase_id",
    "sleeping_until",
    "tool_call_id",
    "tool_calls",
]
