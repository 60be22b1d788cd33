"""What a worker gives one tool job's script: its declared externals, from grants and factories, recorded.

For each `@external` the script declares, in this order: a built-in the bundle grants the tool
(`builtins`), else the bundle's `externals:` factory, else the worker's `--externals` factory. Every
implementation is wrapped by the job's `CallRecorder` (exactly-once under redelivery). A declared external
that nothing provides, or a factory that raises, is an `external` error value naming the external, its
line and what would provide it: the job fails, the worker keeps serving.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runtime.externals.builtins import Grants, Secrets, builtin_externals
from runtime.externals.context import ExecutionContext
from runtime.externals.factory import ExternalsFactory
from runtime.types import ToolError

if TYPE_CHECKING:
    from nats.js.kv import KeyValue

    from runtime.externals.record import CallRecorder
    from runtime.model.client import ModelClient
    from runtime.scripts import Script

__all__ = ["Provided", "ToolSetup", "provide"]


@dataclass(frozen=True)
class ToolSetup:
    """What a bundle says about one tool's externals: its grants, the bundle's factory, its model."""

    bundle: str = ""
    grants: Grants = field(default_factory=Grants)
    factory: ExternalsFactory | None = None
    model: Callable[[], ModelClient] | None = None
    sampling: dict[str, Any] = field(default_factory=dict)


@dataclass
class Provided:
    """One job's externals (wrapped), the recorder that numbers them, and the secret values to scrub."""

    externals: dict[str, Callable[..., Any]]
    recorder: CallRecorder | None = None
    secrets: list[str] = field(default_factory=list)


async def provide(script: Script, tool: str, setup: ToolSetup | None, worker_factory: ExternalsFactory | None,
                  context: ExecutionContext, kv: Callable[[], Awaitable[KeyValue]] | None,
                  secrets: Secrets, printed: Callable[[str], None]) -> Provided | ToolError:
    """The externals of one call of `tool` (`kv` is awaited for the record bucket only when needed; None
    in one process, where a call is never redelivered: each call still gets its idempotency key)."""
    declared = script.externals
    if not declared:
        return Provided({})
    setup = setup or ToolSetup()
    granted = builtin_externals(setup.grants, tool=tool, model=setup.model, sampling=setup.sampling,
                                secrets=secrets, printed=printed)
    impls = {n: f for n, f in granted.items() if n in declared}
    remaining = [n for n in declared if n not in impls]
    factory = setup.factory or worker_factory
    offered: list[str] = []
    if remaining and factory is not None:
        try:
            built = dict(factory.build(tool, context))
        except Exception as e:  # the user's factory: its failure is this job's error, not the worker's
            return ToolError("external", f"the externals factory {factory!r} failed building externals for "
                                         f"{tool}: {type(e).__name__}: {e}")
        offered = sorted(built)
        impls.update({n: built[n] for n in remaining if n in built})
    missing = [n for n in declared if n not in impls]
    if missing:
        spec = declared[missing[0]]
        if factory is None:
            how = ("no externals factory is configured: set `externals: package.module:factory` in the "
                   "bundle or start the worker with `--externals package.module:factory`")
        else:
            how = f"the externals factory {factory!r} provides {', '.join(offered) or 'nothing'}"
        builtin = [n for n in missing if n in ("ask_llm", "http_request", "secret")]
        if builtin:
            how += f"; {', '.join(builtin)} is a built-in: grant it to the tool under `grants:` in its bundle"
        return ToolError("external", f"{tool} declares @external {', '.join(map(repr, missing))} "
                                     f"(line {spec.line}) but nothing on this worker provides it: {how}",
                         line=spec.line)
    from runtime.externals.record import CallRecorder

    recorder = CallRecorder(await kv() if kv is not None else None, context, unrecorded={"secret"})
    wrapped = {n: recorder.wrap(n, f) for n, f in impls.items()}
    return Provided(wrapped, recorder, secrets.values(setup.grants.secrets))
