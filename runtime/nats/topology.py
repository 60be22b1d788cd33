"""The streams and consumers of the runtime: creating them, reading them back, attaching to them.

Why a module: every host and worker calls `attach_topology` at start, in any order, concurrently, and all
must end up agreeing on one configuration, so it is written once. `ensure_topology` creates or updates the
six streams (TASKS, EVENTS, TOOLS, RESULTS, DLQ, SCHEDULES: see `runtime.nats.subjects`), the shared
``workers`` and ``scheduler`` consumers and every bucket; `ensure_partition_consumers` makes the two durable
consumers of one partition; `ensure_schedules` makes SCHEDULES for a fleet whose streams an older version
made.

SCHEDULES is the cluster's clock (nats-server 2.12+ message schedules, ADR-51; `runtime.schedules` says what
the server does with them): it must allow message schedules (which the server lets a stream turn on only
while empty, hence a stream of its own) and rollup headers (a paused schedule replaces its message), and is
a WorkQueue: a fire is gone once a host has turned it into a task, while the schedules themselves, which no
consumer takes, stay.

Replicas. On a cluster, `SA_REPLICAS=3` makes `ensure_topology` create R3 streams; without it a process keeps
the replica count the streams already have (`topology_replicas`), so a process started without the variable
never scales a cluster's streams down.

Partitions. N is fixed when TASKS is created; `read_partitions()` returns it so every host agrees without
configuration. Changing N on a live system only affects newly published tasks: drain TASKS first.
One consumer per slot (a partition of a bundle) is allowed on a WorkQueue stream because slot filters never
overlap (overlapping filters are rejected, err 10100): hosts serving different bundles consume the same
partitions side by side. TASKS and RESULTS allow 10,000 consumers: with N = 16, the slots of 600 bundles.

Consumers. Every stream sets ``max_consumers`` explicitly (nats-server 2.15 silently caps at 1,000 otherwise,
and ``-1`` does not lift it). The ``workers`` consumer acks explicitly, with a short AckWait (3 s by default:
workers heartbeat every job they hold four times per AckWait, `runtime.worker.attempts`, so AckWait bounds how
long a dead worker's job waits, not how long a tool may run), MaxDeliver 5 and a bounded MaxAckPending
(back-pressure).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

import nats
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    ConsumerInfo,
    DeliverPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)
from nats.js.errors import BadRequestError, NotFoundError

from runtime.nats.kv import applied_kv, fleet_kv, payloads_store, runs_kv
from runtime.nats.retention import (
    DEFAULT_RETENTION,
    Retention,
    bounded,
    ensure_retention,
    resolve_retention,
)
from runtime.nats.retry import placing, retrying
from runtime.nats.subjects import (
    ACTIVE_BUCKET,
    ATTEMPTS_BUCKET,
    COMMANDS_PREFIX,
    DEFAULT_PARTITIONS,
    DEFAULT_TOOL_ACK_WAIT_S,
    DEFAULT_TOOL_MAX_ACK_PENDING,
    DEFAULT_TOOL_MAX_DELIVER,
    DLQ,
    DUPLICATE_WINDOW_S,
    EVENTS,
    FIRE_FILTERS,
    HOSTS_BUCKET,
    LEASES_BUCKET,
    RESULTS,
    SCHEDULER_CONSUMER,
    SCHEDULES,
    TASKS,
    THREADS_BUCKET,
    TOOLS,
    WORKERS_BUCKET,
    WORKERS_CONSUMER,
    bundle_result_filters,
    bundle_task_filters,
    result_consumer_name,
    task_consumer_name,
)

ENV_REPLICAS = "SA_REPLICAS"  # replicas of new or updated streams and buckets (`topology_replicas`)

log = logging.getLogger("runtime.nats")


@dataclass(frozen=True)
class Topology:
    """What `ensure_topology` configured; processes that only attach read it with `read_topology`."""

    partitions: int
    replicas: int
    tool_ack_wait: float
    tool_max_deliver: int


TASK_SUBJECTS = ["agents.*.tasks", "agents.*.subtasks", f"{COMMANDS_PREFIX}.*.*"]


def _tasks_transform(partitions: int) -> SubjectTransform:
    """One transform for both TASKS subjects (a stream has exactly one): the agent is token 2 of each
    (``agents.<agent>.tasks``, ``ops.<agent>.<operator>``), so both land in the agent's partition, and the
    two other tokens are kept to tell a task from a command and to name the operator. The agent split at
    ``:`` follows, so its bundle is a token a consumer can filter on (`subjects.bundle_task_filters`): a
    host takes only tasks of bundles it serves."""
    dest = "tasks.{{partition(N,2)}}.{{wildcard(2)}}.{{wildcard(1)}}.{{wildcard(3)}}.{{split(2,:)}}"
    return SubjectTransform(src="*.*.*", dest=dest.replace("N", str(partitions)))


def _results_transform() -> SubjectTransform:
    """RESULTS keeps what workers publish (``results.<p>.<actor>.<run>``) and appends the actor split at
    ``:``, so the host holding the run's bundle and partition filters its outcomes by the bundle token
    (`subjects.bundle_result_filters`); workers need not know."""
    return SubjectTransform(src="results.*.*.*",
                            dest="results.{{wildcard(1)}}.{{wildcard(2)}}.{{wildcard(3)}}.{{split(2,:)}}")


def stream_configs(*, replicas: int = 1, partitions: int = DEFAULT_PARTITIONS,
                   retention: Retention = DEFAULT_RETENTION) -> list[StreamConfig]:
    """The six streams of the runtime (pure data: tests and `sa status` compare against it). EVENTS is
    bounded by `retention` (`runtime.nats.retention`: 90 days, no size bound, by default)."""
    common: dict[str, Any] = {"storage": StorageType.FILE, "num_replicas": replicas,
                              "duplicate_window": DUPLICATE_WINDOW_S}
    consumers = max(10_000, 4 * partitions + 64)  # a pair per slot (partition of a bundle) + ops consumers
    return [
        StreamConfig(name=TASKS, subjects=list(TASK_SUBJECTS), retention=RetentionPolicy.WORK_QUEUE,
                     subject_transform=_tasks_transform(partitions), max_consumers=consumers,
                     metadata={"partitions": str(partitions)}, **common),
        bounded(StreamConfig(name=EVENTS, subjects=["events.>"], retention=RetentionPolicy.LIMITS,
                             allow_direct=True, allow_atomic=True, max_consumers=10_000, **common),
                retention.events_max_age, retention.events_max_bytes),
        StreamConfig(name=TOOLS, subjects=["tools.*"], retention=RetentionPolicy.WORK_QUEUE,
                     max_consumers=256, **common),
        StreamConfig(name=RESULTS, subjects=["results.>"], retention=RetentionPolicy.WORK_QUEUE,
                     subject_transform=_results_transform(), max_consumers=consumers, **common),
        StreamConfig(name=DLQ, subjects=["dlq.>"], retention=RetentionPolicy.LIMITS,
                     allow_direct=True, max_consumers=1024, **common),
        schedules_config(replicas=replicas),
    ]


def schedules_config(*, replicas: int = 1) -> StreamConfig:
    """SCHEDULES (see the module docstring)."""
    return StreamConfig(name=SCHEDULES, subjects=["schedules.>"], retention=RetentionPolicy.WORK_QUEUE,
                        allow_msg_schedules=True, allow_rollup_hdrs=True, allow_direct=True, max_consumers=64,
                        storage=StorageType.FILE, num_replicas=replicas, duplicate_window=DUPLICATE_WINDOW_S)


def scheduler_consumer_config(*, replicas: int = 1, ack_wait: float = 10.0) -> ConsumerConfig:
    """The one durable pull consumer of fires and wake-ups that every host pulls from
    (`runtime.host.scheduler`)."""
    return ConsumerConfig(name=SCHEDULER_CONSUMER, durable_name=SCHEDULER_CONSUMER,
                          filter_subjects=list(FIRE_FILTERS), deliver_policy=DeliverPolicy.ALL,
                          ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_ack_pending=1024,
                          num_replicas=replicas)


async def ensure_schedules(js: JetStreamContext, *, replicas: int | None = None) -> None:
    """SCHEDULES and its ``scheduler`` consumer, created or brought up to date (a host calls it at start:
    streams made by a version without schedules lack it)."""
    replicas = await topology_replicas(js, replicas)
    await _ensure_stream(js, schedules_config(replicas=replicas))
    await ensure_consumer(js, SCHEDULES, scheduler_consumer_config(replicas=replicas))


def workers_consumer_config(*, ack_wait: float = DEFAULT_TOOL_ACK_WAIT_S,
                            max_deliver: int = DEFAULT_TOOL_MAX_DELIVER,
                            max_ack_pending: int = DEFAULT_TOOL_MAX_ACK_PENDING,
                            replicas: int = 1) -> ConsumerConfig:
    """The single durable pull consumer every worker on every machine binds to."""
    return ConsumerConfig(name=WORKERS_CONSUMER, durable_name=WORKERS_CONSUMER, filter_subject="tools.*",
                          deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait,
                          max_deliver=max_deliver, max_ack_pending=max_ack_pending, num_replicas=replicas)


async def _ensure_stream(js: JetStreamContext, config: StreamConfig) -> None:
    assert config.name is not None
    try:
        await js.stream_info(config.name)
    except NotFoundError:
        try:
            await placing(lambda: js.add_stream(config), what=f"creating stream {config.name}")
            return
        except BadRequestError:
            pass  # another process created it between our two calls: fall through to update
    await js.update_stream(config)


async def ensure_consumer(js: JetStreamContext, stream: str, config: ConsumerConfig) -> None:
    """Create or update a durable consumer (the CREATE API with a name is create-or-update)."""
    if config.name is None:
        config = dataclasses.replace(config, name=config.durable_name)
    await js.add_consumer(stream, config)


async def topology_replicas(js: JetStreamContext, replicas: int | None = None) -> int:
    """The replica count to configure: explicit, else `SA_REPLICAS`, else what EVENTS already has (so a
    process started without the variable never scales a cluster's R3 streams down), else 1."""
    if replicas is not None:
        return replicas
    raw = os.environ.get(ENV_REPLICAS, "").strip()
    if raw:
        if not raw.isdigit() or int(raw) < 1:
            raise ValueError(f"{ENV_REPLICAS}={raw!r}: use a replica count such as 1 or 3")
        return int(raw)
    try:
        return (await js.stream_info(EVENTS)).config.num_replicas or 1
    except NotFoundError:
        return 1


async def ensure_topology(js: JetStreamContext, *, replicas: int | None = None,
                          partitions: int = DEFAULT_PARTITIONS,
                          tool_ack_wait: float = DEFAULT_TOOL_ACK_WAIT_S,
                          tool_max_deliver: int = DEFAULT_TOOL_MAX_DELIVER,
                          tool_max_ack_pending: int = DEFAULT_TOOL_MAX_ACK_PENDING,
                          retention: Retention | None = None) -> Topology:
    """Create or update every stream, the `workers` consumer, every KV bucket and the `payloads` store,
    TASKS last, so that its existence means the rest exists.

    Idempotent: every host and worker calls it at start, in any order, concurrently. `replicas=None`
    resolves through `topology_replicas` (SA_REPLICAS, else keep the existing count); an existing TASKS
    stream keeps its partition count whatever `partitions` says; EVENTS and the payload store keep the
    bounds they have unless `retention` asks for others (`runtime.nats.retention`).
    """
    if partitions < 1:
        raise ValueError("partitions must be ≥ 1")
    replicas = await topology_replicas(js, replicas)
    try:  # the partition count is fixed once TASKS exists: changing it would re-route live agents
        existing = _partitions_of((await js.stream_info(TASKS)).config)
    except NotFoundError:
        existing = 0
    if existing and existing != partitions:
        log.warning("TASKS has %d partitions; keeping them (asked for %d: drain and delete TASKS to change)",
                    existing, partitions)
        partitions = existing
    bounds = await resolve_retention(js, retention)  # before any update: never reset a stream's bounds
    configs = stream_configs(replicas=replicas, partitions=partitions, retention=bounds)
    for config in configs:
        if config.name != TASKS:
            await _ensure_stream(js, config)
    await ensure_consumer(js, TOOLS, workers_consumer_config(
        ack_wait=tool_ack_wait, max_deliver=tool_max_deliver, max_ack_pending=tool_max_ack_pending,
        replicas=replicas))
    await ensure_consumer(js, SCHEDULES, scheduler_consumer_config(replicas=replicas))
    await runs_kv(js, replicas=replicas)
    await applied_kv(js, replicas=replicas)
    for bucket in (LEASES_BUCKET, HOSTS_BUCKET, WORKERS_BUCKET, ACTIVE_BUCKET, ATTEMPTS_BUCKET,
                   THREADS_BUCKET):
        await fleet_kv(js, bucket, replicas=replicas)
    await payloads_store(js, replicas=replicas)
    await ensure_retention(js, bounds)  # the payload store's bounds
    # TASKS last: a client that finds it (`submit`, a worker waiting for the topology) then finds every
    # stream, bucket and store it goes on to use (a run's events, its index entry), even on a fresh server
    await _ensure_stream(js, next(c for c in configs if c.name == TASKS))
    return Topology(partitions, replicas, tool_ack_wait, tool_max_deliver)


def _partitions_of(config: StreamConfig) -> int:
    """The partition count of a TASKS stream config (its metadata, else its subject transform), 0 if none."""
    partitions = int((config.metadata or {}).get("partitions", "0"))
    if not partitions and config.subject_transform is not None:
        dest = config.subject_transform.dest or ""
        partitions = int(dest.split("partition(")[1].split(",")[0])
    return partitions


async def read_topology(js: JetStreamContext) -> Topology:
    """The topology as configured on the server (partition count from TASKS, retry policy from `workers`)."""
    si = await js.stream_info(TASKS)
    partitions = _partitions_of(si.config)
    ci = await js.consumer_info(TOOLS, WORKERS_CONSUMER)
    return Topology(partitions or DEFAULT_PARTITIONS, si.config.num_replicas or 1,
                    float(ci.config.ack_wait or DEFAULT_TOOL_ACK_WAIT_S),
                    int(ci.config.max_deliver or DEFAULT_TOOL_MAX_DELIVER))


class NoTopology(nats.js.errors.NotFoundError):
    """No host has created the streams yet (a process that may not create them waits for one)."""

    def __str__(self) -> str:
        return "no host has created the streams and consumers yet: start `sa host` (or `sa up`)"


async def attach_topology(js: JetStreamContext, *, create: bool = True, **ensure: Any) -> Topology:
    """The topology for a process starting up: read it, create it (`ensure_topology(**ensure)`) if there is
    none and `create`, and wait out NATS being unavailable (a cluster electing a leader answers nothing for
    4-6 s) instead of failing: a host or worker restarted during an election must come up, not crash. A
    request NATS rejects (a bad configuration) is raised at once.

    `create=False` is for workers: the hosts own the topology (its partition count is theirs to choose),
    and a secured worker may not create streams at all (each refused request would stall it for the
    request timeout), so a worker that starts first waits for a host, saying so every few seconds."""

    async def read_or_create() -> Topology:
        try:
            return await read_topology(js)
        except NotFoundError:
            if not create:
                raise NoTopology() from None
            await ensure_topology(js, **ensure)
            return await read_topology(js)  # what the server holds: another process may have been first

    delay = 0.5 if create else 2.0
    return await retrying(read_or_create, what="attaching to the NATS topology", fatal=BadRequestError,
                          retry_on=(nats.errors.Error, nats.js.errors.APIError, TimeoutError), delay=delay,
                          logger=log)


async def read_partitions(js: JetStreamContext) -> int:
    """The partition count every host must use (from the TASKS stream, never from local config)."""
    return (await read_topology(js)).partitions


async def consumer_infos(js: JetStreamContext, stream: str) -> list[ConsumerInfo]:
    """Every consumer of `stream` (the server lists 256 a page; nats-py asks for one page)."""
    out: list[ConsumerInfo] = []
    while True:
        page = await js.consumers_info(stream, offset=len(out))
        out += page
        if len(page) < 256:
            return out


async def ensure_transforms(js: JetStreamContext) -> bool:
    """Bring the subject transforms of an existing TASKS and RESULTS up to this version's (a host calls it
    at start, since attaching creates streams only when there are none); True if one was changed.

    Streams made by a version before bundles had a token of their own store a task as
    ``tasks.<p>.<agent>.<t1>.<t3>``: once updated, new messages get the bundle tokens. Messages already
    stored stay as they are; the slot consumers still take those of a bundle's own actor
    (`subjects.bundle_task_filters`), not those of its instances (drain TASKS before such an upgrade)."""
    changed = False
    for name in (TASKS, RESULTS):
        config = (await js.stream_info(name)).config
        want = _tasks_transform(_partitions_of(config)) if name == TASKS else _results_transform()
        have = config.subject_transform
        if have is None or (have.src, have.dest) != (want.src, want.dest):
            log.warning("stream %s: updating its subject transform to %s", name, want.dest)
            await js.update_stream(dataclasses.replace(config, subject_transform=want))
            changed = True
    return changed


async def ensure_partition_consumers(js: JetStreamContext, partition: int, bundle: str, *,
                                     ack_wait: float = 30.0, max_deliver: int = -1,
                                     max_ack_pending: int = 10_000, replicas: int = 1,
                                     fresh: bool = False) -> tuple[str, str]:
    """The durable task and result consumers of one slot (partition `partition` of `bundle`); returns their
    names.

    One pair per partition and bundle, not per agent: a host holding k slots needs 2k consumers whatever
    the number of agents (instances), and the per-agent mailboxes live in the host's memory. Their filters
    (`subjects.bundle_task_filters`, `bundle_result_filters`) take only the bundle's messages, so hosts
    serving other bundles consume the same partition beside them. `max_ack_pending` bounds the task
    messages the owner holds un-acked (waiting in mailboxes): the rest wait in the stream.

    `fresh=True` deletes them first (a takeover): messages the previous owner had been delivered but not
    acked are then delivered again at once instead of after AckWait. Safe on a WorkQueue stream, where
    acked messages are gone and un-acked ones stay stored whatever happens to the consumer. It also
    deletes the partition's consumers of a version that read whole partitions (``tasks-p<N>``): their
    filters would overlap every slot's of the partition, which the server refuses.
    """
    names = (task_consumer_name(partition, bundle), result_consumer_name(partition, bundle))
    for stream, name, filters, legacy in (
            (TASKS, names[0], bundle_task_filters(partition, bundle), f"tasks-p{partition}"),
            (RESULTS, names[1], bundle_result_filters(partition, bundle), f"results-p{partition}")):
        if fresh:
            for old in (name, legacy):
                with contextlib.suppress(NotFoundError):
                    await js.delete_consumer(stream, old)
        await ensure_consumer(js, stream, ConsumerConfig(
            name=name, durable_name=name, filter_subjects=filters, deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_deliver=max_deliver,
            max_ack_pending=max_ack_pending, num_replicas=replicas))
    return names


__all__ = ["ENV_REPLICAS", "TASK_SUBJECTS", "Topology", "attach_topology", "consumer_infos",
           "ensure_consumer", "ensure_partition_consumers", "ensure_schedules", "ensure_topology",
           "ensure_transforms", "read_partitions", "read_topology", "scheduler_consumer_config",
           "schedules_config", "stream_configs", "topology_replicas", "workers_consumer_config"]
