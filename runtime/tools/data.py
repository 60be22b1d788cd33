"""Data in and out of a tool run: `DataProvider` fills a script's virtual files, `ResultHandler` persists
the writes a script returned.

Scripts are pure functions: they read virtual files under `/data/` and return
`{"writes": [{"path": ..., "content": ...}], ...}`; nothing is persisted while they run, so re-running a
script after a crash is safe. The worker
calls, in order: `DataProvider.load_files` -> run -> validate the output -> `ResultHandler.handle` ->
publish the outcome -> ack the job. A crash anywhere repeats work; the workspace handler makes the
repetition harmless:

* Every write carries the KV revision the script read (`Nats-Expected-Last-Subject-Sequence`; 0 means
  "the file did not exist"), so a write based on stale data is refused (`WorkspaceConflict`) instead
  of silently overwriting someone else's change; the worker then re-runs the script on fresh data.
* Every write carries `Nats-Msg-Id = <job>#<i>` and a `Sa-Job` header, so a second attempt of the same
  write is either dropped by JetStream or recognised as ours when its revision check fails.
* After the writes, a marker in the `applied` bucket records the job's validated output. A redelivered
  job finds it and replays that output instead of running again: re-running would read its own writes
  and could answer differently ("entry already exists").

* All of one job's writes land or none does: two or more go as one JetStream atomic batch (the bucket's
  stream allows them), and the server checks every write's expected revision at the commit. So a
  conflict on any write leaves every key as it was, and the re-run starts from a consistent workspace.
  A batch costs one round trip and a disk sync at the commit (5 ms on an idle disk, up to ~30 ms on a
  busy one, against ~0.5 ms for two plain publishes: `bench/worker.py --writes`); a single write stays a
  plain publish. A path written twice in one result keeps its last content.

Workspace files live in KV bucket `ws_<workspace>`; the key is the path under the mount (`/data/notes/a.txt`
-> `notes/a.txt`); a path that is not a valid KV key is stored as `=` + base64url(path).
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import (
    APIError,
    BadRequestError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
    NotFoundError,
)

from runtime.events import PayloadRef
from runtime.jobs import ToolJob
from runtime.log.payloads import Payloads
from runtime.nats.kv import allow_atomic_writes, applied_kv, kv_entries, workspace_kv
from runtime.nats.subjects import (
    BATCH_MAX_MESSAGES,
    ERR_ATOMIC_DISABLED,
    ERR_BATCH_DUPLICATE_MSG_ID,
    HDR_BATCH_COMMIT,
    HDR_BATCH_ID,
    HDR_BATCH_SEQ,
    HDR_EXPECTED_SUBJECT_SEQ,
    HDR_MSG_ID,
    WRONG_LAST_SEQUENCE,
    workspace_bucket,
)

DEFAULT_MOUNT = "/data"
HDR_JOB = "Sa-Job"
BATCH_TIMEOUT_S = 10.0

Files = dict[str, str | bytes]


class WriteError(ValueError):
    """The script's `writes` are malformed or not allowed (becomes a tool failure of kind `output`)."""


class WorkspaceConflict(RuntimeError):
    """A file changed between the script reading it and its write (the worker retries on fresh data)."""


@dataclass
class JobContext:
    """What a provider and a handler know about the call, and what they share with each other.

    `revisions` maps each loaded path (relative to the mount) to the KV revision read (0 = absent);
    `complete` says the provider loaded the whole workspace, so a path it did not see is known absent.
    """

    job: ToolJob
    revisions: dict[str, int] = field(default_factory=dict)
    complete: bool = False
    writes_applied: int = 0

    @property
    def agent_id(self) -> str:
        return self.job.actor

    @property
    def run_id(self) -> str:
        return self.job.run_id


@runtime_checkable
class DataProvider(Protocol):
    async def load_files(self, tool_name: str, arguments: dict[str, Any], context: JobContext) -> Files:
        """Virtual path -> content for this call (e.g. `{"/data/notes/a.txt": "..."}`)."""
        ...


@runtime_checkable
class ResultHandler(Protocol):
    async def handle(self, tool_name: str, result: Any, context: JobContext) -> None:
        """Persist what the validated `result` asks for; raise WriteError / WorkspaceConflict."""
        ...

    async def recorded(self, context: JobContext) -> Recorded | None:
        """The result an earlier attempt of this job already persisted, or None."""
        ...


