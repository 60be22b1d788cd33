"""What a host is told (`HostConfig`) and what it counts (`HostStats`).

Apart from `runtime.host.host` so that the parts of a host (partitions, actors, routing, recovery) can take
the configuration and the counters without importing the coordinator that assembles them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from runtime.host.leases import LeaseConfig
from runtime.nats.durability import require_sync_from_env

DEFAULT_MAX_RUNS = 256
DEFAULT_UNSERVED_AFTER_S = 60.0  # longer than a host's restart, short enough for a typo to be told


@dataclass
class HostConfig:
    partitions: Iterable[int] | None = None  # these of every bundle, no leases; None: a share by lease
    task_ack_wait: float = 30.0  # a dead host's un-started tasks are redelivered after this (or at takeover)
    pull_batch: int = 256
    pull_expires: float = 5.0
    recovery_concurrency: int = 16
    lease: LeaseConfig = field(default_factory=LeaseConfig)
    max_runs: int = DEFAULT_MAX_RUNS  # back-pressure: runs driven + tasks waiting in mailboxes, at most
    host_id: str | None = None  # default: `<hostname>-<pid>-<random>`
    # a task for an agent no live host serves waits in TASKS for a host serving it; once none has for this
    # long it fails `unknown_agent` (`runtime.host.unserved`); None: it waits for ever
    unserved_after: float | None = DEFAULT_UNSERVED_AFTER_S
    # a model endpoint's permit held by a host that stopped renewing it comes back after this long
    # (`runtime.host.endpoint`)
    permit_lease: float = 15.0
    # every this many seconds, a run unfinished in a slot served here that nothing here holds (seen so twice
    # in a row) is folded back and driven (`runtime.host.recovery`, "Orphans"); None: never looked for
    orphan_check: float | None = 15.0
    # refuse to serve unless every JetStream server asked syncs each write before acknowledging it
    # (`runtime.nats.durability`); default: the environment's SA_REQUIRE_SYNC
    require_sync: bool = field(default_factory=require_sync_from_env)
    # the servers' monitoring URLs to ask that of; None: SA_NATS_MONITOR, else port 8222 of each server
    monitor: list[str] | None = None
    # runs of regressions (`sa regress`) this host drives at once, below its production runs; 0: none (an
    # embedded host, `sa up`, a test's host); `sa host --regress-slots`, 2 by default
    regress_slots: int = 0
    regress_nice: int = 10  # ... in a child process at this much lower a CPU priority (`host.regressions`)


@dataclass
class HostStats:
    """Counters for tests, benchmarks and logs."""

    tasks: int = 0
    runs_started: int = 0
    runs_resumed: int = 0
    runs_recovered: int = 0
    runs_adopted: int = 0  # runs found unfinished with no driver outside a takeover, and driven (orphans)
    runs_ended: dict[str, int] = field(default_factory=dict)
    rejected: int = 0  # malformed messages terminated
    tasks_rejected_busy: int = 0  # tasks refused because their actor or thread was busy (double_texting)
    outcomes: int = 0
    superseded: int = 0
    handed_over: int = 0  # runs or tasks dropped because their partition went to another host
    gained: int = 0  # slots (partitions of a bundle) taken (at start or over)
    lost: int = 0  # slots given up (released, expired or fenced)
    unserved_failed: int = 0  # tasks failed because no live host served their agent (`runtime.host.unserved`)
    fires: int = 0  # schedule fires turned into tasks (`runtime.host.scheduler`)
    fires_skipped: int = 0  # missed fires skipped by their schedule's catch_up
    wakes: int = 0  # timer wake-ups turned into wake commands
    runs_parked: int = 0  # times a run went to sleep on a timer, holding nothing


__all__ = ["DEFAULT_MAX_RUNS", "DEFAULT_UNSERVED_AFTER_S", "HostConfig", "HostStats"]
