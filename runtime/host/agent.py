"""One loaded bundle as the host runs it: kernel config, model step (adapter + constraint), model client.

Built once per bundle when the host starts (building the decoding constraint imports xgrammar and can take
seconds, so it happens before serving, never on a task's path). Every actor of the bundle — `bundle` and
each `bundle:instance` — shares it: actors are cheap because all they own is a mailbox.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.bundle import Bundle
from runtime.kernel import KernelConfig
from runtime.model import ModelStep, get_adapter

if TYPE_CHECKING:  # the client imports openai: loading a bundle to validate it should not
    from runtime.model.client import ModelClient


@dataclass
class AgentRuntime:
    bundle: Bundle
    config: KernelConfig
    step: ModelStep
    client: ModelClient

    @property
    def name(self) -> str:
        return self.bundle.name

    def job_limits(self, tool: str) -> dict[str, Any]:
        """The resolved per-tool limits a tool job carries (bundle global merged with the tool's own)."""
        return self.bundle.limits_for(tool).to_dict()

    def tool_digest(self, tool: str) -> str:
        resolved = self.bundle.tools.get(tool)
        return resolved.content_hash if resolved is not None else ""


def build_agent(bundle: Bundle, *, local_model_url: str | None = None, client: ModelClient | None = None,
                api_key: str | None = None) -> AgentRuntime:
    """The runtime of one bundle. `client` overrides the model client (tests, benches); otherwise a
    `ModelClient` for the bundle's `model.base_url` (`local`: `local_model_url`, the embedded server)."""
    import os

    from runtime.scripts.limits import parse_duration

    spec = bundle.spec.model
    config = bundle.kernel_config()
    adapter = get_adapter(spec.adapter)
    constraint = bundle.decoding_constraint()
    step = ModelStep(adapter, config.tools, constraint)
    if client is None:
        from runtime.model.client import ModelClient

        if bundle.uses_local_model:
            if not local_model_url:
                raise ValueError(f"bundle {bundle.name} uses the local model, but no local model server "
                                 "is running: start it with `sa up` or set SA_LOCAL_MODEL_URL")
            base_url, model = local_model_url.rstrip("/") + ("" if local_model_url.rstrip("/").endswith(
                "/v1") else "/v1"), "local"
        else:
            base_url, model = spec.base_url, spec.name
        key = os.environ.get(spec.api_key_env) if spec.api_key_env else api_key
        client = ModelClient(base_url=base_url, model=model, api_key=key,
                             timeout=parse_duration(spec.timeout, field="timeout") or 60.0)
    return AgentRuntime(bundle=bundle, config=config, step=step, client=client)


__all__ = ["AgentRuntime", "build_agent"]
