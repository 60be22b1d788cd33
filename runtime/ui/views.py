"""What the inspector shows, as plain JSON-able data: one shape for the web app and the HTML export.

The browser renders these dicts; it never sees msgspec types. Keeping the shaping here (and out of the
routes and the JavaScript) means the live page, the API and the one-file export cannot drift apart: they
all serialise the same `run_view`. Pure: events in, dicts out, no NATS.

An event's view keeps every field of the event (`data`, as `msgspec.to_builtins` gives it) plus what a
reader wants at a glance: the one-line `describe` of `sa replay`, the milliseconds since the run began,
the turn it belongs to and, for a tool call's events, the call (`lane`) so parallel calls can be drawn
side by side.

A call's script run is shown as its `script.*` events whichever shape the log has (`events.expand`): in a
newer log they are virtual, carried by the call's outcome. A view's `key` tells the page's rows apart: the
seq for a log entry, `<seq>.<i>` for the i-th virtual event before the entry `seq` that holds it (`virtual`:
it shares that seq, and a fork or a fetch by seq means the entry). Totals and flags count log entries.
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from runtime import events as ev
from runtime.client.replay import describe, summarize
from runtime.nats.records import RunIndex
from runtime.nats.retention import parse_age

FAILED_KINDS = frozenset({"run.failed", "model.failed", "tool.failed", "script.failed", "approval.denied"})
SEARCH_CHARS = 64_000  # how much of a run's text the index search looks at (inputs, outputs, replies)
SNIPPET = 160


def _builtins(value: Any) -> Any:
    return msgspec.to_builtins(value, str_keys=True)


def _turn_of_id(effect_id: str) -> int | None:
    """The turn of a kernel id: `<run>/<turn>.<i>` (a call) or `<run>/<turn>[#attempt]` (a request)."""
    tail = effect_id.rsplit("/", 1)[-1].split("#", 1)[0].split(".", 1)[0]
    return int(tail) if tail.isdigit() else None


def call_of(event: ev.Event) -> str | None:
    """The tool call an event is about, if any: its lane in the timeline."""
    if isinstance(event, ev.ToolCalled | ev.ApprovalRequested):
        return event.call.id
    call_id = getattr(event, "call_id", None)
    return call_id if isinstance(call_id, str) else None


def turn_of(event: ev.Event) -> int | None:
    """The turn an event belongs to (None: the run's own events, start and end)."""
    turn = getattr(event, "turn", None)
    if isinstance(turn, int):
        return turn
    call = call_of(event)
    return _turn_of_id(call) if call else None


def event_view(event: ev.Event, t0: float) -> dict[str, Any]:
    """One event for the browser: its fields (`data`) and what the timeline shows of it."""
    kind = ev.kind_of(event)
    view: dict[str, Any] = {
        "seq": event.seq, "key": str(event.seq), "virtual": False, "kind": kind, "ts": event.ts,
        "offset_ms": round((event.ts - t0) * 1000, 1),
        "describe": describe(event), "turn": turn_of(event), "lane": call_of(event),
        "failed": kind in FAILED_KINDS, "data": _builtins(event),
        "ref": _builtins(event.ref) if event.ref is not None else None,
    }
    duration = getattr(event, "latency_ms", None) or getattr(event, "duration_ms", None)
    if isinstance(duration, int | float) and duration:
        view["duration_ms"] = round(float(duration), 1)
    return view


def entry_views(event: ev.Event, t0: float) -> list[dict[str, Any]]:
    """The rows of one log entry: its view, after those of the script events it carries, if any (see
    the module docstring for their `key`)."""
    parts = [event_view(part, t0) for part in ev.expand(event)]
    for i, view in enumerate(parts[:-1]):
        view["key"], view["virtual"] = f"{event.seq}.{i}", True
    return parts


def start_of(events: Sequence[ev.Event]) -> float:
    """Where a run's clock starts: its first event; for a fork, when it was made (the events it kept from
    its source are older, and show as before it), as `sa replay` and the runs index count it."""
    first = next((e for e in events if e.seq == 0), None)
    if isinstance(first, ev.RunForked):
        return first.ts
    return min((e.ts for e in events), default=0.0)


def summary_view(events: Sequence[ev.Event]) -> dict[str, Any]:
    return dataclasses.asdict(summarize(events))


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def _snippet(value: Any) -> str:
    text = " ".join(_text(value).split())
    return text if len(text) <= SNIPPET else text[: SNIPPET - 1] + "…"


# ---------------------------------------------------------------------------------------------------------
# flags: what makes a run worth a second look even when its status says all is well
# ---------------------------------------------------------------------------------------------------------

SUSPICIOUS = "suspicious"  # the index filter that admits a run with any flag
FLAGS = ("no-tokens", "empty-output", "model-retried", "tool-redelivered")


@dataclass(frozen=True)
class Flag:
    """One reason to look again at a run: `name` (one of `FLAGS`) and `why`, a sentence naming what in
    its events raised it."""

    name: str
    why: str


def _empty(value: Any) -> bool:
    """True for an output with nothing in it: None, a blank string, or containers of only such values
    (`{"answer": ""}` is as empty as `""`: a terminal tool called with nothing to say)."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, dict):
        return all(_empty(v) for v in value.values())
    if isinstance(value, list | tuple):
        return all(_empty(v) for v in value)
    return False


def _short(call_id: str) -> str:
    return call_id.rsplit("/", 1)[-1]


def flags(events: Sequence[ev.Event]) -> list[Flag]:
    """Why a run deserves a second look, from its events alone, in `FLAGS` order.

    A status of `completed` says the kernel reached an ending, not that the work happened: a run that
    completed without a single token (no model behind it, a usage-less stub), or with an empty output,
    passes every status filter. Retries and redeliveries are not failures either, but they are where
    duplicated side effects and slow runs come from. Pure: the runs index (per digest), the run page and
    the live view all call this one function, so they cannot disagree."""
    tokens = 0
    attempts: dict[int, int] = {}
    redelivered: list[str] = []
    ending: ev.Event | None = None
    for e in events:
        if isinstance(e, ev.ModelResponded):
            tokens += e.usage.prompt_tokens + e.usage.completion_tokens
        elif isinstance(e, ev.ModelRequested) and e.attempt > 0:
            attempts[e.turn] = max(attempts.get(e.turn, 0), e.attempt)
        elif isinstance(e, ev.ToolRedelivered):
            earlier = f" ({e.earlier[-1]})" if e.earlier else ""
            redelivered.append(f"{e.tool} call {_short(e.call_id)} ran on delivery {e.attempt}{earlier}")
        elif isinstance(e, ev.RunCompleted | ev.RunFailed | ev.RunCancelled):
            ending = e
    out: list[Flag] = []
    if isinstance(ending, ev.RunCompleted):
        if tokens == 0:
            out.append(Flag("no-tokens", "completed without the model using a single token: was a model "
                                         "called at all?"))
        if _empty(ending.output):
            shown = msgspec.json.encode(ending.output).decode()[:SNIPPET]
            out.append(Flag("empty-output", f"completed with an empty output: {shown}"))
    if attempts:
        turns = ", ".join(f"turn {t}: {n + 1} attempts" for t, n in sorted(attempts.items()))
        out.append(Flag("model-retried", f"a model call failed and was made again ({turns})"))
    if redelivered:
        out.append(Flag("tool-redelivered", "a tool job was delivered again after a worker stopped or gave "
                                            "it back: " + "; ".join(redelivered)))
    return out


def flag_views(found: Iterable[Flag]) -> list[dict[str, str]]:
    return [dataclasses.asdict(f) for f in found]


@dataclass
class Digest:
    """What the runs index needs to know of one run's events: read once per new `last_seq`, then cached."""

    run_id: str
    last_seq: int = 0
    started: float = 0.0
    ended: float = 0.0
    status: str = "running"
    input: str = ""
    output: str = ""
    tools: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    turns: int = 0
    tokens: int = 0
    forked_from: str | None = None
    forked_at: int | None = None
    search: str = ""  # lower-cased text of task ids, inputs, outputs and replies, for `q`
    flags: list[Flag] = field(default_factory=list)

    @property
    def flag_names(self) -> list[str]:
        return [f.name for f in self.flags]


def digest(run_id: str, events: Sequence[ev.Event], last_seq: int = 0) -> Digest:
    """The runs-index facts of a run (its events as stored: a payload in the object store is not searched)."""
    out = Digest(run_id, last_seq=last_seq)
    if not events:
        return out
    s = summarize(events)
    out.started, out.ended, out.status = events[0].ts, events[-1].ts, s.status
    out.turns, out.tokens = s.turns, s.prompt_tokens + s.completion_tokens
    tools: dict[str, None] = {}
    errors: dict[str, None] = {}
    texts: list[str] = []
    for e in ev.expand_all(events):  # a script's own error counts, whichever shape the log has
        if isinstance(e, ev.RunStarted):
            out.input = _snippet(e.input)
            texts += [e.input, e.task_id or ""]  # a task id is searchable: a schedule's runs share a prefix
            if isinstance(e, ev.RunForked):
                out.forked_from, out.forked_at = e.source_run, e.source_seq
        elif isinstance(e, ev.ToolCalled):
            tools[e.call.name] = None
            texts.append(_text(e.call.arguments))
        elif isinstance(e, ev.ToolCompleted):
            texts.append(_text(e.output))
        elif isinstance(e, ev.ToolFailed | ev.ScriptFailed):
            errors[e.error.kind] = None
            texts.append(e.error.message)
        elif isinstance(e, ev.ModelFailed):
            errors[f"model:{e.error_kind}"] = None
            texts.append(e.error)
        elif isinstance(e, ev.ModelResponded):
            texts.append(e.content or e.text)
        elif isinstance(e, ev.RunCompleted):
            out.output = _snippet(e.output)
            texts.append(_text(e.output))
        elif isinstance(e, ev.RunFailed):
            errors[f"run:{e.reason}"] = None
            out.output = _snippet(f"{e.reason}: {e.detail}" if e.detail else e.reason)
            texts.append(e.detail)
        elif isinstance(e, ev.RunCancelled):
            out.output = _snippet(f"cancelled: {e.reason}" if e.reason else "cancelled")
    out.tools, out.errors = list(tools), list(errors)
    out.flags = flags(events)
    out.search = "\n".join(texts)[:SEARCH_CHARS].lower()
    return out


# ---------------------------------------------------------------------------------------------------------
# the runs index: filters
# ---------------------------------------------------------------------------------------------------------


class FilterError(ValueError):
    """A filter the index cannot apply; the message says which parameter and what it accepts."""


def parse_time(text: str, what: str, now: float | None = None) -> float | None:
    """Unix time from an ISO date or time (naive: local time) or an age back from now ('15m', '2h', '7d')."""
    text = text.strip()
    if not text:
        return None
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        pass
    try:
        age = parse_age(text, what)
    except ValueError:
        raise FilterError(f"{what}={text!r}: use an age ('15m', '2h', '7d'), a date ('2025-01-31') or a time "
                          "('2025-01-31T12:00')") from None
    return (time.time() if now is None else now) - age


@dataclass(frozen=True)
class RunFilter:
    """The runs index's filters; empty fields match everything. `agent` matches a bundle or an instance."""

    agent: str = ""
    status: str = ""
    tool: str = ""
    error: str = ""
    since: float | None = None
    until: float | None = None
    q: str = ""
    flag: str = ""  # a name of `FLAGS`, or `SUSPICIOUS` for any of them

    def __post_init__(self) -> None:
        if self.flag and self.flag != SUSPICIOUS and self.flag not in FLAGS:
            raise FilterError(f"flag={self.flag!r}: use {SUSPICIOUS!r} (any flag) or one of "
                              f"{', '.join(FLAGS)}")

    @classmethod
    def from_query(cls, params: dict[str, str], now: float | None = None) -> RunFilter:
        return cls(agent=params.get("agent", "").strip(), status=params.get("status", "").strip(),
                   tool=params.get("tool", "").strip(), error=params.get("error", "").strip(),
                   since=parse_time(params.get("since", ""), "since", now),
                   until=parse_time(params.get("until", ""), "until", now), q=params.get("q", "").strip(),
                   flag=params.get("flag", "").strip())

    @property
    def needs_events(self) -> bool:
        """True if the filter looks inside runs (their digests), not only at their index entries."""
        return bool(self.tool or self.error or self.q or self.flag or self.until is not None or
                    self.since is not None)

    def admits_entry(self, entry: RunIndex) -> bool:
        """The cheap test on the index entry alone (a run last updated before `since` cannot have started
        after it)."""
        if self.agent and entry.actor != self.agent and entry.actor.split(":")[0] != self.agent:
            return False
        if self.status and entry.status != self.status:
            return False
        return self.since is None or not entry.updated or entry.updated >= self.since

    def admits(self, d: Digest) -> bool:
        if self.tool and self.tool not in d.tools:
            return False
        if self.error and self.error not in d.errors:
            return False
        if self.since is not None and d.started < self.since:
            return False
        if self.until is not None and d.started > self.until:
            return False
        if self.flag and not (d.flags if self.flag == SUSPICIOUS else self.flag in d.flag_names):
            return False
        return not self.q or self.q.lower() in d.search


def index_row(run_id: str, entry: RunIndex, d: Digest | None) -> dict[str, Any]:
    """One row of the runs index (the entry, and the digest when it was read)."""
    row: dict[str, Any] = {"run_id": run_id, "actor": entry.actor, "status": entry.status,
                           "updated": entry.updated, "task_id": entry.task_id,
                           "forked_from": entry.forked_from, "forked_at": entry.forked_at}
    if d is not None:
        row.update(started=d.started, ended=d.ended, input=d.input, output=d.output, tools=d.tools,
                   errors=d.errors, turns=d.turns, tokens=d.tokens, flags=flag_views(d.flags))
        row["forked_from"] = row["forked_from"] or d.forked_from
        row["forked_at"] = row["forked_at"] if row["forked_at"] is not None else d.forked_at
    return row


def facets(entries: Iterable[RunIndex], digests: Iterable[Digest]) -> dict[str, list[str]]:
    """The values each filter can take, for the index's drop-downs."""
    entries = list(entries)
    digests = list(digests)
    return {"agents": sorted({e.actor for e in entries if e.actor}),
            "statuses": sorted({e.status for e in entries if e.status}),
            "tools": sorted({t for d in digests for t in d.tools}),
            "errors": sorted({k for d in digests for k in d.errors})}


# ---------------------------------------------------------------------------------------------------------
# a run page
# ---------------------------------------------------------------------------------------------------------


def fork_tree(run_id: str, parent: tuple[str, int | None] | None,
              index: dict[str, RunIndex]) -> dict[str, Any]:
    """The run's place among forks: the chain of parents up to the root (from the first event, a
    `run.forked`, then the index's `forked_from`) and the tree of forks below the root (from the index)."""
    links: dict[str, tuple[str, int | None]] = {}
    for rid, entry in index.items():
        if entry.forked_from:
            links[rid] = (entry.forked_from, entry.forked_at)
    if parent is not None:
        links[run_id] = parent
    root, seen = run_id, {run_id}
    while root in links and links[root][0] not in seen:
        root = links[root][0]
        seen.add(root)
    children: dict[str, list[str]] = {}
    for rid, (source, _) in sorted(links.items()):
        children.setdefault(source, []).append(rid)

    def node(rid: str, depth: int) -> dict[str, Any]:
        entry = index.get(rid)
        kids = children.get(rid, []) if depth < 50 else []
        return {"run_id": rid, "at": links[rid][1] if rid in links else None,
                "status": entry.status if entry else None, "current": rid == run_id,
                "children": [node(k, depth + 1) for k in kids if k != rid]}

    return node(root, 0)


def subruns(run_id: str, events: Sequence[ev.Event], index: dict[str, RunIndex]) -> dict[str, Any]:
    """A run's place among sub-runs (agents called as tools): the parent run and call its `run.started`
    names, and the children its calls started, found where they must be: a child's run id is derived from
    the agent (the tool's name), this run and the call (`runtime.commands.child_run_id`), so a call whose
    derived id is in the runs index started that child."""
    from runtime.commands import PARENT_CALL, PARENT_RUN, child_run_id

    first = events[0] if events else None
    parent = None
    if isinstance(first, ev.RunStarted) and first.metadata.get(PARENT_RUN):
        parent = {"run_id": str(first.metadata[PARENT_RUN]),
                  "call_id": str(first.metadata.get(PARENT_CALL, ""))}
    children = []
    for e in events:
        if isinstance(e, ev.ModelResponded):
            for call in e.calls:
                child = child_run_id(call.name, run_id, call.id)
                if child in index:
                    children.append({"run_id": child, "call_id": call.id.rsplit("/", 1)[-1],
                                     "agent": call.name, "status": index[child].status})
    return {"parent": parent, "children": children}


def run_view(run_id: str, actor: str, events: Sequence[ev.Event], *, entry: RunIndex | None = None,
             index: dict[str, RunIndex] | None = None, fork_points: Sequence[int] | None = None,
             exported: bool = False) -> dict[str, Any]:
    """Everything a run page shows: the events' views, the totals, the index entry and the fork tree."""
    t0 = start_of(events)
    first = events[0] if events else None
    parent = (first.source_run, first.source_seq) if isinstance(first, ev.RunForked) else None
    return {
        "run_id": run_id, "actor": actor, "exported": exported,
        "events": [view for e in events for view in entry_views(e, t0)],
        "summary": summary_view(events),
        "index": _builtins(entry) if entry is not None else None,
        "fork_tree": fork_tree(run_id, parent, index or {}),
        "subruns": subruns(run_id, events, index or {}),
        "fork_points": list(fork_points) if fork_points is not None else None,
        "flags": flag_views(flags(events)),
    }


__all__ = ["FLAGS", "SUSPICIOUS", "Digest", "FilterError", "Flag", "RunFilter", "call_of", "digest",
           "entry_views", "event_view", "facets", "flag_views", "flags", "fork_tree", "index_row",
           "parse_time", "run_view", "start_of", "summary_view", "turn_of"]
