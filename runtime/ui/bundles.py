"""The bundles the inspector shows: loaded from the path the runs index names, when this machine can read it.

    bundles = Bundles()
    found = await bundles.load("/srv/agents/calc/bundle.yaml")   # Loaded(bundle=..., problem=None)

A run's index entry names the bundle file its host loaded (`RunIndex.bundle`). The inspector may run on
another machine, or after the file changed or went away, so a load is allowed to fail: `problem` then says
why, in a sentence a page can show, and the page says what it cannot know. A bundle is read again only
when its file changed (its modification time), and read in a worker thread: loading one reads every tool
source, and imports its `externals` module, as `sa replay --verify` does with the same path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import anyio

from runtime.bundle import Bundle, BundleError, load_bundle


@dataclass(frozen=True)
class Loaded:
    """A bundle loaded from `path`, or the `problem` that kept it from loading."""

    path: str
    bundle: Bundle | None = None
    problem: str | None = None


def _stamp(path: str) -> float | None:
    target = os.path.join(path, "bundle.yaml") if os.path.isdir(path) else path
    try:
        return os.stat(target).st_mtime
    except OSError:
        return None


def _load(path: str) -> Loaded:
    try:
        return Loaded(path, bundle=load_bundle(path))
    except BundleError as e:
        return Loaded(path, problem=f"the bundle at {path} does not load here: {e}")
    except Exception as e:  # a file gone, unreadable, an externals module failing to import
        return Loaded(path, problem=f"the bundle at {path} cannot be read on the inspector's machine "
                                    f"({type(e).__name__}: {e})")


class Bundles:
    """Bundles by path, each read again only when its file changed."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[float | None, Loaded]] = {}

    async def load(self, path: str | None) -> Loaded:
        if not path:
            return Loaded("", problem="the runs index names no bundle file for this run")
        stamp = _stamp(path)
        held = self._held.get(path)
        if held is not None and held[0] == stamp and stamp is not None:
            return held[1]
        if stamp is None:
            return Loaded(path, problem=f"the bundle at {path} is not on the inspector's machine (the run's "
                                        "host read it; run `sa ui` where the bundles are to see it)")
        loaded = await anyio.to_thread.run_sync(_load, path)
        self._held[path] = (stamp, loaded)
        return loaded


__all__ = ["Bundles", "Loaded"]
