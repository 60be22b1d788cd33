"""A bundle run in this process: the same kernel, model step and tools a host uses, without NATS.

    async with Agent.from_bundle("bundles/demo") as agent:
        result = await agent.run("What is 17 * 23 + 4?")
    result.output, result.status, result.events

Why it exists: the bundle is the one way to describe an agent, so a library user, a notebook or a test
gets exactly the agent `sa host` would serve (its prompt, tools, limits, policies, decoding constraint,
terminal tool and model) from the same file, and the same event log comes back (`RunOutcome.events`
folds with `kernel.fold` and verifies with `runtime.client.verify.verify`).

Data, as the worker does it. A bundle's static data provider mounts its files under `/data/` for every
call. A workspace bundle gets a workspace of its own in this process (`LocalWorkspace`, in memory unless
given a folder): each call reads the workspace as it is, and the writes a script returns are applied
after the call succeeded, all or none; a malformed `writes` fails the call with an `output` error, as on
a worker. (A workspace shared between processes is what the NATS workspace is for: use `sa host`.)

The model: the bundle's `model.base_url`; `local` means the embedded model server, found at
`model_url`, else `SA_LOCAL_MODEL_URL`, else the one a running `sa up` started (`runtime.model.connect`).
Pass `client` to use another (tests pass one for `runtime.testing.ScriptedModelServer`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runtime import events as ev
from runtime.bundle import Bundle, load_bundle
from runtime.driver.local import Answerer, Approver, OnEvent, RunOutcome, run_task
from runtime.model import ModelClient, ModelStep, get_adapter
from runtime.model.connect import model_client, server_dialect
from runtime.model.limits import DailyBudget, LocalGate, LocalTokens
from runtime.tools.data import DEFAULT_MOUNT, WriteError, parse_writes, text_or_bytes
from runtime.types import ToolCall, ToolResult

Files = dict[str, str | bytes]


class LocalWorkspace:
    """A workspace in this process: files in memory (or in `folder`), mounted under `/data/`."""

    def __init__(self, files: Mapping[str, str | bytes] | None = None, *, folder: str | Path | None = None,
                 static: Mapping[str, str | bytes] | None = None, mount: str = DEFAULT_MOUNT) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.mount = mount.rstrip("/")
        self.static: Files = dict(static or {})
        self.entries: dict[str, bytes] = {k: v.encode() if isinstance(v, str) else v
                                          for k, v in (files or {}).items()}
        if self.folder is not None and self.folder.is_dir():
            for f in sorted(self.folder.rglob("*")):
                if f.is_file():
                    self.entries[f.relative_to(self.folder).as_posix()] = f.read_bytes()

    def files(self, call: ToolCall) -> Files:
        """What a call reads: the static files and the workspace, each under the mount."""
        return {**self.static, **{f"{self.mount}/{k}": text_or_bytes(v) for k, v in self.entries.items()}}

    def apply(self, call: ToolCall, result: ToolResult) -> ToolResult:
        """Persist the writes of a successful result, all of them or (a malformed one) none."""
        try:
            writes = parse_writes(result.output, self.mount)
        except WriteError as e:
            return ToolResult.failure("output", str(e), duration_ms=result.duration_ms)
        for path, content in writes:
            self.entries[path] = content
            if self.folder is not None:
                target = self.folder / path
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
        return result


class StaticFiles:
    """The bundle's static data, the same for every call; writes are not persisted (as on a worker)."""

    def __init__(self, files: Mapping[str, str | bytes]) -> None:
        self._files: Files = dict(files)

    def files(self, call: ToolCall) -> Files:
        return self._files

    def apply(self, call: ToolCall, result: ToolResult) -> ToolResult:
        return result


