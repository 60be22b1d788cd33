"""Externals: the host functions a tool's script calls (`@external`), on whichever worker runs it.

- `ExecutionContext` (`context`): the frozen facts of one tool call (agent, run, call, attempt, deadline,
  workspace, task metadata) and the idempotency key of each external call, `<run>/<call>#<n>`.
- `ExternalsFactory` (`factory`): `build(tool_name, context) -> {name: callable}`, configured per bundle
  (`externals: package.module:factory`) or per worker (`sa worker --externals package.module:factory`).
- built-ins (`builtins`): `ask_llm`, `http_request` (per-tool host allow-list) and `secret`, granted per
  tool in the bundle.
- `record`: exactly-once external calls under redelivery (answers recorded in KV before the script goes
  on, replayed when the job runs again). It talks to NATS, so it is imported on its own
  (`from runtime.externals.record import ...`), never by this package.
- `provide`: what a worker puts together for one job from all of the above.
"""

from runtime.externals.builtins import BUILTINS, Grants, Secrets
from runtime.externals.context import ExecutionContext, call_key
from runtime.externals.factory import ExternalsError, ExternalsFactory, import_object, load_factory

__all__ = [
    "BUILTINS",
    "ExecutionContext",
    "ExternalsError",
    "ExternalsFactory",
    "Grants",
    "Secrets",
    "call_key",
    "import_object",
    "load_factory",
]
