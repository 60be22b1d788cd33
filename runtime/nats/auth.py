"""Who may do what on NATS: the five roles as NATS users and permissions, and the server config for them.

Why the server's own users and permissions rather than a scheme of ours: the NATS server checks every
publish and subscribe of every connection, so a rule written here holds for any client, `sa` or not, and
nothing in the runtime can forget to check it. This module turns the roles into that configuration (a
``authorization { users = [...] }`` block, `server_config`) and writes fresh credentials for `sa up
--secure` (`write_secure_dir`); `deploy/nats/auth.conf` is `server_config(default_users(env=True))`, so the
shipped file and this table cannot drift (tests/system/test_deploy.py compares them).

The roles (subjects in `runtime.nats.subjects`):

* **publisher** — publishes tasks on ``agents.<agent>.tasks`` for the agents it is given (all by default),
  and asks the hosts about the runs it started on ``starter.<agent>.follow`` / ``.cancel``
  (`runtime.nats.starter`): a host answers only a request carrying the key the run started with, so a
  publisher follows and cancels its own runs and nobody else's. Nothing else: no commands, no reading the
  log, the runs index or the payload store.
* **operator** — publishes cancel / approve / deny / answer on ``ops.*.<its own name>`` only, so the name a
  host records as ``by`` is the one the server authenticated; reads runs (EVENTS, the runs index, the fleet
  buckets, the threads, payloads, dead letters) and schedules (SCHEDULES) for `sa runs`, `sa replay`,
  `sa status`, `sa threads`, approvals, `sa ui`, `sa schedule list`; subscribes to runs' live model output
  and the notices of their tool jobs still running (``stream.>``, `sa send --follow`); and acks its own
  durable readers of EVENTS (`sa otel`). Adding, pausing or deleting a schedule is an admin's: a schedule
  starts runs of any agent.
* **host** — the JetStream API (it creates the topology and its partition consumers), events, tool jobs,
  the starters' requests (``starter.*.follow`` / ``.cancel``, which it answers: `runtime.host.starters`),
  buckets, forwarding a command under its operator's name, and the tasks of schedules' fires (the
  cluster's clock has no user of its own: a host turns each fire into a task, `runtime.host.scheduler`);
  it may not publish sub-run tasks or tool outcomes.
* **worker** — pulls tool jobs from the shared ``workers`` consumer, publishes outcomes on ``results.>``
  and dead letters, reads and writes the workspace, ``applied``, ``attempts``, ``workers`` and
  ``externals`` (recorded external answers) buckets and the payload store, and follows every run's
  ``run.cancelled`` (to stop a cancelled job's sandbox); it offers a delivery whose tool version it lacks
  to a worker that has it, and answers such offers, on ``handoffs.>`` (core NATS: `runtime.worker.handoff`;
  a worker may so hand any job it holds to any worker). It tells a run's followers that a job of the run is
  still running on ``stream.<actor>.<run>.script`` (core NATS, `runtime.streaming`), and may publish nothing
  else under ``stream.``: the model output there is the host's. For agent tools (`runtime.worker.subruns`) it
  publishes the child's task on ``agents.<agent>.subtasks`` (a subject of its own: a worker cannot publish an
  ordinary task, and a host takes a task there only if it names its parent run) and a cancel for it on
  ``ops.*.<its own name>``, as an operator would, and reads every run's end through the ``subruns``
  consumer of EVENTS. It may not write events, forward commands under another name, create or change
  consumers of TASKS, RESULTS or TOOLS, or touch the ``runs``, ``leases``, ``hosts``,
  ``active`` and ``threads`` buckets.
* **admin** — everything (`sa runs purge`, `sa dlq replay`, maintenance).

Every user subscribes only to its own inbox (``_INBOX_<name>.>``; `runtime.nats.credentials` sets that
prefix), so nobody reads another user's replies.

What subject permissions cannot enforce (documented, not hidden): a host may do anything the JetStream
API allows (it owns the topology), so one host is not kept from writing the events of a run another host
owns (the expected-sequence check stops an honest second writer, not a hostile one); partition ownership
among hosts is a lease, not a permission. A worker publishing on ``results.>`` may send an outcome for any
run, not only for the job it holds (the host accepts an outcome only for a call the run is waiting on).
Readers (operator, worker) may create consumers on the streams they read, and the JetStream API does not
restrict where such a push consumer delivers.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.nats.starter import STARTER_OPS, STARTER_PREFIX
from runtime.nats.subjects import (
    ACTIVE_BUCKET,
    APPLIED_BUCKET,
    ATTEMPTS_BUCKET,
    COMMANDS_PREFIX,
    DLQ,
    EVENTS,
    HANDOFFS_PREFIX,
    HOSTS_BUCKET,
    LEASES_BUCKET,
    PAYLOADS_BUCKET,
    RESULTS,
    RUNS_BUCKET,
    SCHEDULES,
    STREAM_PREFIX,
    SUBRUNS_CONSUMER,
    TASKS,
    THREADS_BUCKET,
    TOOLS,
    WORKERS_BUCKET,
    WORKERS_CONSUMER,
    check_token,
)

ROLES = ("publisher", "operator", "host", "worker", "admin")

_JS_INFO = ["$JS.API.INFO", "$JS.API.STREAM.INFO.*", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST",
            "$JS.API.CONSUMER.INFO.*.*", "$JS.API.CONSUMER.NAMES.*", "$JS.API.CONSUMER.LIST.*"]


def _reads(*streams: str) -> list[str]:
    """Reading `streams`: direct and stored-message gets, and consumers of one's own (ordered replays,
    KV watches, object reads) with their flow control."""
    out: list[str] = []
    for s in streams:
        out += [f"$JS.API.DIRECT.GET.{s}", f"$JS.API.DIRECT.GET.{s}.>", f"$JS.API.STREAM.MSG.GET.{s}",
                f"$JS.API.CONSUMER.CREATE.{s}", f"$JS.API.CONSUMER.CREATE.{s}.>",
                f"$JS.API.CONSUMER.DELETE.{s}.*", f"$JS.API.CONSUMER.MSG.NEXT.{s}.*"]
    return [*out, "$JS.FC.>"]


def _kv(bucket: str) -> str:
    return f"KV_{bucket}"


_OBJ_PAYLOADS = f"OBJ_{PAYLOADS_BUCKET}"
# the hosts' own state
_FLEET_BUCKETS = (RUNS_BUCKET, LEASES_BUCKET, HOSTS_BUCKET, ACTIVE_BUCKET, THREADS_BUCKET)


@dataclass(frozen=True)
class Permissions:
    """One user's NATS permissions: subjects it may publish on and subscribe to (deny wins over allow)."""

    pub_allow: list[str]
    sub_allow: list[str]
    pub_deny: list[str] = field(default_factory=list)
    sub_deny: list[str] = field(default_factory=list)