class Agent:
    """One bundle, ready to run tasks in this process (see the module docstring)."""

    def __init__(self, bundle: Bundle, *, client: ModelClient | None = None, model_url: str | None = None,
                 workspace: LocalWorkspace | None = None) -> None:
        self.bundle = bundle
        self.config = bundle.kernel_config()
        self.adapter = get_adapter(bundle.spec.model.adapter)
        self.constraint = bundle.decoding_constraint()
        self._own_client = client is None
        self.client = client or model_client(bundle, model_url)
        self.dialect = server_dialect(bundle, getattr(self.client, "base_url", None))
        # an invalid constraint, or one this server cannot enforce, fails here (`DialectError`)
        ModelStep.for_config(self.adapter, self.config, self.constraint, dialect=self.dialect)
        self.data = workspace or _data_for(bundle)
        self.budget = _limit(bundle, self.client)
        self.setups = {name: bundle.setup_for(name, lambda: self.client) for name in bundle.tools}

    @classmethod
    def from_bundle(cls, path: str | Path, *, client: ModelClient | None = None, model_url: str | None = None,
                    workspace: LocalWorkspace | None = None) -> Agent:
        """The agent a bundle describes (`BundleError` says what to fix in an invalid one)."""
        return cls(load_bundle(path), client=client, model_url=model_url, workspace=workspace)

    @property
    def name(self) -> str:
        return self.bundle.name

    async def run(self, task: str | ev.Task, *, on_event: OnEvent | None = None,
                  approver: Approver | None = None, timeout_s: float | None = None,
                  run_id: str | None = None, answerer: Answerer | None = None) -> RunOutcome:
        """Run one task to its end and return the outcome with its full event log. The deadline is
        `timeout_s`, else the task's, else the bundle's. `answerer(question, schema)` answers the
        questions the model asks (`ask_human`, a bundle with `questions:`); without one such a question
        fails at once (`policy`), since nobody in this process can answer it (`runtime.driver.local`)."""
        if isinstance(task, str):
            task = ev.Task(agent=self.bundle.name, input=task)
        timeout = timeout_s if timeout_s is not None else task.timeout_s
        if timeout is None:
            timeout = self.bundle.deadline_s
        if timeout != task.timeout_s:
            task = ev.Task(agent=task.agent, input=task.input, instance=task.instance, task_id=task.task_id,
                           timeout_s=timeout, metadata=task.metadata)
        return await run_task(task, self.config, client=self.client, adapter=self.adapter,
                              tools=list(self.bundle.tools.values()), on_event=on_event,
                              constraint=self.constraint, approver=approver, run_id=run_id,
                              bundle_digest=self.bundle.digest, data=self.data, budget=self.budget,
                              answerer=answerer, setups=self.setups, dialect=self.dialect)

    async def aclose(self) -> None:
        """Close the model client this agent made (one passed in is the caller's to close)."""
        if self._own_client:
            await self.client.aclose()

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()


def _limit(bundle: Bundle, client: ModelClient) -> DailyBudget | None:
    """The bundle's `endpoint:` and `budgets:` in this process: its client's retry settings and a gate over
    `max_in_flight` local permits (shared by this agent's runs only: the fleet's share is the host's,
    `runtime.host.endpoint`), and the agent's daily budget counted here."""
    limits = bundle.endpoint
    if limits is not None:
        client.retry.retry_after_max = limits.retry_after_max
        client.retry.throttle_retries = limits.throttle_retries
        if limits.limited:
            client.limiter = LocalGate(limits.max_in_flight or 10**9,
                                       tokens_per_minute=limits.tokens_per_minute)
    per_day = bundle.budgets.agent_tokens_per_day
    if per_day is None:
        return None
    return DailyBudget(bundle.name, per_day, LocalTokens(), wait=bundle.budgets.on_exceeded == "wait")


def _data_for(bundle: Bundle) -> LocalWorkspace | StaticFiles | None:
    spec = bundle.data_provider
    static: Files = {}
    if spec.kind == "static":
        from runtime.tools.data import StaticDataProvider

        static = dict(StaticDataProvider(spec.files, folder=spec.folder).files)
    if bundle.workspace is not None or spec.kind == "workspace":
        return LocalWorkspace(static=static)
    return StaticFiles(static) if static else None


__all__ = ["Agent", "LocalWorkspace", "StaticFiles"]
