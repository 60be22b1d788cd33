"""The power-loss file system itself (`testbed.lazyfs`): what a crash keeps and what it loses, through a real
FUSE mount, for the model its docstring decides. If this file system lost too little, the power-loss bed
(tests/system/test_powerloss.py) would prove nothing; if it lost too much, the bed would blame the runtime
for the file system's fault. Needs /dev/fuse, fusermount3 and libfuse3 (`make fuse`); skipped otherwise."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.lazyfs import PAGE, LazyFS, unavailable

WHY_NOT = unavailable()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"no FUSE here: {WHY_NOT}")


def _fs(tmp_path: Path, strict: bool) -> Iterator[tuple[LazyFS, Path]]:
    fs = LazyFS(tmp_path / "disk", tmp_path / "mnt", strict=strict).start()
    try:
        yield fs, fs.mount
    finally:
        fs.stop()


@pytest.fixture
def lazy(tmp_path: Path) -> Iterator[tuple[LazyFS, Path]]:
    yield from _fs(tmp_path, strict=False)


@pytest.fixture
def strict(tmp_path: Path) -> Iterator[tuple[LazyFS, Path]]:
    yield from _fs(tmp_path, strict=True)


def power_cycle(fs: LazyFS) -> dict[str, int]:
    lost = fs.crash()
    fs.start()
    return lost


def write(path: Path, data: bytes, *, sync: bool, offset: int | None = None, mode: str = "ab") -> None:
    with open(path, mode) as f:
        if offset is not None:
            f.seek(offset)
        f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def test_synced_writes_survive_and_unsynced_ones_are_lost(lazy):
    fs, mnt = lazy
    write(mnt / "blk", b"a" * 5000, sync=True)
    write(mnt / "blk", b"b" * 3000, sync=False)  # an append after the sync
    assert (mnt / "blk").read_bytes() == b"a" * 5000 + b"b" * 3000  # read back before the loss: all there
    lost = power_cycle(fs)
    assert (mnt / "blk").read_bytes() == b"a" * 5000
    assert lost["bytes"] == 3000 and lost["files"] == 1


def test_an_unsynced_overwrite_inside_synced_data_is_undone_page_by_page(lazy):
    fs, mnt = lazy
    original = bytes(range(256)) * (3 * PAGE // 256)
    write(mnt / "blk", original, sync=True, mode="wb")
    write(mnt / "blk", b"X" * 10, sync=False, offset=PAGE - 5, mode="r+b")  # across two pages
    write(mnt / "blk", b"Y" * 2 * PAGE, sync=False, offset=2 * PAGE, mode="r+b")  # over the end too
    power_cycle(fs)
    assert (mnt / "blk").read_bytes() == original


def test_a_synced_overwrite_survives(lazy):
    fs, mnt = lazy
    write(mnt / "blk", b"a" * 100, sync=True, mode="wb")
    write(mnt / "blk", b"b" * 10, sync=True, offset=20, mode="r+b")
    power_cycle(fs)
    assert (mnt / "blk").read_bytes() == b"a" * 20 + b"b" * 10 + b"a" * 70


def test_an_unsynced_truncate_is_undone(lazy):
    fs, mnt = lazy
    write(mnt / "blk", b"0123456789" * 1000, sync=True, mode="wb")
    os.truncate(mnt / "blk", 7)
    assert (mnt / "blk").stat().st_size == 7
    power_cycle(fs)
    assert (mnt / "blk").read_bytes() == b"0123456789" * 1000


def test_a_file_never_synced_is_gone_and_one_whose_name_committed_comes_back_empty(lazy):
    fs, mnt = lazy
    write(mnt / "never", b"lost", sync=False)
    power_cycle(fs)
    assert not (mnt / "never").exists()
    # ext4's journal: a later sync of another file commits the name, not this file's data
    write(mnt / "named", b"data not synced", sync=False)
    write(mnt / "other", b"x", sync=True)
    power_cycle(fs)
    assert (mnt / "named").read_bytes() == b""
    assert (mnt / "other").read_bytes() == b"x"


def test_an_unsynced_unlink_and_rename_are_undone(lazy):
    fs, mnt = lazy
    write(mnt / "keep", b"kept", sync=True)
    write(mnt / "old", b"renamed", sync=True)
    write(mnt / "target", b"overwritten by the rename", sync=True)
    os.unlink(mnt / "keep")
    os.rename(mnt / "old", mnt / "target")
    (mnt / "dir").mkdir()
    assert sorted(os.listdir(mnt)) == ["dir", "target"]
    lost = power_cycle(fs)
    assert sorted(os.listdir(mnt)) == ["keep", "old", "target"]
    assert (mnt / "keep").read_bytes() == b"kept"
    assert (mnt / "old").read_bytes() == b"renamed"
    assert (mnt / "target").read_bytes() == b"overwritten by the rename"
    assert lost["name_ops"] >= 4 and lost["undo_errors"] == 0


def test_a_sync_commits_every_earlier_name_by_default(lazy):
    fs, mnt = lazy
    write(mnt / "a", b"a", sync=True)
    os.rename(mnt / "a", mnt / "b")
    write(mnt / "c", b"c", sync=True)  # any sync commits the journal, the rename with it
    power_cycle(fs)
    assert sorted(os.listdir(mnt)) == ["b", "c"]


def test_strict_a_rename_needs_its_directory_synced(strict):
    fs, mnt = strict
    (mnt / "d").mkdir()
    dfd = os.open(mnt, os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)  # the root: commits the mkdir
    os.close(dfd)
    write(mnt / "d" / "a", b"a", sync=True)
    power_cycle(fs)
    assert os.listdir(mnt / "d") == []  # the file's data was synced, its name in d never was

    write(mnt / "d" / "a", b"a", sync=True)
    dfd = os.open(mnt / "d", os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.rename(mnt / "d" / "a", mnt / "d" / "b")
    write(mnt / "d" / "b", b"b", sync=True)  # a file sync does not commit the rename
    os.close(dfd)
    power_cycle(fs)
    assert os.listdir(mnt / "d") == ["a"]
    assert (mnt / "d" / "a").read_bytes() == b"ab"  # its data sync held, under the old name

    os.rename(mnt / "d" / "a", mnt / "d" / "b")
    dfd = os.open(mnt / "d", os.O_RDONLY | os.O_DIRECTORY)
    os.fsync(dfd)
    os.close(dfd)
    power_cycle(fs)
    assert os.listdir(mnt / "d") == ["b"]


def test_a_clean_stop_keeps_everything(tmp_path):
    fs = LazyFS(tmp_path / "disk", tmp_path / "mnt").start()
    write(fs.mount / "blk", b"unsynced but flushed at shutdown", sync=False)
    fs.stop()
    fs.start()
    try:
        assert (fs.mount / "blk").read_bytes() == b"unsynced but flushed at shutdown"
    finally:
        fs.stop()


def test_after_a_crash_the_mount_refuses_writes(lazy):
    fs, mnt = lazy
    f = open(mnt / "blk", "wb")  # a writer that was not killed first
    fs.command("crash")
    with pytest.raises(OSError):
        f.write(b"x")
        f.flush()
    with pytest.raises(OSError):
        f.close()
