"""Every NATS name the runtime uses: subjects, filters, Msg-Ids, headers, stream, bucket and consumer names.

Why a module of its own: the host, the workers, replay and the CLI must agree on one set of names, and none
of them may hand-build a subject string. It is pure (no nats-py, no I/O), so the wire-format modules
(`runtime.jobs`, `runtime.commands`) import it without loading a NATS client.

Subjects and streams (`runtime.nats.topology` creates them)
----------------------------------------------------------
=========  ====================================  =========  ==================================================
stream     subjects (as stored)                  retention  purpose
=========  ====================================  =========  ==================================================
TASKS      published: ``agents.<agent>.tasks``   WorkQueue  tasks, and operators' commands (cancel, approve,
           and ``ops.<agent>.<operator>``                   deny). One subject transform, ``*.*.*`` ->
           stored: ``tasks.<p>.<agent>.agents.tasks``       ``tasks.{{partition(N,2)}}.<agent>.<t1>.<t3>``
           ``.<bundle>[.<instance>]`` and                   ``.{{split(2,:)}}``, stores both under the
           ``tasks.<p>.<agent>.ops.<operator>``             agent's partition, so a run's commands reach the
           ``.<bundle>[.<instance>]``                       host serving it, in order with its task. The
                                                            tail repeats the agent split at ``:``, so its
                                                            bundle is a token of its own: a host consumes
                                                            one partition of one bundle it serves
                                                            (`bundle_task_filters(p, bundle)`), never a task
                                                            of a bundle it does not serve. The operator
                                                            token is who sent the command: NATS
                                                            permissions let each operator publish only on
                                                            its own (`runtime.nats.auth`). Publishers set
                                                            ``Nats-Msg-Id`` = task id: the same task
                                                            published twice is stored once.
EVENTS     ``events.<actor>.<run>.<kind...>``    Limits     the append-only event log. ``<kind>`` is the
                                                            event kind with its dots kept as tokens
                                                            (``tool.completed`` -> ``<run>.tool.completed``)
                                                            so ``events.*.*.tool.>`` filters a family. The
                                                            host is the only writer of a run: each append
                                                            carries ``Nats-Expected-Last-Subject-Sequence``
                                                            plus ``...-Subject: events.<actor>.<run>.>``
                                                            (`occ_headers`) and a Msg-Id. Bounded by
                                                            age, 90 days by default
                                                            (`runtime.nats.retention`).
TOOLS      ``tools.<tool>``                      WorkQueue  tool jobs (`ToolJob`, Msg-Id ``<run>/<call>``),
                                                            one shared durable pull consumer ``workers``.
RESULTS    ``results.<p>.<actor>.<run>``         WorkQueue  tool outcomes (`ToolOutcome`, Msg-Id
           stored with ``.<bundle>[.<instance>]``           ``<run>/<call>``) published by workers; stored
           appended                                         with the actor split at ``:`` appended (the same
                                                            transform as TASKS), so the host holding
                                                            partition ``p`` of the run's bundle consumes
                                                            `bundle_result_filters(p, bundle)` and appends
                                                            the script.* and tool.* events itself. Workers
                                                            never write EVENTS: one writer per run keeps
                                                            the sequence contiguous.
DLQ        ``dlq.<original subject>``            Limits     dead letters: malformed jobs and jobs whose
                                                            deliveries ran out (`runtime.worker.dlq`).
SCHEDULES  ``schedules.def.<name>``,             WorkQueue  the cluster's clock (`runtime.schedules`; message
           ``schedules.fire.<name>``,                       schedules, ADR-51): a schedule's message on
           ``schedules.timer.<timer>``,                     ``def`` (or a run's timer wake-up on ``timer``)
           ``schedules.wake.<timer>``                       is republished by the server on ``fire`` (or
                                                            ``wake``) at its instants; the hosts' shared
                                                            ``scheduler`` consumer turns each into a task
                                                            (or a wake command) and acks it.
=========  ====================================  =========  ==================================================

Core NATS subjects (never stored): ``stream.<actor>.<run>`` (a run's live model output, `stream_subject`),
``stream.<actor>.<run>.script`` (a job of the run still running, `script_subject`), ``handoffs.<worker
key>`` (a worker offering a tool-job delivery to one that has the job's tool version, `handoff_subject`) and
``starter.<actor>.follow`` / ``.cancel`` (a run's starter asking the hosts about it with the run's key: the
names and the format are `runtime.nats.starter`'s).

Buckets (`runtime.nats.kv` opens them and says what each holds): KV ``runs`` (the run index), KV
``ws_<workspace>`` per workspace (`workspace_bucket`), KV ``applied`` (applied workspace writes), the fleet
buckets ``leases`` (`lease_key`: one per partition of each bundle served), ``hosts``, ``workers``,
``active`` (`active_key`, `active_filter`) and ``attempts`` (why a tool job's earlier deliveries ended),
and the object store ``payloads``.

Partitions. ``<p>`` is ``fnv32a(agent) % N``, exactly NATS's ``partition(N,1)``; `partition_of()` computes the
same number client-side (verified against the server in tests), e.g. for the ``runs`` index or for a worker.
The agent is the whole actor (``bundle:instance``), so one bundle's instances spread over every partition.

Bundles. Hosts that serve different bundles share the streams: what a host holds is a *slot*, one partition
of one bundle (a lease `lease_key(p, bundle)`, a task consumer `task_consumer_name(p, bundle)` filtering
`bundle_task_filters(p, bundle)`, a result consumer likewise). Filters of different bundles never overlap,
as a WorkQueue stream requires of its consumers; a bundle name that is not a plain word is spelled with
`bundle_slug` in keys and consumer names.

Tokens. Agent ids, run ids and tool names are single subject tokens: `check_token` rejects ``.``, ``*``,
``>`` and whitespace with a message that says so. One bundle serving many instances can address them as
``<bundle>:<instance>`` (``:`` is a legal token character) if instances need their own subject.

"""