class Recorded(msgspec.Struct, frozen=True):
    """The marker value of an applied job: its validated output and how many writes it made. A big
    output lives in the object store (`ref`, `runtime.log.payloads`): a KV value is one NATS message."""

    output: Any
    writes: int
    ref: PayloadRef | None = None


# ---------------------------------------------------------------------------------------------------------
# paths and keys
# ---------------------------------------------------------------------------------------------------------

_PLAIN_KEY = re.compile(r"[-/_a-zA-Z0-9][-/_=a-zA-Z0-9]*(\.[-/_=a-zA-Z0-9]+)*")


def key_for_path(path: str) -> str:
    """The KV key of a workspace path (relative to the mount)."""
    if _PLAIN_KEY.fullmatch(path):
        return path
    return "=" + base64.urlsafe_b64encode(path.encode()).decode().rstrip("=")


def path_for_key(key: str) -> str:
    if key.startswith("="):
        raw = key[1:]
        return base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    return key


def relative_path(path: object, mount: str = DEFAULT_MOUNT) -> str:
    """`/data/notes/a.txt`, `notes/a.txt` -> `notes/a.txt`; refuses `..`, empty and foreign absolute paths."""
    if not isinstance(path, str) or not path.strip():
        raise WriteError(f"a write needs a non-empty string 'path', got {path!r}")
    p = path.strip()
    prefix = mount.rstrip("/") + "/"
    if p.startswith(prefix):
        p = p[len(prefix):]
    elif p.startswith("/"):
        raise WriteError(f"write path {path!r} is outside {mount}/")
    parts = [s for s in p.split("/") if s not in ("", ".")]
    if not parts or ".." in parts:
        raise WriteError(f"write path {path!r} must name a file under {mount}/ without '..'")
    return "/".join(parts)


def text_or_bytes(data: bytes) -> str | bytes:
    """A file's content as a script sees it: text when it is UTF-8, else the bytes."""
    try:
        return data.decode()
    except UnicodeDecodeError:
        return data


def parse_writes(result: Any, mount: str = DEFAULT_MOUNT) -> list[tuple[str, bytes]]:
    """The `writes` of a result as (relative path, bytes), validated; [] when there are none."""
    if not isinstance(result, dict) or result.get("writes") is None:
        return []
    writes = result["writes"]
    if not isinstance(writes, list):
        raise WriteError(f"'writes' must be a list of {{path, content}} objects, got {type(writes).__name__}")
    out: list[tuple[str, bytes]] = []
    for i, w in enumerate(writes):
        if not isinstance(w, dict) or set(w) - {"path", "content"} or "content" not in w:
            raise WriteError(f"writes[{i}] must be an object with 'path' and 'content' only, got {w!r:.80}")
        content = w["content"]
        if isinstance(content, str):
            content = content.encode()
        elif not isinstance(content, bytes):
            raise WriteError(f"writes[{i}].content must be a string or bytes, got {type(content).__name__}")
        out.append((relative_path(w.get("path"), mount), content))
    return out


# ---------------------------------------------------------------------------------------------------------
# providers
# ---------------------------------------------------------------------------------------------------------


class NullDataProvider:
    """No files: for tools that need none."""

    async def load_files(self, tool_name: str, arguments: dict[str, Any], context: JobContext) -> Files:
        return {}


class StaticDataProvider:
    """The same files for every call: a dict, or a host folder read once at construction (mounted under
    `mount`). For tests, demos and read-only reference data."""

    def __init__(self, files: Mapping[str, str | bytes] | None = None, *, folder: str | Path | None = None,
                 mount: str = DEFAULT_MOUNT) -> None:
        self.files: Files = dict(files or {})
        if folder is not None:
            root = Path(folder)
            if not root.is_dir():
                raise FileNotFoundError(f"data folder {root} does not exist")
            for f in sorted(root.rglob("*")):
                if f.is_file():
                    self.files[f"{mount.rstrip('/')}/{f.relative_to(root).as_posix()}"] = text_or_bytes(
                        f.read_bytes())

    async def load_files(self, tool_name: str, arguments: dict[str, Any], context: JobContext) -> Files:
        return dict(self.files)


