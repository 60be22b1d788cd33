"""The run log in memory: the second implementation of what the run driver writes to, for one process.

Why it exists: the in-process `Agent` is the same run driver as a host's (`runtime.driver`), so it needs a log
with the same contract as the JetStream one (`runtime.log.RunLog`): `create` appends a run's first event only
if the run has none, `append` takes an expected last sequence and raises `Superseded` when another writer got
there first, an unstamped event is a bug (`ValueError`), `read` gives the events back in order as the schema
decodes them, `last` names the last event's sequence and id, `append_group` stores several events as
one message. Sequences count across all runs of the log, as
a stream's do. Events are kept encoded, so an event the schema cannot round-trip fails here exactly as it
would on the stream. `tests/log/test_log_conformance.py` holds both logs to these rules.

Big values stay inline (a process's memory is the limit, not a message size): the payloads are the values
themselves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runtime import events as ev
from runtime.jobs import ToolOutcome
from runtime.log.runlog import RunHistory, Superseded, group_msg_id


class InlinePayloads:
    """Payloads for a log in memory: nothing is moved out, so every value is already resolved."""

    async def offload(self, value: Any, *, run: str) -> Any:
        return value

    async def resolve(self, ref: Any) -> Any:
        return ref

    async def resolve_outcome(self, outcome: ToolOutcome) -> ToolOutcome:
        return outcome


class MemoryRunLog:
    """Runs' events in this process's memory, under the run log's contract (see the module docstring)."""

    def __init__(self) -> None:
        self._runs: dict[str, list[tuple[int, bytes]]] = {}
        self._seq = 0
        self._payloads = InlinePayloads()

    @property
    def payloads(self) -> InlinePayloads:
        return self._payloads

    async def create(self, started: ev.RunStarted) -> int | None:
        """Append a run's first event only if the run has none yet; its sequence, or None if it exists."""
        if self._runs.get(started.run_id):
            ev.check_stamped(started)
            return None
        return self._write(started)

    async def append(self, event: ev.Event, *, expect: int) -> int:
        """Append a stamped `event` expecting `expect` as the run's last sequence; return the event's own.
        Raises `Superseded` if the run's last sequence is another."""
        ev.check_stamped(event)
        last = self._last_seq(event.run_id)
        if last != expect:
            raise Superseded(f"run {event.run_id}: another writer appended first (this one expected the "
                             f"run's last sequence to be {expect}, it is {last})")
        return self._write(event)

    async def append_group(self, events: Sequence[ev.Event], *, expect: int) -> int | None:
        """Append stamped `events` of one run as one message expecting `expect` (as a stream holds a group:
        one sequence for all of them); its sequence. Never None: memory has no message size."""
        if len(events) == 1:
            return await self.append(events[0], expect=expect)
        ev.check_group(events)
        run_id = events[0].run_id
        last = self._last_seq(run_id)
        if last != expect:
            raise Superseded(f"run {run_id}: another writer appended first (this one expected the run's "
                             f"last sequence to be {expect}, it is {last})")
        self._seq += 1
        self._runs.setdefault(run_id, []).append((self._seq, ev.encode_group([ev.encode(e) for e in events])))
        return self._seq

    async def last(self, run_id: str, actor: str | None = None) -> tuple[int, str] | None:
        """The sequence and id (`<run>/<seq>`) of the run's last event, or None if it has none."""
        stored = self._runs.get(run_id)
        if not stored:
            return None
        seq, data = stored[-1]
        events = ev.decode_all(data)
        return seq, group_msg_id(events) if len(events) > 1 else f"{run_id}/{events[0].seq}"

    async def read(self, run_id: str, actor: str | None = None) -> RunHistory:
        """Every event of `run_id` in order (an empty history if there is none)."""
        history = RunHistory(run_id, actor or "")
        for seq, data in self._runs.get(run_id, []):
            for event in ev.decode_all(data):  # a group's events share its sequence, as on a stream
                history.events.append(event)
                history.stream_seqs.append(seq)
        history.actor = history.actor or (history.events[0].actor if history.events else "")
        return history

    def _last_seq(self, run_id: str) -> int:
        stored = self._runs.get(run_id)
        return stored[-1][0] if stored else 0

    def _write(self, event: ev.Event) -> int:
        self._seq += 1
        self._runs.setdefault(event.run_id, []).append((self._seq, ev.encode(event)))
        return self._seq


__all__ = ["InlinePayloads", "MemoryRunLog"]
