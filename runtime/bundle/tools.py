"""The `tools:` section: globs and entries resolved into the agent's tools, each carrying its settings.

An item is a glob of `.pym` files (relative to the bundle) or a mapping with exactly one of `path:` (a
`.pym` script), `python:` (a function run by workers) or `agent:` (another agent, called as a durable
sub-run), plus that kind's settings. An explicit `path:` entry refines a glob's match of the same file.
Every tool is loaded here, so a script that does not parse is a bundle error: an agent must never start
with a tool that cannot run. Each tool object comes out configured (limits merged over the bundle's,
output model, approval, description, environ), so `tool.execute` alone is right and the host and the
workers read the settings from the tool; approval rules and built-in externals grants are collected
beside the tools.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.approval_policy import ApprovalRule, ConditionError, parse_condition
from runtime.bundle.problems import Problem, validate
from runtime.bundle.resolved import BundleTool
from runtime.bundle.schema import ApprovalSpec, GrantsSpec, RetrySpec, ToolEntry
from runtime.bundle.values import limits_value, output_model_value
from runtime.externals import ExternalsError, Grants, import_object
from runtime.quantities import LimitsError, parse_duration
from runtime.scripts import Limits
from runtime.tools import ScriptLoadError, ScriptTool, discover_tools
from runtime.tools.agent_tool import DEFAULT_MAX_DEPTH, AgentTool
from runtime.tools.hosted import HostedPythonTool, RetryPolicy

__all__ = ["ToolSet", "tools_section"]


@dataclass(frozen=True)
class ToolSet:
    """`tools:` resolved: the tools by name, the approval rules of those with `approval:`, and the
    built-in externals each script tool was granted."""

    tools: dict[str, BundleTool]
    approvals: tuple[ApprovalRule, ...]
    grants: dict[str, Grants]


def tools_section(items: list[Any], root: Path, global_limits: Limits, named: dict[str, Any]
                  ) -> tuple[ToolSet, list[Problem]]:
    """`tools:` (relative to the bundle folder `root`), with `limits:` as every tool's default and the
    `output_models:` table (`named`) for the entries' `output_model:`."""
    problems: list[Problem] = []
    entries = _entries(items, root, problems)
    found = _Found(root, global_limits, named, problems)
    for f, where, entry in entries.files:  # scripts first, then Python tools, then agents
        found.script(f, where, entry)
    for where, entry in entries.pythons:
        found.python(where, entry)
    for where, entry in entries.agents:
        found.agent(where, entry)
    return ToolSet(found.tools, tuple(found.approvals), found.grants), problems


# ---- the items, sorted by kind ---------------------------------------------------------------------


@dataclass
class _Entries:
    files: list[tuple[Path, str, ToolEntry | None]] = field(default_factory=list)  # (file, yaml path, entry)
    pythons: list[tuple[str, ToolEntry]] = field(default_factory=list)
    agents: list[tuple[str, ToolEntry]] = field(default_factory=list)


def _entries(items: list[Any], root: Path, problems: list[Problem]) -> _Entries:
    """The items as script files (globs expanded), Python tool entries and agent tool entries."""
    out = _Entries()
    for i, item in enumerate(items):
        where = f"tools[{i}]"
        if isinstance(item, str):
            out.files.extend((m, where, None) for m in _glob(item, where, root, problems))
        elif isinstance(item, dict):
            _entry(item, where, root, out, problems)
        else:
            problems.append((where, "a tool is a glob string or a mapping with `path:` or `python:`"))
    return out


def _glob(pattern: str, where: str, root: Path, problems: list[Problem]) -> list[Path]:
    """The files a glob matches (relative to `root` unless absolute); none is a problem."""
    if not Path(pattern).is_absolute():
        matches = sorted(root.glob(pattern))
    else:
        matches = sorted(Path(pattern).parent.glob(Path(pattern).name))
    matches = [m for m in matches if m.is_file()]
    if not matches:
        problems.append((where, f"the glob {pattern!r} matches no file under {root}"))
    return [m.resolve() for m in matches]


def _entry(item: dict[str, Any], where: str, root: Path, out: _Entries, problems: list[Problem]) -> None:
    """One mapping item, added to `out` by its kind (a `path:` entry replaces a glob's match of its file)."""
    entry = validate(ToolEntry, item, where, problems)
    if entry is None:
        return
    if sum(x is not None for x in (entry.path, entry.python, entry.agent)) != 1:
        problems.append((where, "a tool entry has one of `path:` (a .pym script), `python:` "
                                "(package.module:function) or `agent:` (another agent's name)"))
        return
    if entry.agent is not None:
        out.agents.append((where, entry))
        return
    if entry.python is not None:
        out.pythons.append((where, entry))
        return
    if entry.timeout is not None or entry.concurrency is not None or entry.retry is not None:
        problems.append((where, "timeout, concurrency and retry are for `python:` tools; a script's "
                                "time and memory are bounded by `limits:`"))
    assert entry.path is not None
    f = (root / entry.path).resolve()
    if not f.is_file():
        problems.append((f"{where}.path", f"{f} does not exist"))
        return
    out.files = [x for x in out.files if x[0] != f]  # an explicit entry refines a glob match
    out.files.append((f, where, entry))