class WorkspaceDataProvider:
    """Every file of the job's workspace bucket, under `mount`, with the revisions read recorded in the
    context (the handler's conflict check). A job without a workspace (and no default) gets no files."""

    def __init__(self, js: JetStreamContext, *, mount: str = DEFAULT_MOUNT,
                 default_workspace: str | None = None) -> None:
        self.js, self.mount, self.default_workspace = js, mount.rstrip("/"), default_workspace

    async def load_files(self, tool_name: str, arguments: dict[str, Any], context: JobContext) -> Files:
        workspace = context.job.workspace or self.default_workspace
        if workspace is None:
            return {}
        kv = await workspace_kv(self.js, workspace)
        files: Files = {}
        # kv_entries, not kv.watchall(): a watch per job leaves a server-side consumer behind for minutes
        # (a busy fleet hits the stream's consumer cap) and can report an empty bucket on a cluster
        for entry in (await kv_entries(kv, deleted=True)).values():
            path = path_for_key(entry.key)
            context.revisions[path] = entry.revision or 0  # a deleted key's revision guards re-creation
            if entry.operation is None and entry.value is not None:
                files[f"{self.mount}/{path}"] = text_or_bytes(entry.value)
        context.complete = True
        return files


# ---------------------------------------------------------------------------------------------------------
# handlers
# ---------------------------------------------------------------------------------------------------------


class NullResultHandler:
    """Persists nothing (a result's `writes`, if any, are only reported to the model)."""

    async def handle(self, tool_name: str, result: Any, context: JobContext) -> None:
        return None

    async def recorded(self, context: JobContext) -> Recorded | None:
        return None