from __future__ import annotations

import base64
import functools

# -- streams, buckets, consumers --------------------------------------------------------------------------

TASKS = "TASKS"
EVENTS = "EVENTS"
TOOLS = "TOOLS"
RESULTS = "RESULTS"
DLQ = "DLQ"
SCHEDULES = "SCHEDULES"
SCHEDULER_CONSUMER = "scheduler"  # the hosts' shared consumer of fires and wake-ups (runtime.host.scheduler)
SCHEDULE_OPERATOR = "scheduler"  # the operator token a wake command travels under (``ops.<actor>.scheduler``)
RUNS_BUCKET = "runs"
APPLIED_BUCKET = "applied"
APPLIED_TTL_S = 86_400.0  # far beyond MaxDeliver x AckWait: every redelivery of a job finds its marker
PAYLOADS_BUCKET = "payloads"
LEASES_BUCKET = "leases"
HOSTS_BUCKET = "hosts"
WORKERS_BUCKET = "workers"
ACTIVE_BUCKET = "active"
THREADS_BUCKET = "threads"  # conversations: actor + thread -> its runs in order (`runtime.log.threads`)
STREAM_PREFIX = "stream"  # a run's live model output on core NATS: stream.<actor>.<run>
ATTEMPTS_BUCKET = "attempts"  # why a tool job's earlier deliveries ended (`runtime.worker.attempts`)
ACTIVE_PURGE_TTL_S = 60.0  # a purge marker of `active` only needs to outlive a takeover's scan
WORKERS_CONSUMER = "workers"
SUBRUNS_CONSUMER = "subruns"  # the EVENTS consumer of run ends, for agent tools (`runtime.worker.subruns`)
COMMANDS_PREFIX = "ops"  # operators' commands: ops.<agent>.<operator> (`command_subject`)
HANDOFFS_PREFIX = "handoffs"  # tool-job deliveries offered to one worker, core NATS: handoffs.<worker key>
ANONYMOUS = "anonymous"  # the operator name of a connection that authenticated as nobody

DEFAULT_PARTITIONS = 16
DUPLICATE_WINDOW_S = 300.0  # ≥ 2 min: covers a restarted publisher retrying with the same Msg-Id
DEFAULT_TOOL_ACK_WAIT_S = 3.0  # workers heartbeat held jobs every AckWait/4 (`runtime.worker.attempts`)
DEFAULT_TOOL_MAX_DELIVER = 5
DEFAULT_TOOL_MAX_ACK_PENDING = 1024

# -- headers and error codes ------------------------------------------------------------------------------