# ---- the tools ---------------------------------------------------------------------------------------


class _Found:
    """The tools resolved so far, with their approval rules and grants; a second tool of the same name
    is a problem, and the first one stays."""

    def __init__(self, root: Path, global_limits: Limits, named: dict[str, Any],
                 problems: list[Problem]) -> None:
        self.root = root
        self.global_limits = global_limits
        self.named = named
        self.problems = problems
        self.tools: dict[str, BundleTool] = {}
        self.approvals: list[ApprovalRule] = []
        self.grants: dict[str, Grants] = {}

    def script(self, f: Path, where: str, entry: ToolEntry | None) -> None:
        """A `.pym` file, configured by its entry (None: matched by a glob, so the bundle's defaults)."""
        tool, failure = _load_tool(f)
        if tool is None:
            self.problems.append((where, failure))
            return
        if tool.name in self.tools:
            self.problems.append((where, f"two tools are named {tool.name!r} ({self.tools[tool.name].path} "
                                         f"and {f})"))
            return
        limits, output_model, approval = self.global_limits, None, False
        description, environ = None, None
        if entry is not None:
            limits = self.global_limits.merge(self._own_limits(entry, where))
            output_model = self._output_model(entry, where)
            approval = entry.requires_approval
            description, environ = entry.description, dict(entry.environ)
            self._approval(tool.name, entry, where)
            if entry.grants is not None:
                self.grants[tool.name] = _grants(entry.grants)
        try:
            self.tools[tool.name] = tool.configured(limits=limits, output_model=output_model,
                                                    requires_approval=approval, description=description,
                                                    environ=environ)
        except ScriptLoadError as e:  # a `description:` that breaks the tool rules
            message = e.error.message.replace("the description (the docstring's first paragraph)",
                                              "the description")
            self.problems.append((f"{where}.description", message))
            return
        self._parameters(tool.name, where)

    def python(self, where: str, entry: ToolEntry) -> None:
        """A `python:` entry."""
        hosted = self._python_tool(entry, where)
        if hosted is None:
            return
        if hosted.name in self.tools:
            self.problems.append((where, f"two tools are named {hosted.name!r}"))
            return
        self._approval(hosted.name, entry, where)
        self.tools[hosted.name] = hosted
        self._parameters(hosted.name, where)

    def agent(self, where: str, entry: ToolEntry) -> None:
        """An `agent:` entry."""
        delegate = self._agent_tool(entry, where)
        if delegate is None:
            return
        if delegate.name in self.tools:
            self.problems.append((where, f"two tools are named {delegate.name!r}"))
            return
        self.tools[delegate.name] = delegate
        self._parameters(delegate.name, where)

    def _parameters(self, name: str, where: str) -> None:
        """The tool's parameter schema (derived from its inputs or type hints) must be one the argument
        check and the decoding constraint can use: a bad one would refuse every call, so it is refused
        here."""
        from runtime.validate import schema_problems

        tool = self.tools[name]
        for p in schema_problems(tool.schema.parameters):
            self.problems.append((where, f"the parameter schema of tool {name!r} is not a valid JSON "
                                         f"Schema: {p}"))

    def _own_limits(self, entry: ToolEntry, where: str) -> Limits | None:
        """The entry's `limits:` (None when it has none, or after recording why they are invalid)."""
        if entry.limits is None:
            return None
        return limits_value(entry.limits, f"{where}.limits", self.problems)

    def _output_model(self, entry: ToolEntry, where: str) -> Any:
        return output_model_value(entry.output_model, self.named, self.root, f"{where}.output_model",
                                  self.problems)

    def _approval(self, tool: str, entry: ToolEntry, where: str) -> None:
        if entry.approval is not None:
            rule = _approval_rule(tool, entry.approval, f"{where}.approval", self.problems)
            self.approvals.extend([rule] if rule is not None else [])

    def _python_tool(self, entry: ToolEntry, where: str) -> HostedPythonTool | None:
        """A `python:` entry as a tool, or None after recording what is wrong with it."""
        assert entry.python is not None
        problems = self.problems
        if entry.grants is not None or entry.environ:
            problems.append((where, "grants and environ are for `.pym` tools; a Python tool reaches the "
                                    "world directly (and may take an ExecutionContext parameter)"))
        try:
            func = import_object(entry.python, root=self.root, what="python tool")
        except ExternalsError as e:
            problems.append((f"{where}.python", str(e)))
            return None
        if not callable(func):
            problems.append((f"{where}.python", f"{entry.python!r} is not a function"))
            return None
        timeout = _duration(entry.timeout, "timeout", f"{where}.timeout", problems)
        if entry.concurrency is not None and entry.concurrency < 1:
            problems.append((f"{where}.concurrency", "must be at least 1"))
        retry = _retry(entry.retry, f"{where}.retry", problems) if entry.retry is not None else None
        own = self._own_limits(entry, where)
        output_model = self._output_model(entry, where)
        try:
            return HostedPythonTool(func, ref=entry.python, description=entry.description, timeout_s=timeout,
                                    concurrency=entry.concurrency, retry=retry,
                                    limits=self.global_limits.merge(own), output_model=output_model,
                                    requires_approval=entry.requires_approval)
        except (TypeError, ValueError) as e:
            problems.append((f"{where}.python", f"{e}; a Python tool's parameters need type hints that map "
                                                "to JSON Schema (str, int, float, bool, list[...], "
                                                "dict[str, ...], Literal, Optional, pydantic models)"))
            return None

    def _agent_tool(self, entry: ToolEntry, where: str) -> AgentTool | None:
        """An `agent:` entry as a tool, or None after recording what is wrong with it."""
        from runtime.nats.subjects import check_token

        assert entry.agent is not None
        problems = self.problems
        try:
            check_token(entry.agent, "agent")
        except ValueError as e:
            problems.append((f"{where}.agent", str(e)))
            return None
        if entry.grants is not None or entry.environ or entry.python or entry.retry or entry.concurrency:
            problems.append((where, "an agent tool takes description, max_depth, limits and approval "
                                    "settings only"))
        if entry.timeout is not None:
            problems.append((f"{where}.timeout", "an agent tool has no timeout: the child run is bounded by "
                                                 "its own bundle (termination.deadline, max_turns)"))
        if entry.max_depth is not None and entry.max_depth < 1:
            problems.append((f"{where}.max_depth", "must be at least 1"))
        try:
            return AgentTool(entry.agent, description=entry.description,
                             max_depth=entry.max_depth or DEFAULT_MAX_DEPTH, limits=self.global_limits,
                             requires_approval=entry.requires_approval)
        except ValueError as e:
            problems.append((where, str(e)))
            return None


