"""One function per top-level bundle.yaml section (all but `tools:`), each checking what its section means.

The pydantic models (`runtime.bundle.schema`) have already checked shapes and types; these check the rest
(an adapter that exists, a duration that parses, a prompt file that reads, a policy that is known) and
resolve the section into what the `Bundle` holds. Each returns its own problems, named by the section's
YAML path and saying what is allowed, and never raises; `load_bundle` (`runtime.bundle.load`) calls them in
file order and reports every problem at once. `tools:` is big enough for its own module
(`runtime.bundle.tools`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runtime.bundle.problems import Problem, did_you_mean
from runtime.bundle.resolved import DataProviderSpec
from runtime.bundle.schema import (
    BundleSpec,
    ConstraintSpec,
    ConversationSpec,
    ModelSpec,
    QuestionsSpec,
    ScheduleSpec,
    TerminationSpec,
)
from runtime.bundle.values import limits_value, output_model_value
from runtime.externals import ExternalsError, ExternalsFactory, load_factory
from runtime.model import ADAPTERS
from runtime.quantities import LimitsError, parse_duration
from runtime.scripts import Limits

if TYPE_CHECKING:
    from runtime.policies import ToolPolicy
    from runtime.questions import QuestionsConfig
    from runtime.schedules import Schedule

__all__ = ["SAMPLING_KEYS", "conversation_section", "data_provider_section", "externals_section",
           "limits_section", "max_concurrent_tools_section", "model_section", "name_section",
           "output_models_section", "policies_section", "questions_section", "schedules_section",
           "server_section", "system_prompt_section", "termination_section", "timers_section",
           "workspace_section"]

# the sampling parameters `model.sampling` may set (what the model client passes on to the server)
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "stop", "presence_penalty",
                 "frequency_penalty", "repetition_penalty")


def name_section(name: str) -> list[Problem]:
    """`name:` is the agent id, one NATS subject token (`agents.<name>.tasks`)."""
    from runtime.nats.subjects import check_token

    try:
        check_token(name, "name")
    except ValueError as e:
        return [("name", str(e))]
    if ":" in name:
        bundle, _, instance = name.partition(":")
        return [("name", f"{name!r} holds ':', which separates an agent from its instance (tasks for "
                         f"'{bundle}:{instance}' go to instance {instance!r} of bundle {bundle!r}): name the "
                         f"bundle without ':' (say {bundle!r}) and send to {name!r} for that instance")]
    return []


def model_section(model: ModelSpec) -> list[Problem]:
    """`model:`: a known adapter, known sampling keys, a timeout that parses."""
    problems: list[Problem] = []
    if model.adapter not in ADAPTERS:
        problems.append(("model.adapter", f"unknown adapter {model.adapter!r}; known: "
                                          f"{', '.join(sorted(ADAPTERS))}"))
    for k in model.sampling:
        if k not in SAMPLING_KEYS:
            problems.append((f"model.sampling.{k}", f"unknown sampling key{did_you_mean(k, SAMPLING_KEYS)}; "
                                                    f"allowed: {', '.join(SAMPLING_KEYS)}"))
    try:
        parse_duration(model.timeout, field="timeout")
    except LimitsError as e:
        problems.append(("model.timeout", str(e)))
    return problems


def server_section(model: ModelSpec, constraint: ConstraintSpec) -> list[Problem]:
    """`model.server` with `constraint:`: a server that enforces the bundle's strategy for its adapter, or a
    refusal naming the server, the strategy and the strategies it can enforce (`runtime.model.dialects`).
    `auto` is checked at start, once the server has said which it is."""
    from runtime.model import DecodingConstraint, get_adapter
    from runtime.model.dialects import refusal

    if model.server == "auto" or model.adapter not in ADAPTERS:
        return []
    wanted = None if constraint.strategy == "none" else DecodingConstraint(
        constraint.strategy, constraint.parallel_calls, constraint.send_tools_to_api)
    why = refusal(model.server, get_adapter(model.adapter), wanted)
    return [("model.server", why)] if why else []


def system_prompt_section(spec: BundleSpec, root: Path) -> tuple[str, list[Problem]]:
    """`system_prompt:` or `system_prompt_file:` (read relative to the bundle folder `root`): the text."""
    if not spec.system_prompt_file:
        return spec.system_prompt or "", []
    problems: list[Problem] = []
    if spec.system_prompt is not None:
        problems.append(("system_prompt_file", "set system_prompt or system_prompt_file, not both"))
    try:
        return (root / spec.system_prompt_file).read_text(encoding="utf-8"), problems
    except OSError as e:
        problems.append(("system_prompt_file", f"cannot read: {e.strerror or e}"))
        return spec.system_prompt or "", problems


def limits_section(spec: Any) -> tuple[Limits, list[Problem]]:
    """`limits:`, the tools' default (each entry's own limits merge over it); the default preset when
    absent or invalid."""
    problems: list[Problem] = []
    return limits_value(spec, "limits", problems) or Limits.default(), problems


def output_models_section(models: dict[str, Any], root: Path) -> tuple[dict[str, Any], list[Problem]]:
    """`output_models:`, the models tool entries name: each a JSON Schema or `module:Class` (not another
    name from the same table)."""
    problems: list[Problem] = []
    named: dict[str, Any] = {}
    for name, ref in models.items():
        if isinstance(ref, str) and ref in models:
            problems.append((f"output_models.{name}", "must be 'module:Class' or a JSON Schema object"))
            continue
        model = output_model_value(ref, {}, root, f"output_models.{name}", problems)
        if model is not None:
            named[name] = model
    return named, problems


def externals_section(ref: str | None, root: Path) -> tuple[ExternalsFactory | None, list[Problem]]:
    """`externals:`, the factory of the scripts' @external functions, imported relative to `root`."""
    if ref is None:
        return None, []
    try:
        return load_factory(ref, root=root), []
    except ExternalsError as e:
        return None, [("externals", str(e))]


