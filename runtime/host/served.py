"""One loaded bundle as the host runs it: kernel config, model step (adapter + constraint), model client.

Built once per bundle when the host starts: an `ebnf` constraint's grammar is derived by an xgrammar child
process, which takes seconds, so it happens before serving, for the forced last turn too, never on a task's
path; a `model.server: auto` bundle asks its server which one it is (`runtime.model.detect`), and a
constraint that server cannot enforce is refused here (`runtime.model.dialects.DialectError`). Every actor
of the bundle — `bundle` and each `bundle:instance` — shares it: actors are cheap because all they own is a
mailbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.bundle import Bundle
from runtime.kernel import KernelConfig
from runtime.model import ModelStep, get_adapter

if TYPE_CHECKING:  # the client imports openai: loading a bundle to validate it should not
    from runtime.model.client import ModelClient
    from runtime.model.limits import DailyBudget


@dataclass
class AgentRuntime:
    bundle: Bundle
    config: KernelConfig
    step: ModelStep
    client: ModelClient
    budget: DailyBudget | None = None  # the agent's tokens per day (`runtime.host.endpoint` sets it)
    _job_limits: dict[str, dict[str, Any]] = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.bundle.name

    def job_limits(self, tool: str) -> dict[str, Any]:
        """The resolved per-tool limits a tool job carries (bundle global merged with the tool's own),
        worked out once per tool: every job of the tool carries the same dict."""
        limits = self._job_limits.get(tool)
        if limits is None:
            limits = self._job_limits[tool] = self.bundle.limits_for(tool).to_dict()
        return limits

    def tool_digest(self, tool: str) -> str:
        resolved = self.bundle.tools.get(tool)
        return resolved.content_hash if resolved is not None else ""


def build_agent(bundle: Bundle, *, local_model_url: str | None = None, client: ModelClient | None = None,
                api_key: str | None = None) -> AgentRuntime:
    """The runtime of one bundle. `client` overrides the model client (tests, benches); otherwise a
    `ModelClient` for the bundle's `model.base_url` (`local`: `local_model_url`, the embedded server)."""
    from runtime.model.connect import model_client, server_dialect

    config = bundle.kernel_config()
    if client is None:
        client = model_client(bundle, local_model_url, api_key=api_key)
    dialect = server_dialect(bundle, getattr(client, "base_url", None), api_key=api_key)
    step = ModelStep.for_config(get_adapter(bundle.spec.model.adapter), config, bundle.decoding_constraint(),
                                dialect=dialect)
    return AgentRuntime(bundle=bundle, config=config, step=step, client=client)


__all__ = ["AgentRuntime", "build_agent"]
