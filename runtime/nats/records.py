"""The records kept in KV buckets: the run index entry, threads, and the host and worker heartbeats.

Why here: they are wire formats shared by writers and readers in different processes (a host writes a
`HostBeat`, other hosts and `sa status` read it), so, like the subjects, they must be defined once. All are
msgspec Structs in msgpack; new fields get defaults so an older reader and a newer writer still agree.
Pure: no NATS client is needed to build or decode one.
"""

from __future__ import annotations

import msgspec

# the status of a running run that waits for an operator (`sa approvals` lists such runs' calls)
WAITING_FOR_APPROVAL = "waiting for approval"
# a running run parked until a person answers its question (`ask_human`; `sa questions` lists them)
WAITING_FOR_ANSWER = "waiting for an answer"
# a task stored and held by a host, waiting in its actor's mailbox behind the run the actor works on
QUEUED = "queued"
SLEEPING = "sleeping until "  # + the RFC 3339 instant: a run parked on a timer (`runtime.host.sleep`)


def sleeping_status(until: float) -> str:
    """The status of a run asleep on a timer until `until` (unix time): ``sleeping until <RFC 3339>``."""
    from runtime.timers import iso

    return SLEEPING + iso(until)


def active_value(actor: str, until: float | None = None) -> bytes:
    """An `active` entry's value: the run's actor, and for a run asleep on a timer when it wakes (a takeover
    leaves such a run in its log until then; `inf` for a run only an answer wakes)."""
    return (actor if until is None else f"{actor} {until!r}").encode()


def parse_active(value: bytes) -> tuple[str, float | None]:
    """(actor, when it wakes or None) of an `active` entry (an actor is one subject token: no space)."""
    actor, _, until = value.decode().partition(" ")
    return actor, float(until) if until else None


class RunIndex(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One entry of the `runs` bucket (key = run id): enough to list runs without scanning EVENTS.

    The event stream stays the truth; this is a cache the host rewrites as a run advances. The unfinished
    runs of a partition are found through the `active` bucket, not this one. `actor` is the run's actor
    key (`bundle` or `bundle:instance`); entries written before it had that name said `agent`, and are
    read the same."""

    status: str
    actor: str = ""  # e.g. "running" | "completed" | "failed" | "cancelled"
    partition: int
    last_seq: int = 0  # stream sequence of the run's last appended event (what the next append expects)
    seq: int | None = None  # the run's own seq of that event (`sa replay`, `sa fork --at`; None: not kept)
    updated: float = 0.0  # unix time of the last update
    task_id: str | None = None
    bundle: str | None = None
    forked_from: str | None = None  # a fork: the run it was forked from
    forked_at: int | None = None  # ... and the seq it was forked at (it kept the events before it)

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> RunIndex:
        entry = msgspec.msgpack.decode(data, type=cls)
        if not entry.actor:  # written when the field was `agent`
            entry.actor = msgspec.msgpack.decode(data, type=_OldIndex).agent
        return entry


class ThreadRecord(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One entry of the `threads` bucket: a conversation of one actor and its runs, oldest first. The
    run log stays the truth (each run's `run.started` names its previous run); this is how a host finds
    a thread's latest run without scanning EVENTS, and how `sa threads` lists them."""

    actor: str
    thread: str
    runs: list[str] = []
    updated: float = 0.0

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> ThreadRecord:
        return msgspec.msgpack.decode(data, type=cls)


class _OldIndex(msgspec.Struct):
    agent: str = ""


class HostBeat(msgspec.Struct, omit_defaults=True):
    """A host's heartbeat in the `hosts` bucket (renewed with its leases, gone one TTL after it dies)."""

    name: str  # hostname:pid
    started: float
    ttl: float  # its lease TTL
    partitions: list[int] = []  # the partitions it serves now
    runs: int = 0  # runs it is driving
    queued: int = 0  # tasks waiting in its mailboxes
    max_runs: int = 0  # its back-pressure bound (runs + queued tasks)
    agents: list[str] = []  # the bundles it serves
    descriptions: dict[str, str] = {}  # bundle -> its `description:`, for faces that list agents (MCP tools)

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> HostBeat:
        return msgspec.msgpack.decode(data, type=cls)


class WorkerBeat(msgspec.Struct, omit_defaults=True):
    """A worker's heartbeat in the `workers` bucket: read by `sa status`, and by a worker handed a job
    whose tool version it lacks, to tell whether another worker serves it (`runtime.worker.handoff`)."""

    name: str
    started: float
    concurrency: int
    running: int = 0  # jobs held now (running + buffered)
    completed: int = 0
    failed: int = 0
    tools: list[str] = []
    # every tool version served: (name, content hash, bundle or "" for a glob's script); empty from a
    # worker older than versions, which runs any version of the tools it names
    versions: list[tuple[str, str, str]] = []

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> WorkerBeat:
        return msgspec.msgpack.decode(data, type=cls)


__all__ = ["QUEUED", "SLEEPING", "WAITING_FOR_ANSWER", "WAITING_FOR_APPROVAL", "HostBeat", "RunIndex",
           "WorkerBeat", "active_value", "parse_active", "sleeping_status"]
