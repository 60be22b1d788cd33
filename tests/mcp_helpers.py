"""MCP servers for the tests: real ones someone else wrote, installed from PyPI into environments of their
own, and a small counting server of ours that says how many times each tool was really called.

`real_server("time")` is the path of `mcp-server-time`'s command, installed once (pinned) into
`.venv-mcp/time` at the repository root and reused by every later run: the reference servers pin `mcp`
versions of their own, so none is installed beside the runtime. `npm_server("filesystem")` does the same
for the npm reference file-system server (`.venv-mcp/npm-filesystem`, with npm). `make mcp-servers`
installs them all beforehand (`install_all`). When the package index cannot be reached the
test is skipped saying so; any other install failure fails it.

`COUNTER` is a stdio server (run with this interpreter) whose every call appends its tool's name to the file
named by its `COUNT_FILE` environment variable: `calls(file)` reads what the server saw, on the server's side.
Its `slow_*` tools record `tool:note` and then hold the call while the file named by `HOLD_FILE` exists: a
call in whose middle a test kills the worker.
"""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / ".venv-mcp"
PINNED = {
    "time": ("mcp-server-time==2026.10.19", "mcp-server-time"),
    "git": ("mcp-server-git==2026.10.19", "mcp-server-git"),
}
_OFFLINE = ("Could not find a version", "No matching distribution", "Max retries", "NewConnectionError",
            "Temporary failure in name resolution", "Network is unreachable", "ConnectionError")


