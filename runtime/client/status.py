"""What the fleet is doing, read from NATS alone: `sa status [--json]`.

    status = await gather(js)          # a plain dict (the --json output)
    Console().print(render(status))    # tables for people

Everything comes from the buckets and streams the processes already keep (runtime.nats): hosts from their
heartbeats in ``hosts``, who serves which partition of which bundle from ``leases`` (hosts serving
different bundles each hold their own bundles' share of a partition: `runtime.host.leases`), workers from
``workers``, queue depths from stream and consumer state, runs in flight from the ``active`` bucket (one key
per unfinished run, by partition). Nothing here asks a host or a worker anything, so it works with any
number of them, on any machines, and with none.

A partition is unserved while some bundle a live host serves (or that holds a lease) has no holder for it;
``unserved_agents`` counts the tasks waiting in TASKS for a bundle no live host serves (they wait for one,
`runtime.host.unserved`).

Queue depths, per partition and in all:
* tasks held = delivered to a host, in its mailbox or running, not yet acknowledged: the ``num_ack_pending``
  of the partition's consumers (one per bundle served there). Tasks waiting = the rest of the partition's
  messages in TASKS (the stream's per-subject counts; a WorkQueue stream keeps a message until it is
  acknowledged): not yet delivered, because hosts are at their back-pressure bound or no host serves the
  task's bundle;
* results waiting / held = the same for RESULTS and the partitions' result consumers;
* tool jobs = the ``workers`` consumer's pending and ack-pending (held by workers); DLQ = dead letters.
"""

from __future__ import annotations

import time
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from runtime.client.terminal import shown
from runtime.nats.kv import fleet_kv, kv_entries
from runtime.nats.records import HostBeat, WorkerBeat
from runtime.nats.subjects import (
    ACTIVE_BUCKET,
    DLQ,
    HOSTS_BUCKET,
    LEASES_BUCKET,
    RESULTS,
    TASKS,
    TOOLS,
    WORKERS_BUCKET,
    WORKERS_CONSUMER,
    parse_lease_key,
    stored_bundle,
)
from runtime.nats.topology import consumer_infos, read_topology


async def gather(js: JetStreamContext) -> dict[str, Any]:
    """One consistent-enough picture of the fleet (each part is read once, in sequence)."""
    now = time.time()
    topo = await read_topology(js)
    n = topo.partitions
    buckets = {name: await fleet_kv(js, name) for name in
               (LEASES_BUCKET, HOSTS_BUCKET, WORKERS_BUCKET, ACTIVE_BUCKET)}

    holders: dict[tuple[str, int], str] = {}  # (bundle, partition) -> the host holding its lease
    for key, entry in (await kv_entries(buckets[LEASES_BUCKET])).items():
        slot = parse_lease_key(key)
        if slot is not None and slot[1] < n:
            holders[slot] = entry.value.decode()
    hosts = []
    served: set[str] = set()
    for key, entry in sorted((await kv_entries(buckets[HOSTS_BUCKET])).items()):
        beat = HostBeat.decode(entry.value)
        served.update(beat.agents)
        leases: dict[str, list[int]] = {}  # the leases, not the beat's copy
        for (bundle, p), holder in sorted(holders.items()):
            if holder == key:
                leases.setdefault(bundle, []).append(p)
        hosts.append({"id": key, "partitions": sorted({p for ps in leases.values() for p in ps}),
                      "leases": leases, "runs": beat.runs, "queued": beat.queued, "max_runs": beat.max_runs,
                      "agents": beat.agents, "lease_ttl": beat.ttl, "up_s": round(now - beat.started, 1),
                      "beat_age_s": _age(now, entry)})
    bundles = sorted(served | {bundle for bundle, _ in holders})
    in_flight = [0] * n
    for key in await kv_entries(buckets[ACTIVE_BUCKET]):
        digits = key.split(".", 1)[0][1:]
        if digits.isdigit() and int(digits) < n:
            in_flight[int(digits)] += 1

    partitions = []
    task_queues = await _partition_queues(js, TASKS, n)
    result_queues = await _partition_queues(js, RESULTS, n)
    for p, (tasks, results) in enumerate(zip(task_queues, result_queues, strict=True)):
        by_bundle = {bundle: holders.get((bundle, p)) for bundle in bundles}
        held_by = sorted({h for h in by_bundle.values() if h is not None})
        partitions.append({"partition": p, "host": ", ".join(held_by) or None, "hosts": by_bundle,
                           "runs_in_flight": in_flight[p],
                           "tasks_pending": tasks["pending"], "tasks_held": tasks["ack_pending"],
                           "results_pending": results["pending"], "results_held": results["ack_pending"]})

    workers = []
    for _, entry in sorted((await kv_entries(buckets[WORKERS_BUCKET])).items()):
        wbeat = WorkerBeat.decode(entry.value)
        workers.append({"name": wbeat.name, "concurrency": wbeat.concurrency, "running": wbeat.running,
                        "completed": wbeat.completed, "failed": wbeat.failed, "tools": wbeat.tools,
                        "up_s": round(now - wbeat.started, 1), "beat_age_s": _age(now, entry)})

    streams = {name: await _messages(js, name) for name in (TASKS, TOOLS, RESULTS, DLQ)}
    tools = await _consumer(js, TOOLS, WORKERS_CONSUMER) or {"pending": streams[TOOLS],
                                                                     "ack_pending": 0}
    return {
        "partitions_total": n,
        "replicas": topo.replicas,
        "hosts": hosts,
        "partitions": partitions,
        "unserved_partitions": [p for p in range(n)
                                if not bundles or any((b, p) not in holders for b in bundles)],
        "unserved_agents": await _unserved_agents(js, served),
        "workers": workers,
        "queues": {
            "tasks_pending": sum(p["tasks_pending"] for p in partitions),
            "tasks_held": sum(p["tasks_held"] for p in partitions),
            "results_pending": sum(p["results_pending"] for p in partitions),
            "results_held": sum(p["results_held"] for p in partitions),
            "tool_jobs_pending": tools["pending"],
            "tool_jobs_held": tools["ack_pending"],
            "dlq": streams[DLQ],
            "stream_messages": streams,
        },
        "runs_in_flight": sum(in_flight),
    }


