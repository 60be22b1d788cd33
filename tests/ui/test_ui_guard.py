"""The inspector's door (`runtime.ui.guard`), over real HTTP on a real nats-server: a request naming a
Host the app was not bound to (what a DNS-rebinding page sends) is refused before anything is read, a
command from another origin is refused before it is read, and the inspector's own names, its own pages
and programs without an Origin still get through. The names it answers to are a pure function, tested
without a server."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import httpx
import pytest
from ui_helpers import serving

from runtime.client import Client
from runtime.nats.topology import ensure_topology
from runtime.ui.app import create_app
from runtime.ui.guard import allowed_hosts, host_name

# what cancelling a run that is not there answers: a request that reached the command itself
NO_RUN = {"error": "unknown run 'r1': it has no events (list runs with `sa runs`)"}


def test_the_names_an_inspector_answers_to_follow_its_bind_address():
    assert allowed_hosts("127.0.0.1") == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("::1") == {"127.0.0.1", "localhost", "::1"}
    assert allowed_hosts("localhost", ["Inspector.Example:443"]) == {"127.0.0.1", "localhost", "::1",
                                                                      "inspector.example"}
    # every interface: loopback answers too, and the names the user gives
    assert allowed_hosts("0.0.0.0", ["box.lan"]) == {"0.0.0.0", "127.0.0.1", "localhost", "::1", "box.lan"}
    # one other interface: that address and nothing else unless named
    assert allowed_hosts("192.168.1.5") == {"192.168.1.5"}
    assert host_name("[::1]:8377") == "::1" and host_name("LOCALHOST:1") == "localhost"
    for junk in ("", "a b", "x/y", "user@host", "host:port", "[::zz]"):
        with pytest.raises(ValueError, match="is not a host name"):
            allowed_hosts("127.0.0.1", [junk])


async def _get(base: str, path: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        return await client.get(path, headers=headers)


async def _post(base: str, path: str, body: Any, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        return await client.post(path, json=body, headers=headers)


def _raw(base: str, request: bytes) -> bytes:
    """`request` sent as is (httpx always adds a Host header), the whole answer back."""
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.anyio
async def test_a_foreign_host_is_refused_and_a_cross_origin_command_too(nats_server, nc, js):
    await ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    app = create_app(client=Client(nc), allow_hosts=["inspector.example"])
    async with serving(app) as base:
        port = base.rsplit(":", 1)[1]

        # -- Host: what a DNS-rebinding page sends is refused, saying what would be answered -------------
        rebound = await _get(base, "/api/runs", Host=f"attacker.example:{port}")
        assert rebound.status_code == 400, rebound.text
        message = rebound.json()["error"]
        assert f"not to the Host 'attacker.example:{port}'" in message
        assert "127.0.0.1, [::1], inspector.example, localhost" in message
        assert "`sa ui --allow-host attacker.example`" in message
        assert "script-src 'self'" in rebound.headers["content-security-policy"]
        for path in ("/", "/runs/r1", "/api/health", "/static/index.js", "/api/runs/r1/follow", "/pending",
                     "/fleet", "/schedules", "/agents/calc", "/api/pending", "/api/fleet", "/api/schedules",
                     "/api/agents/calc", "/runs/r1/waterfall", "/api/runs/r1/waterfall",
                     "/api/runs/r1/conversation"):
            assert (await _get(base, path, Host="attacker.example")).status_code == 400, path
        assert (await _post(base, "/api/runs/r1/cancel", {}, Host="attacker.example")).status_code == 400
        for name in ("127.0.0.1", "localhost", "LocalHost", "[::1]", "inspector.example"):
            answered = await _get(base, "/api/runs", Host=f"{name}:{port}")
            assert answered.status_code == 200 and answered.json()["runs"] == [], (name, answered.text)
        nameless = await anyio.to_thread.run_sync(_raw, base, b"GET /api/runs HTTP/1.0\r\n\r\n")
        assert nameless.startswith(b"HTTP/1.1 400") and b"not to the Host ''" in nameless

        # -- Origin: a command from any other origin is refused before its body is read ------------------
        cancel = "/api/runs/r1/cancel"
        for origin in ("http://attacker.example", f"http://attacker.example:{port}", "http://127.0.0.1:1",
                       "null"):
            refused = await _post(base, cancel, {"reason": "x"}, Origin=origin)
            assert refused.status_code == 403, (origin, refused.text)
            assert refused.json()["error"] == (
                f"a POST from another origin is refused (Origin: {origin!r}; this inspector is at "
                f"'127.0.0.1:{port}'): commands are taken only from the inspector's own pages")
        by_referer = await _post(base, cancel, {"reason": "x"}, Referer="http://attacker.example/page")
        assert by_referer.status_code == 403 and "(Referer: 'http://attacker.example/page'" in \
            by_referer.json()["error"]
        async with httpx.AsyncClient(base_url=base, timeout=30) as client:  # not JSON: refused even so
            form = await client.post(cancel, content="reason=x", headers={
                "Origin": "http://attacker.example", "Content-Type": "application/x-www-form-urlencoded"})
        assert form.status_code == 403
        replay = await _post(base, "/api/dead-letters/1/replay", {}, Origin="http://attacker.example")
        assert replay.status_code == 403 and "another origin" in replay.json()["error"]  # the new command too
        for page in ("/pending", "/fleet", "/schedules", "/agents/calc", "/runs/r1/waterfall",
                     "/runs/r1/conversation"):
            served = await _get(base, page)
            assert served.status_code == 200, page
            assert "script-src 'self'" in served.headers["content-security-policy"]

        # the inspector's own origin, by any of its names, and a program (no Origin, no Referer) get
        # through to the command itself, which answers that the run is not there
        for origin, host in ((f"http://127.0.0.1:{port}", f"127.0.0.1:{port}"),
                             (f"http://localhost:{port}", f"localhost:{port}"),
                             (f"https://inspector.example:{port}", f"inspector.example:{port}"),
                             (f"http://[::1]:{port}", f"[::1]:{port}")):
            own = await _post(base, cancel, {"reason": "x"}, Origin=origin, Host=host)
            assert own.json() == NO_RUN, (origin, own.text)
        assert (await _post(base, cancel, {"reason": "x"})).json() == NO_RUN
        assert (await _post(base, cancel, {"reason": "x"}, Referer=f"{base}/runs/r1")).json() == NO_RUN


def test_create_app_refuses_a_name_that_is_not_a_host_name():
    with pytest.raises(ValueError, match="'a/b' is not a host name"):
        create_app("nats://127.0.0.1:4222", allow_hosts=["a/b"])