HDR_MSG_ID = "Nats-Msg-Id"
# on every event a host appends: the id of the host that wrote it (who drove the run then, for `sa audit`
# and fault tests; the fencing itself is the expected sequence, never this header)
HDR_WRITER = "Sa-Writer"
HDR_TASK_SEQ = "Sa-Task-Seq"  # where a task with no id was first stored, on a host's copy (`host.routing`)
HDR_EXPECTED_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
HDR_EXPECTED_SUBJECT_SEQ_SUBJECT = "Nats-Expected-Last-Subject-Sequence-Subject"
ERR_WRONG_LAST_SEQUENCE = 10071  # the JetStream err_code of a failed expected-sequence check
# the same refusal without the number: what a clustered stream answers when the check fails as the write is
# proposed (seen after an EVENTS leader was cut off mid-append); every check must take both
ERR_WRONG_LAST_SEQUENCE_CONSTANT = 10164
WRONG_LAST_SEQUENCE = (ERR_WRONG_LAST_SEQUENCE, ERR_WRONG_LAST_SEQUENCE_CONSTANT)
# Atomic batch publish (streams with `allow_atomic`): every message of a batch carries the batch id and its
# 1-based position; the last one also carries the commit marker, and only its reply is a publish ack.
HDR_BATCH_ID = "Nats-Batch-Id"
HDR_BATCH_SEQ = "Nats-Batch-Sequence"
HDR_BATCH_COMMIT = "Nats-Batch-Commit"
# The W3C trace context a publisher may send with a task, as headers or in its metadata: the host records it
# in `run.started`, and the run's trace becomes a child of the publisher's span (`runtime.observe.traces`).
TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
BATCH_MAX_MESSAGES = 1000  # the server's cap on messages in one atomic batch
ERR_ATOMIC_DISABLED = 10174  # "atomic publish is disabled": the stream lacks `allow_atomic`
ERR_BATCH_DUPLICATE_MSG_ID = 10201  # a batch message's Msg-Id is stored already: the batch landed before

_BAD_TOKEN_CHARS = frozenset(".*> \t\r\n")

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


# -- subjects and filters ---------------------------------------------------------------------------------


def task_subject(agent: str) -> str:
    """Where any NATS client publishes a task for `agent` (the stream rewrites it on store)."""
    return f"agents.{check_token(agent, 'agent')}.tasks"


def subtask_subject(agent: str) -> str:
    """Where a tool worker publishes the task of a sub-run (an agent called as a tool): a subject of its
    own, so the permission to start a child run is not the permission to publish any task."""
    return f"agents.{check_token(agent, 'agent')}.subtasks"


def command_subject(agent: str, operator: str) -> str:
    """Where `operator` publishes a cancel / approve / deny for a run of `agent` (the actor key).

    The operator token is the sender's identity: the host records it as the command's `by`, and a secured
    server lets each operator publish only on ``ops.*.<its own name>`` (`runtime.nats.auth`)."""
    return f"{COMMANDS_PREFIX}.{check_token(agent, 'agent')}.{check_token(operator, 'operator')}"


def task_filter(partition: int) -> str:
    """Every stored subject of one task partition (tasks and commands), whatever their bundle."""
    return f"tasks.{partition}.>"


def bundle_task_filters(partition: int, bundle: str) -> list[str]:
    """The stored subjects of one partition's tasks and commands for actors of `bundle` (the bundle and
    each ``bundle:instance``): the filters of that slot's task consumer. The last one takes messages
    stored before the bundle had a token of its own (``tasks.<p>.<bundle>.<t1>.<t3>``: the bundle's own
    actor only)."""
    b = check_token(bundle, "bundle")
    return [f"tasks.{partition}.*.*.*.{b}", f"tasks.{partition}.*.*.*.{b}.>", f"tasks.{partition}.{b}.*.*"]


def unserved_task_filters(bundle: str) -> list[str]:
    """Every stored task and command of `bundle`'s actors, in any partition (the current form only): how a
    host reads the tasks of a bundle no host serves (`runtime.host.unserved`). It overlaps every slot
    consumer of the bundle, so the server refuses it while any exists, and refuses them while it does."""
    b = check_token(bundle, "bundle")
    return [f"tasks.*.*.*.*.{b}", f"tasks.*.*.*.*.{b}.>"]


def bundle_token(actor: str) -> str:
    """The token TASKS and RESULTS store as the bundle of `actor` (``bundle`` or ``bundle:instance``): the
    first non-empty ``:``-separated piece, as NATS's ``split`` makes it; the slot a message of the actor
    belongs to is this bundle's."""
    return next((piece for piece in actor.split(":") if piece), actor)