def termination_section(term: TerminationSpec, tools: Collection[str], complete: bool = True
                        ) -> tuple[float | None, list[Problem]]:
    """`termination:`: a terminal tool the bundle has, at least one turn, a deadline that parses (the
    deadline in seconds is the value). `complete`: every tool entry loaded; when none did, a missing
    terminal tool is likely one of those entries' problems, already named."""
    problems: list[Problem] = []
    if term.terminal_tool is not None and (tools or complete) and term.terminal_tool not in tools:
        names = ", ".join(sorted(tools)) or "none"
        hint = did_you_mean(term.terminal_tool, tools)
        problems.append(("termination.terminal_tool",
                         f"{term.terminal_tool!r} is not a tool of this bundle{hint}; tools: {names}"))
    if term.max_turns < 1:
        problems.append(("termination.max_turns", "must be at least 1"))
    deadline_s = None
    if term.deadline is not None:
        try:
            deadline_s = parse_duration(term.deadline, field="deadline")
        except LimitsError as e:
            problems.append(("termination.deadline", str(e)))
    return deadline_s, problems


def max_concurrent_tools_section(value: int) -> list[Problem]:
    """`max_concurrent_tools:`: how many of a turn's tool calls run at once; at least one."""
    return [("max_concurrent_tools", "must be at least 1")] if value < 1 else []


def conversation_section(conversation: ConversationSpec) -> list[Problem]:
    """`conversation:`: a summary keeps some, but not all, of the messages it would replace."""
    summarise = conversation.summarise
    if summarise is not None and not 1 <= summarise.keep < summarise.after:
        return [("conversation.summarise",
                 f"needs 1 <= keep < after (got keep {summarise.keep}, after {summarise.after}): "
                 "keep is how many of the newest messages stay as they are")]
    return []


