"""NATS / JetStream for the runtime: every name, the streams and buckets, consumers, and the server itself.

- `subjects`    every subject, filter, Msg-Id, header, stream, bucket and consumer name; `ENV_VARS` (pure)
- `records`     what the KV buckets hold: `RunIndex`, `HostBeat`, `WorkerBeat` (pure)
- `connection`  `connect` (reconnecting forever) and `close`
- `jetstream`   `jetstream_for(nc)`: the JetStream context with the leaner acked publish
- `topology`    the streams and consumers: `ensure_topology`, `read_topology`, `attach_topology`
- `kv`          opening buckets, `put_kv` with a per-key TTL, `kv_entries` (exact listing), the payload store
- `pull`        `consume` (a continuous pull: hosts, workers), `Budget`, `fetch_batch` (a batch at a time)
- `retry`       `retrying`: the one way to retry until NATS answers
- `server`      the `nats-server` binary, its process supervisor, `EmbeddedNats`
- `cluster`     `LocalCluster`: a 3-node cluster on loopback from deploy/nats/nats.conf

The pure names (`subjects`, `records`) are imported here at once; the others load on first use, so a module
that only needs names (`runtime.jobs`, `runtime.commands`) never loads nats-py.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from runtime.nats.records import HostBeat, RunIndex, WorkerBeat
from runtime.nats.subjects import (
    ACTIVE_BUCKET,
    ACTIVE_PURGE_TTL_S,
    APPLIED_BUCKET,
    APPLIED_TTL_S,
    DEFAULT_PARTITIONS,
    DEFAULT_TOOL_ACK_WAIT_S,
    DEFAULT_TOOL_MAX_ACK_PENDING,
    DEFAULT_TOOL_MAX_DELIVER,
    DLQ,
    DUPLICATE_WINDOW_S,
    ENV_REPLICAS,
    ENV_VARS,
    ERR_WRONG_LAST_SEQUENCE,
    EVENTS,
    HDR_EXPECTED_SUBJECT_SEQ,
    HDR_EXPECTED_SUBJECT_SEQ_SUBJECT,
    HDR_MSG_ID,
    HOSTS_BUCKET,
    LEASES_BUCKET,
    PAYLOADS_BUCKET,
    RESULTS,
    RUNS_BUCKET,
    TASKS,
    TOOLS,
    WORKERS_BUCKET,
    WORKERS_CONSUMER,
    active_filter,
    active_key,
    agent_of_task_subject,
    bundle_of_slug,
    bundle_result_filters,
    bundle_slug,
    bundle_task_filters,
    bundle_token,
    check_token,
    dlq_subject,
    event_subject,
    job_msg_id,
    lease_key,
    occ_headers,
    parse_lease_key,
    partition_of,
    result_consumer_name,
    result_filter,
    result_subject,
    run_events_filter,
    stored_bundle,
    task_consumer_name,
    task_filter,
    task_subject,
    tool_subject,
    unserved_task_filters,
    workspace_bucket,
)

if TYPE_CHECKING:
    from runtime.nats.cluster import LocalCluster
    from runtime.nats.connection import close, connect, servers_from_env
    from runtime.nats.jetstream import JetStream, jetstream_for
    from runtime.nats.kv import (
        KV_MAX_CONSUMERS,
        KvEntry,
        applied_kv,
        fleet_kv,
        kv_entries,
        payloads_store,
        put_kv,
        runs_kv,
        workspace_kv,
    )
    from runtime.nats.pull import Budget, consume, fetch_batch
    from runtime.nats.retry import backoff, retrying
    from runtime.nats.server import EmbeddedNats, default_store_dir, find_nats_server
    from runtime.nats.topology import (
        Topology,
        attach_topology,
        consumer_infos,
        ensure_consumer,
        ensure_partition_consumers,
        ensure_topology,
        ensure_transforms,
        read_partitions,
        read_topology,
        stream_configs,
        topology_replicas,
        workers_consumer_config,
    )

# the names that load their module on first use (`__getattr__`)
_LAZY: dict[str, str] = {name: module for module, names in {
    "cluster": "LocalCluster",
    "connection": "close connect servers_from_env",
    "jetstream": "JetStream jetstream_for",
    "kv": "KV_MAX_CONSUMERS KvEntry applied_kv fleet_kv kv_entries payloads_store put_kv runs_kv "
          "workspace_kv",
    "pull": "Budget consume fetch_batch",
    "retry": "backoff retrying",
    "server": "EmbeddedNats default_store_dir find_nats_server",
    "topology": "Topology attach_topology consumer_infos ensure_consumer ensure_partition_consumers "
                "ensure_topology ensure_transforms read_partitions read_topology stream_configs "
                "topology_replicas workers_consumer_config",
}.items() for name in names.split()}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ACTIVE_BUCKET", "ACTIVE_PURGE_TTL_S", "APPLIED_BUCKET", "APPLIED_TTL_S", "DEFAULT_PARTITIONS",
    "DEFAULT_TOOL_ACK_WAIT_S", "DEFAULT_TOOL_MAX_ACK_PENDING", "DEFAULT_TOOL_MAX_DELIVER", "DLQ",
    "DUPLICATE_WINDOW_S", "ENV_REPLICAS", "ENV_VARS", "ERR_WRONG_LAST_SEQUENCE", "EVENTS",
    "HDR_EXPECTED_SUBJECT_SEQ", "HDR_EXPECTED_SUBJECT_SEQ_SUBJECT", "HDR_MSG_ID", "HOSTS_BUCKET",
    "KV_MAX_CONSUMERS", "LEASES_BUCKET", "PAYLOADS_BUCKET", "RESULTS", "RUNS_BUCKET", "TASKS", "TOOLS",
    "WORKERS_BUCKET", "WORKERS_CONSUMER", "Budget", "EmbeddedNats", "HostBeat", "JetStream", "KvEntry",
    "LocalCluster", "RunIndex", "Topology", "WorkerBeat", "active_filter", "active_key",
    "agent_of_task_subject", "applied_kv", "attach_topology", "backoff", "bundle_of_slug",
    "bundle_result_filters", "bundle_slug", "bundle_task_filters", "bundle_token", "check_token", "close",
    "connect", "consume", "consumer_infos", "default_store_dir", "dlq_subject", "ensure_consumer",
    "ensure_partition_consumers", "ensure_topology", "ensure_transforms", "event_subject", "fetch_batch",
    "find_nats_server", "fleet_kv", "jetstream_for", "job_msg_id", "kv_entries", "lease_key", "occ_headers",
    "parse_lease_key", "partition_of", "payloads_store", "put_kv", "read_partitions", "read_topology",
    "result_consumer_name", "result_filter", "result_subject", "retrying", "run_events_filter", "runs_kv",
    "servers_from_env", "stored_bundle", "stream_configs", "task_consumer_name", "task_filter",
    "task_subject", "tool_subject", "topology_replicas", "unserved_task_filters", "workers_consumer_config",
    "workspace_bucket", "workspace_kv",
]
