"""The run log: every read and write of a run's events goes through this package.

- `runlog`   — `RunLog`: create a run, append as its single writer (expected-sequence check; `Superseded` for
               the loser, `LogRejected` for an event no retry can land), read, follow, tail, copy a prefix
- `tail`     — `Tail`: every run's events through a durable consumer, acked as handled (a group's once whole)
- `payloads` — `Payloads`: values too big for an event, kept in the object store and referenced
- `purge`    — `purge_runs`: a run's events, index entries and payloads removed together
- `rebase`   — `rebased`: an event re-addressed to another run, every id re-derived (forks, diffs)
- `threads`  — conversations that continue across runs: read back by reference to the run before
- `backup`   — a mirror of EVENTS and the runs index kept elsewhere, and a run restored from it
"""

from runtime.log.purge import Purged, purge_runs
from runtime.log.runlog import (
    CANCELLED_FILTER,
    TERMINAL_KINDS,
    LogRejected,
    RunHistory,
    RunLog,
    Superseded,
    Tail,
    Tailed,
    rebased,
    run_filter,
)

__all__ = ["CANCELLED_FILTER", "TERMINAL_KINDS", "LogRejected", "Purged", "RunHistory", "RunLog",
           "Superseded", "Tail", "Tailed", "purge_runs", "rebased", "run_filter"]