def _age(now: float, entry: Any) -> float | None:
    created = getattr(entry, "created", None)
    if created is None:
        return None
    ts = created.timestamp() if hasattr(created, "timestamp") else float(created)
    return round(max(0.0, now - ts), 1)


async def _consumer(js: JetStreamContext, stream: str, name: str) -> dict[str, int] | None:
    """A consumer's undelivered and delivered-unacknowledged counts; None if it does not exist."""
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:
        return None
    return {"pending": info.num_pending or 0, "ack_pending": info.num_ack_pending or 0}


async def _partition_queues(js: JetStreamContext, stream: str, n: int) -> list[dict[str, int]]:
    """Per partition of `stream`: messages delivered but not yet acknowledged (`ack_pending`, summed over
    the partition's consumers, one per bundle served there) and the rest of its messages in the stream
    (`pending`: not yet delivered to anyone)."""
    in_stream = await _messages_by_partition(js, stream, n)
    held = [0] * n
    try:
        consumers = await consumer_infos(js, stream)
    except NotFoundError:
        consumers = []
    for info in consumers:
        p = _partition_of_consumer(info)
        if p is not None and p < n:
            held[p] += info.num_ack_pending or 0
    return [{"pending": max(0, in_stream[p] - held[p]), "ack_pending": held[p]} for p in range(n)]


def _partition_of_consumer(info: Any) -> int | None:
    """The partition a host's consumer reads (the second token of its filters), None for any other."""
    config = info.config
    filters = config.filter_subjects or ([config.filter_subject] if config.filter_subject else [])
    tokens = filters[0].split(".") if filters else []
    return int(tokens[1]) if len(tokens) > 1 and tokens[1].isdigit() else None


async def _unserved_agents(js: JetStreamContext, served: set[str]) -> dict[str, int]:
    """Bundle -> tasks and commands waiting in TASKS for it while no live host serves it."""
    out: dict[str, int] = {}
    try:
        info = await js.stream_info(TASKS, subjects_filter="tasks.>")
    except NotFoundError:
        return out
    for subject, count in (info.state.subjects or {}).items():
        bundle = stored_bundle(subject)
        if bundle is not None and bundle not in served:
            out[bundle] = out.get(bundle, 0) + count
    return dict(sorted(out.items()))