def real_server(name: str) -> Path:
    """The command of a pinned reference server, installed into `.venv-mcp/<name>` on first use."""
    requirement, command = PINNED[name]
    folder = ROOT / name
    stamp = folder / f".installed-{requirement}"
    exe = folder / "bin" / command
    ROOT.mkdir(exist_ok=True)
    with open(ROOT / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes never install into one folder at once
        if stamp.exists() and exe.exists():
            return exe
        venv.create(folder, with_pip=True, clear=True)
        done = subprocess.run([str(folder / "bin" / "pip"), "install", "-q", requirement],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            if any(hint in done.stderr for hint in _OFFLINE):
                pytest.skip(f"cannot install {requirement}: the package index is unreachable "
                            f"({done.stderr.strip().splitlines()[-1]})")
            raise RuntimeError(f"installing {requirement} failed:\n{done.stderr}")
        stamp.touch()
    return exe


NPM_PINNED = {"filesystem": ("@modelcontextprotocol/server-filesystem@2026.8.31", "mcp-server-filesystem")}
_NPM_OFFLINE = ("ENOTFOUND", "EAI_AGAIN", "ETIMEDOUT", "ECONNREFUSED", "ECONNRESET", "network")


def npm_server(name: str) -> Path:
    """The command of a pinned npm reference server, installed with npm into `.venv-mcp/npm-<name>` on first
    use (a project folder of its own, as the PyPI ones have: nothing global). Skipped, saying why, when
    there is no npm or the registry cannot be reached; any other install failure fails the test."""
    package, command = NPM_PINNED[name]
    folder = ROOT / f"npm-{name}"
    stamp = folder / f".installed-{package.replace('/', '+')}"
    exe = folder / "node_modules" / ".bin" / command
    ROOT.mkdir(exist_ok=True)
    with open(ROOT / f".npm-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if stamp.exists() and exe.exists():
            return exe
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            pytest.skip(f"cannot install {package}: node and npm are not installed (Node 18 or later)")
        folder.mkdir(exist_ok=True)
        done = subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(folder), package],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            if any(hint in done.stderr for hint in _NPM_OFFLINE):
                pytest.skip(f"cannot install {package}: the npm registry is unreachable "
                            f"({done.stderr.strip().splitlines()[-1]})")
            raise RuntimeError(f"installing {package} failed:\n{done.stderr}")
        stamp.touch()
    return exe


def install_all() -> None:
    """Every pinned reference server (what `make mcp-servers` runs, so the tests find them installed)."""
    for name in PINNED:
        print(real_server(name))
    for name in NPM_PINNED:
        print(npm_server(name))


COUNTER_SOURCE = '''\
"""A tiny MCP server that records every call on its own side (one line per call in $COUNT_FILE)."""
import os, sys, time
from typing import TypedDict
import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("counter")
COUNT_FILE = os.environ["COUNT_FILE"]


class Count(TypedDict):
    count: int
    note: str


def seen(tool: str) -> int:
    with open(COUNT_FILE, "a") as f:
        f.write(tool + "\\n")
    with open(COUNT_FILE) as f:
        return sum(1 for _ in f)


@server.tool()
def bump(note: str) -> Count:
    """Record a note: an effect in the world (not repeatable)."""
    return {"count": seen("bump"), "note": note}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def peek(note: str) -> Count:
    """Read the counter (read-only: repeatable)."""
    return {"count": seen("peek"), "note": note}


@server.tool()
def refuse(reason: str) -> str:
    """Always fail, with the reason given."""
    seen("refuse")
    raise ToolError(f"refused: {reason}")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def token(ctx: Context) -> str:
    """The X-Token header of the request (HTTP only)."""
    seen("token")
    return (ctx.headers or {}).get("x-token", "none")


async def held(tool: str, note: str) -> int:
    """Record the call (`tool:note`), then hold it while $HOLD_FILE exists: a call a test can kill a worker
    in the middle of (several at once). A server whose worker died (its parent changed) exits unanswered."""
    n = seen(f"{tool}:{note}")
    parent, hold = os.getppid(), os.environ.get("HOLD_FILE", "")
    while hold and os.path.exists(hold):
        if os.getppid() != parent:
            os._exit(0)
        await anyio.sleep(0.05)
    return n


@server.tool()
async def slow_bump(note: str) -> Count:
    """Record a note slowly: an effect in the world (not repeatable)."""
    return {"count": await held("slow_bump", note), "note": note}


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def slow_peek(note: str) -> Count:
    """Read the counter slowly (read-only: repeatable)."""
    return {"count": await held("slow_peek", note), "note": note}


@server.tool()
def die(note: str) -> str:
    """Exit the server process in the middle of the call."""
    seen("die")
    os._exit(3)


@server.tool()
def hang(note: str) -> str:
    """Never answer."""
    seen("hang")
    time.sleep(3600)
    return "late"


if os.environ.get("MCP_PORT"):  # streamable HTTP on loopback, else stdio
    server.run("streamable-http", host="127.0.0.1", port=int(os.environ["MCP_PORT"]))
else:
    server.run("stdio")
'''


def counter_server(folder: Path) -> tuple[Path, Path]:
    """The counting server's script and its count file, in `folder`."""
    script = folder / "counter_server.py"
    script.write_text(COUNTER_SOURCE)
    return script, folder / "calls.txt"


def calls(count_file: Path) -> list[str]:
    """Every call the counting server saw, in order (by tool name)."""
    return count_file.read_text().split() if count_file.exists() else []


PYTHON = sys.executable


GARBAGE_SOURCE = '''\
"""A hand-written stdio "server" speaking just enough JSON-RPC to be listed, whose tool answers garbage."""
import json, os, sys

KIND = {"type": "bogus"} if os.environ.get("BAD_SCHEMA") else {"type": "string"}
TOOL = {"name": "weird", "description": "Answers garbage.",
        "inputSchema": {"type": "object", "properties": {"kind": KIND}, "required": ["kind"]},
        "outputSchema": {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}}

for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue  # a notification
    method, answer = msg.get("method"), None
    if method == "initialize":
        answer = {"protocolVersion": msg["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "garbage", "version": "0"}}
    elif method == "tools/list":
        answer = {"tools": [TOOL]}
    elif method == "tools/call":
        kind = msg["params"]["arguments"]["kind"]
        answer = ({"content": "not a list"} if kind == "shape" else
                  {"content": [], "structuredContent": {"n": "not a number"}})
    reply = ({"jsonrpc": "2.0", "id": msg["id"], "result": answer} if answer is not None else
             {"jsonrpc": "2.0", "id": msg["id"], "error": {"code": -32601, "message": "no such method"}})
    sys.stdout.write(json.dumps(reply) + "\\n")
    sys.stdout.flush()
'''


def garbage_server(folder: Path) -> Path:
    """A stdio server whose one tool (`weird`) answers a malformed result (`kind: shape`) or one that breaks
    its own output schema (any other kind); with BAD_SCHEMA set in its environment, it lists an input schema
    that is no JSON Schema."""
    script = folder / "garbage_server.py"
    script.write_text(GARBAGE_SOURCE)
    return script


ASKER_SOURCE = '''\
"""An MCP server whose tool asks the user for input in the middle of the call (`elicitation/create`): on the
2026 protocol the SDK answers the call with an input-required result and finishes it when the client calls
again with the answer. Every call round is recorded in $COUNT_FILE."""
import os
from typing import Annotated
from pydantic import BaseModel
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve

server = MCPServer("asker")


class Who(BaseModel):
    name: str
    sure: bool


def ask_who(place: str) -> Elicit[Who]:
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write("asked\\n")
    return Elicit(f"Who is booking {place}?", Who)


@server.tool()
def book(place: str, who: Annotated[Who, Resolve(ask_who)]) -> str:
    """Book a place, asking who for."""
    with open(os.environ["COUNT_FILE"], "a") as f:
        f.write("booked\\n")
    return f"booked {place} for {who.name} ({'sure' if who.sure else 'unsure'})"


class Seats(BaseModel):
    seats: int


def ask_seats(who: Annotated[Who, Resolve(ask_who)]) -> Elicit[Seats]:
    return Elicit(f"How many seats for {who.name}?", Seats)  # asked only once `who` is answered


@server.tool()
def reserve(place: str, who: Annotated[Who, Resolve(ask_who)],
            seats: Annotated[Seats, Resolve(ask_seats)]) -> str:
    """Reserve seats at a place, asking who for and then how many (two rounds)."""
    return f"reserved {seats.seats} at {place} for {who.name}"


server.run("stdio")
'''


def asker_server(folder: Path) -> tuple[Path, Path]:
    """The asking server's script and its count file, in `folder`."""
    script = folder / "asker_server.py"
    script.write_text(ASKER_SOURCE)
    return script, folder / "asked.txt"