def permissions(role: str, name: str, *, agents: Sequence[str] = ("*",)) -> Permissions | None:
    """The permissions of user `name` in `role` (None: admin, unrestricted). `agents` limits a publisher
    to those agents' task subjects (`*`: every agent)."""
    inbox = [f"_INBOX_{check_token(name, 'user name')}.>"]
    if role == "admin":
        return None
    if role == "publisher":
        return Permissions([*(f"agents.{a}.tasks" for a in agents), "$JS.API.INFO",
                            f"$JS.API.STREAM.INFO.{TASKS}",
                            *(f"{STARTER_PREFIX}.{a}.*" for a in agents)], inbox)  # its own runs, by key
    if role == "operator":
        buckets = (RUNS_BUCKET, ACTIVE_BUCKET, LEASES_BUCKET, HOSTS_BUCKET, WORKERS_BUCKET, ATTEMPTS_BUCKET,
                   THREADS_BUCKET)
        streams = [EVENTS, DLQ, _OBJ_PAYLOADS, *(_kv(b) for b in buckets)]
        # schedules are read by direct gets only: a consumer's acks on the WorkQueue SCHEDULES would delete
        schedules = [f"$JS.API.DIRECT.GET.{SCHEDULES}", f"$JS.API.DIRECT.GET.{SCHEDULES}.>"]
        # acks on EVENTS only move its own durable readers along (`sa otel`): EVENTS keeps what is acked
        return Permissions([f"{COMMANDS_PREFIX}.*.{name}", *_JS_INFO, *_reads(*streams), *schedules,
                            f"$JS.ACK.{EVENTS}.>"], [*inbox, f"{STREAM_PREFIX}.>"])
    if role == "host":
        return Permissions([">"], [*inbox, *(f"{STARTER_PREFIX}.*.{op}" for op in STARTER_OPS)],
                           pub_deny=["agents.*.subtasks", "results.>"])
    if role == "worker":
        # Workspace buckets are named per workspace (`ws_<name>`): a subject permission cannot match part
        # of a token, so the worker gets every bucket except the hosts' own state.
        pub = [*_JS_INFO, f"$JS.API.CONSUMER.MSG.NEXT.{TOOLS}.{WORKERS_CONSUMER}", f"$JS.ACK.{TOOLS}.>",
               f"$JS.ACK.{EVENTS}.{SUBRUNS_CONSUMER}.>",  # the sub-run ends the agent-tool workers answer
               "agents.*.subtasks", f"{COMMANDS_PREFIX}.*.{name}",  # an agent tool's child task and cancel
               "results.>", "dlq.>", "$KV.>", f"$O.{PAYLOADS_BUCKET}.>",
               f"$JS.API.STREAM.MSG.DELETE.{TOOLS}",  # a job the server gave up on, once dead-lettered
               f"$JS.API.STREAM.PURGE.{_OBJ_PAYLOADS}", "$JS.API.STREAM.CREATE.*",
               "$JS.API.DIRECT.GET.>", "$JS.API.STREAM.MSG.GET.*", "$JS.API.CONSUMER.CREATE.>",
               "$JS.API.CONSUMER.DELETE.>", "$JS.API.CONSUMER.MSG.NEXT.>", "$JS.FC.>",
               f"{HANDOFFS_PREFIX}.>",  # a job's delivery offered to a worker that has its tool version
               f"{STREAM_PREFIX}.*.*.script"]  # a job still running, told to the run's followers (not tokens)
        deny = [*(f"$KV.{b}.>" for b in _FLEET_BUCKETS),
                *(f"$JS.API.CONSUMER.{op}.{s}{tail}" for op in ("CREATE", "DELETE")
                  for s in (TASKS, RESULTS, TOOLS) for tail in ("", ".>")),
                *(f"$JS.API.CONSUMER.MSG.NEXT.{s}.*" for s in (TASKS, RESULTS)),
                *(f"$JS.API.STREAM.CREATE.{s}" for s in (TASKS, EVENTS, TOOLS, RESULTS, DLQ)),
                *(f"$JS.API.STREAM.CREATE.{_kv(b)}" for b in (*_FLEET_BUCKETS, APPLIED_BUCKET)),
                "events.>", "tasks.>", "tools.>"]
        # a worker follows every run's `run.cancelled` (a plain subscription) to stop a cancelled job,
        # hears the server give up on a tool job (the MaxDeliver advisory) to dead-letter it, and takes the
        # deliveries other workers offer it (and their answers to its own offers)
        advisory = f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{TOOLS}.{WORKERS_CONSUMER}"
        return Permissions(pub, [*inbox, "events.*.*.run.cancelled", advisory, f"{HANDOFFS_PREFIX}.>"],
                           pub_deny=deny)
    raise ValueError(f"unknown role {role!r}: use one of {', '.join(ROLES)}")