async def _messages_by_partition(js: JetStreamContext, stream: str, n: int) -> list[int]:
    """Messages stored in TASKS or RESULTS per partition (their subjects are `<prefix>.<partition>.…`),
    from the stream's per-subject counts."""
    counts = [0] * n
    prefix = "tasks" if stream == TASKS else "results"
    try:
        info = await js.stream_info(stream, subjects_filter=f"{prefix}.>")
    except NotFoundError:
        return counts
    for subject, count in (info.state.subjects or {}).items():
        token = subject.split(".")[1] if subject.count(".") >= 2 else ""
        if token.isdigit() and int(token) < n:
            counts[int(token)] += count
    return counts


async def _messages(js: JetStreamContext, stream: str) -> int:
    try:
        return (await js.stream_info(stream)).state.messages
    except NotFoundError:
        return 0


def render(status: dict[str, Any]) -> Any:
    """Rich tables: hosts, partitions, workers, queues. Names read from NATS (hosts, workers, agents) are
    `shown` cells: as they are, never read as rich markup nor obeyed by the terminal."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def row(table: Table, *cells: Any) -> None:
        table.add_row(*(c if isinstance(c, Text) else shown(c) for c in cells))

    q = status["queues"]
    head = Table.grid(padding=(0, 2))
    row(head, "partitions", f"{status['partitions_total']} (R{status['replicas']})",
        "runs in flight", status["runs_in_flight"])
    unserved = status["unserved_partitions"]
    row(head, "hosts", len(status["hosts"]), "unserved partitions",
        Text(str(unserved), "red") if unserved else "none")
    waiting = status.get("unserved_agents") or {}
    if waiting:
        row(head, "", "", "tasks for agents no host serves",
            Text(", ".join(f"{b}: {c}" for b, c in waiting.items()), "red"))
    row(head, "workers", len(status["workers"]), "dead letters", q["dlq"])

    hosts = Table(title="hosts", title_justify="left")
    for col in ("host", "partitions", "runs", "queued", "bound", "agents", "up", "beat"):
        hosts.add_column(col)
    for h in status["hosts"]:
        leases = h.get("leases") or {}
        held = (partition_ranges(h["partitions"]) if len(leases) <= 1 else
                "; ".join(f"{b}: {partition_ranges(ps)}" for b, ps in leases.items()))
        row(hosts, h["id"], held, h["runs"], h["queued"], h["max_runs"], ", ".join(h["agents"]),
            f"{h['up_s']:.0f}s", _secs(h["beat_age_s"]))

    parts = Table(title="partitions", title_justify="left")
    for col in ("p", "host", "runs in flight", "tasks (waiting/held)", "results (waiting/held)"):
        parts.add_column(col)
    for p in status["partitions"]:
        by_bundle = p.get("hosts") or {}
        who: Any = (p["host"] or Text("unserved", "red")) if len(by_bundle) <= 1 else \
            Text("; ".join(f"{b}: {h or 'unserved'}" for b, h in by_bundle.items()),
                 "red" if not all(by_bundle.values()) else "")
        row(parts, p["partition"], who, p["runs_in_flight"], f"{p['tasks_pending']}/{p['tasks_held']}",
            f"{p['results_pending']}/{p['results_held']}")

    workers = Table(title="workers", title_justify="left")
    for col in ("worker", "concurrency", "holding", "completed", "failed", "up", "beat"):
        workers.add_column(col)
    for w in status["workers"]:
        row(workers, w["name"], w["concurrency"], w["running"], w["completed"], w["failed"],
            f"{w['up_s']:.0f}s", _secs(w["beat_age_s"]))

    queues = Table(title="queues", title_justify="left")
    for col in ("queue", "waiting", "held by a process"):
        queues.add_column(col)
    row(queues, "tasks (TASKS)", q["tasks_pending"], q["tasks_held"])
    row(queues, "tool jobs (TOOLS)", q["tool_jobs_pending"], q["tool_jobs_held"])
    row(queues, "tool results (RESULTS)", q["results_pending"], q["results_held"])
    row(queues, "dead letters (DLQ)", q["dlq"], "")
    return Group(head, hosts, parts, workers, queues)


def _secs(value: float | None) -> str:
    return "" if value is None else f"{value:.1f}s ago"


def partition_ranges(ps: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    spans: list[list[int]] = []
    for p in sorted(ps):
        if spans and spans[-1][1] == p - 1:
            spans[-1][1] = p
        else:
            spans.append([p, p])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans) or "-"


__all__ = ["gather", "partition_ranges", "render"]
