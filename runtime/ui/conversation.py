"""What the model saw: a run's conversation at any turn, folded from the log by the kernel.

    reader = Conversations(client, bundles)
    await reader.read(run_id, turn=3)        # the prompt of turn 3: every message, sent or left out
    await reader.read(run_id, turn=None)     # the whole conversation so far
    await reader.message(run_id, index=7)    # one message whole (its big payload fetched)

The messages are `kernel.fold`'s `state.messages`, never re-derived here: the same fold a host recovers a
run with. What the model received at turn N is what `kernel.decide` handed the model runner then, and
`model.requested` recorded the one number that explains it, `context_start`: the prompt is the pinned head
(system prompt and task, `history.pinned_count`) plus the messages from `context_start` on. Messages
between the two were left out by the bundle's history window: the page shows them struck through. They
are shown in the kernel's neutral form (role, text, tool calls); the model adapter renders them for its
model family.

Alongside the fold this module keeps, for each message, its origin: the event it came from (the task from
`run.started`, a reply from `model.responded`, a tool message from its call's `tool.completed` or
`tool.failed`), so a page can link a message to its event, and so a big payload, stored apart and read
here only as a stub, is fetched when someone asks for it (`message`) rather than with the page.

Where the system prompt comes from: the kernel takes it from the bundle (`KernelConfig.system_prompt`),
and the first `model.requested` of a run records it (it records the messages added since the last
request, and at first that is all of them). So: the fork's own (`run.forked.system_prompt`), else the one
this run recorded, else (a thread's later run records only its task) the bundle the runs index names if
its digest is the run's, else the one the thread's first run recorded, else the bundle as it is now (with
a warning), else none, said so. Every request whose recorded delta can be compared is compared with the
fold's, and a difference is reported (`mismatches`).

Threads: a run in a thread starts from the conversation its previous run ended with. The chain of runs is
walked back through `run.started.previous_run` and folded forward as `runtime.log.threads.conversation`
does it (`kernel.fold`, then `history.continued`), from the events as stored, so the page shows the
thread's conversation continuous, each earlier message naming the run it came from.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from runtime import events as ev
from runtime import history, kernel
from runtime.client import Client
from runtime.nats.subjects import check_token
from runtime.types import Message
from runtime.ui.bundles import Bundles

LATEST = -1  # the turn `read` shows when asked for none in particular: the latest one with a request
CUT = 4000  # characters of a message's text (or a call's arguments) a page gets before asking for it whole
MAX_THREAD_RUNS = 1000  # how far back a thread is walked


class NoConversation(LookupError):
    """No such run, turn or message; the message says what there is instead."""


@dataclass(frozen=True)
class Origin:
    """Where a message came from: the event (`run_id`, `seq`) whose fold added it; `stub` is the stored size
    when that event's big fields are in the object store (the message's text is then fetched on demand)."""

    run_id: str
    seq: int | None
    note: str = ""
    stub: int | None = None


def origin_of(event: ev.Event, note: str = "") -> Origin:
    return Origin(event.run_id, event.seq, note, event.ref.size if event.ref is not None else None)


@dataclass(frozen=True)
class Request:
    """One `model.requested`: the conversation had `count` messages then (the prompt is drawn from them)."""

    seq: int
    request_id: str
    turn: int
    attempt: int
    context_start: int
    count: int
    ts: float
    tools: tuple[str, ...]
    sampling: dict[str, Any]


@dataclass
class Traced:
    """A run folded by the kernel, with every message's origin and every request's shape."""

    state: kernel.State
    origins: list[Origin]
    requests: list[Request] = field(default_factory=list)
    answers: dict[str, ev.Event] = field(default_factory=dict)  # request id -> its reply or failure
    mismatches: list[int] = field(default_factory=list)  # seqs of requests the log records differently
    kept: tuple[str, int] | None = None  # a fork: its source run, and the seq below which events are its
    reprompted: bool = False  # a fork that goes on with another system prompt than its kept events had


def _same(recorded: Sequence[Message], folded: Sequence[Message]) -> bool:
    return [(m.role, m.content, m.tool_call_id) for m in recorded] == \
        [(m.role, m.content, m.tool_call_id) for m in folded]


def _started_origins(state: kernel.State, event: ev.RunStarted, earlier: list[Origin],
                     system: Origin) -> list[Origin]:
    """The origins of the messages `run.started` folds in: the system prompt, the thread's earlier
    messages (a summary first, when the run started from one), the task."""
    head = [system] if state.messages and state.messages[0].role == "system" else []
    if event.summary is not None:
        summary = origin_of(event, "a summary of the thread's earlier messages")
        earlier = [summary, *earlier[event.summarised:]]
    count = len(state.messages) - len(head) - 1
    if len(earlier) != count:  # never expected: still show the messages, without their runs
        earlier = [Origin(event.previous_run or event.run_id, None, "earlier in the thread")] * count
    return [*head, *earlier, origin_of(event, "the task")]


def fold_traced(config: kernel.KernelConfig, events: Sequence[ev.Event], *,
                earlier: kernel.Conversation | None = None, earlier_origins: Sequence[Origin] = (),
                system: Origin | None = None) -> Traced:
    """`kernel.fold(config, events, earlier)`, keeping each message's origin and each request's shape."""
    state = kernel.initial(config, earlier)
    traced = Traced(state, [])
    outcomes: dict[str, Origin] = {}  # call id -> the origin of its outcome (what its tool message says)
    for e in events:
        before = len(state.messages)
        if isinstance(e, ev.ModelRequested) and state.status == "running":
            _request(traced, state, e)
        elif isinstance(e, ev.ModelResponded | ev.ModelFailed):
            traced.answers.setdefault(e.request_id, e)
        elif isinstance(e, ev.ToolCompleted | ev.ToolFailed):
            outcomes.setdefault(e.call_id, origin_of(e))
        state = kernel.evolve(state, e)
        if isinstance(e, ev.RunStarted) and not traced.origins:
            traced.origins = _started_origins(state, e, list(earlier_origins),
                                              system or origin_of(e, "the system prompt"))
            if isinstance(e, ev.RunForked):
                traced.kept, traced.reprompted = (e.source_run, e.source_seq), e.system_prompt is not None
            continue
        for m in state.messages[before:]:
            traced.origins.append(outcomes.get(m.tool_call_id or "") or origin_of(e))
    traced.state = state
    return traced


def _request(traced: Traced, state: kernel.State, e: ev.ModelRequested) -> None:
    traced.requests.append(Request(e.seq, e.request_id, e.turn, e.attempt, e.context_start,
                                   len(state.messages), e.ts, e.tools, dict(e.sampling)))
    delta = state.messages[state.recorded:]
    origins = traced.origins[state.recorded:]
    comparable = e.ref is None and all(o.stub is None for o in origins)
    if traced.kept is not None and traced.reprompted and e.seq < traced.kept[1]:
        comparable = False  # the source's request, made with the source's system prompt
    if comparable and e.attempt == 0 and not _same(e.messages, delta):
        traced.mismatches.append(e.seq)


def continued_origins(messages: Sequence[Message], origins: Sequence[Origin], run_id: str) -> list[Origin]:
    """The origins of `history.continued(messages)`, in its order: the system prompt left out, and a
    result added for every call of a trailing exchange that never got one."""
    out = [o for m, o in zip(messages, origins, strict=True) if m.role != "system"]
    added = len(history.continued(messages)) - len(out)
    return out + [Origin(run_id, None, "added when the run ended before this call finished")] * added


# ---------------------------------------------------------------------------------------------------------
# the views
# ---------------------------------------------------------------------------------------------------------


def _short(call_id: str | None) -> str | None:
    return call_id.rsplit("/", 1)[-1] if call_id else call_id


def _cut(text: str, cut: int | None) -> tuple[str, bool]:
    return (text[:cut], True) if cut is not None and len(text) > cut else (text, False)


def message_view(index: int, message: Message, origin: Origin, *, sent: bool = True,
                 cut: int | None = CUT) -> dict[str, Any]:
    """One message as the page shows it (text and arguments cut at `cut` characters, None: whole)."""
    text, was_cut = _cut("" if origin.stub is not None else message.content, cut)  # a stub's is fetched
    calls = []
    for call in message.tool_calls:
        arguments, args_cut = _cut(json.dumps(call.arguments, ensure_ascii=False, indent=2), cut)
        calls.append({"id": call.id, "short": _short(call.id), "name": call.name, "arguments": arguments,
                      "cut": args_cut})
        was_cut = was_cut or args_cut
    return {"index": index, "role": message.role, "content": text, "length": len(message.content),
            "cut": was_cut, "tool_calls": calls, "tool_call_id": message.tool_call_id,
            "call": _short(message.tool_call_id), "name": message.name, "sent": sent,
            "origin": {"run_id": origin.run_id, "seq": origin.seq, "note": origin.note, "stub": origin.stub}}


def _answer(event: ev.Event | None) -> dict[str, Any] | None:
    if isinstance(event, ev.ModelResponded):
        return {"kind": "model.responded", "seq": event.seq, "latency_ms": event.latency_ms,
                "prompt_tokens": event.usage.prompt_tokens,
                "completion_tokens": event.usage.completion_tokens,
                "finish_reason": event.finish_reason, "model": event.model, "parse_error": event.parse_error}
    if isinstance(event, ev.ModelFailed):
        return {"kind": "model.failed", "seq": event.seq, "error": event.error,
                "error_kind": event.error_kind}
    return None


def turns_of(traced: Traced) -> list[dict[str, Any]]:
    """Each turn's latest request (a retry replaces a failed attempt): what the turn picker offers."""
    latest: dict[int, Request] = {}
    for r in traced.requests:
        latest[r.turn] = r
    return [{"turn": r.turn, "seq": r.seq, "attempt": r.attempt, "messages": r.count,
             "context_start": r.context_start} for r in sorted(latest.values(), key=lambda r: r.turn)]