def policies_section(items: list[Any]) -> tuple[tuple[ToolPolicy, ...], list[Problem]]:
    """`policies:`, each a one-key mapping `{kind: arguments}` of a known kind."""
    problems: list[Problem] = []
    policies = tuple(x for i, item in enumerate(items)
                     if (x := _policy(item, f"policies[{i}]", problems)) is not None)
    return policies, problems


def _policy(item: Any, path: str, problems: list[Problem]) -> ToolPolicy | None:
    if not (isinstance(item, dict) and len(item) == 1):
        problems.append((path, f"a policy is a one-key mapping, one of: {', '.join(_POLICIES)}"))
        return None
    (kind, args), = item.items()
    build = _POLICIES.get(kind)
    if build is None:
        problems.append((f"{path}.{kind}", f"unknown policy{did_you_mean(str(kind), _POLICIES)}; "
                                           f"known: {', '.join(_POLICIES)}"))
        return None
    try:
        return build(args)
    except (TypeError, ValueError) as e:
        problems.append((f"{path}.{kind}", str(e)))
        return None


def _sequential_dependency(args: Any) -> ToolPolicy:
    from runtime.policies import SequentialDependencyPolicy

    if not isinstance(args, dict) or not all(isinstance(v, list) for v in args.values()):
        raise ValueError("expects {tool: [prerequisite tools]}")
    return SequentialDependencyPolicy(args)


def _read_before_write(args: Any) -> ToolPolicy:
    from runtime.policies import ReadBeforeWritePolicy

    args = args or {}
    if not isinstance(args, dict):
        raise ValueError("expects {read_tools: [...], write_tools: [...], path_argument: name}")
    allowed = ("read_tools", "write_tools", "path_argument")
    extra = [k for k in args if k not in allowed]
    if extra:
        raise ValueError(f"unknown key(s) {extra}; allowed keys: {', '.join(allowed)}")
    return ReadBeforeWritePolicy(**args)


# each policy kind and how its arguments become one (a ValueError or TypeError says what is wrong)
_POLICIES: dict[str, Callable[[Any], ToolPolicy]] = {
    "sequential_dependency": _sequential_dependency,
    "read_before_write": _read_before_write,
}

# each data provider and the keys it takes
_PROVIDER_KEYS = {"none": {"type"}, "static": {"type", "folder", "files"}, "workspace": {"type", "workspace"}}
_PROVIDERS = tuple(_PROVIDER_KEYS)


def data_provider_section(spec: Any, default_ws: str | None, root: Path
                          ) -> tuple[DataProviderSpec, list[Problem]]:
    """`data_provider:`, a kind's name or `{type: kind, ...}`: where a tool job's virtual files come
    from. A workspace provider without its own `workspace:` uses the bundle's (`default_ws`)."""
    path = "data_provider"
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        return DataProviderSpec(), [(path, f"use one of {', '.join(_PROVIDERS)}, or a mapping with 'type'")]
    kind = spec["type"]
    if not isinstance(spec["type"], str) or spec["type"] not in _PROVIDER_KEYS:
        return DataProviderSpec(), [(f"{path}.type", f"unknown data provider {kind!r}; "
                                                     f"use one of {', '.join(_PROVIDERS)}")]
    problems: list[Problem] = [(f"{path}.{k}", f"not a key of the {kind} provider; allowed: "
                                               f"{', '.join(sorted(_PROVIDER_KEYS[kind]))}")
                               for k in spec if k not in _PROVIDER_KEYS[kind]]
    folder = None
    if kind == "static" and spec.get("folder") is not None:
        folder = (root / str(spec["folder"])).resolve()
        if not folder.is_dir():
            problems.append((f"{path}.folder", f"{folder} is not a directory"))
    files = spec.get("files") or {}
    if not isinstance(files, dict) or not all(isinstance(v, str) for v in files.values()):
        problems.append((f"{path}.files", "must map virtual paths to text"))
        files = {}
    workspace = spec.get("workspace") or default_ws
    if kind == "workspace" and not workspace:
        problems.append((path, "the workspace provider needs a workspace: set `workspace:` in the bundle"))
    return DataProviderSpec(kind=kind, folder=folder, files=dict(files), workspace=workspace), problems