@dataclass(frozen=True)
class User:
    """One NATS user of a role; `password` is the literal secret, or ``$VAR`` for the server to read from
    its environment (the deploy files); `agents` limits a publisher."""

    name: str
    role: str
    password: str
    agents: tuple[str, ...] = ("*",)


def default_users(passwords: dict[str, str] | None = None, *, env: bool = False) -> list[User]:
    """One user per role, named after it. `env=True`: each password is ``$SA_<ROLE>_PASSWORD``, read by
    nats-server from its environment at start (the deploy files set those from secrets)."""
    users = []
    for role in ROLES:
        pw = f"$SA_{role.upper()}_PASSWORD" if env else (passwords or {}).get(role) or new_password()
        users.append(User(role, role, pw))
    return users


def new_password() -> str:
    return secrets.token_urlsafe(24)


def _quote(items: Iterable[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in items) + "]"


def _rule(allow: list[str], deny: list[str]) -> str:
    return f"allow: {_quote(allow)}" + (f", deny: {_quote(deny)}" if deny else "")


def server_config(users: Sequence[User]) -> str:
    """The ``authorization`` block of a nats-server config for `users` (include it, or append it, to a
    server's config). An env-var password (``$VAR``) is written bare so the server substitutes it."""
    lines = ["# Users and permissions of structured-agents: generated from runtime/nats/auth.py",
             "# (`sa auth config`); the README's \"Who may do what\" explains each role.",
             "authorization {", "  users = ["]
    for u in users:
        pw = u.password if u.password.startswith("$") else json.dumps(u.password)
        perms = permissions(u.role, u.name, agents=u.agents)
        lines.append(f"    # {u.role}")
        if perms is None:
            lines.append(f"    {{user: {json.dumps(u.name)}, password: {pw}}}")
            continue
        pub, sub = _rule(perms.pub_allow, perms.pub_deny), _rule(perms.sub_allow, perms.sub_deny)
        lines += [f"    {{user: {json.dumps(u.name)}, password: {pw}, permissions: {{",
                  f"      publish: {{{pub}}}", f"      subscribe: {{{sub}}}", "    }}"]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)