def _load_tool(path: Path) -> tuple[ScriptTool | None, str]:
    """(tool, "") or (None, why it cannot be a tool): via runtime.tools, so the tool rules are the same."""
    found, failures = discover_tools([path])
    if failures:
        return None, "; ".join(str(f) for f in failures)
    return found[0], ""


def _duration(value: float | str | None, name: str, path: str, problems: list[Problem]) -> float | None:
    """A duration setting in seconds (None when absent, or after recording why it does not parse)."""
    if value is None:
        return None
    try:
        return parse_duration(value, field=name)
    except LimitsError as e:
        problems.append((path, str(e)))
        return None


def _retry(spec: RetrySpec, path: str, problems: list[Problem]) -> RetryPolicy:
    """A Python tool's `retry:` (a backoff that does not parse counts as none)."""
    backoff = _duration(spec.backoff, "backoff", f"{path}.backoff", problems) or 0.0
    if spec.attempts < 1:
        problems.append((f"{path}.attempts", "must be at least 1"))
    return RetryPolicy(attempts=spec.attempts, backoff_s=backoff, on=tuple(spec.exceptions))


def _grants(spec: GrantsSpec) -> Grants:
    http = spec.http_request
    return Grants(ask_llm=spec.ask_llm, http=http is not None, http_hosts=tuple(http.hosts) if http else (),
                  secrets=tuple(spec.secrets))


def _approval_rule(tool: str, spec: ApprovalSpec, where: str, problems: list[Problem]) -> ApprovalRule | None:
    """A tool entry's `approval:` as a rule, or None after recording what is wrong with it."""
    ok = True
    when = None
    if spec.when is not None:
        try:
            when = parse_condition(spec.when)
        except ConditionError as e:
            problems.append((f"{where}.when", str(e)))
            ok = False
    timeout = None
    if spec.timeout is not None:
        try:
            timeout = parse_duration(spec.timeout, field="timeout")
        except LimitsError as e:
            problems.append((f"{where}.timeout", str(e)))
            ok = False
    if not ok:
        return None
    try:
        return ApprovalRule(tool, when=when, timeout_s=timeout, on_timeout=spec.on_timeout, role=spec.role)
    except ConditionError as e:
        problems.append((where, str(e)))
        return None
