"""Deleting finished runs: their events, their payload objects and their `runs` index entry.

    purged = await RunLog(js).purge(["r-1", "r-2"], dry_run=True)   # what would go; nothing is deleted
    for p in purged: print(p.run_id, p.skipped or f"{p.events} events, {len(p.objects)} objects")

The operation belongs to the run log (`RunLog.purge` calls `purge_runs`); `sa runs purge` only chooses the
runs. A run is deleted only when it is over everywhere it could still be going on:

* its last event in EVENTS is terminal (`run.completed`, `run.failed`, `run.cancelled`), or it has no
  events left (the stream's age bound removed them);
* its `runs` index entry, if any, says it ended (the host writes that entry after the terminal event, so
  a run between the two is left for the next purge);
* it has no live `active` entry (a host that took over the partition would resume it from its events).

Anything else is "in flight": skipped, with the reason, never deleted.

What goes, in this order, so that a purge cut short is finished by running it again: the run's payload
objects (named `<run>/...`: no other run references them, `runtime.log.payloads`), its events (one purge of
`events.*.<run>.>`), then its index entry, through which purge finds runs. Shared objects written before
objects were named per run are left to the store's age bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from runtime import events as ev
from runtime.log.payloads import Payloads, StoredObject
from runtime.nats.kv import fleet_kv, kv_entries, runs_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import ACTIVE_BUCKET, EVENTS, RUNS_BUCKET, check_token

TERMINAL_STATUSES = frozenset({"completed", "failed", "cancelled"})


@dataclass
class Purged:
    """What a purge did to one run (or, with `dry_run`, would do); `skipped` says why it left it alone."""

    run_id: str
    actor: str = ""
    status: str = ""  # the run's end as the log says it ("completed", ...), or "" when it has no events
    events: int = 0
    objects: list[str] = field(default_factory=list)
    object_bytes: int = 0
    index: bool = False  # it had an index entry (deleted unless dry run)
    skipped: str | None = None
    dry_run: bool = False

    @property
    def deleted(self) -> bool:
        return self.skipped is None and not self.dry_run


def _kind_of_subject(subject: str) -> str:
    """`events.<actor>.<run>.run.completed` -> `run.completed`."""
    return ".".join(subject.split(".")[3:])


async def _events_held(js: JetStreamContext, flt: str, last: bytes) -> int:
    """How many events the run's log holds, from its first and last messages alone (seqs are contiguous;
    a message may hold several events: `runtime.events.decode_all`); the messages' count when either
    cannot be read as events."""
    try:
        first = await js.get_msg(EVENTS, seq=1, subject=flt, next=True, direct=True)
        return ev.decode_all(last)[-1].seq - ev.decode_all(first.data or b"")[0].seq + 1
    except (ev.EventDecodeError, NotFoundError, IndexError):
        info = await js.stream_info(EVENTS, subjects_filter=flt)
        return sum((info.state.subjects or {}).values())


async def purge_runs(js: JetStreamContext, payloads: Payloads, run_ids: list[str], *,
                     dry_run: bool = False, terminal_kinds: frozenset[str]) -> list[Purged]:
    """Purge each finished run of `run_ids` (see the module doc); one report per run, in order."""
    runs, active = await runs_kv(js), await fleet_kv(js, ACTIVE_BUCKET)
    objects = await payloads.objects_by_run()  # one pass over the store for all the runs
    out: list[Purged] = []
    for run_id in run_ids:
        check_token(run_id, "run id")
        flt = f"events.*.{run_id}.>"
        report = Purged(run_id, dry_run=dry_run)
        try:
            last = await js.get_last_msg(EVENTS, flt, direct=True)
        except NotFoundError:
            last = None
        try:
            entry = await runs.get(run_id)
            index = RunIndex.decode(entry.value) if entry.value else None
        except (KeyNotFoundError, NotFoundError):
            index = None
        report.index = index is not None
        if last is not None:
            report.actor = (last.subject or "").split(".")[1]
            kind = _kind_of_subject(last.subject or "")
            report.status = kind.removeprefix("run.") if kind in terminal_kinds else "running"
            if kind not in terminal_kinds:
                report.skipped = f"in flight: its last event is {kind}"
        elif index is not None:
            report.actor = index.actor
        if report.skipped is None and index is not None and index.status not in TERMINAL_STATUSES:
            report.skipped = f"in flight: the runs index says {index.status}"
        if report.skipped is None and await kv_entries(active, f"*.{run_id}"):
            report.skipped = "in flight: it has an active entry (a host would resume it)"
        if report.skipped is not None:
            out.append(report)
            continue
        mine: list[StoredObject] = objects.get(run_id, [])
        report.objects = [o.name for o in mine]
        report.object_bytes = sum(o.size for o in mine)
        if last is not None:
            report.events = await _events_held(js, flt, last.data or b"")
        if not dry_run:
            await payloads.delete_objects(mine)
            if last is not None:
                await js.purge_stream(EVENTS, subject=flt)
            if index is not None:  # the key's messages go, with no purge marker left behind
                await js.purge_stream(f"KV_{RUNS_BUCKET}", subject=f"$KV.{RUNS_BUCKET}.{run_id}")
        out.append(report)
    return out


__all__ = ["TERMINAL_STATUSES", "Purged", "purge_runs"]
