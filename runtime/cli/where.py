"""Where things are, for every `sa` command that talks to NATS or loads bundles.

The NATS server: `--nats`, else `NATS_URL`, else the state file a running `sa up` writes
(`<user data dir>/structured-agents/up.json`, e.g. ~/.local/share/structured-agents/up.json on Linux;
it holds the NATS URL, the local model URL, the bundles and the pid, and is removed when `sa up` stops).
A state file whose pid is gone (an `sa up` that was killed) is ignored.

Bundles: a bundle.yaml file or a folder holding one; with no argument, `bundles/demo` of the current
directory.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import typer

BUNDLE_FILE = "bundle.yaml"
DEFAULT_BUNDLE = Path("bundles/demo")


def state_file() -> Path:
    """Where `sa up` records its NATS and model URLs while it runs."""
    import platformdirs

    return Path(platformdirs.user_data_dir("structured-agents")) / "up.json"


def read_state() -> dict[str, Any]:
    """The running `sa up`'s state ({} when there is none, or its process is gone)."""
    path = state_file()
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    pid = state.get("pid")
    if isinstance(pid, int):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return {}  # a stale file from an `sa up` that was killed
        except PermissionError:
            pass
    return state


def resolve_nats(explicit: str | None, command: str) -> str:
    """`--nats`/NATS_URL, else the running `sa up`; exit 2 with what to do if there is neither."""
    url = explicit or read_state().get("nats_url")
    if not url:
        typer.echo(f"sa {command}: no NATS server: start one with `sa up`, or set NATS_URL "
                   "(or pass --nats nats://host:4222)", err=True)
        raise typer.Exit(2)
    return str(url)


def bundle_paths(bundles: list[Path]) -> list[Path]:
    """The bundles `sa up` / `sa host` serve; `bundles/demo` when none is given."""
    if bundles:
        return bundles
    if (DEFAULT_BUNDLE / BUNDLE_FILE).is_file():
        return [DEFAULT_BUNDLE]
    typer.echo("no bundle given (and no bundles/demo here): pass bundle.yaml files or folders", err=True)
    raise typer.Exit(2)


__all__ = ["bundle_paths", "read_state", "resolve_nats", "state_file"]
