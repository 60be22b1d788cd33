"""Ways to run the server: blocking (the CLI), on a thread in this process, or as a child process.

`sa up` and tests of other subsystems need a live endpoint without caring how it runs. The child process is
the better default for them: torch's thread settings and ~300 MB of weights stay out of the caller, and
stopping it frees everything. The in-thread form suits a caller that already pays for torch (the bench).
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from runtime.modelserver.app import SERVED_MODEL_NAME, create_app

log = logging.getLogger("runtime.modelserver")

READY_PREFIX = "sa-model-server ready at "


def build_engine(
    model_path: Path | None = None, *, threads: int | None = None, default_max_tokens: int = 512,
    any_whitespace: bool = False,
) -> Any:
    """Load the model (converting the GGUF on first use) and wrap it in an `Engine`."""
    from runtime.modelserver.engine import Engine
    from runtime.modelserver.weights import load_model

    return Engine(load_model(model_path, threads=threads), default_max_tokens=default_max_tokens,
                  any_whitespace=any_whitespace)


def _bind(host: str, port: int) -> socket.socket:
    """Bind before starting uvicorn so that port 0 works and the real port is known up front."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


def _url(host: str, sock: socket.socket) -> str:
    port = sock.getsockname()[1]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def serve(
    host: str = "127.0.0.1",
    port: int = 8000,
    *,
    model_path: Path | None = None,
    model_name: str = SERVED_MODEL_NAME,
    default_max_tokens: int = 512,
    any_whitespace: bool = False,
) -> None:
    """Load the model and serve until interrupted. Prints `READY_PREFIX + url` on stdout once listening."""
    import uvicorn

    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log.setLevel(logging.INFO)
    sock = _bind(host, port)
    engine = build_engine(model_path, default_max_tokens=default_max_tokens, any_whitespace=any_whitespace)
    app = create_app(engine, model_name=model_name)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2))

    async def run() -> None:
        serving = asyncio.ensure_future(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started:
            print(f"{READY_PREFIX}{_url(host, sock)} (model {model_name})", flush=True)
        await serving

    asyncio.run(run())


@dataclass
class ServerHandle:
    """A server running on a thread of this process. `stop()` shuts it down and joins the thread."""

    base_url: str
    engine: Any
    _server: Any = field(repr=False)
    _thread: threading.Thread = field(repr=False)

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)


def serve_in_thread(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    engine: Any | None = None,
    model_path: Path | None = None,
    model_name: str = SERVED_MODEL_NAME,
    start_timeout: float = 30.0,
) -> ServerHandle:
    """Start the server on a daemon thread and return once it accepts connections.

    Pass `engine` to reuse an already loaded model; otherwise one is loaded here (a few seconds when cached).
    """
    import uvicorn

    engine = engine if engine is not None else build_engine(model_path)
    sock = _bind(host, port)
    server = uvicorn.Server(uvicorn.Config(create_app(engine, model_name=model_name), log_level="warning"))
    thread = threading.Thread(
        target=lambda: asyncio.run(server.serve(sockets=[sock])), name="sa-model-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the model server thread did not start")
        time.sleep(0.02)
    return ServerHandle(base_url=_url(host, sock), engine=engine, _server=server, _thread=thread)


@dataclass
class ServerProcess:
    """A server in a child process (`python -m runtime.modelserver`). `stop()` terminates it."""

    process: subprocess.Popen[str]
    base_url: str

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_model_server(
    port: int = 0,
    *,
    host: str = "127.0.0.1",
    model_path: Path | None = None,
    timeout: float = 300.0,
    stderr: IO[str] | int | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """Start `python -m runtime.modelserver` and wait until it says it is listening and /health answers.

    `timeout` covers a first start that must convert the GGUF (15–30 s idle, minutes on a loaded box).
    The child's log goes to `stderr` (inherited by default).
    """
    import httpx

    cmd = [sys.executable, "-m", "runtime.modelserver", "--host", host, "--port", str(port)]
    if model_path is not None:
        cmd += ["--model", str(model_path)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=stderr, text=True, env={**os.environ, **(env or {})}
    )
    stdout = proc.stdout
    assert stdout is not None
    found: list[str] = []

    def read() -> None:
        for line in stdout:
            m = re.match(re.escape(READY_PREFIX) + r"(\S+)", line)
            if m:
                found.append(m.group(1))
                return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    if not found:
        proc.kill()
        proc.wait()
        raise RuntimeError(
            f"the model server did not start within {timeout:.0f} s (exit code {proc.returncode})"
        )
    handle = ServerProcess(process=proc, base_url=found[0])
    r = httpx.get(f"{handle.base_url}/health", timeout=10)
    if r.status_code != 200:
        handle.stop()
        raise RuntimeError(f"the model server's /health answered {r.status_code}")
    return handle
