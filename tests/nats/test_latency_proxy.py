"""The latency proxy (`testbed.latency`) that `bench/latency.py` puts between every process and NATS:
it must pass bytes intact and in order (a NATS connection through it works), and it must really delay them.
The delay is proved by order, never by a clock threshold: a reply sent through the proxy at the same moment
as one sent directly comes back after it."""

from __future__ import annotations

import asyncio
import random

import pytest
from nats_fixtures import nats_server  # noqa: F401

from runtime.nats.connection import connect
from runtime.nats.server import EmbeddedNats
from testbed.latency import LatencyProxy

pytestmark = pytest.mark.anyio


async def _echo_server() -> tuple[asyncio.base_events.Server, int]:
    async def echo(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(echo, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_bytes_arrive_intact_and_in_order():
    server, port = await _echo_server()
    rng = random.Random(7)
    payload = rng.randbytes(3 * 1024 * 1024)
    async with LatencyProxy("127.0.0.1", port, rtt_ms=2) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)

        async def send() -> None:
            at = 0
            while at < len(payload):  # chunks of many sizes, so the proxy sees many reads
                size = rng.choice((1, 7, 100, 1500, 65536, 200_000))
                writer.write(payload[at:at + size])
                at += size
                await writer.drain()
            writer.write_eof()

        sender = asyncio.create_task(send())
        got = await reader.read(-1)  # until the proxy passes on the echo server's close
        await sender
        writer.close()
    server.close()
    assert got == payload


async def test_a_reply_through_the_proxy_comes_after_one_sent_directly_at_the_same_moment():
    server, port = await _echo_server()
    async with LatencyProxy("127.0.0.1", port, rtt_ms=40) as proxy:
        slow_r, slow_w = await asyncio.open_connection("127.0.0.1", proxy.port)
        fast_r, fast_w = await asyncio.open_connection("127.0.0.1", port)
        order: list[str] = []

        async def ask(name: str, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            w.write(name.encode())
            await w.drain()
            assert await r.readexactly(len(name)) == name.encode()
            order.append(name)

        # the proxied one is sent first: it still comes back second
        await asyncio.gather(ask("proxied", slow_r, slow_w), ask("direct", fast_r, fast_w))
        for w in (slow_w, fast_w):
            w.close()
    server.close()
    assert order == ["direct", "proxied"]


async def test_a_nats_connection_works_through_it(nats_server: EmbeddedNats):  # noqa: F811
    host, _, port = nats_server.url.removeprefix("nats://").rpartition(":")
    async with LatencyProxy(host, int(port), rtt_ms=5) as proxy:
        slow = await connect(proxy.url, name="through-proxy")
        fast = await connect(nats_server.url, name="direct")
        try:
            async def answer(msg) -> None:
                await msg.respond(msg.data[::-1])

            await fast.subscribe("echo", cb=answer)
            await fast.flush()
            replies = [await slow.request("echo", f"m{i}".encode(), timeout=10) for i in range(20)]
            assert [r.data for r in replies] == [f"m{i}".encode()[::-1] for i in range(20)]
            assert slow.connected_url is not None and slow.connected_url.port == proxy.port
        finally:
            await slow.close()
            await fast.close()
