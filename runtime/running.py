"""What a running `sa up` on this machine tells other processes: where its NATS server and model are.

`sa up` writes a small state file while it runs (`state_file()`: `<user data dir>/structured-agents/up.json`,
e.g. ~/.local/share/structured-agents/up.json on Linux) with the NATS URL, the local model's URL, the
bundles and its pid, and removes it when it stops. Why a module of its own, below the CLI: the CLI is not
the only reader. `Client.connect()` without a URL and `Agent.from_bundle` of a bundle on the `local` model
find the running fleet the same way `sa send` does, so a newcomer's script works beside `sa up` without
being told where anything is. A file whose pid is gone (an `sa up` that was killed) is ignored.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def state_file() -> Path:
    """Where `sa up` records its NATS and model URLs while it runs."""
    import platformdirs

    return Path(platformdirs.user_data_dir("structured-agents")) / "up.json"


def read_state() -> dict[str, Any]:
    """The running `sa up`'s state ({} when there is none, or its process is gone)."""
    try:
        state = json.loads(state_file().read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(state, dict):
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


def running_nats_url() -> str | None:
    """The NATS URL of the `sa up` running here, if one is."""
    url = read_state().get("nats_url")
    return str(url) if url else None


def running_model_url() -> str | None:
    """The local model server's URL of the `sa up` running here, if it started one."""
    url = read_state().get("model_url")
    return str(url) if url else None


__all__ = ["read_state", "running_model_url", "running_nats_url", "state_file"]
