"""How an `sa` command reaches runs: one `runtime.client.Client` per command, and nothing else.

    async with client_for(url, "send") as client:          # a command with several async steps
        handle = await client.start("calc", "6 * 7")
    runs = with_client(url, "runs", lambda c: c.runs())     # a command with one

Why one helper: every command that reads or changes a run (send, runs, replay, fork, cancel, approvals,
threads, status) goes through the client, so what `sa` can do a program can do the same way, and the
connection is named after the command (`sa-send`: what `nats server report connections` shows) and
closed when the command ends, whatever happened. The client is imported when a command runs, not when
`sa` starts, so `sa run SCRIPT` does not load the NATS client.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from runtime.client import Client

T = TypeVar("T")


@asynccontextmanager
async def client_for(url: str, command: str) -> AsyncIterator[Client]:
    """A client connected to `url` as `sa-<command>`, closed on the way out."""
    from runtime.client import Client

    client = await Client.connect(url, name=f"sa-{command}")
    try:
        yield client
    finally:
        await client.close()


async def unserved(client: Client, agent: str) -> str | None:
    """When no live host serves `agent`'s bundle: the bundles served now, for a warning (an agent's tasks
    and fires wait in the stream until a host serving it starts, which otherwise looks like a hang, and a
    misspelt agent looks the same); None when one does, or when this role may not read the hosts' beats."""
    bundle = agent.split(":")[0]
    try:
        served = await client.served()
    except Exception:  # a role that may not read the hosts' beats: nothing to say
        return None
    return None if bundle in served else ", ".join(sorted(served)) or "none"


def with_client(url: str, command: str, op: Callable[[Client], Awaitable[T]]) -> T:
    """Run `op(client)` to its end on a client of its own (`client_for`); its result."""
    import anyio

    async def main() -> T:
        async with client_for(url, command) as client:
            return await op(client)

    return anyio.run(main, backend="asyncio")


__all__ = ["client_for", "unserved", "with_client"]
