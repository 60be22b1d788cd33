"""A file system that loses what was not synced when told the power went out: a FUSE pass-through over a
real folder, in the spirit of LazyFS (the tool of Jepsen's NATS analysis), for the power-loss bed.

    fs = LazyFS(backing=tmp / "disk", mount=tmp / "n0").start()   # a process of its own
    ... a program writes under tmp/"n0", syncs some of it ...
    fs.crash()          # power lost: what was not synced is gone; the mount is gone too (the machine is off)
    fs.start()          # powered on again: the mount shows what a disk would hold after the loss

Why a pass-through with an undo log, not a page cache in memory: every write goes to the backing folder
at once (reads need no merging), and the file system remembers, per file, what the *synced* state was:
its size at its last sync and the original bytes of every 4 KiB page written or cut off below that size
since. A sync forgets that file's record (its present state is now the synced one); a crash puts every
record back (truncate to the synced size, write the saved pages), which is the state a disk would hold if
the kernel's page cache had been dropped. Memory grows with what is unsynced, as a page cache would.

What is modelled (decided here, checked in tests/testbed/test_lazyfs.py):

* **File data and size** are durable once that file is synced (`fsync` or `fdatasync`, through any of its
  handles). Closing a file syncs nothing. A write or truncate after the sync is lost by a crash; a file
  whose creation survived but whose data was never synced comes back empty (as ext4 with delayed allocation
  does).
* **Names** (create, mkdir, unlink, rmdir, rename, a rename over an existing file) form one ordered journal,
  as ext4's does (jbd2 commits every pending metadata change at once): by default *any* sync, of a file or a
  directory, commits the whole journal. With ``strict=True`` (POSIX's letter, and what some file systems
  do) only a sync of the directory holding a name commits an operation on it (both directories, for a
  rename), so a file created and synced but whose directory was never synced is gone after a crash.
  A crash undoes the uncommitted operations in reverse order: a removed file comes back with its synced
  contents (removed files are kept aside until their removal commits), a created one disappears, a rename
  goes back.
* **Not modelled**: modes, owners and times (passed through, never lost); hard links, symlinks and special
  files (refused: a JetStream store needs none); torn pages (a page is either all written or all lost) and
  reordering within one file's unsynced writes (all of them are lost together: the worst case, LazyFS's
  default too); bit errors (the bed flips bits in a stopped node's files directly).

The process: `python testbed/lazyfs.py BACKING MOUNT --control SOCKET [--strict]` mounts in the foreground
(single-threaded) and answers one-line commands on a Unix socket: ``stats``, ``sync`` (commit everything:
a clean shutdown's flush), ``crash`` (undo, answer what was lost, refuse every later operation with EIO);
`LazyFS` runs it and unmounts after a crash. It imports only the standard library and mfusepy, so it runs
from a file path with no package on sys.path.

Needs /dev/fuse, libfuse3 (`make fuse` installs Debian's fuse3) and mfusepy; `unavailable()` says which is
missing.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

PAGE = 4096
T = TypeVar("T")
TRASH = ".lazyfs-removed"  # in the backing folder's root: removed names wait here until their removal commits


@dataclass
class Dirty:
    """One file's unsynced changes: its size at its last sync and the original bytes of every page below
    that size changed since (page index -> bytes, clipped at `synced_size`)."""

    synced_size: int
    pages: dict[int, bytes] = field(default_factory=dict)


@dataclass
class NameOp:
    """One uncommitted name operation: `src` moved to `dst` (`src` None: `dst` was created). `dirs`: the
    directories whose sync commits it (strict mode)."""

    src: str | None
    dst: str
    dirs: set[str]


class Disk:
    """The model, on real paths of the backing folder (no FUSE here: unit-testable and reusable)."""

    def __init__(self, root: Path, *, strict: bool = False) -> None:
        self.root = Path(root)
        self.strict = strict
        self.dirty: dict[int, Dirty] = {}  # inode -> unsynced changes
        self.journal: list[NameOp] = []
        self.trash = self.root / TRASH
        self.trash.mkdir(exist_ok=True)
        self.removed = 0
        self.off = False  # after a crash: every operation fails
        self.lost_by_kind: dict[str, int] = {}  # what the last crash dropped: bytes by `_kind` of file
        self.counters = dict.fromkeys(("writes", "syncs", "dir_syncs"), 0)

    def real(self, path: str) -> str:
        return os.path.join(self.root, path.lstrip("/"))

    # -- data -------------------------------------------------------------------------------------------

    def before_change(self, fd: int, start: int, end: int) -> None:
        """Save what bytes [start, end) of the file open as `fd` held at its last sync, before they change
        (`end` None: to its end)."""
        st = os.fstat(fd)
        d = self.dirty.get(st.st_ino)
        if d is None:
            d = self.dirty[st.st_ino] = Dirty(st.st_size)
        stop = min(end, d.synced_size)
        if stop <= start:  # only bytes beyond the synced size change: truncating to it restores them
            return
        for page in range(start // PAGE, (stop - 1) // PAGE + 1):
            if page not in d.pages:
                lo = page * PAGE
                d.pages[page] = os.pread(fd, min(PAGE, d.synced_size - lo), lo)

    def write(self, fd: int, data: bytes, offset: int) -> int:
        self.before_change(fd, offset, offset + len(data))
        self.counters["writes"] += 1
        return os.pwrite(fd, data, offset)

    def truncate(self, fd: int, length: int) -> None:
        self.before_change(fd, length, os.fstat(fd).st_size)
        os.ftruncate(fd, length)

    def sync(self, fd: int) -> None:
        """fsync/fdatasync of a file: its data is durable; with the default model, every name too."""
        self.counters["syncs"] += 1
        self.dirty.pop(os.fstat(fd).st_ino, None)
        if not self.strict:
            self.commit()

    def sync_dir(self, path: str) -> None:
        self.counters["dir_syncs"] += 1
        if not self.strict:
            self.commit()
            return
        real = os.path.normpath(self.real(path))
        for op in self.journal:
            op.dirs.discard(real)
        self.commit([op for op in self.journal if not op.dirs])

    def forget(self, fd: int) -> None:
        """A handle closed: a removed file's record goes (its inode number may be reused)."""
        st = os.fstat(fd)
        if st.st_nlink == 0:
            self.dirty.pop(st.st_ino, None)

    # -- names ------------------------------------------------------------------------------------------

    def _dirs(self, *paths: str) -> set[str]:
        return {os.path.dirname(os.path.normpath(p)) for p in paths
                if not os.path.normpath(p).startswith(str(self.trash))}

    def created(self, real: str) -> None:
        ino = os.lstat(real).st_ino
        self.dirty.pop(ino, None)  # an inode number reused: not this file's history
        self.journal.append(NameOp(None, real, self._dirs(real)))

    def remove(self, real: str) -> None:
        """unlink or rmdir: kept aside until the removal commits."""
        if os.path.isdir(real) and not os.path.islink(real) and os.listdir(real):
            raise OSError(errno.ENOTEMPTY, "directory not empty", real)
        self.removed += 1
        aside = str(self.trash / str(self.removed))
        os.rename(real, aside)
        self.journal.append(NameOp(real, aside, self._dirs(real)))

    def rename(self, old: str, new: str) -> None:
        if os.path.lexists(new):
            if os.path.isdir(new) != os.path.isdir(old):
                raise OSError(errno.EISDIR if os.path.isdir(new) else errno.ENOTDIR, "rename", new)
            self.remove(new)
        os.rename(old, new)
        self.journal.append(NameOp(old, new, self._dirs(old, new)))

    def commit(self, ops: list[NameOp] | None = None) -> None:
        """Make `ops` (all pending: None) durable; removed files they name are gone for good."""
        ops = list(self.journal) if ops is None else ops
        for op in ops:
            if op.src is not None and op.dst.startswith(str(self.trash)) and os.path.lexists(op.dst):
                for ino in _inodes(op.dst):
                    self.dirty.pop(ino, None)
                _remove_tree(op.dst)
        done = {id(op) for op in ops}
        self.journal = [op for op in self.journal if id(op) not in done]

    # -- power ------------------------------------------------------------------------------------------

    def crash(self) -> dict[str, int]:
        """Undo what was not synced (module docstring); what was lost, counted."""
        self.off = True
        lost = {"name_ops": len(self.journal), "files": 0, "bytes": 0, "undo_errors": 0}
        kinds: dict[str, int] = {}
        for op in reversed(self.journal):
            try:
                if op.src is None:
                    _remove_tree(op.dst)
                else:
                    os.rename(op.dst, op.src)
            except OSError:
                lost["undo_errors"] += 1
        self.journal = []
        where = {os.lstat(path).st_ino: path for path in _walk(self.root, skip=str(self.trash))}
        for ino, d in self.dirty.items():
            path = where.get(ino)
            if path is None or not os.path.isfile(path):
                continue
            size = os.path.getsize(path)
            dropped = max(0, size - d.synced_size) + sum(len(p) for p in d.pages.values())
            lost["files"] += 1
            lost["bytes"] += dropped
            name = os.path.relpath(path, self.root)
            kinds[_kind(name)] = kinds.get(_kind(name), 0) + dropped
            with open(path, "r+b") as f:
                f.truncate(d.synced_size)
                for page, data in d.pages.items():
                    f.seek(page * PAGE)
                    f.write(data)
        self.dirty = {}
        _remove_tree(str(self.trash))
        self.lost_by_kind = kinds
        return lost

    def stats(self) -> dict[str, Any]:
        def rel(path: str | None) -> str:
            return "" if path is None else os.path.relpath(path, self.root)

        pending = [f"{rel(op.src)} -> {rel(op.dst)}" if op.src else f"created {rel(op.dst)}"
                   for op in self.journal[:20]]
        return {"unsynced_files": len(self.dirty), "pending_name_ops": len(self.journal), "pending": pending,
                "saved_pages": sum(len(d.pages) for d in self.dirty.values()), "strict": self.strict,
                **self.counters}


