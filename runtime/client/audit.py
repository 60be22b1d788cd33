"""The audit: re-read every run's log (or one agent's, or one run's) and prove it whole.

    report = await audit(js)          # every run; or audit(js, actor="calc"), audit(js, run_id=R)
    report.findings                   # [] when every log is whole (`sa audit` exits 0)

Why: the log is the truth, and storage can lose or change what it acknowledged (a node that lost power with
writes not yet synced, a truncated block file, a flipped bit, an operator's purge by sequence). A run whose
log lost an event still folds to *a* state, one its writer never had: a tool call forgotten and run again,
a model reply asked for again. Nothing on the hot path looks back at old events, so nothing would notice;
this does, on demand or on a schedule.

What each run is checked for (`check_run`, pure, over the messages as stored: `RunLog.stored`):
* ``decode``: a message that is not an event (`events.decode` refuses it);
* ``first``: the first event is not `run.started` (or `run.forked`);
* ``gap`` / ``fork``: the run's own `seq` is not 0, 1, 2, ... in stream order (one missing, one twice);
* ``fold``: the events do not re-fold (`kernel.evolve` raises: an event out of place, of another run);
  folded with the default kernel config, since the audit has no bundle: what is checked is the log's
  structure, not the bundle's policies (`sa replay RUN --verify --bundle ...` checks those);
* ``outcome``: a tool outcome (`tool.completed`, `tool.failed`) for a call no earlier event named (no
  `model.responded` proposed it, no fork's edit, no `tool.called` recorded it);
* ``tail``: the log ends before the event the ``runs`` index says it reached (`RunIndex.seq`, written by the
  host after its appends): the last events were lost, which no gap shows (`check_tail`);
* ``no_log``: the ``runs`` index lists the run but the stream holds none of its events.

On a schedule (`audit_every`, `sa audit --every 1h`): a pass every period until stopped, each pass's
report handed on (metrics, an error log line per finding: `runtime.observe.metrics.AuditMetrics`). Re-reading
every log costs 4 to 7 ms a run on loopback (1,000 twelve-event runs: 3.8 to 6.7 s on two busy cores; reading
8 or 32 at once was slower, 8 to 10 s: the reader is CPU-bound), so a scheduled pass remembers (`Memo`) each
*ended* run it proved whole with its message count (1,000 such runs: 0.11 s instead of 6.8 s):
the next pass skips such a run while the stream still holds exactly that many of its messages (one stream
info request counts them all), and reads it again the moment one is lost (a purge by sequence, a truncated
block) or added. What a count cannot see (a message changed in place, one lost and another added to the same
ended run) a full pass does: every `full_every`-th pass forgets the memo and reads every log.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import anyio
from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.log import RunLog
from runtime.log.runlog import TERMINAL_KINDS, Stored
from runtime.nats.kv import kv_entries, runs_kv
from runtime.nats.records import RunIndex

logger = logging.getLogger("runtime.client.audit")

FAULTS = ("decode", "first", "gap", "fork", "fold", "outcome", "tail", "no_log")
FULL_EVERY = 24  # a scheduled audit reads every log again on every 24th pass (daily, at --every 1h)


@dataclass(frozen=True)
class Finding:
    """One fault of one run: which (`FAULTS`), and what exactly (with the stream sequence where known)."""

    fault: str
    detail: str
    stream_seq: int | None = None


@dataclass
class RunAudit:
    """One run's audit: how many messages its log holds, and what is wrong with it (nothing: whole)."""

    run_id: str
    actor: str
    events: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def whole(self) -> bool:
        return not self.findings


@dataclass
class Audit:
    """Every run audited, in order of actor and run id; `unchanged`: the ended runs a scheduled pass did
    not read again, since the stream holds exactly the messages they had when proved whole (`Memo`)."""

    runs: list[RunAudit] = field(default_factory=list)
    unchanged: int = 0

    @property
    def findings(self) -> list[tuple[RunAudit, Finding]]:
        return [(r, f) for r in self.runs for f in r.findings]


