"""The bundle.yaml schema: every key a bundle may have, as strict pydantic models.

A bundle is what `sa up`/`sa host` load to make an agent reachable at `agents.<name>.tasks`, and what a
worker loads to know the agent's tools::

    name: workspace_agent                     # the agent id: one subject token
    system_prompt: "You are ..."              # or system_prompt_file: prompt.md (relative to the bundle)
    model:
      adapter: hermes                         # a runtime.model adapter
      base_url: local                         # `local`: the embedded model server; else a URL
      name: smollm2-135m
      sampling: {temperature: 0.2, max_tokens: 512}
      server: vllm                            # its request dialect: vllm (default) | sglang | llamacpp |
                                              #   ollama | tgi | lmstudio | openai | auto (asked at start)
    constraint: {strategy: ebnf, parallel_calls: false}   # strategy none: unconstrained, said so
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
    mcp:                                      # MCP servers whose tools the agent gets (runtime.tools.mcp)
      time:                                   #   the server's name (errors, the default prefix `time_`)
        command: mcp-server-time              #   stdio: a command (args, cwd, env), or url: + headers:
        args: [--local-timezone, UTC]
        env: {TOKEN: "${TIME_TOKEN}"}         #   ${NAME}: from the host's/worker's environment, on connect
        allow: [get_current_time]             #   which tools (default all), or deny: [...]
        prefix: time_                         #   the model calls time_get_current_time; rename: {a: b}
        repeatable: true                      #   may a redelivered job call again (default: its hints)
        in_doubt: fail                        #   if not: fail (the model is told) | ask a person | recall
        timeout: 30s                          #   one call, within the call's deadline
        max_result: 10mb                      #   a bigger answer is a `limit` failure
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
    endpoint:                                 # the model endpoint (base_url + name), shared by the fleet
      max_in_flight: 32                       # requests at once across every host; more wait their turn
      tokens_per_minute: 200000               # prompt + completion tokens per minute, fleet-wide
      retry_after_max: 30s                    # a 429/503's Retry-After is honoured up to this
      throttle_retries: 8                     # 429/503 answers retried before the call fails
    budgets:
      run_tokens: 100000                      # a run that has used this many tokens fails budget_exceeded
      agent_tokens_per_day: 5000000           # every run of the agent together, per UTC day, fleet-wide
      on_exceeded: fail                       # the daily budget spent: fail the run, or wait for the next day
    priority: 5                               # its tasks' priority at the endpoint (0..9, higher first),
                                              # unless a task says otherwise
    timers: [sleep, wait_until]               # durable timers the model may call (runtime.timers)
    questions:                                # offers ask_human: the model asks a person (runtime.questions)
      timeout: 1h                             #   no answer by then: the default (none: waits until answered
      default: "no"                           #   or the deadline); no default: the call fails `timeout`
    schedules:                                # runs started by the cluster's clock (runtime.schedules),
      - name: digest                          #   stored when a host of this bundle starts
        cron: "0 0 8 * * mon-fri"             #   or every: 30s, or at: 2030-01-01T09:00:00+01:00
        tz: Europe/Paris                      #   a cron's zone (default UTC)
        input: "Summarise yesterday's tickets."
        instance: ops                         #   optional: the actor's instance, a thread to continue
        catch_up: latest                      #   fires missed while no host ran: none | latest | all
        grace: 60s                            #   a fire taken later than this after it fired was missed

Every mapping rejects unknown keys, so a misspelt key is an error with a "did you mean" hint
(`runtime.bundle.problems`) rather than a setting silently ignored. Unions of models are avoided so
that pydantic's error locations stay the YAML's own paths. These models only check shapes and types; what
a value means (an adapter that exists, a duration that parses, a tool file that loads) is checked by the
function for its section (`runtime.bundle.sections`, `runtime.bundle.tools`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from runtime.model.dialects import Server

__all__ = ["ApprovalSpec", "BudgetsSpec", "BundleSpec", "ConstraintSpec", "ConversationSpec", "EndpointSpec",
           "GrantsSpec", "HttpGrant", "McpServerSpec", "ModelSpec", "QuestionsSpec", "RetrySpec",
           "ScheduleSpec", "SummariseSpec", "TerminationSpec", "ToolEntry"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Strict):
    adapter: str = "hermes"
    base_url: str = "local"
    name: str = "smollm2-135m"
    api_key_env: str | None = None
    timeout: float | str = 60.0
    sampling: dict[str, Any] = {}
    provider: str | None = None  # `gen_ai.provider.name` in traces (default: from the server's address)
    # the request dialect the server speaks (`runtime.model.dialects`); `auto`: asked once at start
    server: Server = "vllm"


class ConstraintSpec(_Strict):
    # `runtime.model.Strategy`'s names and `none` (unconstrained, recorded on every model request), as one
    # flat Literal so a wrong value is one problem at its path
    strategy: Literal["ebnf", "structural_tag", "json_schema", "none"] = "ebnf"
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


class McpServerSpec(_Strict):
    """One entry of `mcp:`: how to reach the server (a stdio `command` or a streamable-HTTP `url`), which of
    its tools the agent gets under which names, whether a call may be repeated, and how long one may take
    (`runtime.bundle.mcp` checks what the values mean)."""

    command: str | None = None
    args: list[str] = []
    cwd: str | None = None  # relative to the bundle folder
    env: dict[str, str] = {}  # values may be ${NAME} references, resolved on connect
    url: str | None = None
    headers: dict[str, str] = {}  # values may be ${NAME} references, resolved on connect
    allow: list[str] | None = None  # the server's tool names the agent gets (None: all of them)
    deny: list[str] = []  # ... except these
    prefix: str | None = None  # before each tool's name (None: "<server>_")
    rename: dict[str, str] = {}  # server tool name -> the name the model calls (no prefix added)
    repeatable: bool | dict[str, bool] | None = None  # for all tools, or per server tool name
    # a call that may not be repeated, redelivered after its worker died mid-call: `fail` it `in_doubt` (the
    # model is told), `ask` a person (re-call or fail), or `recall` it anyway
    in_doubt: Literal["fail", "ask", "recall"] = "fail"
    timeout: float | str | None = None  # one call
    connect_timeout: float | str | None = None  # starting the server and listing its tools
    max_result: int | str | None = None  # the largest result a call may return (`10mb`; none: no limit)
    requires_approval: bool = False


class TerminationSpec(_Strict):
    terminal_tool: str | None = None
    max_turns: int = 20
    max_consecutive_errors: int = 3
    deadline: float | str | None = None
    force_terminal_on_last_turn: bool = True  # the last turn offers only the terminal tool (kernel)
    # that turn's prompt: every tool, the constraint narrowing the call (the prefix cache holds), or only
    # the terminal tool (a very small model answers better): `KernelConfig.last_turn_prompt`
    last_turn_prompt: Literal["same", "narrowed"] = "same"


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


class EndpointSpec(_Strict):
    """How the fleet shares the model endpoint (`runtime.model.limits.EndpointLimits`)."""

    max_in_flight: int | None = None
    tokens_per_minute: int | None = None
    retry_after_max: float | str = 30.0
    throttle_retries: int = 8


class BudgetsSpec(_Strict):
    """Token budgets: per run (the kernel's), per agent per UTC day (the fleet's), and what a run does when
    the daily one is spent."""

    run_tokens: int | None = None
    agent_tokens_per_day: int | None = None
    on_exceeded: Literal["fail", "wait"] = "fail"


class ScheduleSpec(_Strict):
    """One entry of `schedules:` (`runtime.schedules.make_schedule` checks what the values mean)."""

    name: str
    input: str
    cron: str | None = None
    every: str | int | None = None
    at: str | None = None
    tz: str | None = None
    instance: str | None = None
    thread: str | None = None
    catch_up: Literal["none", "latest", "all"] = "latest"
    grace: float | str = 60.0


class QuestionsSpec(_Strict):
    """`questions:`: the built-in `ask_human` is offered; how long a question waits (`timeout`) and the
    answer it gets then (`default`: given or not, since null is a default too)."""

    timeout: float | str | None = None
    default: Any = None


class BundleSpec(_Strict):
    name: str
    description: str = ""
    system_prompt: str | None = None
    system_prompt_file: str | None = None
    model: ModelSpec = ModelSpec()
    constraint: ConstraintSpec = ConstraintSpec()
    limits: Any = None
    tools: list[Any] = []
    mcp: dict[str, McpServerSpec] = {}  # MCP servers whose tools the agent gets
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
    endpoint: EndpointSpec | None = None
    budgets: BudgetsSpec = BudgetsSpec()
    priority: int | None = None
    timers: list[Literal["sleep", "wait_until"]] = []  # built-in durable timers offered to the model
    questions: QuestionsSpec | None = None  # the built-in ask_human offered to the model
    schedules: list[ScheduleSpec] = []
