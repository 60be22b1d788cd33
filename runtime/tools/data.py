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

Known limit: several writes of one job are applied one by one, not atomically; a conflict on the second
after the first landed leaves the first applied (reported in the failure message). Atomic batches
(server 2.12+) are the upgrade path.

Workspace files live in KV bucket `ws_<workspace>`; the key is the path under the mount (`/data/notes/a.txt`
-> `notes/a.txt`); a path that is not a valid KV key is stored as `=` + base64url(path).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import BadRequestError, KeyNotFoundError, KeyWrongLastSequenceError, NotFoundError

from runtime.events import PayloadRef
from runtime.jobs import ToolJob
from runtime.nats.kv import applied_kv, kv_entries, workspace_kv
from runtime.nats.subjects import (
    ERR_WRONG_LAST_SEQUENCE,
    HDR_EXPECTED_SUBJECT_SEQ,
    HDR_MSG_ID,
    workspace_bucket,
)
from runtime.payloads import Payloads

DEFAULT_MOUNT = "/data"
HDR_JOB = "Sa-Job"

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
        return self.job.agent

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
    output lives in the object store (`ref`, `runtime.payloads`): a KV value is one NATS message."""

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


def _text_or_bytes(data: bytes) -> str | bytes:
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
                    self.files[f"{mount.rstrip('/')}/{f.relative_to(root).as_posix()}"] = _text_or_bytes(
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
                files[f"{self.mount}/{path}"] = _text_or_bytes(entry.value)
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
        writes = parse_writes(result, self.mount)
        if not writes:
            return
        workspace = context.job.workspace or self.default_workspace
        if workspace is None:
            raise WriteError(f"{tool_name} returned {len(writes)} write(s) but the call has no workspace")
        if (prior := await self.recorded(context)) is not None:  # a concurrent or earlier attempt did it
            context.writes_applied = prior.writes
            return
        bucket = workspace_bucket(workspace)
        await workspace_kv(self.js, workspace)
        job_id = context.job.msg_id
        for i, (path, content) in enumerate(writes):
            subject = f"$KV.{bucket}.{key_for_path(path)}"
            headers = {HDR_MSG_ID: f"{job_id}#{i}", HDR_JOB: f"{job_id}#{i}"}
            expected = context.revisions.get(path, 0 if context.complete else None)
            if expected is not None:
                headers[HDR_EXPECTED_SUBJECT_SEQ] = str(expected)
            try:
                ack = await self.js.publish(subject, content, headers=headers)
            except BadRequestError as e:
                if e.err_code != ERR_WRONG_LAST_SEQUENCE:
                    raise
                if not await self._written_by(bucket, subject, f"{job_id}#{i}"):
                    done = f" ({i} earlier write(s) of this call were applied)" if i else ""
                    raise WorkspaceConflict(f"{path} changed while {tool_name} ran{done}") from None
            else:
                context.revisions[path] = ack.seq
        context.writes_applied = len(writes)
        applied = await applied_kv(self.js)
        kept = await self._payloads().offload(result)  # a PayloadRef when too big for a KV value
        recorded = Recorded(output=None, writes=len(writes), ref=kept) if isinstance(kept, PayloadRef) \
            else Recorded(output=result, writes=len(writes))
        marker = msgspec.msgpack.encode(recorded)
        try:
            await applied.create(self._marker_key(context), marker)
        except KeyWrongLastSequenceError:
            pass  # already there: a concurrent attempt of the same job recorded it

    async def _written_by(self, bucket: str, subject: str, write_id: str) -> bool:
        try:
            msg = await self.js.get_last_msg(f"KV_{bucket}", subject, direct=True)
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
]