def workspace_section(workspace: str | None) -> list[Problem]:
    """`workspace:`, the KV workspace tool jobs read and write: a name a KV bucket can have."""
    if workspace is None:
        return []
    from runtime.nats.subjects import workspace_bucket

    try:
        workspace_bucket(workspace)
    except ValueError as e:
        return [("workspace", str(e))]
    return []


def timers_section(timers: Sequence[str], tools: Collection[str]) -> list[Problem]:
    """`timers:`, the built-in durable timers (`runtime.timers`) the model is offered: each once, and not
    the name of one of the bundle's own tools."""
    problems: list[Problem] = []
    for i, name in enumerate(timers):
        if name in timers[:i]:
            problems.append((f"timers[{i}]", f"{name} is listed twice"))
        elif name in tools:
            problems.append((f"timers[{i}]", f"a tool of this bundle is named {name}: rename it, or drop the "
                                             "timer"))
    return problems


def questions_section(spec: QuestionsSpec | None, tools: Collection[str],
                      ) -> tuple[QuestionsConfig | None, list[Problem]]:
    """`questions:`, the built-in `ask_human` (`runtime.questions`): a timeout that parses, and no tool of
    the bundle's own with that name. A default given (even null) is the answer a question gets at its
    timeout; given without a timeout it would never apply, which is an error rather than a surprise."""
    from runtime.questions import ASK_HUMAN, QuestionsConfig

    if spec is None:
        return None, []
    problems: list[Problem] = []
    if ASK_HUMAN in tools:
        problems.append(("questions", f"a tool of this bundle is named {ASK_HUMAN}: rename it, or drop "
                                      "`questions:`"))
    timeout = None
    if spec.timeout is not None:
        timeout = _long_duration(spec.timeout)
        if timeout is None:
            problems.append(("questions.timeout", f"{spec.timeout!r} is not a duration such as 90s, 30m, 4h "
                                                  "or 2d"))
    if "default" in spec.model_fields_set and spec.timeout is None:
        problems.append(("questions.default", "a default is the answer at the timeout: set `timeout` too "
                                              "(e.g. timeout: 1h), or drop the default"))
    if problems:
        return None, problems
    return QuestionsConfig(timeout_s=timeout, default=spec.default,
                           has_default="default" in spec.model_fields_set), []


def _long_duration(value: float | str) -> float | None:
    """Seconds of a duration that may run to hours or days (`90s`, `500ms`, `4h`, `1h30m`, `2d`): a person's
    answer is awaited on that scale. None if it does not parse."""
    from runtime.schedules import ScheduleError
    from runtime.schedules.spec import parse_every

    try:
        return parse_duration(value, field="timeout")
    except LimitsError:
        pass
    try:
        return float(parse_every(value))
    except ScheduleError:
        return None


def schedules_section(entries: list[ScheduleSpec], agent: str) -> tuple[tuple[Schedule, ...], list[Problem]]:
    """`schedules:`, runs of this agent the cluster's clock starts (`runtime.schedules`): each a valid
    schedule, names unique."""
    from runtime.schedules import ScheduleError, make_schedule

    problems: list[Problem] = []
    out: list[Schedule] = []
    for i, entry in enumerate(entries):
        path = f"schedules[{i}]"
        if any(e.name == entry.name for e in entries[:i]):
            problems.append((f"{path}.name", f"schedule {entry.name!r} is defined twice"))
            continue
        try:
            grace = parse_duration(entry.grace, field="grace")
            out.append(make_schedule(entry.name, agent, entry.input, cron=entry.cron, every=entry.every,
                                     at=entry.at, tz=entry.tz, instance=entry.instance, thread=entry.thread,
                                     catch_up=entry.catch_up, grace_s=grace, origin=f"bundle {agent}"))
        except (ScheduleError, LimitsError) as e:
            problems.append((path, str(e)))
    return tuple(out), problems
