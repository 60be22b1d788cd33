"""Where two runs part ways (`sa replay A --diff B`): the shared prefix, the first difference, the rest.

Two runs are compared seq by seq, fact by fact: an event of B is re-addressed to A's run id first (its
model request and tool call ids re-derived, as a fork derives them), and two events are the same when
they record the same fact: equal but for where and when they were written (run, seq, time, actor,
schema version, payload reference) and how long they took (latency, durations, the worker that ran
them). So a fork and its source share exactly the events the fork kept, and the first seq that differs
is where they diverge: an edit, or the first reply of a model that answered otherwise. The first event
of two runs of one task is the same when the task is (a fork's `run.forked` stands in for `run.started`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from runtime import events as ev
from runtime.log import rebased

# Fields that say where, when or how fast a fact was recorded, not what it is.
# where, when and how fast: the run, its place, the time, who served it (a worker, a model server and the
# id it gave its answer) and how long it took
_NOT_THE_FACT = frozenset({"run_id", "seq", "ts", "actor", "v", "ref", "latency_ms", "duration_ms", "worker",
                           "earlier", "response_id", "server", "provider"})
_TASK = ("input", "instance", "timeout_s", "metadata")


@dataclass(frozen=True)
class Divergence:
    """Runs `a` and `b` record the same facts for seqs `0..common-1`; from `common` on they differ."""

    a: str
    b: str
    common: int
    a_rest: tuple[ev.Event, ...]
    b_rest: tuple[ev.Event, ...]

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


def diverge(a_run: str, a: Sequence[ev.Event], b_run: str, b: Sequence[ev.Event]) -> Divergence:
    """Compare two runs' logs (as read, payloads resolved) seq by seq."""
    common = 0
    for x, y in zip(a, b, strict=False):
        try:
            y_in_a = rebased(y, b_run, a_run)
        except ValueError:  # an id of another run: cannot be the same fact
            break
        if fact(x) != fact(y_in_a):
            break
        common += 1
    return Divergence(a_run, b_run, common, tuple(a[common:]), tuple(b[common:]))


def render(d: Divergence) -> Any:
    """A rich renderable: the verdict line, then the differing events side by side."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from runtime.client.replay import describe, summarize

    if d.identical:
        return Text(f"runs {d.a} and {d.b} record the same {d.common} event(s)")
    shared = f"the same {d.common} event(s) (seq 0-{d.common - 1})" if d.common else "no event in common"
    head = Text(f"runs {d.a} and {d.b} record {shared}; they diverge at seq {d.common}")
    table = Table(show_lines=False, header_style="bold", expand=False)
    table.add_column("seq", justify="right")
    for run in (d.a, d.b):
        table.add_column(run)
        table.add_column("detail", overflow="fold")
    for i in range(max(len(d.a_rest), len(d.b_rest))):
        cells: list[Text] = [Text(str(d.common + i))]
        for rest in (d.a_rest, d.b_rest):
            e = rest[i] if i < len(rest) else None
            # Text, not str: a recorded value with square brackets is data, never rich markup
            cells += [Text(ev.kind_of(e)), Text(describe(e))] if e is not None else [Text(), Text()]
        table.add_row(*cells)
    ends = []
    for run, rest in ((d.a, d.a_rest), (d.b, d.b_rest)):
        s = summarize(rest) if rest else None
        last = describe(rest[-1]) if rest else ""
        ends.append(f"{run}: {len(rest)} more event(s)" + (f", {s.model_calls} model call(s), "
                                                           f"{s.tool_calls} tool call(s); last: {last}"
                                                           if s else ""))
    return Group(head, table, Text("\n".join(ends)))


__all__ = ["Divergence", "diverge", "fact", "render"]
