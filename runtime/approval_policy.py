"""Which tool calls wait for a person, for how long, and who may decide: the approval policy of a bundle.

    rule = ApprovalRule("transfer", when=Condition(all=(Clause("amount", ">", 100),)),
                        timeout_s=600, on_timeout="deny", role="finance")
    rule.applies(call)        # True: this call waits for an approver (the kernel asks for one)

A rule is data, never code: a tool, an optional condition over the call's arguments, a timeout with the
verdict to apply when it passes, and the operator role that may decide. The condition is a small
declarative predicate (`Clause(arg, op, value)`, combined with `all` / `any`) so a bundle can say "only
transfers over 100" without running anything, a replay evaluates it to the same answer, and the kernel,
which must stay pure and deterministic, can check it.

Fail-closed: a clause that cannot be evaluated (the argument has a type the operator does not compare,
say `"lots" > 100`) counts as holding, so a call the condition cannot judge waits for a person rather
than slipping through. An argument that is absent makes its clause false (except `op: absent`): a
condition names what must be approved, and a call without that argument is not it.

The role is recorded in `approval.requested` for the operator tools; who holds it is the business of
the NATS authorization layer, not of this module.

Pure: no I/O, no clock. Timeouts are durations; the kernel turns them into deadlines from the
`approval.requested` event's timestamp.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from runtime.types import ToolCall

Verdict = Literal["approve", "deny"]
VERDICTS: tuple[str, ...] = ("approve", "deny")

_ORDER: dict[str, Callable[[Any, Any], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le,
}
OPS: tuple[str, ...] = ("==", "!=", ">", ">=", "<", "<=", "in", "not_in", "contains", "matches",
                        "present", "absent")


class ConditionError(ValueError):
    """A condition that is not well formed (unknown op, a value of the wrong shape); says what to fix."""


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Clause:
    """`arguments[arg] <op> value`. `arg` may be a dotted path into nested objects (`target.env`)."""

    arg: str
    op: str
    value: Any = None

    def __post_init__(self) -> None:
        if not self.arg:
            raise ConditionError("a clause needs `arg`: the name of the argument it tests")
        if self.op not in OPS:
            raise ConditionError(f"unknown op {self.op!r}; use one of: {', '.join(OPS)}")
        if self.op in ("in", "not_in") and not isinstance(self.value, list | tuple):
            raise ConditionError(f"op {self.op!r} needs a list `value`, got {self.value!r}")
        if self.op in _ORDER and not (_number(self.value) or isinstance(self.value, str)):
            raise ConditionError(f"op {self.op!r} compares numbers or strings, got {self.value!r}")
        if self.op == "matches":
            if not isinstance(self.value, str):
                raise ConditionError(f"op 'matches' needs a regular expression string, got {self.value!r}")
            try:
                re.compile(self.value)
            except re.error as e:
                raise ConditionError(f"op 'matches': {self.value!r} is not a regular expression: {e}"
                                     ) from None

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        found, value = _lookup(arguments, self.arg)
        if self.op == "present":
            return found
        if self.op == "absent":
            return not found
        if not found:
            return False
        try:
            return _compare(self.op, value, self.value)
        except (TypeError, ValueError):
            return True  # fail-closed: a value the clause cannot judge waits for a person

    def describe(self) -> str:
        return f"{self.arg} {self.op}" + ("" if self.op in ("present", "absent") else f" {self.value!r}")


def _lookup(arguments: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    value: Any = arguments
    for part in path.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _compare(op: str, left: Any, right: Any) -> bool:
    if op == "==":
        return bool(left == right)
    if op == "!=":
        return bool(left != right)
    if op in _ORDER:
        if _number(right) != _number(left) or isinstance(left, bool):
            raise TypeError(f"cannot compare {left!r} with {right!r}")
        return _ORDER[op](left, right)
    if op == "in":
        return left in right
    if op == "not_in":
        return left not in right
    if op == "contains":
        if isinstance(left, str):
            if not isinstance(right, str):
                raise TypeError("a string contains only strings")
            return right in left
        if isinstance(left, list | tuple | Mapping):
            return right in left
        raise TypeError(f"{left!r} cannot contain anything")
    if op == "matches":
        if not isinstance(left, str):
            raise TypeError(f"{left!r} is not a string")
        return re.search(right, left) is not None
    raise ValueError(op)


@dataclass(frozen=True)
class Condition:
    """`all` of its clauses hold and (when given) `any` of the others does. Empty: always holds."""

    all: tuple[Clause, ...] = ()
    any: tuple[Clause, ...] = ()

    def holds(self, arguments: Mapping[str, Any]) -> bool:
        if not all(c.holds(arguments) for c in self.all):
            return False
        return not self.any or any(c.holds(arguments) for c in self.any)

    def describe(self) -> str:
        parts = []
        if self.all:
            parts.append(" and ".join(c.describe() for c in self.all))
        if self.any:
            parts.append("(" + " or ".join(c.describe() for c in self.any) + ")")
        return " and ".join(parts) or "always"


@dataclass(frozen=True)
class ApprovalRule:
    """A call of `tool` waits for an approver when `when` holds (always when it is None). With
    `timeout_s`, `on_timeout` is the verdict once that long has passed without a decision."""

    tool: str
    when: Condition | None = None
    timeout_s: float | None = None
    on_timeout: Verdict = "deny"
    role: str = ""

    def __post_init__(self) -> None:
        if self.timeout_s is not None and self.timeout_s <= 0:
            raise ConditionError(f"timeout must be positive, got {self.timeout_s}")
        if self.on_timeout not in VERDICTS:
            raise ConditionError(f"on_timeout must be one of {', '.join(VERDICTS)}, got {self.on_timeout!r}")

    def applies(self, call: ToolCall) -> bool:
        return call.name == self.tool and (self.when is None or self.when.holds(call.arguments))


def rule_for(rules: tuple[ApprovalRule, ...], call: ToolCall) -> ApprovalRule | None:
    """The first rule that makes `call` wait for an approver, or None if it may run without one."""
    return next((r for r in rules if r.applies(call)), None)


def parse_condition(spec: Any) -> Condition:
    """A condition from its YAML shape: one clause `{arg, op, value}`, or `{all: [...], any: [...]}` of
    clauses. `ConditionError` says what is wrong."""
    if not isinstance(spec, Mapping):
        raise ConditionError("a condition is a mapping: {arg: amount, op: '>', value: 100} or "
                             "{all: [clauses]} / {any: [clauses]}")
    if "arg" in spec:
        return Condition(all=(_clause(spec, "when"),))
    unknown = sorted(set(spec) - {"all", "any"})
    if unknown:
        raise ConditionError(f"unknown key(s) {', '.join(unknown)} in a condition; use arg/op/value for one "
                             "clause, or all / any for a list of clauses")
    groups: dict[str, tuple[Clause, ...]] = {}
    for key in ("all", "any"):
        items = spec.get(key, [])
        if not isinstance(items, list):
            raise ConditionError(f"`{key}` is a list of clauses {{arg, op, value}}")
        groups[key] = tuple(_clause(item, f"{key}[{i}]") for i, item in enumerate(items))
    if not groups["all"] and not groups["any"]:
        raise ConditionError("an empty condition: give `all` or `any` clauses (or leave `when` out)")
    return Condition(all=groups["all"], any=groups["any"])


def _clause(spec: Any, where: str) -> Clause:
    if not isinstance(spec, Mapping):
        raise ConditionError(f"{where}: a clause is a mapping {{arg, op, value}}")
    unknown = sorted(set(spec) - {"arg", "op", "value"})
    if unknown:
        raise ConditionError(f"{where}: unknown key(s) {', '.join(unknown)}; a clause has arg, op, value")
    if not isinstance(spec.get("arg"), str) or "op" not in spec:
        raise ConditionError(f"{where}: a clause needs `arg` (an argument name) and `op` (one of "
                             f"{', '.join(OPS)})")
    if spec["op"] not in ("present", "absent") and "value" not in spec:
        raise ConditionError(f"{where}: op {spec['op']!r} needs a `value`")
    try:
        return Clause(spec["arg"], str(spec["op"]), spec.get("value"))
    except ConditionError as e:
        raise ConditionError(f"{where}: {e}") from None


__all__ = ["OPS", "VERDICTS", "ApprovalRule", "Clause", "Condition", "ConditionError", "Verdict",
           "parse_condition", "rule_for"]
