"""`ExecutionContext`: what an external's implementation may know about the tool call it serves.

An externals factory is called once per tool job with this context, so the functions it returns can
scope themselves to the call: tag a request with the run, honour the deadline, write under the workspace,
and above all pass `idempotency_key(n)` to a service that de-duplicates, so that the `n`-th external call
of this job is recognisable as the same request however many times the job is run (see
`runtime.externals.record` for when a call can be made twice).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["ExecutionContext", "call_key"]


def call_key(run_id: str, call_id: str, n: int) -> str:
    """The idempotency key of the `n`-th external call (from 1) of one tool call: `<run>/<call>#<n>`.

    A call id already starts with its run (`<run>/<turn>.<index>`), so the run is not written twice."""
    base = call_id if call_id.startswith(f"{run_id}/") else f"{run_id}/{call_id}"
    return f"{base}#{n}"


@dataclass(frozen=True)
class ExecutionContext:
    """One tool call as its externals see it. Frozen: an implementation cannot change what the next sees.

    `attempt` is the delivery of the job (1, then 2... after a worker died); `deadline` is unix time or
    None; `workspace` the KV workspace the job reads and writes, if any; `metadata` the task's metadata
    (read-only); `environ` what the bundle gives the sandbox as `os.environ`.
    """

    agent: str
    actor: str
    run_id: str
    call_id: str
    tool: str
    attempt: int = 1
    deadline: float | None = None
    workspace: str | None = None
    metadata: MappingProxyType[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    environ: MappingProxyType[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def idempotency_key(self, n: int) -> str:
        """The key of this call's `n`-th external call (from 1): the same on every delivery of the job."""
        return call_key(self.run_id, self.call_id, n)

    def time_left(self) -> float | None:
        """Seconds until the deadline (never negative), or None without one."""
        return None if self.deadline is None else max(0.0, self.deadline - time.time())

    @classmethod
    def of(cls, *, agent: str, actor: str = "", run_id: str, call_id: str, tool: str, attempt: int = 1,
           deadline: float | None = None, workspace: str | None = None,
           metadata: dict[str, Any] | None = None, environ: dict[str, str] | None = None) -> ExecutionContext:
        """Build one from plain dicts (copied, then frozen)."""
        return cls(agent=agent, actor=actor or agent, run_id=run_id, call_id=call_id, tool=tool,
                   attempt=attempt, deadline=deadline, workspace=workspace,
                   metadata=MappingProxyType(dict(metadata or {})),
                   environ=MappingProxyType(dict(environ or {})))
