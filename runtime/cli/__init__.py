"""The `sa` command line: one module per group of commands, each registering on the app of `app.py`.

- `up_cmds`         — `sa up` (NATS, the local model, a host and workers on this machine, stopped together)
- `fleet_cmds`      — `sa host`, `sa worker` (the long-running processes) and `sa status`
- `run_cmds`        — `sa send`, `sa runs` (tasks and runs)
- `replay_cmds`     — `sa replay` (a run's timeline, `--verify`, `--diff`, `--thread`, `--html`)
- `thread_cmds`     — `sa threads` (conversations: threads and their runs)
- `fork_cmds`       — `sa fork` (a new run from any past event of a run)
- `regress_cmds`    — `sa regress` (recorded runs driven again on a candidate, tools served from the log)
- `control_cmds`    — `sa cancel`, `sa approvals`, `sa approve`, `sa deny` (run control for operators)
- `question_cmds`   — `sa questions`, `sa answer` (the questions runs ask a person, `ask_human`)
- `schedule_cmds`   — `sa schedule add / list / pause / resume / delete` (runs started by the cluster's clock)
- `tools_cmds`      — `sa tools`, `sa check`, `sa run` (sandboxed .pym scripts)
- `constraint_cmds` — `sa constraint` (the decoding constraint sent for a set of tools)
- `model_cmds`      — `sa model serve` (the embedded CPU model server)
- `dlq_cmds`        — `sa dlq`, `sa dlq replay` (dead-lettered tool jobs)
- `audit_cmds`      — `sa audit` (every run's log re-read and proved whole; `--every`: on a schedule)
- `backup_cmds`     — `sa backup start / status / restore` (a mirror of the log, runs restored from it)
- `observe_cmds`    — `sa otel` (traces to an OpenTelemetry collector); `--metrics-port`, `--log-format`
- `ui_cmds`         — `sa ui` (the run inspector in a browser)
- `mcp_cmds`        — `sa mcp serve` (the fleet's agents as tools of any MCP client)
- `auth_cmds`       — `sa auth config` (the NATS users and permissions per role, as config)
- `serving`         — what `sa up`, `sa host` and `sa worker` share (retention, logging, metrics, agents)
- `signals`         — how the long-running commands stop on SIGINT / SIGTERM
- `where`           — finding the NATS server (flag, NATS_URL, a running `sa up`) and the bundles
- `connect`         — how a command reaches runs: one `runtime.client.Client`, and nothing else
"""

from runtime.cli import (  # noqa: F401, I001  (importing registers the commands: `sa --help` lists them in this order)
    up_cmds,
    fleet_cmds,
    run_cmds,
    replay_cmds,
    thread_cmds,
    fork_cmds,
    regress_cmds,
    control_cmds,
    question_cmds,
    schedule_cmds,
    tools_cmds,
    constraint_cmds,
    model_cmds,
    dlq_cmds,
    audit_cmds,
    backup_cmds,
    observe_cmds,
    ui_cmds,
    mcp_cmds,
    auth_cmds,
)
from runtime.cli.app import app, hoist_auth_flags


def main() -> None:
    """Run `sa`; a command the NATS server refused (bad credentials, a permission the user lacks) ends
    with one line saying which operation was refused and why, and exit code 1."""
    import sys

    from runtime.nats.credentials import CredentialsError

    try:
        app(args=hoist_auth_flags(sys.argv[1:]), prog_name="sa")
    except CredentialsError as e:
        print(f"sa: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    except Exception as e:
        from runtime.nats.connection import explain_refusal

        text = explain_refusal(e)
        if text is None:
            raise
        print(f"sa: {text}", file=sys.stderr)
        raise SystemExit(1) from None
