"""What changed, run by run: each regression run compared with its source, graded, and the totals.

Each row's verdict:
* `same` — the candidate's run records the same behaviour as the source, event for event;
* `diverged` — it went another way from seq K (`diverged_at`: the first event that differs, as
  `sa replay SOURCE --diff RUN` shows it) but ended as the source did, with the same output; or a `diverge`
  rule stopped it there;
* `different-output` — it ended with another output or another status than the source (also from seq K);
* `failed` — the source completed and the candidate's run failed or was cancelled, or the regression could not
  drive it at all (`detail` says why).

"The same behaviour" is the diff's comparison (`runtime.client.diff.fact`) with what a candidate changes on
purpose left out: the prompt a model request carried (its messages, constraint, sampling, the server it went
to) and, of a model reply, the token counts, the model's name and the time it took. What the model answered,
which tools were called with what, what they returned and how the run ended all count.

Beside each verdict: turns, tokens and tool calls of both runs, and the graders' pass/fail of both
(`runtime.regress.graders`). A regression is a run that passes under the source and not under the candidate;
a fix, the other way round. The totals: pass rates of both, the regressions and fixes by run, and how many
model calls the regression made (and how many the cache answered).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from nats.js import JetStreamContext

from runtime import events as ev
from runtime.client.diff import diverge, fact
from runtime.client.replay import summarize
from runtime.regress.candidate import Candidate
from runtime.regress.drive import Driven, drive_all
from runtime.regress.graders import Ending, Grader, grade_all
from runtime.regress.ports import BY, Rule
from runtime.regress.recorded import Matcher, canonical
from runtime.regress.sets import RunSet

VERDICTS = ("same", "diverged", "different-output", "failed")


def behaviour(event: ev.Event) -> dict[str, Any]:
    """What counts of `event` when a regression run is compared with its source (see the module docstring)."""
    f = fact(event)
    if isinstance(event, ev.ModelRequested):
        return {"kind": f["kind"], "request_id": f["request_id"], "turn": f["turn"], "attempt": f["attempt"]}
    if isinstance(event, ev.ModelResponded):
        for key in ("usage", "model", "queued_ms"):
            f.pop(key, None)
    return f


@dataclass(frozen=True)
class Side:
    """One run's ending and costs."""

    run_id: str
    status: str
    output: Any
    turns: int
    tokens: int
    tool_calls: int
    wall_s: float

    @classmethod
    def of(cls, run_id: str, events: Sequence[ev.Event]) -> Side:
        s = summarize(events)
        end = events[-1] if events else None
        output = end.output if isinstance(end, ev.RunCompleted) else None
        return cls(run_id, s.status, output, s.turns, s.prompt_tokens + s.completion_tokens, s.tool_calls,
                   round(s.wall_s, 3))


@dataclass
class Row:
    """One source run and its regression (see the module docstring)."""

    source_run: str
    run_id: str | None
    verdict: str
    diverged_at: int | None
    source: Side
    candidate: Side | None
    source_pass: bool
    candidate_pass: bool
    reasons: list[str] = field(default_factory=list)  # why the candidate did not pass
    grader_errors: list[str] = field(default_factory=list)
    served: int = 0
    ran: int = 0
    refused: int = 0
    detail: str = ""
    unmatched: list[str] = field(default_factory=list)  # tools the candidate called with no recorded match

    @property
    def change(self) -> str:
        if self.source_pass and not self.candidate_pass:
            return "regression"
        if self.candidate_pass and not self.source_pass:
            return "fix"
        return ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "change": self.change}


@dataclass
class Report:
    """A regression of one set on one candidate: the rows in the set's order and the totals."""

    set: str
    agent: str
    candidate: str
    rows: list[Row]
    model_calls: int = 0  # requests that reached the candidate's model server
    cached: int = 0  # requests the reply cache answered
    id: str = ""  # the id it was saved under in the fleet (`runtime.regress.saved`), once saved
    where: str = ""  # where its runs were driven: `fleet` (the hosts) or `local` (the process that asked)

    @property
    def regressions(self) -> list[Row]:
        return [r for r in self.rows if r.change == "regression"]

    @property
    def fixes(self) -> list[Row]:
        return [r for r in self.rows if r.change == "fix"]

    @property
    def counts(self) -> dict[str, int]:
        seen = Counter(r.verdict for r in self.rows)
        return {v: seen[v] for v in VERDICTS}

    def pass_rate(self, side: str) -> float:
        passed = sum(r.source_pass if side == "source" else r.candidate_pass for r in self.rows)
        return passed / len(self.rows) if self.rows else 0.0

    def tokens(self, side: str) -> int:
        """Tokens spent by the source runs or by their regressions (prompt and completion)."""
        sides = [r.source if side == "source" else r.candidate for r in self.rows]
        return sum(s.tokens for s in sides if s is not None)

    @property
    def grader_errors(self) -> list[str]:
        return [f"{r.source_run}: {e}" for r in self.rows for e in r.grader_errors]

    def to_json(self) -> dict[str, Any]:
        return {"set": self.set, "agent": self.agent, "candidate": self.candidate, "runs": len(self.rows),
                "counts": self.counts, "pass_rate": {"source": self.pass_rate("source"),
                                                      "candidate": self.pass_rate("candidate")},
                "regressions": [r.source_run for r in self.regressions],
                "fixes": [r.source_run for r in self.fixes], "model_calls": self.model_calls,
                "tokens": {"source": self.tokens("source"), "candidate": self.tokens("candidate")},
                "cached": self.cached, "grader_errors": self.grader_errors, "where": self.where,
                "rows": [r.to_json() for r in self.rows]}