def stored_bundle(subject: str) -> str | None:
    """The bundle token of a TASKS or RESULTS subject as stored now (``tasks.<p>.<agent>.<t1>.<t3>.<bundle>
    [...]``, ``results.<p>.<actor>.<run>.<bundle>[...]``); None for a subject stored in an older form."""
    parts = subject.split(".")
    if parts[0] == "tasks" and len(parts) >= 6:
        return parts[5]
    if parts[0] == "results" and len(parts) >= 5:
        return parts[4]
    return None


def _published(subject: str) -> list[str]:
    """The tokens of a TASKS subject in its published form (a stored ``tasks.<p>.<agent>.<t1>.<t3>...`` back
    to ``<t1>.<agent>.<t3>``, whatever follows); any other subject's tokens as they are."""
    parts = subject.split(".")
    return [parts[3], parts[2], parts[4]] if len(parts) >= 5 and parts[0] == "tasks" else parts


def parse_task_subject(subject: str) -> tuple[str, str | None]:
    """(agent, operator) of a TASKS subject, stored or as published; operator is None for a task subject.

    Stored forms: ``tasks.<p>.<agent>.agents.tasks`` (a task; ``.subtasks``: a sub-run's task, see
    `subtask_subject`), ``tasks.<p>.<agent>.ops.<operator>`` (a command), each followed by the agent's
    bundle and instance tokens since those have their own (`stored_bundle`), and ``tasks.<p>.<agent>`` (a
    task stored before commands had their own subject). Published
    forms: ``agents.<agent>.tasks`` and ``ops.<agent>.<operator>``."""
    parts = _published(subject)
    if len(parts) == 3 and parts[0] == "tasks":
        return parts[2], None
    if len(parts) == 3 and parts[0] == "agents" and parts[2] in ("tasks", "subtasks"):
        return parts[1], None
    if len(parts) == 3 and parts[0] == COMMANDS_PREFIX:
        return parts[1], parts[2]
    raise ValueError(f"not a task subject: {subject!r}")


def is_subtask_subject(subject: str) -> bool:
    """True for a sub-run's task subject (`subtask_subject`), stored or as published."""
    parts = _published(subject)
    return len(parts) == 3 and parts[0] == "agents" and parts[2] == "subtasks"


def agent_of_task_subject(subject: str) -> str:
    """The agent token of a TASKS subject, stored or published (see `parse_task_subject`)."""
    return parse_task_subject(subject)[0]


@functools.lru_cache(maxsize=8192)  # a host appends ~8 events a turn to runs it holds: checked once each
def event_subject(actor: str, run: str, kind: str) -> str:
    """The subject of one event of `run`; the kind's dots stay tokens (`tool.completed`)."""
    for token in kind.split("."):
        check_token(token, "event kind")
    return f"events.{check_token(actor, 'actor')}.{check_token(run, 'run id')}.{kind}"


@functools.lru_cache(maxsize=4096)
def run_events_filter(actor: str, run: str) -> str:
    """Every event of one run: the replay filter and the OCC wildcard of its appends."""
    return f"events.{check_token(actor, 'actor')}.{check_token(run, 'run id')}.>"


def occ_headers(actor: str, run: str, last_seq: int, msg_id: str, writer: str = "") -> dict[str, str]:
    """Headers for appending to a run whose last stored event has stream sequence `last_seq` (0 = empty).

    A stale second writer gets err_code 10071 (`ERR_WRONG_LAST_SEQUENCE`) and must stop: a run has one
    writer. The Msg-Id makes a retry of an append that did land a no-op. `writer` names the process.
    """
    headers = {
        HDR_MSG_ID: msg_id,
        HDR_EXPECTED_SUBJECT_SEQ: str(last_seq),
        HDR_EXPECTED_SUBJECT_SEQ_SUBJECT: run_events_filter(actor, run),
    }
    if writer:
        headers[HDR_WRITER] = writer
    return headers


def stream_subject(actor: str, run: str) -> str:
    """Where the host publishes a run's model output as it is generated (core NATS, never stored)."""
    return f"{STREAM_PREFIX}.{check_token(actor, 'agent')}.{check_token(run, 'run id')}"


