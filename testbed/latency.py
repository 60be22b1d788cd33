"""A user-space TCP proxy that adds network latency: what `netem` would do, for a machine without it.

    async with LatencyProxy("127.0.0.1", 4222, rtt_ms=5) as proxy:   # proxy.url: nats://127.0.0.1:<port>
        ...                                                          # connect through it
    python -m testbed.latency --target 127.0.0.1:4222 --rtt-ms 5 [--port-file F]   # its own process

Why: a tool turn's cost in round trips to NATS is invisible on loopback (a round trip there is ~0.1 ms, lost
in the CPU time around it). With every process talking to NATS through this proxy, each sequential round trip
costs the injected RTT, so the slope of a turn's time against the RTT counts them (`bench/latency.py`).
The `netem` qdisc is missing on the development machine and CI, hence a proxy.

How: one listening port; each accepted connection gets its own connection to the target, and each direction
its own pump. A chunk read at time t is written at t + RTT/2 (one-way delay), by a writer that takes chunks in
arrival order: each chunk waits for its own due time, not for a sleep after the previous one, so bytes keep
their order on the connection and the throughput is not capped by the delay (a chunk that arrives while
another waits is already on its way). A connection closed on one side is closed on the other once the bytes
before the close are delivered.

Beware clusters: a NATS client learns the other servers of a cluster from INFO's `connect_urls` and may reach
them directly, around the proxy. Put the proxy in front of a single server (no cluster), as the bench does.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import socket
import sys
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any

CHUNK = 64 * 1024


class LatencyProxy:
    """Forwards `127.0.0.1:<port>` to `target_host:target_port`, each direction `rtt_ms / 2` late."""

    def __init__(self, target_host: str, target_port: int, *, rtt_ms: float, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        if rtt_ms < 0:
            raise ValueError("the round trip to add cannot be negative")
        self.target = (target_host, target_port)
        self.one_way = rtt_ms / 2000.0
        self.host, self.port = host, port
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    async def start(self) -> LatencyProxy:
        self._server = await asyncio.start_server(self._accept, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for w in list(self._writers):
            w.close()
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def __aenter__(self) -> LatencyProxy:
        return await self.start()

    async def __aexit__(self, t: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for w in (writer, up_writer):
            self._writers.add(w)
            sock = w.get_extra_info("socket")
            if sock is not None:  # every chunk out at once: the delay is ours, not Nagle's
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ends = [2]  # directions still open: both sockets are closed once both ended
        self._spawn(self._pipe(reader, up_writer, ends, (writer, up_writer)))
        self._spawn(self._pipe(up_reader, writer, ends, (writer, up_writer)))

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ends: list[int],
                    both: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        """Read chunks as they come and hand each to the writer with its due time (arrival + one way)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        self._spawn(self._deliver(queue, writer, ends, both))
        try:
            while True:
                data = await reader.read(CHUNK)
                queue.put_nowait((loop.time() + self.one_way, data))
                if not data:  # end of stream: passed on after the bytes before it
                    return
        except OSError:
            queue.put_nowait((loop.time() + self.one_way, b""))

    async def _deliver(self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter,
                       ends: list[int], both: tuple[asyncio.StreamWriter, asyncio.StreamWriter]) -> None:
        """Write each chunk at its due time, in arrival order; at the end of stream, half-close this
        direction (the other may still be sending), and close both sockets once both directions ended."""
        loop = asyncio.get_running_loop()
        try:
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                if not data:
                    if writer.can_write_eof():
                        writer.write_eof()
                    return
                writer.write(data)
                await writer.drain()
        except OSError:
            ends[0] = 1  # a broken socket ends both directions
        finally:
            ends[0] -= 1
            if ends[0] <= 0:
                for w in both:
                    self._writers.discard(w)
                    w.close()


async def _serve(target: str, rtt_ms: float, port: int, port_file: Path | None) -> None:
    host, _, port_text = target.rpartition(":")
    proxy = await LatencyProxy(host or "127.0.0.1", int(port_text), rtt_ms=rtt_ms, port=port).start()
    if port_file is not None:  # written whole, then renamed: a reader never sees half a port
        tmp = port_file.with_suffix(".tmp")
        tmp.write_text(str(proxy.port))
        tmp.replace(port_file)
    print(f"latency proxy: {proxy.url} -> {target}, +{rtt_ms:g} ms round trip", file=sys.stderr, flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="a TCP proxy adding a round-trip delay (RTT/2 each way)")
    ap.add_argument("--target", required=True, help="host:port to forward to")
    ap.add_argument("--rtt-ms", type=float, required=True, help="round trip to add, in ms")
    ap.add_argument("--port", type=int, default=0, help="port to listen on (0: any free one)")
    ap.add_argument("--port-file", type=Path, help="write the port listened on here once listening")
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.target, args.rtt_ms, args.port, args.port_file))


__all__ = ["LatencyProxy", "main"]

if __name__ == "__main__":
    main()