class WorkspaceResultHandler:
    """Applies `writes` to the job's workspace bucket: revision-checked, idempotent by job id."""

    def __init__(self, js: JetStreamContext, *, mount: str = DEFAULT_MOUNT,
                 default_workspace: str | None = None) -> None:
        self.js, self.mount, self.default_workspace = js, mount, default_workspace
        self.payloads: Payloads | None = None  # made on first use

    @staticmethod
    def _marker_key(context: JobContext) -> str:
        return "job." + base64.urlsafe_b64encode(context.job.msg_id.encode()).decode().rstrip("=")

    async def recorded(self, context: JobContext) -> Recorded | None:
        applied = await applied_kv(self.js)
        try:
            entry = await applied.get(self._marker_key(context))
        except (KeyNotFoundError, NotFoundError):
            return None
        if entry.value is None:
            return None
        marker = msgspec.msgpack.decode(entry.value, type=Recorded)
        if marker.ref is not None:
            output = await self._payloads().resolve(marker.ref)
            marker = Recorded(output=output, writes=marker.writes)
        return marker

    def _payloads(self) -> Payloads:
        if self.payloads is None:
            self.payloads = Payloads(self.js)
        return self.payloads

    async def handle(self, tool_name: str, result: Any, context: JobContext) -> None:
        writes = list(dict(parse_writes(result, self.mount)).items())  # a path written twice: its last
        if not writes:
            return
        workspace = context.job.workspace or self.default_workspace
        if workspace is None:
            raise WriteError(f"{tool_name} returned {len(writes)} write(s) but the call has no workspace")
        if len(writes) > BATCH_MAX_MESSAGES:
            raise WriteError(f"{tool_name} returned {len(writes)} writes; one call may write at most "
                             f"{BATCH_MAX_MESSAGES} files (they are applied as one atomic batch)")
        if (prior := await self.recorded(context)) is not None:  # a concurrent or earlier attempt did it
            context.writes_applied = prior.writes
            return
        await workspace_kv(self.js, workspace)
        await self._apply(tool_name, workspace, writes, context)
        context.writes_applied = len(writes)
        applied = await applied_kv(self.js)
        kept = await self._payloads().offload(result, run=context.run_id)  # a PayloadRef if too big for KV
        recorded = Recorded(output=None, writes=len(writes), ref=kept) if isinstance(kept, PayloadRef) \
            else Recorded(output=result, writes=len(writes))
        marker = msgspec.msgpack.encode(recorded)
        try:
            await applied.create(self._marker_key(context), marker)
        except KeyWrongLastSequenceError:
            pass  # already there: a concurrent attempt of the same job recorded it

    async def _apply(self, tool_name: str, workspace: str, writes: list[tuple[str, bytes]],
                     context: JobContext) -> None:
        """Write every file or none: one publish for one file, one atomic batch for more. Raises
        `WorkspaceConflict` naming the files that changed since the script read them."""
        bucket = workspace_bucket(workspace)
        job_id = context.job.msg_id
        messages: list[tuple[str, bytes, dict[str, str]]] = []
        for i, (path, content) in enumerate(writes):
            headers = {HDR_MSG_ID: f"{job_id}#{i}", HDR_JOB: f"{job_id}#{i}"}
            expected = context.revisions.get(path, 0 if context.complete else None)
            if expected is not None:
                headers[HDR_EXPECTED_SUBJECT_SEQ] = str(expected)
            messages.append((f"$KV.{bucket}.{key_for_path(path)}", content, headers))
        try:
            if len(messages) == 1:
                subject, content, headers = messages[0]
                last = (await self.js.publish(subject, content, headers=headers)).seq
            else:
                try:
                    last = await self._publish_batch(messages)
                except BadRequestError as e:
                    if e.err_code != ERR_ATOMIC_DISABLED:
                        raise
                    await allow_atomic_writes(self.js, workspace)  # a bucket made by an older version
                    last = await self._publish_batch(messages)
        except BadRequestError as e:
            if e.err_code not in (*WRONG_LAST_SEQUENCE, ERR_BATCH_DUPLICATE_MSG_ID):
                raise
            # refused as a whole: either an earlier attempt of this job landed it (its ack was lost), or
            # a file changed since the script read it; all-or-none means one of ours shows the first
            mine = [await self._written_by(bucket, subject, headers[HDR_JOB])
                    for subject, _, headers in messages]
            if e.err_code == ERR_BATCH_DUPLICATE_MSG_ID or any(mine):
                return
            changed = [path for (path, _), (subject, _, headers) in zip(writes, messages, strict=True)
                       if await self._changed(bucket, subject, headers.get(HDR_EXPECTED_SUBJECT_SEQ))]
            what = ", ".join(changed or [p for p, _ in writes])
            none = f" (none of its {len(writes)} writes was applied)" if len(writes) > 1 else ""
            raise WorkspaceConflict(f"{what} changed while {tool_name} ran{none}") from None
        for i, (path, _) in enumerate(writes):  # a batch's messages have consecutive stream sequences
            context.revisions[path] = last - len(writes) + 1 + i

    async def _publish_batch(self, messages: list[tuple[str, bytes, dict[str, str]]]) -> int:
        """Publish `messages` as one atomic batch; the stream sequence of the last. Only the commit asks
        for a reply: the server answers it with the batch's publish ack or the error that refused it
        (a failed revision check on any message refuses them all)."""
        nc = self.js._nc  # nats-py keeps the connection on the context; a batch is plain core publishes
        batch = uuid.uuid4().hex
        for n, (subject, content, headers) in enumerate(messages, 1):
            headers = {**headers, HDR_BATCH_ID: batch, HDR_BATCH_SEQ: str(n)}
            if n < len(messages):
                await nc.publish(subject, content, headers=headers)
                continue
            headers[HDR_BATCH_COMMIT] = "1"
            reply = json.loads((await nc.request(subject, content, headers=headers,
                                                 timeout=BATCH_TIMEOUT_S)).data)
            if "error" in reply:
                APIError.from_error(reply["error"])  # raises the error's own class (400: BadRequestError)
            return int(reply["seq"])
        raise AssertionError("unreachable: a batch has at least one message")

    async def _changed(self, bucket: str, subject: str, expected: str | None) -> bool:
        """True if the file's last revision is not the one the script read. Asked of the bucket's leader, not
        as a direct get: a replica catching up after a cut answers with an older revision, and these two
        reads decide whether a refused write was this job's own."""
        if expected is None:
            return False
        try:
            msg = await self.js.get_last_msg(f"KV_{bucket}", subject)  # the leader: see `_changed`
        except NotFoundError:
            return expected != "0"
        return str(msg.seq) != expected

    async def _written_by(self, bucket: str, subject: str, write_id: str) -> bool:
        try:
            msg = await self.js.get_last_msg(f"KV_{bucket}", subject)  # the leader: see `_changed`
        except NotFoundError:
            return False
        return bool(msg.headers) and msg.headers is not None and msg.headers.get(HDR_JOB) == write_id


__all__ = [
    "DEFAULT_MOUNT",
    "DataProvider",
    "JobContext",
    "NullDataProvider",
    "NullResultHandler",
    "Recorded",
    "ResultHandler",
    "StaticDataProvider",
    "WorkspaceConflict",
    "WorkspaceDataProvider",
    "WorkspaceResultHandler",
    "WriteError",
    "key_for_path",
    "parse_writes",
    "path_for_key",
    "relative_path",
    "text_or_bytes",
]
