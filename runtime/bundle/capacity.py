"""The sections that share the model among agents: `endpoint:`, `budgets:` and `priority:`.

Each function checks its section's values and resolves it into what the `Bundle` holds (the types of
`runtime.model.limits`); like every section function it returns its own problems, named by YAML path, and
never raises. What the settings do at run time is `runtime.model.limits`' and `runtime.host.endpoint`'s to
say.
"""

from __future__ import annotations

from runtime.bundle.problems import Problem
from runtime.bundle.schema import BudgetsSpec, EndpointSpec
from runtime.events import MAX_PRIORITY, MIN_PRIORITY
from runtime.model.limits import Budgets, EndpointLimits
from runtime.quantities import LimitsError, parse_duration

__all__ = ["budgets_section", "endpoint_section", "priority_section"]


def endpoint_section(spec: EndpointSpec | None) -> tuple[EndpointLimits | None, list[Problem]]:
    """`endpoint:`: positive limits, a `retry_after_max` that parses, throttle retries not negative."""
    if spec is None:
        return None, []
    problems: list[Problem] = []
    for key in ("max_in_flight", "tokens_per_minute"):
        value = getattr(spec, key)
        if value is not None and value < 1:
            problems.append((f"endpoint.{key}", f"must be at least 1 (leave it out for no limit), got "
                                                f"{value}"))
    if spec.throttle_retries < 0:
        problems.append(("endpoint.throttle_retries", f"must be 0 or more, got {spec.throttle_retries}"))
    retry_after_max = 30.0
    try:
        retry_after_max = parse_duration(spec.retry_after_max, field="retry_after_max") or 0.0
    except LimitsError as e:
        problems.append(("endpoint.retry_after_max", str(e)))
    if problems:
        return None, problems
    return EndpointLimits(spec.max_in_flight, spec.tokens_per_minute, retry_after_max,
                          spec.throttle_retries), []


def budgets_section(spec: BudgetsSpec) -> tuple[Budgets, list[Problem]]:
    """`budgets:`: token budgets of at least one token."""
    problems: list[Problem] = [
        (f"budgets.{key}", f"must be at least 1 token (leave it out for no budget), got {value}")
        for key in ("run_tokens", "agent_tokens_per_day")
        if (value := getattr(spec, key)) is not None and value < 1]
    if problems:
        return Budgets(), problems
    return Budgets(spec.run_tokens, spec.agent_tokens_per_day, spec.on_exceeded), []


def priority_section(priority: int | None) -> list[Problem]:
    """`priority:`: the default priority of the agent's tasks, from 0 to 9 (higher first)."""
    if priority is not None and not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        return [("priority", f"must be from {MIN_PRIORITY} (least urgent) to {MAX_PRIORITY} (most urgent, "
                             f"served first), got {priority}")]
    return []
