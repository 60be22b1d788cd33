"""What a running `sa up` on this machine tells other processes, and how one `sa up` keeps its store.

`sa up` writes a small state file while it runs (`state_file()`: `<user data dir>/structured-agents/up.json`,
e.g. ~/.local/share/structured-agents/up.json on Linux) with the NATS URL, the local model's URL, the
bundles, its store, its pid, when it started and a token of its own, and removes it when it stops. Why a
module of its own, below the CLI: the CLI is not the only reader. `Client.connect()` without a URL and
`Agent.from_bundle` of a bundle on the `local` model find the running fleet the same way `sa send` does
(`find_nats`: one function for every command and the client), so a newcomer's script works beside `sa up`
without being told where anything is. A file whose pid is gone (an `sa up` that was killed) is ignored,
and the reader is told so.

Why the claims: two `sa up`s on one JetStream store started two nats-servers on the same files (nothing in
nats-server stops that), and the second overwrote the state file, then deleted it when it stopped, so the
first one, still running, could no longer be found. So an `sa up` claims its store for its whole life
(`claim_store`: an `flock` on `<store>/sa-up.lock`, which the kernel drops when the process dies, so a
killed `sa up` leaves no claim behind and two starts at once cannot both win), and the state file belongs
to the first live `sa up`: a second one (on another store) does not overwrite it (`write_state`), and an
`sa up` removes it only while it holds that `sa up`'s own token (`remove_state`). Both checks run under a
short `flock` on `up.json.lock`, so a check and the write it allows are one step.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

STORE_LOCK = "sa-up.lock"  # in the store folder: held by the `sa up` serving that store, for its life

Note = Callable[[str], None]


def state_file() -> Path:
    """Where `sa up` records its NATS and model URLs while it runs."""
    import platformdirs

    return Path(platformdirs.user_data_dir("structured-agents")) / "up.json"


def _alive(pid: Any) -> bool:
    """True unless `pid` names no process (a pid of another user's process counts as alive)."""
    if not isinstance(pid, int) or pid <= 0:
        return True  # no pid recorded: nothing says it is gone
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _load() -> dict[str, Any]:
    """The state file as written, live or not ({} when there is none or it is not a JSON object)."""
    try:
        state = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def read_state(note: Note | None = None) -> dict[str, Any]:
    """The running `sa up`'s state ({} when there is none, or its process is gone: `note`, if given, is
    told that a stale file was ignored)."""
    state = _load()
    if state and not _alive(state.get("pid")):
        if note is not None:
            note(f"ignoring {state_file()}: the sa up that wrote it (pid {state.get('pid')}) is gone")
        return {}
    return state


def describe(state: dict[str, Any]) -> str:
    """Which `sa up` a state names, for a person: `the sa up started at <time>, pid N, nats://…`."""
    parts = []
    started = state.get("started")
    if isinstance(started, int | float):
        parts.append(f"started at {datetime.datetime.fromtimestamp(started).strftime('%Y-%m-%d %H:%M:%S')}")
    if state.get("pid") is not None:
        parts.append(f"pid {state['pid']}")
    if state.get("nats_url"):
        parts.append(str(state["nats_url"]))
    if state.get("store"):
        parts.append(f"store {state['store']}")
    return "the sa up " + ", ".join(parts) if parts else "an sa up"


def find_nats(explicit: str | None = None, *, note: Note | None = None) -> str | None:
    """The NATS server(s) to use, found the same way by every `sa` command and by `Client.connect()`:
    `explicit` (a --nats flag, a URL passed in), else `NATS_URL`, else the `sa up` running here (`note` is
    told which one: `using the sa up started at …, pid N, nats://…`), else None."""
    if explicit:
        return explicit
    env = os.environ.get("NATS_URL", "").strip()
    if env:
        return env
    state = read_state(note)
    url = state.get("nats_url")
    if not url:
        return None
    if note is not None:
        note(f"using {describe(state)} ({state_file()})")
    return str(url)


def running_model_url() -> str | None:
    """The local model server's URL of the `sa up` running here, if it started one."""
    url = read_state().get("model_url")
    return str(url) if url else None


# -- the writer's side: `sa up` ----------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive `flock` on `path` (made if missing) for the block: a check and its write are one step."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the lock


def _state_lock() -> Path:
    return state_file().with_name(state_file().name + ".lock")


def write_state(state: dict[str, Any]) -> dict[str, Any] | None:
    """Record `state` (which must hold this `sa up`'s `token`) as the running `sa up`'s, unless a live
    `sa up` of another token holds the file: then nothing is written and its state is returned."""
    with _locked(_state_lock()):
        current = _load()
        if current and current.get("token") != state["token"] and _alive(current.get("pid")):
            return current
        tmp = state_file().with_name(f".{state_file().name}.{os.getpid()}")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(state_file())  # a reader sees the old file or the new one, never half of one
    return None


def remove_state(token: str) -> bool:
    """Remove the state file if it is still the one this `sa up` wrote (`token`); whether it did."""
    with _locked(_state_lock()):
        if _load().get("token") != token:
            return False
        with contextlib.suppress(FileNotFoundError):
            state_file().unlink()
    return True


def new_state(**fields: Any) -> dict[str, Any]:
    """A state for this process: `fields` plus its pid, the time and a fresh token."""
    return {**fields, "pid": os.getpid(), "started": time.time(), "token": uuid.uuid4().hex}


class StoreTaken(Exception):
    """Another live `sa up` serves this store (`holder`: what it recorded in the lock file, maybe {})."""

    def __init__(self, store: Path, holder: dict[str, Any]) -> None:
        self.store = store
        self.holder = holder
        super().__init__(f"{describe({**holder, 'store': str(store)})} is running on this store")


@dataclass
class StoreClaim:
    """This process's claim on a JetStream store folder: an exclusive `flock` held until `release` (or
    until the process ends, however it ends)."""

    store: Path
    fd: int

    def record(self, state: dict[str, Any]) -> None:
        """Write who holds the claim into the lock file, so a refused `sa up` can name it."""
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, json.dumps(state).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _holder(fd: int, patience: float = 2.0) -> dict[str, Any]:
    """What the holder of a taken store recorded in its lock file. A holder that has just won the lock
    writes its record right after: a claim racing it waits up to `patience` seconds for the record, so the
    refusal can name who holds the store (an empty record names nobody)."""
    deadline = time.monotonic() + patience
    while True:
        try:
            holder = json.loads(os.pread(fd, 1 << 16, 0) or b"{}")
        except ValueError:  # caught mid-write
            holder = {}
        if (isinstance(holder, dict) and "pid" in holder) or time.monotonic() >= deadline:
            return holder if isinstance(holder, dict) else {}
        time.sleep(0.02)


def claim_store(store: Path, state: dict[str, Any]) -> StoreClaim:
    """Claim `store` for this process (see the module docstring), recording `state` in its lock file;
    `StoreTaken` naming the holder if a live `sa up` has it."""
    store.mkdir(parents=True, exist_ok=True)
    fd = os.open(store / STORE_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise StoreTaken(store, holder) from None
    claim = StoreClaim(store, fd)
    claim.record(state)
    return claim


__all__ = ["STORE_LOCK", "StoreClaim", "StoreTaken", "claim_store", "describe", "find_nats", "new_state",
           "read_state", "remove_state", "running_model_url", "state_file", "write_state"]
