"""The fleet as a Model Context Protocol server (`sa mcp serve`): any MCP client (a desktop assistant, an IDE,
another agent) hands work to durable agents.

- `fleet`      — `FleetTools`: each served agent as a tool (a call is a run: idempotent by task id, progress
                 from its events, its output or why it failed, cancelled with the call), runs as resources
                 (``run://<run_id>``: the timeline `sa replay` prints)
- `transports` — stdio, and streamable HTTP on loopback behind a bearer token

A face: it reaches the fleet through `runtime.client` alone, with the credentials it is given.
"""

from runtime.mcp.fleet import INPUT_SCHEMA, RUN_SCHEME, FleetTools, replay_text
from runtime.mcp.transports import MCP_PATH, BearerToken, http_app, serve_http, serve_stdio

__all__ = ["INPUT_SCHEMA", "MCP_PATH", "RUN_SCHEME", "BearerToken", "FleetTools", "http_app", "replay_text",
           "serve_http", "serve_stdio"]