def helm_authorization(users: Sequence[User]) -> dict[str, Any]:
    """The same ``authorization`` block as `server_config`, as data for the NATS Helm chart's
    ``config.merge`` (deploy/k8s/nats-values.yaml): an env-var password becomes the chart's unquoted
    ``<< $VAR >>`` so the server substitutes it from the container's environment."""
    out = []
    for u in users:
        pw = f"<< {u.password} >>" if u.password.startswith("$") else u.password
        entry: dict[str, Any] = {"user": u.name, "password": pw}
        perms = permissions(u.role, u.name, agents=u.agents)
        if perms is not None:
            entry["permissions"] = {
                "publish": {"allow": perms.pub_allow, **({"deny": perms.pub_deny} if perms.pub_deny else {})},
                "subscribe": {"allow": perms.sub_allow,
                              **({"deny": perms.sub_deny} if perms.sub_deny else {})}}
        out.append(entry)
    return {"users": out}


def write_secure_dir(directory: Path, users: Sequence[User] | None = None) -> dict[str, Path]:
    """Write `auth.conf` (the server's users) and one `<user>.env` per user (NATS_USER, NATS_PASSWORD)
    into `directory`, every file 0600 and the folder 0700; return {user: its env file}.

    Passwords are generated fresh each time, so a stolen file from an earlier session is worth nothing;
    an env file is what the `sa` flags and the `nats` CLI both read (`set -a; . operator.env`)."""
    users = list(users) if users is not None else default_users()
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    _write_private(directory / "auth.conf", server_config(users))
    out: dict[str, Path] = {}
    for u in users:
        path = directory / f"{u.name}.env"
        _write_private(path, f"# {u.role} credentials for structured-agents\nNATS_USER={u.name}\n"
                             f"NATS_PASSWORD={u.password}\n")
        out[u.name] = path
    return out


def read_env_file(path: Path) -> dict[str, str]:
    """The NAME=value lines of an env file `write_secure_dir` wrote (comments and blanks skipped)."""
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)  # an existing file keeps its mode through O_CREAT: set it


__all__ = ["ROLES", "Permissions", "User", "default_users", "new_password", "permissions", "read_env_file",
           "server_config", "write_secure_dir"]
