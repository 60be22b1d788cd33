"""The read-only in-memory filesystem (and environment) a script sees.

`files` maps virtual paths to contents (`{"/data/notes.txt": "...", "/data/img.bin": b"..."}`; relative
paths are placed under `/`). Scripts read them with `open`, `pathlib.Path` and `os.listdir`/`os.walk`;
`environ` feeds `os.environ` / `os.getenv`. Nothing touches the host disk. Writes are refused: a script
returns the changes it wants and the host persists them (scripts are pure functions).
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any, NoReturn

from pydantic_monty import MemoryFile, MontyFileHandle, OSAccess

__all__ = ["READ_ONLY_HINT", "ReadOnlyFS", "make_fs"]

READ_ONLY_HINT = (
    "scripts cannot write files; return the changes you want in the result and the host applies them"
)


def _deny(path: Any = None) -> NoReturn:
    where = f": {str(getattr(path, 'path', path))!r}" if path is not None else ""
    raise PermissionError(f"[Errno 30] Read-only file system{where} ({READ_ONLY_HINT})")


class ReadOnlyFS(OSAccess):
    """`OSAccess` over `MemoryFile`s with every write refused (`permissions` is not enforced upstream)."""

    def path_write_text(self, path: Any, data: str) -> int:
        _deny(path)

    def path_write_bytes(self, path: Any, data: bytes) -> int:
        _deny(path)

    def path_append_text(self, path: Any, data: str) -> int:
        _deny(path)

    def path_append_bytes(self, path: Any, data: bytes) -> int:
        _deny(path)

    def path_mkdir(self, path: PurePosixPath, parents: bool, exist_ok: bool) -> None:
        _deny(path)

    def path_unlink(self, path: PurePosixPath) -> None:
        _deny(path)

    def path_rmdir(self, path: PurePosixPath) -> None:
        _deny(path)

    def path_rename(self, path: PurePosixPath, target: PurePosixPath) -> None:
        _deny(path)

    def path_open(self, path: PurePosixPath, mode: str) -> MontyFileHandle:
        if not mode.startswith("r") or "+" in mode:
            _deny(path)
        return super().path_open(path, mode)

    def listing(self, limit: int = 12) -> list[str]:
        """Some file paths, for error messages ("available files: ...")."""
        paths = sorted(str(f.path) for f in self.files)
        return paths[:limit] + ([f"... {len(paths) - limit} more"] if len(paths) > limit else [])


def make_fs(files: dict[str, str | bytes] | None, environ: dict[str, str] | None) -> ReadOnlyFS:
    """A fresh filesystem for one run. Raises ValueError for contents that are not str/bytes or clashing
    paths (a file where a directory is needed)."""
    entries = []
    for path, content in (files or {}).items():
        if not isinstance(content, (str, bytes)):
            raise ValueError(f"file {path!r}: content must be str or bytes, not {type(content).__name__}")
        entries.append(MemoryFile(path if str(path).startswith("/") else "/" + str(path), content))
    env = {str(k): str(v) for k, v in (environ or {}).items()}
    return ReadOnlyFS(entries, environ=env)