def prompt_view(traced: Traced, turn: int | None) -> dict[str, Any]:
    """The messages of `turn`'s prompt (each marked sent or left out by the history window) with the
    model's answer to it; for None, the whole conversation so far."""
    messages, origins = traced.state.messages, traced.origins
    if turn is None:
        return {"turn": None, "request": None, "answer": None, "left_out": 0, "kept_from": None,
                "messages": [message_view(i, m, o)
                             for i, (m, o) in enumerate(zip(messages, origins, strict=True))]}
    request = next((r for r in reversed(traced.requests) if r.turn == turn), None)
    if request is None:
        asked = [t["turn"] for t in turns_of(traced)]
        raise NoConversation(f"turn {turn} asked the model nothing (turns with a request: "
                             f"{', '.join(map(str, asked)) or 'none yet'})")
    shown = messages[:request.count]
    pinned = history.pinned_count(shown)
    start = max(request.context_start, pinned)
    views = [message_view(i, m, o, sent=i < pinned or i >= start)
             for i, (m, o) in enumerate(zip(shown, origins, strict=False))]
    answer = traced.answers.get(request.request_id)
    replied = None
    if answer is not None and request.count < len(messages) and origins[request.count].seq == answer.seq:
        replied = message_view(request.count, messages[request.count], origins[request.count])
    return {"turn": turn, "messages": views, "left_out": start - pinned, "reply": replied,
            "answer": _answer(answer),
            "kept_from": ({"run_id": traced.kept[0], "seq": traced.kept[1]}
                          if traced.kept is not None and request.seq < traced.kept[1] else None),
            "request": {"seq": request.seq, "attempt": request.attempt,
                        "context_start": request.context_start,
                        "ts": request.ts, "tools": list(request.tools), "sampling": request.sampling}}