def script_subject(actor: str | None, run: str) -> str:
    """Where a worker tells that a job of `run` is still running (core NATS, never stored; `actor` None: the
    filter of any actor's). Below the run's stream subject, so whoever may follow a run's model output
    (``stream.>``) may follow its scripts too, and a worker may publish these only (``stream.*.*.script``)."""
    return f"{stream_subject(actor, run) if actor else stream_filter(run)}.script"


def handoff_subject(worker_key: str) -> str:
    """Where a worker that lacks a job's tool version offers the delivery to a worker that has it (core
    NATS request/reply: `runtime.worker.handoff`); `worker_key` is the worker's key in the ``workers``
    bucket."""
    return f"{HANDOFFS_PREFIX}.{check_token(worker_key, 'worker key')}"


def stream_filter(run: str) -> str:
    """A run's stream without knowing its actor."""
    return f"{STREAM_PREFIX}.*.{check_token(run, 'run id')}"


def tool_subject(tool: str) -> str:
    """Where tool jobs for `tool` are published."""
    return f"tools.{check_token(tool, 'tool name')}"


def result_subject(partition: int, actor: str, run: str) -> str:
    """Where a worker publishes the outcome of a job of `run` (partition-prefixed for its host)."""
    return f"results.{partition}.{check_token(actor, 'actor')}.{check_token(run, 'run id')}"


def result_filter(partition: int) -> str:
    """All tool outcomes of one partition, whatever their bundle."""
    return f"results.{partition}.>"


def bundle_result_filters(partition: int, bundle: str) -> list[str]:
    """The tool outcomes of one partition's runs of `bundle`'s actors: the filters of that slot's result
    consumer (the last: outcomes stored before the bundle had a token of its own, of the bundle's own
    actor)."""
    b = check_token(bundle, "bundle")
    return [f"results.{partition}.*.*.{b}", f"results.{partition}.*.*.{b}.>", f"results.{partition}.{b}.*"]


def schedule_subject(name: str) -> str:
    """Where schedule `name` is held (its message carries the ``Nats-Schedule`` headers; a paused one's
    does not)."""
    return f"schedules.def.{check_token(name, 'schedule name')}"


def fire_subject(name: str) -> str:
    """Where the server republishes schedule `name` at each of its instants (a fire)."""
    return f"schedules.fire.{check_token(name, 'schedule name')}"


def timer_token(call_id: str) -> str:
    """A timer's call id (``<run>/<turn>.<i>``) as one subject token."""
    return check_token(call_id.replace("/", "_").replace(".", "-"), "timer")


def timer_subject(call_id: str) -> str:
    """Where the wake-up of the timer of call `call_id` waits for its instant (an ``@at`` schedule)."""
    return f"schedules.timer.{timer_token(call_id)}"


def wake_subject(call_id: str) -> str:
    """Where the server republishes that wake-up at its instant."""
    return f"schedules.wake.{timer_token(call_id)}"


SCHEDULE_FILTER = "schedules.def.>"
FIRE_FILTERS = ["schedules.fire.>", "schedules.wake.>"]  # what the `scheduler` consumer takes


def dlq_subject(original: str) -> str:
    """Where a dead letter of a message first published on `original` is kept."""
    return f"dlq.{original}"


def job_msg_id(run: str, call_id: str) -> str:
    """The dedup id of a tool job and of its outcome: `<run>/<call>` (call ids that already start with
    `<run>/`, as the kernel's do, are used as they are)."""
    return call_id if call_id.startswith(f"{run}/") else f"{run}/{call_id}"


# -- bucket keys and consumer names -----------------------------------------------------------------------


def workspace_bucket(workspace: str) -> str:
    """The KV bucket holding one workspace's files."""
    name = f"ws_{workspace}"
    if not all(c.isalnum() or c in "-_" for c in workspace) or not workspace:
        raise ValueError(f"workspace {workspace!r}: use letters, digits, '-' or '_'")
    return name


def bundle_slug(bundle: str) -> str:
    """`bundle` as it appears in KV keys and consumer names: as it is if it is a plain word (letters,
    digits, ``-``, ``_``), else ``=`` and its base32 (a key allows few characters; ``=`` starts no plain
    word, so the two never collide). `bundle_of_slug` reverses it."""
    if bundle and all(c.isascii() and (c.isalnum() or c in "-_") for c in bundle):
        return bundle
    return "=" + base64.b32encode(bundle.encode()).decode().rstrip("=").lower()


