"""bundle.yaml: one agent's whole configuration, validated up front with errors that name the YAML path.

A bundle is what `sa up`/`sa host` load to make an agent reachable at `agents.<name>.tasks`, and what a
worker loads to know the agent's tools::

    name: workspace_agent                     # the agent id: one subject token
    system_prompt: "You are ..."              # or system_prompt_file: prompt.md (relative to the bundle)
    model:
      adapter: hermes                         # a runtime.model adapter
      base_url: local                         # `local`: the embedded model server; else a URL
      name: smollm2-135m
      sampling: {temperature: 0.2, max_tokens: 512}
    constraint: {strategy: ebnf, parallel_calls: false}
    limits: default                           # preset name or inline {max_memory: 16mb, ...}
    tools:
      - "tools/*.pym"                         # a glob relative to the bundle file
      - path: tools/add_entry.pym             # an explicit entry
        limits: {max_duration: 5s}            # merged over the global limits (Limits.merge)
        output_model: AddEntryResult          # a name from output_models, `module:Class`, or a JSON Schema
        requires_approval: false              # true: every call waits for an operator (`sa approve`)
      - path: tools/order.pym                 # a script with @external functions
        description: Places an order.         #   the model's description when the script has no docstring
        environ: {REGION: eu}                 #   the sandbox's os.environ
        grants:                               #   built-in externals (runtime.externals.builtins)
          ask_llm: true
          http_request: {hosts: [api.example.com]}
          secrets: [SHOP_TOKEN]
      - python: shop_tools:lookup_order       # a Python function as a tool, run by workers
        timeout: 5s                           #   (runtime.tools.hosted): timeout, concurrency, retry
        concurrency: 4
        retry: {attempts: 3, backoff: 200ms, exceptions: [ConnectionError]}
      - agent: researcher                     # another agent as a tool: a durable sub-run
        description: Finds facts on the web.  #   (max_depth: how deep sub-runs may nest)
      - path: tools/transfer.pym
        approval:                             # a call waits for an operator when `when` holds
          when: {arg: amount, op: ">", value: 100}   # or {all: [clauses]} / {any: [clauses]}; no `when`:
          timeout: 10m                        #   always. Without a decision in 10 min: on_timeout
          on_timeout: deny                    #   (deny | approve) applies, recorded `by: timeout`
          role: finance                       # the operator role that may decide (recorded)
    output_models:
      AddEntryResult: {type: object, properties: {message: {type: string}}, required: [message]}
    data_provider: workspace                  # none | static | workspace, or {type: static, folder: data/}
    workspace: notes                          # the KV workspace tool jobs read and write
    externals: shop_externals:Factory         # an ExternalsFactory for the scripts' @external functions
    termination: {terminal_tool: submit_result, max_turns: 20, deadline: 10m, max_consecutive_errors: 3}
    policies:
      - sequential_dependency: {deploy: [build, test]}
      - read_before_write: {read_tools: [read_file], write_tools: [write_file]}
    max_concurrent_tools: 4
    history_window: 40
    resume: same-version                      # a run resumed after a crash on a changed bundle: fail it
                                              # (same-version, the default) or go on with it (latest)
    conversation:                             # tasks that name a thread (`sa send --thread`)
      double_texting: enqueue                 # a task while one is active: enqueue | reject | interrupt
      stream: true                            # publish model output live on stream.<actor>.<run>
      summarise: {after: 80, keep: 20}        # a thread over 80 messages: older ones become a summary

Every mapping rejects unknown keys (with a "did you mean" hint). `load_bundle` collects every problem it
can find, then raises one `BundleError` listing them as `<file>: <yaml path>: <what is wrong; what is
allowed>`, so a user fixes a bundle in one pass. Tool load failures (a .pym that does not parse) are
bundle errors too: an agent must never start with a tool that cannot run.

This is one module although it is over 500 lines, because it is one concept: the file's schema and its
resolution into tools, limits, policies and data share the YAML paths every error names, so a reader who
asks what a key means finds its model and what becomes of it in the same place.
"""