def _ending(side: Side, first: ev.Event | None) -> Ending:
    task = first if isinstance(first, ev.RunStarted) else None
    return Ending(side.status, side.output, task.input if task else "", dict(task.metadata) if task else {})


async def compare(driven: Driven, graders: Sequence[Grader]) -> Row:
    """The row of one driven run: its verdict, first divergence, costs and grades."""
    source_events = driven.source.events
    source = Side.of(driven.source.run_id, source_events)
    first = source_events[0] if source_events else None
    source_ending = _ending(source, first)
    source_pass, _, source_errors = await grade_all(graders, source_ending, source_ending)
    tally = driven.tally
    base: dict[str, Any] = {
        "source_run": driven.source.run_id, "run_id": driven.run_id, "source": source,
        "source_pass": source_pass, "served": tally.served, "ran": tally.ran, "refused": tally.refused,
        "unmatched": list(tally.unmatched)}
    if driven.error is not None:
        return Row(**base, verdict="failed", diverged_at=None, candidate=None, candidate_pass=False,
                   reasons=[driven.error], grader_errors=source_errors, detail=driven.error)
    assert driven.run_id is not None
    candidate = Side.of(driven.run_id, driven.events)
    passed, reasons, errors = await grade_all(graders, _ending(candidate, first), source_ending)
    d = diverge(driven.source.run_id, source_events, driven.run_id, driven.events, fact_of=behaviour)
    stopped = tally.stopped
    if d.identical:
        verdict = "same"
    elif source.status == "completed" and candidate.status != "completed" and stopped is None:
        verdict = "failed"
    elif stopped is None and (candidate.status != source.status
                              or canonical(candidate.output) != canonical(source.output)):
        verdict = "different-output"
    else:
        verdict = "diverged"
    detail = f"stopped: {stopped}" if stopped else ""
    if verdict == "failed":
        end = driven.events[-1] if driven.events else None
        detail = getattr(end, "detail", "") or getattr(end, "reason", "") or candidate.status
    return Row(**base, verdict=verdict, diverged_at=None if d.identical else d.common, candidate=candidate,
               candidate_pass=passed, reasons=reasons, grader_errors=source_errors + errors, detail=detail)


async def _compare_all(driven: Sequence[Driven], graders: Sequence[Grader], concurrency: int) -> list[Row]:
    """Every row, in the set's order, graded `concurrency` at a time: a judge grader is an agent run with a
    model call per run, which would otherwise add up one after the other."""
    import anyio

    rows: list[Row | None] = [None] * len(driven)
    gate = anyio.Semaphore(max(1, concurrency))

    async def one(i: int, d: Driven) -> None:
        async with gate:
            rows[i] = await compare(d, graders)

    async with anyio.create_task_group() as tg:
        for i, d in enumerate(driven):
            tg.start_soon(one, i, d)
    return [r for r in rows if r is not None]


async def regress(js: JetStreamContext, run_set: RunSet, candidate: Candidate, *,
                  graders: Sequence[Grader] = (), rules: Mapping[str, Rule] | None = None,
                  matcher: Matcher | None = None, concurrency: int = 4,
                  on_done: Callable[[Driven], Any] | None = None) -> Report:
    """Drive every run of `run_set` on `candidate` in this process (`runtime.regress.drive`) and report what
    changed."""
    driven = await drive_all(js, run_set, candidate, rules=rules, matcher=matcher, concurrency=concurrency,
                             on_done=on_done)
    return await report_of(run_set, candidate, driven, graders=graders, concurrency=concurrency)


async def report_of(run_set: RunSet, candidate: Candidate, driven: Sequence[Driven], *,
                    graders: Sequence[Grader] = (), concurrency: int = 4) -> Report:
    """The report of `driven`, the runs of `run_set` driven on `candidate` here or on the fleet."""
    rows = await _compare_all(driven, graders, concurrency)
    return Report(run_set.name, run_set.agent, candidate.id, rows, model_calls=sum(d.misses for d in driven),
                  cached=sum(d.hits for d in driven))


__all__ = ["BY", "VERDICTS", "Report", "Row", "Side", "behaviour", "compare", "regress", "report_of"]
