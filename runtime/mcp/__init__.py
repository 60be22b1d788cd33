"""The fleet as a Model Context Protocol server (`sa mcp serve`): any MCP client (a desktop assistant, an IDE,
another agent) hands work to durable agents.

- `fleet`      — `FleetTools`: each served agent as a tool (a call is a run: idempotent by task id, progress
                 from its events, its output or why it failed, cancelled with the call), runs as resources
                 (``run://<run_id>``: the timeline `sa replay` prints)
- `started`    — `StartedRuns`: the runs it started, followed and cancelled through the hosts with each run's
                 key (`runtime.nats.starter`), so a publisher's credentials are enough
- `transports` — stdio, and streamable HTTP on loopback behind a bearer token

A face: it starts runs through `runtime.client` and follows them through the hosts, with the credentials it
is given; reading a run it did not start needs an operator's.
"""

from runtime.mcp.fleet import INPUT_SCHEMA, RUN_SCHEME, FleetTools, replay_text
from runtime.mcp.transports import MCP_PATH, BearerToken, http_app, serve_http, serve_stdio

__all__ = ["INPUT_SCHEMA", "MCP_PATH", "RUN_SCHEME", "BearerToken", "FleetTools", "http_app", "replay_text",
           "serve_http", "serve_stdio"]