def check_run(stored: Sequence[Stored]) -> list[Finding]:
    """What is wrong with one run's messages as stored, in stream order (see the module docstring)."""
    findings: list[Finding] = []
    events: list[tuple[int, ev.Event]] = []
    for msg in stored:
        try:  # a group (several events in one message) gives each of them its stream sequence
            events += [(msg.stream_seq, event) for event in ev.decode_all(msg.data)]
        except ev.EventDecodeError as e:
            findings.append(Finding("decode", f"{msg.subject}: {e}", msg.stream_seq))
    if not events:
        return findings
    first_seq, first = events[0]
    if not isinstance(first, ev.RunStarted):
        findings.append(Finding("first", f"the log starts with {ev.kind_of(first)}, not run.started",
                                first_seq))
    expected = 0
    for stream_seq, event in events:
        if event.seq < expected:
            findings.append(Finding("fork", f"seq {event.seq} ({ev.kind_of(event)}) is there twice",
                                    stream_seq))
            continue
        if event.seq > expected:
            missing = f"seq {expected}" if event.seq == expected + 1 else f"seq {expected} to {event.seq - 1}"
            findings.append(Finding("gap", f"{missing} missing before {ev.kind_of(event)} (seq {event.seq})",
                                    stream_seq))
        expected = event.seq + 1
    findings += _fold(events)
    findings += _outcomes(events)
    return findings


def _fold(events: list[tuple[int, ev.Event]]) -> list[Finding]:
    """Re-fold the events in their own order (duplicates and gaps already reported are stepped over)."""
    state = kernel.initial(kernel.KernelConfig())
    for stream_seq, event in events:
        if event.seq != state.seq:
            if event.seq < state.seq:
                continue  # a fork, reported
            state = _skip_to(state, event.seq)  # a gap, reported: fold what follows
        try:
            state = kernel.evolve(state, event)
        except kernel.EvolveError as e:
            if "continues run" in str(e):  # a run in a thread: its conversation is another run's log
                return []
            return [Finding("fold", f"{ev.kind_of(event)} (seq {event.seq}): {e}", stream_seq)]
    return []


def _skip_to(state: kernel.State, seq: int) -> kernel.State:
    return replace(state, seq=seq)


def _outcomes(events: list[tuple[int, ev.Event]]) -> list[Finding]:
    """Every tool outcome must answer a call an earlier event named."""
    named: set[str] = set()
    out: list[Finding] = []
    for stream_seq, event in events:
        match event:
            case ev.ModelResponded():
                named.update(c.id for c in event.calls)
            case ev.RunForked() if isinstance(event.edit, ev.ReplyEdit):
                return out  # the edited reply's calls get their ids as the fork folds: not named here
            case ev.ToolCalled():
                named.add(event.call.id)
            case ev.ApprovalRequested():
                named.add(event.call.id)
            case ev.ToolCompleted() | ev.ToolFailed() if event.call_id not in named:
                out.append(Finding("outcome", f"{ev.kind_of(event)} for call {event.call_id}, which no "
                                              "earlier event named", stream_seq))
    return out


def check_tail(stored: Sequence[Stored], entry: RunIndex | None) -> list[Finding]:
    """A ``tail`` finding when the run's log ends before the seq its ``runs`` index entry says it reached.
    The host writes the entry after the events it folded are stored, so the entry never runs ahead of a
    whole log; an entry without a seq (an older one) or no entry says nothing."""
    if entry is None or entry.seq is None or not stored:
        return []
    try:
        last = ev.decode_all(stored[-1].data)[-1]
    except ev.EventDecodeError:
        return []  # reported as ``decode``
    if last.seq >= entry.seq:
        return []
    lost = f"seq {entry.seq}" if entry.seq == last.seq + 1 else f"seq {last.seq + 1} to {entry.seq}"
    return [Finding("tail", f"the log ends at seq {last.seq} ({ev.kind_of(last)}), but the runs index says "
                            f"it reached seq {entry.seq} ({entry.status}): {lost} lost",
                    stored[-1].stream_seq)]


@dataclass
class Memo:
    """What a scheduled audit keeps between passes: each ended run proved whole, by (actor, run id), with
    how many messages its log held then (see the module docstring). Empty: the next pass reads every log."""

    whole: dict[tuple[str, str], int] = field(default_factory=dict)


Progress = Callable[[RunAudit, int, int], None]  # (a run just audited, runs audited so far, runs to audit)


