"""The fleet, live: hosts (the partitions and bundles each serves, its runs, its last lease renewal),
workers (the tools each serves, its jobs in flight), queue depths, and the dead letters with their reasons.

    await Fleet(client).read()

Everything is `Client.status` (`sa status --json`) and `Client.dead_letters` (`sa dlq --json`), so the page
and the commands cannot disagree; this module only adds what a page wants at a glance: a host whose
heartbeat (renewed with its leases) is older than its lease TTL is marked `stale` (its leases are about to
go to another host), and a dead letter's age, run and call. The page polls it.
"""

from __future__ import annotations

import json
import time
from typing import Any

from runtime.client import Client

ARGUMENTS_SHOWN = 2000  # characters of a dead job's arguments the page gets


def letter_view(letter: dict[str, Any], now: float) -> dict[str, Any]:
    """One dead letter (`DeadLetter.to_dict`) for the page: its job's run, call and tool, why it died."""
    job = letter.get("job") or {}
    arguments = json.dumps(job.get("arguments"), ensure_ascii=False) if job else ""
    return {**{k: v for k, v in letter.items() if k != "job"},
            "age_s": round(now - letter["dead_at"], 1) if letter.get("dead_at") else None,
            "run_id": job.get("run_id"), "actor": job.get("actor"), "tool": job.get("tool"),
            "call": str(job.get("call_id", "")).rsplit("/", 1)[-1] or None,
            "arguments": arguments[:ARGUMENTS_SHOWN], "readable": bool(job)}


class Fleet:
    """The fleet page's read over one client."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def read(self) -> dict[str, Any]:
        now = time.time()
        status = await self.client.status()
        for host in status["hosts"]:
            age, ttl = host.get("beat_age_s"), host.get("lease_ttl")
            host["stale"] = age is not None and bool(ttl) and age > ttl
        letters = [letter_view(d.to_dict(), now) for d in await self.client.dead_letters()]
        served = {a for h in status["hosts"] for a in h["agents"]}
        agents = sorted(served | set(status.get("unserved_agents") or {}))
        return {**status, "now": now, "dead_letters": letters, "agents": agents}


__all__ = ["Fleet", "letter_view"]
