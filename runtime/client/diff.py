"""Where two runs part ways (`sa replay A --diff B`): the shared prefix, the first difference, the rest.

Two runs are compared seq by seq, fact by fact: an event of B is re-addressed to A's run id first (its
model request and tool call ids re-derived, as a fork derives them), and two events are the same when
they record the same fact: equal but for where and when they were written (run, seq, time, actor,
schema version, payload reference) and how long they took (latency, durations, the worker that ran
them). So a fork and its source share exactly the events the fork kept, and the first seq that differs
is where they diverge: an edit, or the first reply of a model that answered otherwise. The first event
of two runs of one task is the same when the task is (a fork's `run.forked` stands in for `run.started`).

Both logs are compared as the detailed view reads them (`events.expand`): a tool outcome that carries its
script run counts as the `script.*` events an older writer appended beside it. So a log written before
outcomes carried their script runs and one written after (a fork of an old run, a re-run of its task)
diverge where their facts do, not at the first script run; each side's divergence is then counted in its
own log entries (`common` for `a`, `b_common` for `b`), which differ when the shapes do.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from difflib import SequenceMatcher
from typing import Any

import msgspec

from runtime import events as ev
from runtime.client.terminal import shown
from runtime.log import rebased

# Fields that say where, when or how fast a fact was recorded, not what it is.
# where, when and how fast: the run, its place, the time, who served it (a worker, a model server and the
# id it gave its answer) and how long it took
_NOT_THE_FACT = frozenset({"run_id", "seq", "ts", "actor", "v", "ref", "latency_ms", "duration_ms", "worker",
                           "earlier", "response_id", "server", "provider"})
_TASK = ("input", "instance", "timeout_s", "metadata")


@dataclass(frozen=True)
class Divergence:
    """Run `a`'s entries `0..common-1` record the same facts as run `b`'s `0..b_common-1`; from there on
    (`a_rest`, `b_rest`: log entries) they differ. `b_common == common` unless the two logs hold their
    script runs in different shapes (see the module docstring)."""

    a: str
    b: str
    common: int
    a_rest: tuple[ev.Event, ...]
    b_rest: tuple[ev.Event, ...]
    b_common: int
    a_detail: tuple[ev.Event, ...] = ()  # each side's detailed view from the first fact that differs
    b_detail: tuple[ev.Event, ...] = ()

    @property
    def identical(self) -> bool:
        return not self.a_rest and not self.b_rest


def fact(event: ev.Event) -> dict[str, Any]:
    """What `event` records, without where, when and how fast (the comparison key of a diff)."""
    if isinstance(event, ev.RunStarted):
        return {"kind": "run.started", **{f: getattr(event, f) for f in _TASK}}
    plain = msgspec.to_builtins(event)
    if isinstance(event, ev.ToolCompleted | ev.ToolFailed) and event.script is not None:
        plain["script"] = _script_fact(event.script)
    return {k: v for k, v in plain.items() if k not in _NOT_THE_FACT}


def _script_fact(run: ev.ScriptRun) -> dict[str, Any]:
    """What a carried script run records: what it printed and how it ended (not when, where or how fast,
    as for the `script.*` events an older log holds instead)."""
    return {"printed": [line.text for line in run.printed], "ended": run.ended is not None,
            "failed": run.failed, "error": msgspec.to_builtins(run.error)}


def diverge(a_run: str, a: Sequence[ev.Event], b_run: str, b: Sequence[ev.Event], *,
            fact_of: Callable[[ev.Event], Any] | None = None) -> Divergence:
    """Compare two runs' logs (as read, payloads resolved) fact by fact, in their detailed view. `fact_of`
    is what counts of an event (default `fact`): a regression compares behaviour, not the request it made
    on purpose otherwise (`runtime.regress.report`). Fences (`run.taken`) are left out of both."""
    fact_of = fact_of or fact
    xa, xb = _behaviour(ev.expand_all(a)), _behaviour(ev.expand_all(b))
    same = 0
    for x, y in zip(xa, xb, strict=False):
        try:
            y_in_a = rebased(y, b_run, a_run)
        except ValueError:  # an id of another run: cannot be the same fact
            break
        if fact_of(x) != fact_of(y_in_a):
            break
        same += 1
    common, b_common = _entries_before(a, xa, same), _entries_before(b, xb, same)
    return Divergence(a_run, b_run, common, tuple(a[common:]), tuple(b[b_common:]), b_common,
                      tuple(xa[same:]), tuple(xb[same:]))


def _behaviour(events: Sequence[ev.Event]) -> list[ev.Event]:
    """The events that say what a run did: a fence (`run.taken`, a host taking the run over) says who drove
    it, so two runs that did the same are the same whichever hosts drove them, and however often."""
    return [e for e in events if not isinstance(e, ev.RunTaken)]


def _entries_before(log: Sequence[ev.Event], expanded: Sequence[ev.Event], same: int) -> int:
    """How many of `log`'s entries lie wholly within the first `same` events of its detailed view: an entry
    whose script run matched only in part is where its log diverges."""
    if same >= len(expanded):
        return len(log)
    holder = expanded[same].seq  # a virtual event carries the seq of the entry that holds it
    return next((i for i, e in enumerate(log) if e.seq >= holder), len(log))


def aligned(a: Sequence[ev.Event], b: Sequence[ev.Event]) -> list[tuple[ev.Event | None, ev.Event | None]]:
    """`a` and `b` as rows: matched by kind (difflib's longest matching runs), the rest beside a gap or
    beside each other. A fork whose edited result ran no script lines up with its source's outcome, not
    with the `script.*` rows before it."""
    rows: list[tuple[ev.Event | None, ev.Event | None]] = []
    matcher = SequenceMatcher(a=[ev.kind_of(e) for e in a], b=[ev.kind_of(e) for e in b], autojunk=False)
    for _tag, i1, i2, j1, j2 in matcher.get_opcodes():
        for k in range(max(i2 - i1, j2 - j1)):  # equal and replace pair up; delete and insert face a gap
            rows.append((a[i1 + k] if i1 + k < i2 else None, b[j1 + k] if j1 + k < j2 else None))
    return rows


def render(d: Divergence) -> Any:
    """A rich renderable: the verdict line, then the differing events side by side."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from runtime.client.replay import describe, summarize

    shapes = d.b_common != d.common  # the logs hold their script runs in different shapes
    if d.identical and shapes:
        return Text(f"runs {d.a} and {d.b} record the same facts ({d.common} and {d.b_common} entries: their "
                    "script runs in different shapes)")
    if d.identical:
        return Text(f"runs {d.a} and {d.b} record the same {d.common} event(s)")
    if shapes:
        shared = f"the same facts in seq 0-{d.common - 1} and 0-{d.b_common - 1}" if d.common and d.b_common \
            else "no event in common"
        head = Text(f"runs {d.a} and {d.b} record {shared} (their script runs in different shapes); they "
                    f"diverge at seq {d.common} and seq {d.b_common}")
    else:
        shared = f"the same {d.common} event(s) (seq 0-{d.common - 1})" if d.common else "no event in common"
        head = Text(f"runs {d.a} and {d.b} record {shared}; they diverge at seq {d.common}")
    table = Table(show_lines=False, header_style="bold", expand=False)
    for run in (d.a, d.b):
        table.add_column("seq", justify="right")
        table.add_column(run)
        table.add_column("detail", overflow="fold")
    # each side in its detailed view from the first fact that differs (what a carried script run printed
    # is a row of its own, under the seq of the entry that holds it, so a difference in it shows), events of
    # the same kind side by side and an event the other side lacks beside a gap
    for pair in aligned(d.a_detail, d.b_detail):
        cells: list[Text] = []
        for e in pair:
            # shown, not str: a recorded value is data, never rich markup nor a terminal's command
            cells += [Text(str(e.seq)), Text(ev.kind_of(e)), shown(describe(e))] if e is not None else \
                [Text(), Text(), Text()]
        table.add_row(*cells)
    ends = []
    for run, rest in ((d.a, d.a_rest), (d.b, d.b_rest)):
        s = summarize(rest) if rest else None
        last = describe(rest[-1]) if rest else ""
        ends.append(f"{run}: {len(rest)} more event(s)" + (f", {s.model_calls} model call(s), "
                                                           f"{s.tool_calls} tool call(s); last: {last}"
                                                           if s else ""))
    return Group(head, table, shown("\n".join(ends)))


__all__ = ["Divergence", "aligned", "diverge", "fact", "render"]
