"""An agent's page: its bundle (prompt, tools with their input and output schemas, limits, model and
constraint), the hosts serving it, its runs, and its failure kinds over time.

    await Agents(client, bundles, reads).read("calc")

Where each part comes from: the bundle is the file the runs index names for the agent's latest run
(`RunIndex.bundle`), loaded with `runtime.bundle.load_bundle` when this machine can read it (else the
page says why, `runtime.ui.bundles`); which hosts serve the agent, from their heartbeats
(`HostBeat.agents`) and leases (`Client.status`); its runs and their failures, from the runs index and
each run's digest (the index's own, `Reads.runs`). `failures_over_time` buckets the runs by when they
started and counts, per bucket, how they ended and the error kinds their events recorded.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import TYPE_CHECKING, Any, Protocol

from runtime.client import Client
from runtime.nats.subjects import check_token
from runtime.ui import views
from runtime.ui.bundles import Bundles

if TYPE_CHECKING:
    from runtime.bundle import Bundle, BundleTool

RUNS_SHOWN = 200  # the agent's most recent runs the page lists and buckets
# bucket widths tried, smallest first: the first that makes at most 24 buckets of the runs' span
BUCKETS = (1.0, 5.0, 15.0, 60.0, 300.0, 900.0, 3600.0, 6 * 3600.0, 86400.0, 7 * 86400.0)


class RunsIndex(Protocol):
    """What the agent page reads its runs from: the runs index with its digests (`Reads.runs`)."""

    async def runs(self, flt: views.RunFilter, limit: int) -> dict[str, Any]: ...


class NoAgent(LookupError):
    """No run and no host knows the agent; the message says which agents there are."""


def _output_schema(model: Any) -> Any:
    if model is None or isinstance(model, dict):
        return model
    to_schema = getattr(model, "model_json_schema", None)
    return to_schema() if callable(to_schema) else {"description": repr(model)}


def tool_view(name: str, tool: BundleTool, bundle: Bundle) -> dict[str, Any]:
    """One tool as the page shows it: what the model is told (description, input schema), what its
    result must be (output schema), where it runs, its limits and when it waits for a person."""
    from runtime.tools import ScriptTool
    from runtime.tools.agent_tool import AgentTool
    from runtime.tools.mcp import McpTool

    kind = ("script" if isinstance(tool, ScriptTool) else "agent" if isinstance(tool, AgentTool)
            else "mcp" if isinstance(tool, McpTool) else "python")
    rules = [{"when": r.when.describe() if r.when is not None else "always", "role": r.role,
              "timeout_s": r.timeout_s, "on_timeout": r.on_timeout}
             for r in bundle.approvals if r.tool == name]
    if tool.requires_approval and not rules:
        rules = [{"when": "always", "role": "", "timeout_s": None, "on_timeout": "deny"}]
    view = {"name": name, "kind": kind, "description": tool.schema.description,
            "input_schema": tool.schema.parameters, "output_schema": _output_schema(tool.output_model),
            "limits": _limits_that_apply(tool), "approval": rules,
            "terminal": name == bundle.spec.termination.terminal_tool}
    if isinstance(tool, McpTool):  # where it runs: its server, the server's name for it, its effect class
        view.update(server=tool.server.name, remote=tool.remote, effect=tool.effect,
                    output_schema=tool.output_schema)
    return view


def _limits_that_apply(tool: BundleTool) -> dict[str, Any] | None:
    """The limits that bind this kind of tool: a script's sandbox `Limits`; a Python tool's timeout,
    concurrency and retry (it runs outside the sandbox, so Monty's limits do not apply); an agent tool's
    depth of sub-runs (its own bundle's limits bind the sub-run)."""
    from runtime.tools import ScriptTool
    from runtime.tools.agent_tool import AgentTool
    from runtime.tools.hosted import HostedPythonTool
    from runtime.tools.mcp import McpTool

    if isinstance(tool, ScriptTool):
        return tool.limits.to_dict()
    if isinstance(tool, AgentTool):
        return {"max_depth": tool.max_depth}
    if isinstance(tool, McpTool):  # a call on its server's session: its deadline and largest answer
        return {"call_timeout_s": tool.server.call_timeout_s, "max_result": tool.server.max_result}
    if isinstance(tool, HostedPythonTool):
        retry = tool.retry
        tries = f"{retry.attempts} attempt(s), backoff {retry.backoff_s:g} s" + (
            f", on {', '.join(retry.on)}" if retry.on else "")
        return {"timeout_s": tool.timeout_s, "concurrency": tool.concurrency, "retry": tries}
    return None


def bundle_view(bundle: Bundle) -> dict[str, Any]:
    """The bundle's parts a team reads: prompt, model, constraint, limits, termination, tools."""
    spec = bundle.spec
    model = spec.model
    return {
        "name": bundle.name, "path": str(bundle.path), "digest": bundle.digest,
        "description": spec.description,
        "system_prompt": bundle.system_prompt,
        "model": {"name": model.name, "adapter": model.adapter, "base_url": model.base_url,
                  "provider": model.provider, "sampling": dict(model.sampling), "timeout": model.timeout},
        "constraint": spec.constraint.model_dump(),
        "limits": bundle.limits.to_dict(),
        "termination": {**spec.termination.model_dump(), "deadline_s": bundle.deadline_s},
        "max_concurrent_tools": spec.max_concurrent_tools, "history_window": spec.history_window,
        "workspace": bundle.workspace, "data_provider": bundle.data_provider.kind,
        "policies": [type(p).__name__ for p in bundle.policies],
        "timers": sorted(spec.timers),
        "questions": spec.questions.model_dump() if spec.questions is not None else None,
        "budgets": {"run_tokens": bundle.budgets.run_tokens,
                    "agent_tokens_per_day": bundle.budgets.agent_tokens_per_day,
                    "on_exceeded": bundle.budgets.on_exceeded},
        "tools": [tool_view(name, tool, bundle) for name, tool in bundle.tools.items()],
    }


def bucket_width(span_s: float) -> float:
    return next((w for w in BUCKETS if span_s / w <= 24), BUCKETS[-1])


def failures_over_time(rows: list[dict[str, Any]], now: float) -> dict[str, Any]:
    """The runs (index rows with their digests) by when they started: per bucket, how many ended each way
    and which error kinds their events recorded; the totals over all of them."""
    started = [r["started"] for r in rows if r.get("started")]
    if not started:
        return {"width_s": None, "buckets": [], "statuses": {}, "errors": {}}
    width = bucket_width(max(now - min(started), 1.0))
    first = (min(started) // width) * width
    buckets: dict[int, tuple[Counter[str], Counter[str]]] = {}
    for r in rows:
        if r.get("started"):
            at = int((r["started"] - first) // width)
            statuses, errors = buckets.setdefault(at, (Counter(), Counter()))
            statuses[r["status"]] += 1
            errors.update(r.get("errors") or [])
    count = int((now - first) // width) + 1
    shown = []
    for i in range(max(0, count - 200), count):
        statuses, errors = buckets.get(i, (Counter(), Counter()))
        shown.append({"start": first + i * width, "runs": sum(statuses.values()), "statuses": dict(statuses),
                      "errors": dict(errors)})
    return {"width_s": width, "buckets": shown,
            "statuses": dict(Counter(r["status"] for r in rows)),
            "errors": dict(Counter(k for r in rows for k in r.get("errors") or []))}


class Agents:
    """The agent page's read over one client, the inspector's bundles and its runs index."""

    def __init__(self, client: Client, bundles: Bundles, reads: RunsIndex) -> None:
        self.client, self.bundles, self.reads = client, bundles, reads

    async def read(self, name: str) -> dict[str, Any]:
        check_token(name, "agent")
        now = time.time()
        status = await self.client.status()
        hosts = [{"id": h["id"], "partitions": h["leases"].get(name, []), "beat_age_s": h["beat_age_s"],
                  "lease_ttl": h["lease_ttl"], "runs": h["runs"], "max_runs": h["max_runs"]}
                 for h in status["hosts"] if name in h["agents"]]
        listed = await self.reads.runs(views.RunFilter(agent=name), RUNS_SHOWN)
        rows = listed["runs"]
        unserved = (status.get("unserved_agents") or {}).get(name)
        if not rows and not hosts and not unserved:
            known = sorted({h for host in status["hosts"] for h in host["agents"]} |
                           {a.split(":")[0] for a in listed["facets"]["agents"]})
            raise NoAgent(f"no run and no host knows an agent {name!r} "
                          f"(agents: {', '.join(known) or 'none'})")
        index = await self.client.index()
        paths = [(e.updated, e.bundle) for e in index.values()
                 if e.bundle and (e.actor == name or e.actor.split(":")[0] == name)]
        loaded = await self.bundles.load(max(paths)[1] if paths else None)
        return {"name": name, "now": now, "hosts": hosts,
                "unserved": unserved,
                "instances": sorted({r["actor"] for r in rows}),
                "bundle": bundle_view(loaded.bundle) if loaded.bundle is not None else None,
                "bundle_path": loaded.path or None, "bundle_problem": loaded.problem,
                "runs": rows, "runs_total": sum(1 for e in index.values()
                                                if e.actor == name or e.actor.split(":")[0] == name),
                "failures": failures_over_time(rows, now)}


__all__ = ["Agents", "NoAgent", "RunsIndex", "bucket_width", "bundle_view", "failures_over_time", "tool_view"]