# ---------------------------------------------------------------------------------------------------------
# reading: the run, its thread, its system prompt
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Run:
    run_id: str
    upto: int  # the next run of the thread continues this one's events below this seq
    events: list[ev.Event]


class Conversations:
    """Reads runs through the client and folds them (see the module docstring)."""

    def __init__(self, client: Client, bundles: Bundles) -> None:
        self.client = client
        self.bundles = bundles

    async def _events(self, run_id: str, upto: int | None, whole: tuple[str, int] | None) -> list[ev.Event]:
        handle = self.client.get(run_id)
        events = [e for e in (await handle.stored()).events if upto is None or e.seq < upto]
        if whole is not None and whole[0] == run_id:
            events = [await handle.whole(e) if e.seq == whole[1] else e for e in events]
        return events

    async def _chain(self, first: ev.RunStarted, whole: tuple[str, int] | None) -> list[_Run]:
        """The runs before this one in its thread, oldest first, each cut where the next continues it."""
        chain: list[_Run] = []
        at: tuple[str, int] | None = None
        if first.previous_run:
            at = (first.previous_run, first.previous_seq or 0)
        while at is not None and len(chain) < MAX_THREAD_RUNS:
            events = await self._events(at[0], at[1], whole)
            if not events or not isinstance(events[0], ev.RunStarted):
                raise NoConversation(f"run {at[0]}, earlier in this run's thread, has no events (purged?): "
                                     "its conversation cannot be shown")
            chain.append(_Run(at[0], at[1], events))
            started = events[0]
            at = (started.previous_run, started.previous_seq or 0) if started.previous_run else None
        if at is not None:
            raise NoConversation(f"this run's thread is longer than {MAX_THREAD_RUNS} runs: its conversation "
                                 "is not shown here (`sa replay` each run)")
        return chain[::-1]

    @staticmethod
    def _earlier(chain: list[_Run]) -> tuple[kernel.Conversation | None, list[Origin]]:
        conv: kernel.Conversation | None = None
        origins: list[Origin] = []
        for run in chain:
            traced = fold_traced(kernel.KernelConfig(), run.events, earlier=conv, earlier_origins=origins)
            origins = continued_origins(traced.state.messages, traced.origins, run.run_id)
            conv = kernel.Conversation(run.run_id, run.upto, history.continued(traced.state.messages))
        return conv, origins

    async def _system(self, run_id: str, events: list[ev.Event],
                      chain: list[_Run]) -> tuple[str, Origin, dict[str, Any]]:
        """The system prompt to fold with, its origin and where it was found (see the module docstring)."""
        first = events[0]
        assert isinstance(first, ev.RunStarted)
        if isinstance(first, ev.RunForked) and first.system_prompt is not None:
            return "", origin_of(first, "the fork's system prompt"), {"source": "fork", "run_id": run_id}
        own = recorded_system(events)
        if own is not None and own[1].stub is None:
            return own[0], own[1], {"source": "recorded", "run_id": run_id, "seq": own[1].seq}
        entry = await self.client.run_info(run_id)
        loaded = await self.bundles.load(entry.bundle if entry is not None else None)
        bundle = loaded.bundle
        if bundle is not None and bundle.digest == first.bundle_digest:
            return bundle.system_prompt, Origin(run_id, None, "the bundle's system prompt"), {
                "source": "bundle", "path": loaded.path}
        oldest = own or (recorded_system(chain[0].events) if chain else None)
        if oldest is not None:
            found = {"source": "recorded", "run_id": oldest[1].run_id, "seq": oldest[1].seq}
            return oldest[0], oldest[1], found
        if bundle is not None:
            return bundle.system_prompt, Origin(run_id, None, "the bundle's system prompt, as it is now"), {
                "source": "bundle-changed", "path": loaded.path, "digest": bundle.digest,
                "run_digest": first.bundle_digest}
        return "", Origin(run_id, None), {"source": "unknown", "problem": loaded.problem}

    async def fold(self, run_id: str, whole: tuple[str, int] | None = None) -> tuple[Traced, dict[str, Any]]:
        """The run folded, with its thread's earlier messages, and where its system prompt came from."""
        check_token(run_id, "run id")
        events = await self._events(run_id, None, whole)
        if not events or not isinstance(events[0], ev.RunStarted):
            raise NoConversation(f"no events for run {run_id!r}: pick a run from the index")
        chain = await self._chain(events[0], whole)
        earlier, origins = self._earlier(chain)
        system, system_origin, source = await self._system(run_id, events, chain)
        traced = fold_traced(kernel.KernelConfig(system_prompt=system), events, earlier=earlier,
                             earlier_origins=origins, system=system_origin)
        return traced, {"system": source, "thread": [r.run_id for r in chain]}

    async def read(self, run_id: str, turn: int | None) -> dict[str, Any]:
        """The page's data: the turns, the chosen turn's prompt (None: the whole conversation; `LATEST`:
        the latest turn's)."""
        traced, about = await self.fold(run_id)
        state = traced.state
        if turn == LATEST:
            turn = traced.requests[-1].turn if traced.requests else None
        return {"run_id": run_id, "actor": state.actor, "status": state.status, "turns": turns_of(traced),
                "messages_total": len(state.messages), "mismatches": traced.mismatches, **about,
                **prompt_view(traced, turn)}

    async def message(self, run_id: str, index: int) -> dict[str, Any]:
        """Message `index` of the run's conversation whole: the event it came from fetched whole first."""
        traced, _ = await self.fold(run_id)
        if not 0 <= index < len(traced.origins):
            raise NoConversation(f"run {run_id!r} has {len(traced.origins)} message(s), not one at {index}")
        origin = traced.origins[index]
        if origin.stub is not None and origin.seq is not None:
            traced, _ = await self.fold(run_id, whole=(origin.run_id, origin.seq))
            origin = Origin(origin.run_id, origin.seq, origin.note)
        return message_view(index, traced.state.messages[index], origin, cut=None)


# what a system prompt stored apart is folded as: the message is there, its text is fetched when asked for
STORED_APART = "(stored apart)"


def recorded_system(events: Sequence[ev.Event]) -> tuple[str, Origin] | None:
    """The system prompt a run's first `model.requested` recorded, with its origin ("" when it recorded
    none: the bundle has no system prompt); None when the run cannot tell (no request yet, or a thread's
    later run, whose first request records only its task)."""
    started = events[0] if events else None
    first = next((e for e in events if isinstance(e, ev.ModelRequested)), None)
    if first is None or not isinstance(started, ev.RunStarted) or started.previous_run is not None:
        return None
    origin = origin_of(first, "the system prompt, as the first request recorded it")
    if first.ref is not None:  # a stub: the prompt is fetched with the event
        return STORED_APART, origin
    if first.messages and first.messages[0].role == "system":
        return first.messages[0].content, origin
    return "", Origin(first.run_id, first.seq, "no system prompt: the first request recorded none")


__all__ = ["CUT", "LATEST", "STORED_APART", "Conversations", "NoConversation", "Origin", "Request", "Traced",
           "continued_origins", "fold_traced", "message_view", "prompt_view", "recorded_system", "turns_of"]