async def audit(js: JetStreamContext, *, actor: str | None = None, run_id: str | None = None,
                log: RunLog | None = None, memo: Memo | None = None, on_run: Progress | None = None) -> Audit:
    """Audit every run (of `actor`, or the one run `run_id`): the stream's runs and the ``runs`` index's.

    With `memo`, an ended run proved whole before whose message count has not changed is counted in
    `Audit.unchanged` instead of read, and the memo is brought up to date. `on_run` is told of each run as
    it is audited (a long audit's progress)."""
    log = log or RunLog(js)
    sizes = await log.sizes(actor)  # (actor, run) in the stream -> its messages
    indexed = await _index(js)
    report = Audit(runs=_unlogged(indexed, {run for _, run in sizes}, actor, run_id))
    todo = []
    for key, count in sorted(sizes.items()):
        if run_id is not None and key[1] != run_id:
            continue
        if memo is not None and memo.whole.get(key) == count:
            report.unchanged += 1
        else:
            todo.append(key)
    if memo is not None:  # a run whose count changed (or that is gone) is no longer proved whole
        memo.whole = {k: n for k, n in memo.whole.items() if sizes.get(k) == n}
    total = len(todo) + len(report.runs)
    for done, r in enumerate(list(report.runs), 1):
        if on_run is not None:
            on_run(r, done, total)
    for a, run in todo:  # one by one: reading a few at once was slower here (the reader is CPU-bound)
        stored = await log.stored(run, a)
        checked = RunAudit(run, a, len(stored), check_run(stored) + check_tail(stored, indexed.get(run)))
        report.runs.append(checked)
        if memo is not None:
            if checked.whole and stored and _kind(stored[-1].subject) in TERMINAL_KINDS:
                memo.whole[(a, run)] = len(stored)
            else:
                memo.whole.pop((a, run), None)
        if on_run is not None:
            on_run(checked, len(report.runs), total)
    report.runs.sort(key=lambda r: (r.actor, r.run_id))
    return report


async def _index(js: JetStreamContext) -> dict[str, RunIndex]:
    """Every readable entry of the ``runs`` index (an unreadable one is not a run's log: left to `sa
    runs`)."""
    out = {}
    for run, kv_entry in (await kv_entries(await runs_kv(js))).items():
        try:
            out[run] = RunIndex.decode(kv_entry.value)
        except Exception:
            continue
    return out


def _unlogged(indexed: dict[str, RunIndex], in_stream: set[str], actor: str | None,
              run_id: str | None) -> list[RunAudit]:
    """A ``no_log`` finding for each run the ``runs`` index lists (of `actor`, or `run_id`) that has no
    event in the stream."""
    out = []
    for run, entry in sorted(indexed.items()):
        if run in in_stream or (run_id is not None and run != run_id) or \
                (actor is not None and entry.actor != actor):
            continue
        out.append(RunAudit(run, entry.actor, 0, [Finding(
            "no_log", f"the runs index says {entry.status!r}, but the stream holds no event of the run")]))
    return out


def log_findings(report: Audit) -> None:
    """One log line at error level per finding, with the run and agent as fields (`--log-format json`):
    what a log-based alert matches, beside the metric one."""
    for r, f in report.findings:
        where = f" at stream seq {f.stream_seq}" if f.stream_seq is not None else ""
        logger.error("run %s (%s): %s%s: %s", r.run_id, r.actor, f.fault, where, f.detail,
                     extra={"run_id": r.run_id, "agent": r.actor, "fault": f.fault})


def _kind(subject: str) -> str:
    """The event kind a message's subject ends with (`events.<actor>.<run>.<kind>`)."""
    parts = subject.split(".", 3)
    return parts[3] if len(parts) == 4 else ""


async def audit_every(js: JetStreamContext, every: float, stop: anyio.Event, *,
                      on_report: Callable[[Audit], None], on_error: Callable[[Exception], None],
                      on_pass: Callable[[], None] | None = None, actor: str | None = None,
                      log: RunLog | None = None, on_run: Progress | None = None,
                      full_every: int = FULL_EVERY) -> int:
    """Audit every `every` seconds until `stop` is set (a pass under way is abandoned at once); returns how
    many passes finished. Each report goes to `on_report`; a pass that could not finish (NATS unreachable,
    a permission refused) goes to `on_error` and the loop goes on: a scheduled audit that died would look
    the same as one that finds nothing, which is why the metrics carry the time of the last finished pass.
    `on_pass` is told as each pass starts (to time it). Every `full_every`-th pass reads every log again (see
    the module docstring)."""
    memo = Memo()
    passes = 0
    async with anyio.create_task_group() as tg:
        async def stopper() -> None:
            await stop.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(stopper)
        attempt = 0
        while True:
            if attempt % max(1, full_every) == 0:
                memo = Memo()
            attempt += 1
            if on_pass is not None:
                on_pass()
            try:
                report = await audit(js, actor=actor, log=log, memo=memo, on_run=on_run)
            except Exception as e:
                on_error(e)
            else:
                passes += 1
                on_report(report)
            await anyio.sleep(every)
    return passes


__all__ = ["FAULTS", "FULL_EVERY", "Audit", "Finding", "Memo", "Progress", "RunAudit", "audit", "audit_every",
           "check_run", "check_tail", "log_findings"]