def _kind(relpath: str) -> str:
    """A lost file named by its kind, not its instance, for a JetStream store: a stream's files by stream
    (`EVENTS/msgs/N.blk`), a raft group's log by the kind of group (`raft S/msgs/N.blk`: a stream's, C: a
    consumer's, _meta_: the meta layer's); digits become N. Other paths: their last two parts."""
    parts = Path(relpath).parts
    if "_js_" in parts and len(parts) > parts.index("_js_") + 1:
        i = parts.index("_js_") + 1
        group = parts[i] if parts[i] == "_meta_" else parts[i][:1]
        tail = "raft " + "/".join((group, *parts[i + 1:]))
    elif "streams" in parts:
        tail = "/".join(parts[parts.index("streams") + 1:])
    else:
        tail = "/".join(parts[-2:])
    return re.sub(r"\d+", "N", tail)


def _walk(root: Path, skip: str) -> list[str]:
    out: list[str] = []
    for folder, dirs, files in os.walk(root):
        if folder.startswith(skip):
            continue
        dirs[:] = [d for d in dirs if not os.path.join(folder, d).startswith(skip)]
        out.extend(os.path.join(folder, name) for name in files)
    return out


def _inodes(path: str) -> list[int]:
    if os.path.isdir(path) and not os.path.islink(path):
        return [os.lstat(p).st_ino for p in _walk(Path(path), skip="\0")]
    return [os.lstat(path).st_ino]


