"""Tool policies: rules checked before a call runs and updated after its result.

A policy does not change what a tool does; it decides whether a call may run now, given what earlier
calls in the same run did ("deploy only after build succeeded", "overwrite a file only after reading
it"). The model reads a denial as an ordinary tool failure of kind `policy` and can adapt.

Policies live inside the pure kernel, so they obey its rules: a policy keeps no state of its own. Its
state is a value folded from results (`initial` → `update` per result) and held in the kernel state, so
a replay or a recovered run rebuilds it exactly. `check` and `update` must be deterministic functions.

Fail-closed: a policy that raises in `check` denies the call; a policy that raises in `update` is
broken for the rest of the run and denies every later call (`BROKEN`). A bug in a guard must never
turn into "allow everything".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from runtime.types import ToolCall, ToolResult


@runtime_checkable
class ToolPolicy(Protocol):
    """A guard on tool calls whose state folds from results. Return a reason string to deny, None to allow."""

    name: str

    def initial(self) -> Any: ...

    def check(self, state: Any, call: ToolCall) -> str | None: ...

    def update(self, state: Any, call: ToolCall, result: ToolResult) -> Any: ...


class _Broken:
    """The state of a policy whose `update` raised: every later check denies."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Broken) and other.reason == self.reason

    def __hash__(self) -> int:
        return hash(("broken", self.reason))

    def __repr__(self) -> str:
        return f"BROKEN({self.reason!r})"


def check_all(policies: Iterable[ToolPolicy], states: tuple[Any, ...], call: ToolCall) -> str | None:
    """The first denial among all policies (all must allow), fail-closed; None when every one allows."""
    for policy, state in zip(policies, states, strict=True):
        if isinstance(state, _Broken):
            return f"policy {policy.name} is out of order ({state.reason}); no calls are allowed"
        try:
            reason = policy.check(state, call)
        except Exception as exc:  # fail-closed: a guard that cannot decide says no
            return f"policy {policy.name} failed while checking the call: {type(exc).__name__}: {exc}"
        if reason is not None:
            return f"{policy.name}: {reason}"
    return None


def update_all(
    policies: Iterable[ToolPolicy], states: tuple[Any, ...], call: ToolCall, result: ToolResult
) -> tuple[Any, ...]:
    """Every policy's state after one result; a policy that raises becomes BROKEN (fail-closed)."""
    out = []
    for policy, state in zip(policies, states, strict=True):
        if isinstance(state, _Broken):
            out.append(state)
            continue
        try:
            out.append(policy.update(state, call, result))
        except Exception as exc:
            out.append(_Broken(f"update raised {type(exc).__name__}: {exc}"))
    return tuple(out)


def initial_all(policies: Iterable[ToolPolicy]) -> tuple[Any, ...]:
    out = []
    for policy in policies:
        try:
            out.append(policy.initial())
        except Exception as exc:
            out.append(_Broken(f"initial raised {type(exc).__name__}: {exc}"))
    return tuple(out)


class SequentialDependencyPolicy:
    """A tool may run only after each of its prerequisite tools has succeeded at least once in this run.

    `SequentialDependencyPolicy({"deploy": ["build", "test"]})`: `deploy` is denied until both `build` and
    `test` returned a result without error. State: the frozenset of tools that have succeeded.
    """

    name = "sequential_dependency"

    def __init__(self, dependencies: Mapping[str, Iterable[str]]) -> None:
        self.dependencies = {tool: tuple(deps) for tool, deps in dependencies.items()}

    def initial(self) -> frozenset[str]:
        return frozenset()

    def check(self, state: frozenset[str], call: ToolCall) -> str | None:
        missing = [dep for dep in self.dependencies.get(call.name, ()) if dep not in state]
        if not missing:
            return None
        needs = ", ".join(missing)
        return f"{call.name} requires {needs} to succeed first; call {missing[0]} before {call.name}"

    def update(self, state: frozenset[str], call: ToolCall, result: ToolResult) -> frozenset[str]:
        return state | {call.name} if result.ok else state


class ReadBeforeWritePolicy:
    """A write to a path is allowed only after the model has read that path (or written it before).

    A read counts once it completed, even with an error: a failed read of a missing file tells the model
    the file does not exist, so creating it next is informed, not blind. What the policy prevents is
    overwriting a file the model never looked at. State: the frozenset of paths seen.
    """

    name = "read_before_write"

    def __init__(
        self,
        read_tools: Iterable[str] = ("read_file",),
        write_tools: Iterable[str] = ("write_file", "edit_file"),
        path_argument: str = "path",
    ) -> None:
        self.read_tools = frozenset(read_tools)
        self.write_tools = frozenset(write_tools)
        self.path_argument = path_argument

    def _path(self, call: ToolCall) -> str | None:
        value = call.arguments.get(self.path_argument)
        return None if value is None else str(value)

    def initial(self) -> frozenset[str]:
        return frozenset()

    def check(self, state: frozenset[str], call: ToolCall) -> str | None:
        if call.name not in self.write_tools:
            return None
        path = self._path(call)
        if path is None:
            return f"{call.name} needs a `{self.path_argument}` argument"
        if path in state:
            return None
        readers = " or ".join(sorted(self.read_tools)) or "a read tool"
        return f"read {path!r} with {readers} before writing it with {call.name}"

    def update(self, state: frozenset[str], call: ToolCall, result: ToolResult) -> frozenset[str]:
        path = self._path(call)
        if path is None:
            return state
        if call.name in self.read_tools or (call.name in self.write_tools and result.ok):
            return state | {path}
        return state


__all__ = [
    "ReadBeforeWritePolicy",
    "SequentialDependencyPolicy",
    "ToolPolicy",
    "check_all",
    "initial_all",
    "update_all",
]