def bundle_of_slug(slug: str) -> str:
    """The bundle name `bundle_slug` spelled as `slug`."""
    if not slug.startswith("="):
        return slug
    raw = slug[1:].upper()
    return base64.b32decode(raw + "=" * (-len(raw) % 8)).decode()


def lease_key(partition: int, bundle: str) -> str:
    """The `leases` key of one slot: partition `partition` of `bundle`."""
    return f"{bundle_slug(bundle)}.p{partition}"


def parse_lease_key(key: str) -> tuple[str, int] | None:
    """(bundle, partition) of a `leases` key; None for a key of another form (an older version's ``p<N>``)."""
    slug, _, p = key.rpartition(".")
    if not slug or not p.startswith("p") or not p[1:].isdigit():
        return None
    try:
        return bundle_of_slug(slug), int(p[1:])
    except (ValueError, UnicodeDecodeError):
        return None


def active_key(partition: int, run: str) -> str:
    """The `active` key of an unfinished run of `partition`."""
    return f"p{partition}.{check_token(run, 'run id')}"


def active_filter(partition: int) -> str:
    """Every `active` key of one partition (a KV watch pattern)."""
    return f"p{partition}.>"


def task_consumer_name(partition: int, bundle: str) -> str:
    """The durable consumer of one slot's tasks and commands (on TASKS): partition `partition` of `bundle`."""
    return f"tasks-p{partition}-{bundle_slug(bundle)}"


def result_consumer_name(partition: int, bundle: str) -> str:
    """The durable consumer of one slot's tool outcomes (on RESULTS)."""
    return f"results-p{partition}-{bundle_slug(bundle)}"


__all__ = ["ACTIVE_BUCKET", "ACTIVE_PURGE_TTL_S", "ANONYMOUS", "APPLIED_BUCKET", "APPLIED_TTL_S",
           "ATTEMPTS_BUCKET", "BATCH_MAX_MESSAGES", "COMMANDS_PREFIX", "DEFAULT_PARTITIONS",
           "DEFAULT_TOOL_ACK_WAIT_S", "DEFAULT_TOOL_MAX_ACK_PENDING", "DEFAULT_TOOL_MAX_DELIVER", "DLQ",
           "DUPLICATE_WINDOW_S", "ERR_ATOMIC_DISABLED",
           "ERR_BATCH_DUPLICATE_MSG_ID", "ERR_WRONG_LAST_SEQUENCE", "ERR_WRONG_LAST_SEQUENCE_CONSTANT",
           "EVENTS", "FIRE_FILTERS", "HANDOFFS_PREFIX",
           "HDR_BATCH_COMMIT", "HDR_BATCH_ID", "HDR_BATCH_SEQ", "HDR_EXPECTED_SUBJECT_SEQ",
           "HDR_EXPECTED_SUBJECT_SEQ_SUBJECT", "HDR_MSG_ID", "HDR_TASK_SEQ", "HDR_WRITER", "HOSTS_BUCKET",
           "LEASES_BUCKET",
           "PAYLOADS_BUCKET", "RESULTS", "RUNS_BUCKET", "SCHEDULER_CONSUMER", "SCHEDULES", "SCHEDULE_FILTER",
           "SCHEDULE_OPERATOR", "STREAM_PREFIX", "SUBRUNS_CONSUMER", "TASKS", "THREADS_BUCKET", "TOOLS",
           "TRACEPARENT", "TRACESTATE", "WORKERS_BUCKET", "WORKERS_CONSUMER", "WRONG_LAST_SEQUENCE",
           "active_filter", "active_key",
           "agent_of_task_subject", "bundle_of_slug", "bundle_result_filters", "bundle_slug",
           "bundle_task_filters", "bundle_token", "check_token", "command_subject", "dlq_subject",
           "event_subject", "fire_subject", "handoff_subject", "is_subtask_subject", "job_msg_id",
           "lease_key", "occ_headers", "parse_lease_key", "parse_task_subject", "partition_of",
           "result_consumer_name", "result_filter", "result_subject", "run_events_filter",
           "schedule_subject", "script_subject", "stored_bundle", "stream_filter", "stream_subject",
           "task_consumer_name", "task_filter", "task_subject", "timer_subject", "timer_token",
           "tool_subject", "unserved_task_filters", "wake_subject", "workspace_bucket"]
