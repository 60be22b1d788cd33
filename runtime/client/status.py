"""What the fleet is doing, read from NATS alone: `sa status [--json]`.

    status = await gather(js)          # a plain dict (the --json output)
    Console().print(render(status))    # tables for people

Everything comes from the buckets and streams the processes already keep (runtime.nats): hosts from their
heartbeats in ``hosts``, who serves which partition from ``leases``, workers from ``workers``, queue
depths from stream and consumer state, runs in flight from the ``active`` bucket (one key per unfinished
run, by partition). Nothing here asks a host or a worker anything, so it works with any number of them,
on any machines, and with none.

Queue depths, per partition and in all:
* tasks waiting = in TASKS, not yet delivered to any host: the partition consumer's ``num_pending`` (this
  grows when hosts are at their back-pressure bound); a partition no host has served yet has no consumer,
  so every message of it in the stream is waiting (counted from the stream's per-subject counts).
  Tasks held = ``num_ack_pending``: delivered, in a host's mailbox or running, not yet acknowledged;
* results waiting / held = the same for RESULTS and the partition's result consumer;
* tool jobs = the ``workers`` consumer's pending and ack-pending (held by workers); DLQ = dead letters.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from runtime import nats as bus


async def gather(js: JetStreamContext) -> dict[str, Any]:
    """One consistent-enough picture of the fleet (each part is read once, in sequence)."""
    now = time.time()
    topo = await bus.read_topology(js)
    n = topo.partitions
    buckets = {name: await bus.fleet_kv(js, name) for name in
               (bus.LEASES_BUCKET, bus.HOSTS_BUCKET, bus.WORKERS_BUCKET, bus.ACTIVE_BUCKET)}

    holders = {}
    for key, entry in (await bus.kv_entries(buckets[bus.LEASES_BUCKET])).items():
        if key.startswith("p") and key[1:].isdigit():
            holders[int(key[1:])] = entry.value.decode()
    hosts = []
    for key, entry in sorted((await bus.kv_entries(buckets[bus.HOSTS_BUCKET])).items()):
        beat = bus.HostBeat.decode(entry.value)
        held = sorted(p for p, holder in holders.items() if holder == key)  # the leases, not the beat's copy
        hosts.append({"id": key, "partitions": held, "runs": beat.runs, "queued": beat.queued,
                      "max_runs": beat.max_runs, "agents": beat.agents, "lease_ttl": beat.ttl,
                      "up_s": round(now - beat.started, 1), "beat_age_s": _age(now, entry)})
    in_flight = [0] * n
    for key in await bus.kv_entries(buckets[bus.ACTIVE_BUCKET]):
        digits = key.split(".", 1)[0][1:]
        if digits.isdigit() and int(digits) < n:
            in_flight[int(digits)] += 1

    partitions = []
    task_queues = await _partition_queues(js, bus.TASKS, bus.task_consumer_name, n)
    result_queues = await _partition_queues(js, bus.RESULTS, bus.result_consumer_name, n)
    for p, (tasks, results) in enumerate(zip(task_queues, result_queues, strict=True)):
        partitions.append({"partition": p, "host": holders.get(p), "runs_in_flight": in_flight[p],
                           "tasks_pending": tasks["pending"], "tasks_held": tasks["ack_pending"],
                           "results_pending": results["pending"], "results_held": results["ack_pending"]})

    workers = []
    for _, entry in sorted((await bus.kv_entries(buckets[bus.WORKERS_BUCKET])).items()):
        wbeat = bus.WorkerBeat.decode(entry.value)
        workers.append({"name": wbeat.name, "concurrency": wbeat.concurrency, "running": wbeat.running,
                        "completed": wbeat.completed, "failed": wbeat.failed, "tools": wbeat.tools,
                        "up_s": round(now - wbeat.started, 1), "beat_age_s": _age(now, entry)})

    streams = {name: await _messages(js, name) for name in (bus.TASKS, bus.TOOLS, bus.RESULTS, bus.DLQ)}
    tools = await _consumer(js, bus.TOOLS, bus.WORKERS_CONSUMER) or {"pending": streams[bus.TOOLS],
                                                                     "ack_pending": 0}
    return {
        "partitions_total": n,
        "replicas": topo.replicas,
        "hosts": hosts,
        "partitions": partitions,
        "unserved_partitions": [p for p in range(n) if p not in holders],
        "workers": workers,
        "queues": {
            "tasks_pending": sum(p["tasks_pending"] for p in partitions),
            "tasks_held": sum(p["tasks_held"] for p in partitions),
            "results_pending": sum(p["results_pending"] for p in partitions),
            "results_held": sum(p["results_held"] for p in partitions),
            "tool_jobs_pending": tools["pending"],
            "tool_jobs_held": tools["ack_pending"],
            "dlq": streams[bus.DLQ],
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
    """A partition consumer's undelivered and delivered-unacknowledged counts; None if it does not exist."""
    try:
        info = await js.consumer_info(stream, name)
    except NotFoundError:  # a partition no host has served yet
        return None
    return {"pending": info.num_pending or 0, "ack_pending": info.num_ack_pending or 0}


async def _partition_queues(js: JetStreamContext, stream: str, consumer_name: Callable[[int], str],
                            n: int) -> list[dict[str, int]]:
    """Per partition of `stream`: messages not yet delivered (`pending`) and delivered but not yet
    acknowledged (`ack_pending`). A partition without its consumer was never delivered from: all of its
    messages in the stream are pending."""
    found = [await _consumer(js, stream, consumer_name(p)) for p in range(n)]
    if all(c is not None for c in found):
        return [c for c in found if c is not None]
    in_stream = await _messages_by_partition(js, stream, n)
    return [c if c is not None else {"pending": in_stream[p], "ack_pending": 0} for p, c in enumerate(found)]


async def _messages_by_partition(js: JetStreamContext, stream: str, n: int) -> list[int]:
    """Messages stored in TASKS or RESULTS per partition (their subjects are `<prefix>.<partition>.…`),
    from the stream's per-subject counts."""
    counts = [0] * n
    prefix = "tasks" if stream == bus.TASKS else "results"
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
    `Text` cells, shown as they are, never read as rich markup."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    def row(table: Table, *cells: Any) -> None:
        table.add_row(*(c if isinstance(c, Text) else Text(str(c)) for c in cells))

    q = status["queues"]
    head = Table.grid(padding=(0, 2))
    row(head, "partitions", f"{status['partitions_total']} (R{status['replicas']})",
        "runs in flight", status["runs_in_flight"])
    unserved = status["unserved_partitions"]
    row(head, "hosts", len(status["hosts"]), "unserved partitions",
        Text(str(unserved), "red") if unserved else "none")
    row(head, "workers", len(status["workers"]), "dead letters", q["dlq"])

    hosts = Table(title="hosts", title_justify="left")
    for col in ("host", "partitions", "runs", "queued", "bound", "agents", "up", "beat"):
        hosts.add_column(col)
    for h in status["hosts"]:
        row(hosts, h["id"], partition_ranges(h["partitions"]), h["runs"], h["queued"], h["max_runs"],
            ", ".join(h["agents"]), f"{h['up_s']:.0f}s", _secs(h["beat_age_s"]))

    parts = Table(title="partitions", title_justify="left")
    for col in ("p", "host", "runs in flight", "tasks (waiting/held)", "results (waiting/held)"):
        parts.add_column(col)
    for p in status["partitions"]:
        row(parts, p["partition"], p["host"] or Text("unserved", "red"), p["runs_in_flight"],
            f"{p['tasks_pending']}/{p['tasks_held']}", f"{p['results_pending']}/{p['results_held']}")

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