def _remove_tree(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


# -- the FUSE side ------------------------------------------------------------------------------------------


def _guarded(method: Callable[..., T]) -> Callable[..., T]:
    """Run an operation under the file system's lock, and refuse it (EIO) once the power is off."""

    @functools.wraps(method)  # mfusepy reads some methods' signatures
    def run(self: Ops, *args: Any) -> T:
        with self.lock:
            if self.disk.off:
                raise OSError(errno.EIO, "the power is off")
            return method(self, *args)

    return run


class Ops:
    """The FUSE operations over a `Disk` (mfusepy calls what is defined and leaves the rest ENOSYS: hard
    links, symlinks, special files, extended attributes). An OSError becomes its errno."""

    use_ns = True  # times in nanoseconds

    def __init__(self, disk: Disk) -> None:
        self.disk = disk
        self.lock = threading.Lock()  # shared with the control socket

    @_guarded
    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        if path == "/" + TRASH:
            raise OSError(errno.ENOENT, path)
        st = os.fstat(fh) if fh is not None else os.lstat(self.disk.real(path))
        keys = ("st_mode", "st_nlink", "st_size", "st_uid", "st_gid", "st_ino", "st_blocks")
        return {k: getattr(st, k) for k in keys} | {
            "st_atime": st.st_atime_ns, "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns}

    @_guarded
    def readdir(self, path: str, fh: int) -> list[tuple[str, dict[str, int], int]]:
        # each entry with its inode number: with use_ino, an entry numbered 0 is skipped by readdir(3)
        out = []
        for entry in os.scandir(self.disk.real(path)):
            if not (path == "/" and entry.name == TRASH):
                st = entry.stat(follow_symlinks=False)
                out.append((entry.name, {"st_mode": st.st_mode, "st_ino": st.st_ino}, 0))
        return out

    @_guarded
    def access(self, path: str, amode: int) -> int:
        if not os.access(self.disk.real(path), amode):
            raise OSError(errno.EACCES, path)
        return 0

    @_guarded
    def statfs(self, path: str) -> dict[str, int]:
        sv = os.statvfs(self.disk.real(path))
        return {k: getattr(sv, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail",
                                            "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    @_guarded
    def chmod(self, path: str, mode: int) -> int:
        os.chmod(self.disk.real(path), mode)
        return 0

    @_guarded
    def chown(self, path: str, uid: int, gid: int) -> int:
        os.chown(self.disk.real(path), uid, gid)
        return 0

    @_guarded
    def utimens(self, path: str, times: tuple[int, int] | None = None) -> int:
        if times is None:
            os.utime(self.disk.real(path))
        else:
            os.utime(self.disk.real(path), ns=times)
        return 0

    @_guarded
    def open(self, path: str, flags: int) -> int:
        return _open(self.disk.real(path), flags)

    @_guarded
    def create(self, path: str, mode: int, flags: int) -> int:
        real = self.disk.real(path)
        existed = os.path.lexists(real)
        fd = _open(real, flags | os.O_CREAT, mode)
        if not existed:
            self.disk.created(real)
        return fd

    @_guarded
    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    @_guarded
    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return self.disk.write(fh, data, offset)

    @_guarded
    def truncate(self, path: str, length: int, fh: int | None = None) -> int:
        fd = fh if fh is not None else os.open(self.disk.real(path), os.O_RDWR)
        try:
            self.disk.truncate(fd, length)
        finally:
            if fh is None:
                os.close(fd)
        return 0

    @_guarded
    def flush(self, path: str, fh: int) -> int:
        return 0  # a close syncs nothing

    @_guarded
    def fsync(self, path: str, datasync: int, fh: int) -> int:
        self.disk.sync(fh)
        return 0

    @_guarded
    def fsyncdir(self, path: str, datasync: int, fh: int) -> int:
        self.disk.sync_dir(path)
        return 0

    def release(self, path: str, fh: int) -> int:
        with self.lock:  # after a crash too: the handle is closed either way
            try:
                if not self.disk.off:
                    self.disk.forget(fh)
            finally:
                os.close(fh)
        return 0

    @_guarded
    def mkdir(self, path: str, mode: int) -> int:
        os.mkdir(self.disk.real(path), mode)
        self.disk.created(self.disk.real(path))
        return 0

    @_guarded
    def unlink(self, path: str) -> int:
        self.disk.remove(self.disk.real(path))
        return 0

    @_guarded
    def rmdir(self, path: str) -> int:
        real = self.disk.real(path)
        if not os.path.isdir(real):
            raise OSError(errno.ENOTDIR, path)
        self.disk.remove(real)
        return 0

    @_guarded
    def rename(self, old: str, new: str) -> int:
        self.disk.rename(self.disk.real(old), self.disk.real(new))
        return 0


def _open(real: str, flags: int, mode: int = 0o644) -> int:
    """The backing file opened for reading too (a write saves the bytes it replaces) and without O_APPEND
    (the kernel gives every write its offset)."""
    if flags & os.O_ACCMODE != os.O_RDONLY:
        flags = (flags & ~os.O_ACCMODE) | os.O_RDWR
    return os.open(real, flags & ~os.O_APPEND, mode)


def _serve_control(disk: Disk, lock: threading.Lock, path: str) -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)
    while True:
        conn, _ = server.accept()
        with conn, conn.makefile("rw") as f:
            for line in f:
                command = line.strip()
                with lock:
                    if command == "crash":
                        answer: dict[str, Any] = {"lost": disk.crash(), "by_kind": disk.lost_by_kind}
                    elif command == "sync":
                        disk.dirty.clear()
                        disk.commit()
                        answer = disk.stats()
                    elif command == "stats":
                        answer = disk.stats()
                    else:
                        answer = {"error": f"unknown command {command!r}: stats, sync or crash"}
                f.write(json.dumps(answer) + "\n")
                f.flush()


def serve(backing: str, mount: str, control: str, *, strict: bool = False) -> None:
    """Mount (foreground, single-threaded) until unmounted."""
    import mfusepy as fuse  # type: ignore[import-untyped]

    ops = Ops(Disk(Path(backing), strict=strict))
    threading.Thread(target=_serve_control, args=(ops.disk, ops.lock, control), daemon=True).start()
    # no attribute or name caching in the kernel: every call reaches the model, and no stale view is left
    fuse.FUSE(ops, mount, foreground=True, nothreads=True, hard_remove=True, use_ino=True,
              attr_timeout=0, entry_timeout=0, negative_timeout=0, fsname="lazyfs")


# -- the controller -----------------------------------------------------------------------------------------


class LazyFS:
    """A `serve` process over `backing`, mounted at `mount` (see the module docstring)."""

    def __init__(self, backing: Path, mount: Path, *, strict: bool = False, log: Path | None = None) -> None:
        self.backing, self.mount, self.strict = Path(backing), Path(mount), strict
        self.control = str(self.backing.parent / f".{self.backing.name}.lazyfs.sock")
        self.log = log or self.backing.parent / f"{self.backing.name}.lazyfs.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.lost: list[dict[str, int]] = []  # what each crash dropped
        self.lost_by_kind: list[dict[str, int]] = []  # and in which kind of file (bytes)

    def start(self, timeout: float = 15.0) -> LazyFS:
        """Mount (a new process); returns when the mount and its control socket answer."""
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mount.mkdir(parents=True, exist_ok=True)
        if os.path.exists(self.control):
            os.unlink(self.control)
        args = [sys.executable, __file__, str(self.backing), str(self.mount), "--control", self.control]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(args + (["--strict"] if self.strict else []), stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while not (os.path.ismount(self.mount) and os.path.exists(self.control)):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._reap()
                raise RuntimeError(f"lazyfs did not mount {self.mount}: {self.log.read_text()[-2000:]}")
            time.sleep(0.02)
        return self

    def command(self, command: str) -> dict[str, Any]:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(60)
            s.connect(self.control)
            s.sendall(command.encode() + b"\n")
            answer = b""
            while not answer.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        return dict(json.loads(answer))

    def stats(self) -> dict[str, Any]:
        return self.command("stats")

    def crash(self) -> dict[str, int]:
        """Power lost: drop what was not synced, and unmount (start again to power on). Whatever writes
        to the mount should be dead first (SIGKILL): a process still writing gets EIO."""
        answer = self.command("crash")
        lost = dict(answer["lost"])
        self.lost.append(lost)
        self.lost_by_kind.append(dict(answer["by_kind"]))
        self._unmount()
        return lost

    def stop(self) -> None:
        """A clean shutdown: everything written stays (as a flushed disk's would)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.command("sync")
            except OSError:
                pass
        self._unmount()

    def _unmount(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            # lazily: a killed process's handles may still be closing (and after a crash the mount answers
            # EIO, so os.path.ismount cannot tell)
            subprocess.run(["fusermount3", "-u", "-z", str(self.mount)], capture_output=True, check=False)
        self._reap()

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None


def unavailable() -> str | None:
    """Why a lazyfs cannot be mounted here (None: it can)."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if shutil.which("fusermount3") is None:
        return "no fusermount3 (`make fuse` installs Debian's fuse3)"
    try:
        import mfusepy  # noqa: F401  (raises when libfuse is missing)
    except (ImportError, OSError) as e:
        return f"mfusepy cannot load libfuse: {e}"
    if not stat.S_ISCHR(os.stat("/dev/fuse").st_mode):
        return "/dev/fuse is not a character device"
    return None


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="a FUSE pass-through that loses unsynced writes on command")
    parser.add_argument("backing")
    parser.add_argument("mount")
    parser.add_argument("--control", required=True, help="the Unix socket answering stats, sync, crash")
    parser.add_argument("--strict", action="store_true", help="only a directory's sync commits its names")
    a = parser.parse_args()
    serve(a.backing, a.mount, a.control, strict=a.strict)
