"""A candidate bundle shipped to the fleet: its files packed into the object store, unpacked by a host.

    name = await ship(js, candidate.bundle)          # the client: pack, check, store (once per content)
    folder = await unpack(js, name, into)            # a host: the same bundle file, loadable there

A regression's candidate is a bundle the fleet does not serve (tomorrow's version, on someone's laptop or in a
CI job), and the hosts that drive its runs need its files. Hosts load bundles from folders; nothing else in
the fleet carries bundles. So the client packs what the bundle is made of into one archive in the
``regress_candidates`` object store, named by the archive's hash (the same candidate twice is stored once),
and a host unpacks it into a folder of its own and loads it there with the same `load_bundle`.

What is packed: every file under the bundle's folder (not `__pycache__`, hidden folders, virtualenvs), and
each tool source or static data folder it names outside it (`../../agents/summarize.pym`), all laid out
relative to their common folder so that the bundle file's relative paths still resolve. Why checked before it
is stored: a bundle may reach further than that (a prompt file two folders up, a Python module imported from
the client's own `PYTHONPATH`), and a host that loaded another bundle than the client did would regress the
wrong thing. So the archive is unpacked and loaded here first, and it must load with the very digest the
client loaded; otherwise `RegressError` says so (drive it in process: `--local`).

A Python tool's module is imported by name, and a host that already imported a module of that name (the
production bundle's) keeps it: such a tool is never called in a regression unless its rule says `run`.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path

from nats.js import JetStreamContext
from nats.js.errors import NotFoundError
from nats.js.object_store import ObjectStore

from runtime.bundle import Bundle, BundleError, load_bundle
from runtime.regress.sets import RegressError
from runtime.tools import ScriptTool

STORE = "regress_candidates"
MANIFEST = ".sa-candidate.json"
MAX_BYTES = 64 * 1024 * 1024  # a candidate bigger than this is not a bundle but a folder someone pointed at
SKIPPED = {"__pycache__", ".git", ".venv", "venv", "node_modules", ".mypy_cache", ".ruff_cache",
           ".pytest_cache"}


async def store(js: JetStreamContext) -> ObjectStore:
    """The candidates' object store (made by the first regression that ships one)."""
    try:
        return await js.object_store(STORE)
    except NotFoundError:
        return await js.create_object_store(STORE, description="regression candidates, by content")


def _files(bundle: Bundle) -> list[Path]:
    """What the bundle is made of (see the module docstring), absolute."""
    roots = [bundle.root.resolve()]
    if bundle.data_provider.folder is not None:
        roots.append(Path(bundle.data_provider.folder).resolve())
    found: set[Path] = set()
    for root in roots:
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in SKIPPED and not d.startswith(".")]
            found.update(Path(folder) / n for n in names if not n.endswith((".pyc", ".pyo")))
    for tool in bundle.tools.values():
        if isinstance(tool, ScriptTool):
            found.add(Path(str(tool.path)).resolve())
    return sorted(found)


def pack(bundle: Bundle) -> bytes:
    """The bundle's files as one gzipped tar (deterministic: the same files, the same bytes), with a
    manifest naming the bundle file inside it."""
    files = _files(bundle)
    yaml = bundle.path.resolve()
    base = Path(os.path.commonpath([str(yaml.parent), *(str(f.parent) for f in files)]))
    size = sum(f.stat().st_size for f in files)
    if size > MAX_BYTES:
        raise RegressError(f"the candidate bundle at {bundle.root} holds {size} bytes of files, more than "
                           f"{MAX_BYTES} can be shipped to the fleet: regress it in process (--local)")
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime, info.mode = len(data), 0, 0o644
            tar.addfile(info, io.BytesIO(data))

        add(MANIFEST, json.dumps({"bundle": yaml.relative_to(base).as_posix()}).encode())
        for f in files:
            add(f.relative_to(base).as_posix(), f.read_bytes())
    return out.getvalue()


def unpacked(archive: bytes, into: Path) -> Path:
    """Unpack `archive` into `into`; the bundle file's path there."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        tar.extractall(into, filter="data")
    manifest = json.loads((into / MANIFEST).read_text())
    return into / manifest["bundle"]


async def ship(js: JetStreamContext, bundle: Bundle) -> str:
    """Store `bundle` for the fleet's hosts (checked first: see the module docstring); its name there."""
    archive = pack(bundle)
    with tempfile.TemporaryDirectory(prefix="sa-candidate-") as tmp:
        try:
            again = load_bundle(unpacked(archive, Path(tmp)))
        except (BundleError, OSError, ValueError) as e:
            raise RegressError(f"the candidate bundle at {bundle.root} cannot be shipped to the fleet: it "
                               f"does not load from its own files ({e}); regress it in process (--local)"
                               ) from None
    if again.digest != bundle.digest:
        raise RegressError(f"the candidate bundle at {bundle.root} cannot be shipped to the fleet: it reads "
                           "files outside its folder and its tools' sources (loaded from its own files it is "
                           "another bundle); regress it in process (--local)")
    name = "c" + hashlib.sha256(archive).hexdigest()[:32]
    objects = await store(js)
    try:
        await objects.get_info(name)
    except NotFoundError:
        await objects.put(name, archive)
    return name


async def unpack(js: JetStreamContext, name: str, into: Path) -> Path:
    """Fetch candidate `name` and unpack it into `into` (a host's own folder); its bundle file."""
    result = await (await store(js)).get(name)
    if result.data is None:
        raise RegressError(f"candidate {name} is not in the fleet's object store {STORE}")
    return unpacked(result.data, into)


__all__ = ["STORE", "pack", "ship", "unpack", "unpacked"]
