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
* ``no_log``: the ``runs`` index lists the run but the stream holds none of its events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from nats.js import JetStreamContext

from runtime import events as ev
from runtime import kernel
from runtime.log import RunLog
from runtime.log.runlog import Stored
from runtime.nats.kv import kv_entries, runs_kv
from runtime.nats.records import RunIndex

FAULTS = ("decode", "first", "gap", "fork", "fold", "outcome", "no_log")


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
    """Every run audited, in order of actor and run id."""

    runs: list[RunAudit] = field(default_factory=list)

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


async def audit(js: JetStreamContext, *, actor: str | None = None, run_id: str | None = None,
                log: RunLog | None = None) -> Audit:
    """Audit every run (of `actor`, or the one run `run_id`): the stream's runs and the ``runs`` index's."""
    log = log or RunLog(js)
    found = dict.fromkeys(await log.runs(actor))  # (actor, run) in the stream
    indexed: dict[str, RunIndex] = {}
    for key, kv_entry in (await kv_entries(await runs_kv(js))).items():
        try:
            indexed[key] = RunIndex.decode(kv_entry.value)
        except Exception:  # an unreadable entry is not a run's log: left to `sa runs`
            continue
    in_stream = {run for _, run in found}
    report = Audit()
    for a, run in found:
        if run_id is not None and run != run_id:
            continue
        stored = await log.stored(run, a)
        report.runs.append(RunAudit(run, a, len(stored), check_run(stored)))
    for run, entry in sorted(indexed.items()):
        if run in in_stream or (run_id is not None and run != run_id) or \
                (actor is not None and entry.actor != actor):
            continue
        report.runs.append(RunAudit(run, entry.actor, 0, [Finding(
            "no_log", f"the runs index says {entry.status!r}, but the stream holds no event of the run")]))
    report.runs.sort(key=lambda r: (r.actor, r.run_id))
    return report


__all__ = ["FAULTS", "Audit", "Finding", "RunAudit", "audit", "check_run"]