from __future__ import annotations

import difflib
import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

from runtime.approval_policy import ApprovalRule, ConditionError, parse_condition
from runtime.externals import ExternalsError, ExternalsFactory, Grants, import_object, load_factory
from runtime.model import ADAPTERS, DecodingConstraint, Strategy
from runtime.scripts import Limits, LimitsError, parse_duration
from runtime.tools import ScriptLoadError, ScriptTool, discover_tools
from runtime.tools.agent_tool import DEFAULT_MAX_DEPTH, AgentTool
from runtime.tools.hosted import HostedPythonTool, RetryPolicy
from runtime.types import ToolSchema

BundleTool = ScriptTool | HostedPythonTool | AgentTool

if TYPE_CHECKING:
    from runtime.kernel import KernelConfig
    from runtime.policies import ToolPolicy

_SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "max_tokens", "seed", "stop", "presence_penalty",
                  "frequency_penalty", "repetition_penalty")
_PROVIDERS = ("none", "static", "workspace")
_POLICIES = ("sequential_dependency", "read_before_write")


class BundleError(ValueError):
    """An invalid bundle: every problem found, each as (yaml path, message)."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{source}: {path}: {msg}" if path else f"{source}: {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))


# ---------------------------------------------------------------------------------------------------------
# the YAML schema (pydantic models; unions are avoided so error paths stay the YAML's own)
# ---------------------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    adapter: str = "hermes"
    base_url: str = "local"
    name: str = "smollm2-135m"
    api_key_env: str | None = None
    timeout: float | str = 60.0
    sampling: dict[str, Any] = {}


class ConstraintSpec(_Strict):
    strategy: Strategy = "ebnf"
    parallel_calls: bool = False
    send_tools_to_api: bool = False


class ApprovalSpec(_Strict):
    """When a tool's call waits for an operator (`runtime.approval_policy`): always, or when `when` holds;
    for how long (`timeout`), the verdict then (`on_timeout`), and who may decide (`role`)."""

    when: Any = None
    timeout: float | str | None = None
    on_timeout: Literal["approve", "deny"] = "deny"
    role: str = ""


class HttpGrant(_Strict):
    hosts: list[str]


class GrantsSpec(_Strict):
    """Built-in externals a tool may use (`runtime.externals.builtins`)."""

    ask_llm: bool = False
    http_request: HttpGrant | None = None
    secrets: list[str] = []


class RetrySpec(_Strict):
    attempts: int = 1
    backoff: float | str = 0.1
    exceptions: list[str] = []  # (not `on:`, which YAML reads as `true`)


class ToolEntry(_Strict):
    path: str | None = None  # a .pym script, or
    python: str | None = None  # a Python function `package.module:function` run by workers, or
    agent: str | None = None  # another agent, called as a durable sub-run
    max_depth: int | None = None  # agent tools only: how deep sub-runs may nest
    description: str | None = None
    environ: dict[str, str] = {}
    grants: GrantsSpec | None = None
    limits: Any = None
    output_model: Any = None
    requires_approval: bool = False
    approval: ApprovalSpec | None = None
    timeout: float | str | None = None  # python tools only
    concurrency: int | None = None
    retry: RetrySpec | None = None


class TerminationSpec(_Strict):
    terminal_tool: str | None = None
    max_turns: int = 20
    max_consecutive_errors: int = 3
    deadline: float | str | None = None
    force_terminal_on_last_turn: bool = True  # the last turn offers only the terminal tool (kernel)


class SummariseSpec(_Strict):
    """When a thread's conversation has more than `after` messages, the next run starts from a summary of
    all but the newest `keep` (made by the bundle's model with `prompt`, recorded in `run.started`)."""

    after: int = 80
    keep: int = 20
    prompt: str = ("Summarise the conversation so far for your own later use: the user's goals, the facts "
                   "and results established, decisions made and what is still open. Be brief and concrete.")


class ConversationSpec(_Strict):
    """How the agent behaves as a chat: what a second task does while one is active (`double_texting`:
    wait behind it, be refused at once, or cancel it and go on from its conversation so far), whether
    model output is published as it is generated, and when a long thread is summarised."""

    double_texting: Literal["enqueue", "reject", "interrupt"] = "enqueue"
    stream: bool = True
    summarise: SummariseSpec | None = None


class BundleSpec(_Strict):
    name: str
    description: str = ""
    system_prompt: str | None = None
    system_prompt_file: str | None = None
    model: ModelSpec = ModelSpec()
    constraint: ConstraintSpec = ConstraintSpec()
    limits: Any = None
    tools: list[Any] = []
    output_models: dict[str, Any] = {}
    data_provider: Any = "none"
    workspace: str | None = None
    termination: TerminationSpec = TerminationSpec()
    policies: list[Any] = []
    max_concurrent_tools: int = 4
    history_window: int | None = None
    externals: str | None = None  # an ExternalsFactory `package.module:attr` for the tools' @externals
    # What a host does with a run that started on another version of this bundle (a host restarted or took
    # over with a changed bundle.yaml or tool): fail it, saying why, or continue it on the loaded version.
    resume: Literal["same-version", "latest"] = "same-version"
    conversation: ConversationSpec = ConversationSpec()


# ---------------------------------------------------------------------------------------------------------
# the resolved bundle
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataProviderSpec:
    kind: Literal["none", "static", "workspace"] = "none"
    folder: Path | None = None
    files: dict[str, str] = field(default_factory=dict)
    workspace: str | None = None


@dataclass(frozen=True)
class Bundle:
    """A validated bundle. `digest` is a content hash of the bundle file and every tool source, recorded
    in `run.started` so a replay can tell which bundle version produced a run."""

    name: str
    path: Path
    spec: BundleSpec
    system_prompt: str
    limits: Limits
    tools: dict[str, BundleTool]  # each with its limits (global merged with its own), output model, approval
    data_provider: DataProviderSpec
    deadline_s: float | None
    policies: tuple[ToolPolicy, ...]
    digest: str
    approvals: tuple[ApprovalRule, ...] = ()  # the tools' approval rules (`approval:` entries)
    grants: dict[str, Grants] = field(default_factory=dict)  # tool -> its built-in externals
    factory: ExternalsFactory | None = None  # `externals:`, imported

    @property
    def root(self) -> Path:
        return self.path.parent

    @property
    def workspace(self) -> str | None:
        return self.data_provider.workspace or self.spec.workspace

    def limits_for(self, tool: str) -> Limits:
        return self.tools[tool].limits if tool in self.tools else self.limits

    def output_model_for(self, tool: str) -> Any:
        return self.tools[tool].output_model if tool in self.tools else None

    def tool_schemas(self) -> tuple[ToolSchema, ...]:
        return tuple(t.schema for t in self.tools.values())

    def kernel_config(self) -> KernelConfig:
        """The kernel's `KernelConfig` for this bundle (tool schemas, termination, policies, sampling)."""
        from runtime.kernel import KernelConfig

        term = self.spec.termination
        return KernelConfig(
            system_prompt=self.system_prompt, tools=self.tool_schemas(), terminal_tool=term.terminal_tool,
            max_turns=term.max_turns, max_consecutive_errors=term.max_consecutive_errors,
            force_terminal_on_last_turn=term.force_terminal_on_last_turn,
            max_concurrent_tools=self.spec.max_concurrent_tools, history_window=self.spec.history_window,
            policies=self.policies,
            requires_approval=frozenset(n for n, t in self.tools.items() if t.requires_approval),
            approvals=self.approvals, sampling=dict(self.spec.model.sampling))

    def decoding_constraint(self) -> DecodingConstraint:
        c = self.spec.constraint
        return DecodingConstraint(strategy=c.strategy, allow_parallel_calls=c.parallel_calls,
                                  send_tools_to_api=c.send_tools_to_api)

    @property
    def uses_local_model(self) -> bool:
        return self.spec.model.base_url == "local"


# ---------------------------------------------------------------------------------------------------------
# loading
# ---------------------------------------------------------------------------------------------------------


def _path_str(loc: tuple[Any, ...], base: str = "") -> str:
    out = base
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at `loc` (the parent of an unknown key), walking nested models."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        info = getattr(current, "model_fields", {}).get(part)
        ann = getattr(info, "annotation", None)
        models = [a for a in (ann, *get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)]
        current = models[0] if models else None  # `X | None` of a model: the model
    return list(getattr(current, "model_fields", {})) if current is not None else []


def _pydantic_problems(err: ValidationError, model: type[BaseModel], base: str) -> list[tuple[str, str]]:
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _path_str(loc, base)
        if e["type"] == "extra_forbidden":
            allowed = _allowed_fields(model, loc[:-1])
            key = str(loc[-1])
            close = difflib.get_close_matches(key, allowed, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((path, f"unknown key{hint}; allowed keys: {', '.join(allowed)}"))
        elif e["type"] == "missing":
            problems.append((path, "required key is missing"))
        else:
            got = e.get("input")
            problems.append((path, f"{e['msg']} (got {got!r:.60})"))
    return problems


def _validate(model: type[BaseModel], data: Any, base: str, problems: list[tuple[str, str]]) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems.extend(_pydantic_problems(e, model, base))
        return None


def _limits(spec: Any, path: str, problems: list[tuple[str, str]]) -> Limits | None:
    if isinstance(spec, dict):
        allowed = list(Limits.model_fields)
        bad = [k for k in spec if k not in allowed]
        for k in bad:
            close = difflib.get_close_matches(str(k), allowed, n=1, cutoff=0.6)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((f"{path}.{k}", f"unknown limits key{hint}; allowed keys: {', '.join(allowed)}"))
        if bad:
            return None
        for k, v in spec.items():
            try:
                Limits.resolve({k: v})
            except LimitsError as e:
                problems.append((f"{path}.{k}", str(e)))
                return None
    try:
        return Limits.resolve(spec)
    except LimitsError as e:
        problems.append((path, str(e)))
        return None


def _output_model(ref: Any, named: dict[str, Any], root: Path, path: str,
                  problems: list[tuple[str, str]]) -> Any:
    if ref is None:
        return None
    if isinstance(ref, str) and ref in named:
        return named[ref]
    if isinstance(ref, dict):
        from runtime.scripts.validate import unsupported_keywords

        bad = unsupported_keywords(ref)
        if bad:
            problems.append((path, f"JSON Schema keywords not supported: {', '.join(bad)}"))
            return None
        return ref
    if isinstance(ref, str) and ":" in ref:
        try:
            obj = import_object(ref, root=root, what="output model")
        except ExternalsError as e:
            problems.append((path, str(e)))
            return None
        if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
            problems.append((path, f"{ref!r} is not a pydantic BaseModel class"))
            return None
        return obj
    names = ", ".join(named) or "none defined"
    problems.append((path, f"{ref!r} is not an output model: use a name from output_models ({names}), "
                           "'module:Class', or an inline JSON Schema object"))
    return None


def _policy(item: Any, path: str, problems: list[tuple[str, str]]) -> ToolPolicy | None:
    from runtime.policies import ReadBeforeWritePolicy, SequentialDependencyPolicy

    if not (isinstance(item, dict) and len(item) == 1):
        problems.append((path, f"a policy is a one-key mapping, one of: {', '.join(_POLICIES)}"))
        return None
    (kind, args), = item.items()
    try:
        if kind == "sequential_dependency":
            if not isinstance(args, dict) or not all(isinstance(v, list) for v in args.values()):
                raise ValueError("expects {tool: [prerequisite tools]}")
            return SequentialDependencyPolicy(args)
        if kind == "read_before_write":
            args = args or {}
            if not isinstance(args, dict):
                raise ValueError("expects {read_tools: [...], write_tools: [...], path_argument: name}")
            allowed = ("read_tools", "write_tools", "path_argument")
            extra = [k for k in args if k not in allowed]
            if extra:
                raise ValueError(f"unknown key(s) {extra}; allowed keys: {', '.join(allowed)}")
            return ReadBeforeWritePolicy(**args)
    except (TypeError, ValueError) as e:
        problems.append((f"{path}.{kind}", str(e)))
        return None
    close = difflib.get_close_matches(str(kind), _POLICIES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    problems.append((f"{path}.{kind}", f"unknown policy{hint}; known: {', '.join(_POLICIES)}"))
    return None


def _data_provider(spec: Any, default_ws: str | None, root: Path, problems: list[tuple[str, str]]
                   ) -> DataProviderSpec:
    path = "data_provider"
    if isinstance(spec, str):
        spec = {"type": spec}
    if not isinstance(spec, dict) or "type" not in spec:
        problems.append((path, f"use one of {', '.join(_PROVIDERS)}, or a mapping with 'type'"))
        return DataProviderSpec()
    kind = spec["type"]
    allowed = {"none": {"type"}, "static": {"type", "folder", "files"}, "workspace": {"type", "workspace"}}
    if kind not in allowed:
        problems.append((f"{path}.type", f"unknown data provider {kind!r}; "
                                         f"use one of {', '.join(_PROVIDERS)}"))
        return DataProviderSpec()
    for k in spec:
        if k not in allowed[kind]:
            problems.append((f"{path}.{k}", f"not a key of the {kind} provider; allowed: "
                                            f"{', '.join(sorted(allowed[kind]))}"))
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
    return DataProviderSpec(kind=kind, folder=folder, files=dict(files), workspace=workspace)


def _load_tool(path: Path) -> tuple[ScriptTool | None, str]:
    """(tool, "") or (None, why it cannot be a tool): via runtime.tools, so the tool rules are the same."""
    found, failures = discover_tools([path])
    if failures:
        return None, "; ".join(str(f) for f in failures)
    return found[0], ""


def load_bundle(path: str | Path) -> Bundle:
    """Read, validate and resolve a bundle file (or a folder holding `bundle.yaml`); raise BundleError."""
    p = Path(path)
    if p.is_dir():
        p = p / "bundle.yaml"
    source = str(p)
    try:
        raw_text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise BundleError(source, [("", f"cannot read the bundle: {e.strerror or e}")]) from None
    try:
        raw = yaml.safe_load(raw_text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise BundleError(source, [(where, f"not valid YAML: {getattr(e, 'problem', e)}")]) from None
    if not isinstance(raw, dict):
        raise BundleError(source, [("", "a bundle is a YAML mapping with at least `name:`")])

    problems: list[tuple[str, str]] = []
    try:
        spec = BundleSpec.model_validate(raw)
    except ValidationError as e:
        # report these, then go on without the offending top-level keys to find every other problem
        problems.extend(_pydantic_problems(e, BundleSpec, ""))
        bad = {err["loc"][0] for err in e.errors() if err["loc"]}
        rest = {k: v for k, v in raw.items() if k not in bad}
        rest.setdefault("name", "_")
        rest["name"] = rest["name"] if isinstance(rest["name"], str) else "_"
        spec = BundleSpec.model_validate(rest)
    root = p.parent.resolve()

    from runtime.nats.subjects import check_token

    try:
        check_token(spec.name, "name")
    except ValueError as e:
        problems.append(("name", str(e)))

    # model
    if spec.model.adapter not in ADAPTERS:
        problems.append(("model.adapter", f"unknown adapter {spec.model.adapter!r}; known: "
                                          f"{', '.join(sorted(ADAPTERS))}"))
    for k in spec.model.sampling:
        if k not in _SAMPLING_KEYS:
            close = difflib.get_close_matches(k, _SAMPLING_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            problems.append((f"model.sampling.{k}", f"unknown sampling key{hint}; allowed: "
                                                    f"{', '.join(_SAMPLING_KEYS)}"))
    try:
        parse_duration(spec.model.timeout, field="timeout")
    except LimitsError as e:
        problems.append(("model.timeout", str(e)))

    # system prompt
    system_prompt = spec.system_prompt or ""
    if spec.system_prompt_file:
        if spec.system_prompt is not None:
            problems.append(("system_prompt_file", "set system_prompt or system_prompt_file, not both"))
        try:
            system_prompt = (root / spec.system_prompt_file).read_text(encoding="utf-8")
        except OSError as e:
            problems.append(("system_prompt_file", f"cannot read: {e.strerror or e}"))

    # limits and output models
    global_limits = _limits(spec.limits, "limits", problems) or Limits.default()
    named: dict[str, Any] = {}
    for name, ref in spec.output_models.items():
        if isinstance(ref, str) and ref in spec.output_models:
            problems.append((f"output_models.{name}", "must be 'module:Class' or a JSON Schema object"))
            continue
        model = _output_model(ref, {}, root, f"output_models.{name}", problems)
        if model is not None:
            named[name] = model

    # tools: expand globs and entries to files, then load them all at once
    files: list[tuple[Path, str, ToolEntry | None]] = []  # (file, yaml path, entry)
    pythons: list[tuple[str, ToolEntry]] = []
    agents: list[tuple[str, ToolEntry]] = []
    for i, item in enumerate(spec.tools):
        where = f"tools[{i}]"
        if isinstance(item, str):
            matches = sorted(root.glob(item)) if not Path(item).is_absolute() else sorted(
                Path(item).parent.glob(Path(item).name))
            matches = [m for m in matches if m.is_file()]
            if not matches:
                problems.append((where, f"the glob {item!r} matches no file under {root}"))
            files.extend((m.resolve(), where, None) for m in matches)
        elif isinstance(item, dict):
            entry = _validate(ToolEntry, item, where, problems)
            if entry is None:
                continue
            if sum(x is not None for x in (entry.path, entry.python, entry.agent)) != 1:
                problems.append((where, "a tool entry has one of `path:` (a .pym script), `python:` "
                                        "(package.module:function) or `agent:` (another agent's name)"))
                continue
            if entry.agent is not None:
                agents.append((where, entry))
                continue
            if entry.python is not None:
                pythons.append((where, entry))
                continue
            if entry.timeout is not None or entry.concurrency is not None or entry.retry is not None:
                problems.append((where, "timeout, concurrency and retry are for `python:` tools; a script's "
                                        "time and memory are bounded by `limits:`"))
            assert entry.path is not None
            f = (root / entry.path).resolve()
            if not f.is_file():
                problems.append((f"{where}.path", f"{f} does not exist"))
                continue
            files = [x for x in files if x[0] != f]  # an explicit entry refines a glob match
            files.append((f, where, entry))
        else:
            problems.append((where, "a tool is a glob string or a mapping with `path:` or `python:`"))

    tools: dict[str, BundleTool] = {}
    approvals: list[ApprovalRule] = []
    grants: dict[str, Grants] = {}
    for f, where, entry in files:
        tool, failure = _load_tool(f)
        if tool is None:
            problems.append((where, failure))
            continue
        if tool.name in tools:
            problems.append((where, f"two tools are named {tool.name!r} ({tools[tool.name].path} and {f})"))
            continue
        limits, output_model, approval = global_limits, None, False
        description, environ = None, None
        if entry is not None:
            own = _limits(entry.limits, f"{where}.limits", problems) if entry.limits is not None else None
            limits = global_limits.merge(own)
            output_model = _output_model(entry.output_model, named, root, f"{where}.output_model", problems)
            approval = entry.requires_approval
            description, environ = entry.description, dict(entry.environ)
            if entry.approval is not None:
                rule = _approval_rule(tool.name, entry.approval, f"{where}.approval", problems)
                approvals.extend([rule] if rule is not None else [])
            if entry.grants is not None:
                grants[tool.name] = _grants(entry.grants)
        # the tool object carries the bundle's settings: `tool.execute` alone is right, and the host and
        # the workers read them from it
        try:
            tools[tool.name] = tool.configured(limits=limits, output_model=output_model,
                                               requires_approval=approval, description=description,
                                               environ=environ)
        except ScriptLoadError as e:  # a `description:` that breaks the tool rules
            message = e.error.message.replace("the description (the docstring's first paragraph)",
                                              "the description")
            problems.append((f"{where}.description", message))
    for where, entry in pythons:
        hosted = _python_tool(entry, where, root, global_limits, named, problems)
        if hosted is None:
            continue
        if hosted.name in tools:
            problems.append((where, f"two tools are named {hosted.name!r}"))
            continue
        if entry.approval is not None:
            rule = _approval_rule(hosted.name, entry.approval, f"{where}.approval", problems)
            approvals.extend([rule] if rule is not None else [])
        tools[hosted.name] = hosted
    for where, entry in agents:
        delegate = _agent_tool(entry, where, global_limits, problems)
        if delegate is None:
            continue
        if delegate.name in tools:
            problems.append((where, f"two tools are named {delegate.name!r}"))
            continue
        tools[delegate.name] = delegate
    factory = None
    if spec.externals is not None:
        try:
            factory = load_factory(spec.externals, root=root)
        except ExternalsError as e:
            problems.append(("externals", str(e)))

    # termination, policies, data
    term = spec.termination
    if term.terminal_tool is not None and tools and term.terminal_tool not in tools:
        problems.append(("termination.terminal_tool", f"{term.terminal_tool!r} is not a tool of this bundle; "
                                                      f"tools: {', '.join(sorted(tools))}"))
    if term.max_turns < 1:
        problems.append(("termination.max_turns", "must be at least 1"))
    deadline_s = None
    if term.deadline is not None:
        try:
            deadline_s = parse_duration(term.deadline, field="deadline")
        except LimitsError as e:
            problems.append(("termination.deadline", str(e)))
    if spec.max_concurrent_tools < 1:
        problems.append(("max_concurrent_tools", "must be at least 1"))
    summarise = spec.conversation.summarise
    if summarise is not None and not 1 <= summarise.keep < summarise.after:
        problems.append(("conversation.summarise",
                         f"needs 1 <= keep < after (got keep {summarise.keep}, after {summarise.after}): "
                         "keep is how many of the newest messages stay as they are"))
    policies = tuple(x for i, item in enumerate(spec.policies)
                     if (x := _policy(item, f"policies[{i}]", problems)) is not None)
    data = _data_provider(spec.data_provider, spec.workspace, root, problems)
    if spec.workspace is not None:
        from runtime.nats.subjects import workspace_bucket

        try:
            workspace_bucket(spec.workspace)
        except ValueError as e:
            problems.append(("workspace", str(e)))

    if problems:
        raise BundleError(source, problems)

    h = hashlib.sha256(raw_text.encode())
    for name in sorted(tools):
        h.update(name.encode())
        t = tools[name]
        h.update(Path(str(t.path)).read_bytes() if isinstance(t, ScriptTool) else t.content_hash.encode())
    return Bundle(name=spec.name, path=p.resolve(), spec=spec, system_prompt=system_prompt,
                  limits=global_limits, tools=tools, data_provider=data, deadline_s=deadline_s,
                  policies=policies, digest=h.hexdigest()[:16], approvals=tuple(approvals), grants=grants,
                  factory=factory)


def _agent_tool(entry: ToolEntry, where: str, global_limits: Limits,
                problems: list[tuple[str, str]]) -> AgentTool | None:
    """An `agent:` entry as a tool, or None after recording what is wrong with it."""
    from runtime.nats.subjects import check_token

    assert entry.agent is not None
    try:
        check_token(entry.agent, "agent")
    except ValueError as e:
        problems.append((f"{where}.agent", str(e)))
        return None
    if entry.grants is not None or entry.environ or entry.python or entry.retry or entry.concurrency:
        problems.append((where, "an agent tool takes description, max_depth, limits and approval "
                                "settings only"))
    if entry.timeout is not None:
        problems.append((f"{where}.timeout", "an agent tool has no timeout: the child run is bounded by its "
                                             "own bundle (termination.deadline, max_turns)"))
    if entry.max_depth is not None and entry.max_depth < 1:
        problems.append((f"{where}.max_depth", "must be at least 1"))
    try:
        return AgentTool(entry.agent, description=entry.description,
                         max_depth=entry.max_depth or DEFAULT_MAX_DEPTH, limits=global_limits,
                         requires_approval=entry.requires_approval)
    except ValueError as e:
        problems.append((where, str(e)))
        return None


def _grants(spec: GrantsSpec) -> Grants:
    http = spec.http_request
    return Grants(ask_llm=spec.ask_llm, http=http is not None, http_hosts=tuple(http.hosts) if http else (),
                  secrets=tuple(spec.secrets))


def _python_tool(entry: ToolEntry, where: str, root: Path, global_limits: Limits, named: dict[str, Any],
                 problems: list[tuple[str, str]]) -> HostedPythonTool | None:
    """A `python:` entry as a tool, or None after recording what is wrong with it."""
    assert entry.python is not None
    if entry.grants is not None or entry.environ:
        problems.append((where, "grants and environ are for `.pym` tools; a Python tool reaches the world "
                                "directly (and may take an ExecutionContext parameter)"))
    try:
        func = import_object(entry.python, root=root, what="python tool")
    except ExternalsError as e:
        problems.append((f"{where}.python", str(e)))
        return None
    if not callable(func):
        problems.append((f"{where}.python", f"{entry.python!r} is not a function"))
        return None
    timeout = None
    if entry.timeout is not None:
        try:
            timeout = parse_duration(entry.timeout, field="timeout")
        except LimitsError as e:
            problems.append((f"{where}.timeout", str(e)))
    if entry.concurrency is not None and entry.concurrency < 1:
        problems.append((f"{where}.concurrency", "must be at least 1"))
    retry = None
    if entry.retry is not None:
        try:
            backoff = parse_duration(entry.retry.backoff, field="backoff") or 0.0
        except LimitsError as e:
            problems.append((f"{where}.retry.backoff", str(e)))
            backoff = 0.0
        if entry.retry.attempts < 1:
            problems.append((f"{where}.retry.attempts", "must be at least 1"))
        retry = RetryPolicy(attempts=entry.retry.attempts, backoff_s=backoff,
                            on=tuple(entry.retry.exceptions))
    own = _limits(entry.limits, f"{where}.limits", problems) if entry.limits is not None else None
    output_model = _output_model(entry.output_model, named, root, f"{where}.output_model", problems)
    try:
        return HostedPythonTool(func, ref=entry.python, description=entry.description, timeout_s=timeout,
                                concurrency=entry.concurrency, retry=retry, limits=global_limits.merge(own),
                                output_model=output_model, requires_approval=entry.requires_approval)
    except (TypeError, ValueError) as e:
        problems.append((f"{where}.python", f"{e}; a Python tool's parameters need type hints that map to "
                                            "JSON Schema (str, int, float, bool, list[...], dict[str, ...], "
                                            "Literal, Optional, pydantic models)"))
        return None


def _approval_rule(tool: str, spec: ApprovalSpec, where: str,
                   problems: list[tuple[str, str]]) -> ApprovalRule | None:
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


__all__ = ["Bundle", "BundleError", "BundleSpec", "BundleTool", "DataProviderSpec", "load_bundle"]
