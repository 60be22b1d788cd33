"""Connecting to NATS, and closing a connection without waiting on it.

Why a module: every process connects the same way. `connect()` takes the servers from `NATS_URL` (a
comma-separated list for a cluster) unless given, passes an async `error_cb` (nats-py's default prints a
traceback on every reconnect attempt) and reconnects forever with a short wait: a process of this runtime
has nothing useful to do without NATS, and a cluster leader election takes 4-6 s, so waiting beats exiting
and losing in-flight work. `close()` unsubscribes pull subscriptions before draining, because draining with
one still open waits the whole drain timeout (30 s by default).

Credentials and TLS come from the environment (`runtime.nats.credentials`: NATS_CREDS, NATS_USER /
NATS_PASSWORD, NATS_CA / NATS_CERT / NATS_KEY), so every process authenticates the one way. A server that
refuses (a connection without valid credentials, a publish or subscribe the user's permissions do not
allow) reports it only asynchronously, and a refused JetStream request just times out; so the error
callback records each refusal and `explain_refusal(exc)` turns the exception a command ends with into one
sentence saying which operation was refused, for whom, and what to do. A connection refused for its
credentials is not retried: waiting cannot fix them.

A node that cannot be reached any more (its machine cut off: packets vanish, TCP says nothing) is noticed by
pings: every `PING_INTERVAL_S`, and after `MAX_OUTSTANDING_PINGS` unanswered ones the connection moves to
another node of the cluster, so within about 6 s. nats-py's default (every 2 minutes) left a host or worker
talking to a cut-off node for minutes while the other two served: on machines of their own
(`bench/partitions.py`) a worker's job then ran out of deliveries and its run was told the tool crashed.
What it does not remove: on a minority cut the slowest task start was 0.7 s and 15.3 s in two runs with
it, 11.7 s and 14.3 s in two without; the leader elections of streams and consumers and the hosts' fences
weigh more.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import deque
from collections.abc import Sequence
from typing import Any

from nats.aio.client import Client as NATS
from nats.aio.subscription import Subscription
from nats.js import JetStreamContext

from runtime.nats.credentials import Credentials

log = logging.getLogger("runtime.nats")


def servers_from_env(env: dict[str, str] | None = None) -> list[str] | None:
    """`NATS_URL` as a list of server URLs (comma-separated for a cluster), or None when unset."""
    raw = (env if env is not None else os.environ).get("NATS_URL", "").strip()
    return [u.strip() for u in raw.split(",") if u.strip()] or None


_refusals: deque[str] = deque(maxlen=16)  # the server's latest refusals, newest last (`explain_refusal`)


def _refusal_of(err: BaseException) -> str | None:
    text = str(err)
    low = text.lower()
    if "permissions violation" in low or "authorization violation" in low:
        text = text.removeprefix("nats: ")
        return text[1:-1] if len(text) > 1 and text[0] == text[-1] == "'" else text
    return None


async def _quiet_error_cb(err: Exception) -> None:
    # nats-py's default error_cb prints a traceback on every reconnect attempt; one line is enough.
    refused = _refusal_of(err)
    if refused is not None:
        log.error("NATS refused: %s", refused)
        return
    log.warning("nats: %s: %s", type(err).__name__, err)


def explain_refusal(exc: BaseException, credentials: Credentials | None = None) -> str | None:
    """One sentence for an error caused by the server refusing this process, or None if it was not.

    `exc` is what the operation raised: an authorization violation at connect, or (for a publish or
    subscribe the permissions forbid, which the server reports apart) whatever followed while a
    refusal was recorded, typically a timeout waiting for a reply that was never sent."""
    creds = credentials or Credentials.from_env()
    who = creds.describe()
    direct = _refusal_of(exc)
    if direct is not None and "authorization violation" in direct.lower():
        fix = ("pass --creds FILE or --user NAME with --password (NATS_CREDS / NATS_USER, NATS_PASSWORD)"
               if not creds.authenticated else "check the user name and password, or the credentials file")
        return (f"NATS refused the connection with {who} (authorization violation): the server requires "
                f"valid credentials; {fix}")
    if direct is None and not _refusals:
        return None
    refused = direct or _refusals[-1]
    if "subscription to \"_inbox." in refused.lower():  # a client with the default inbox prefix
        prefix = f"_INBOX_{creds.identity()}" if creds.authenticated else "_INBOX_<user>"
        return (f"NATS refused {who} a subscription to the default reply inbox ({refused}): each user may "
                f"receive replies only under its own prefix, {prefix}. Connect with that inbox prefix "
                f"(nats-py: connect(..., inbox_prefix=\"{prefix}\"); nats CLI: --inbox-prefix {prefix}); "
                "a JetStream publish without it times out although the message may be stored, so re-send "
                "only with the same Nats-Msg-Id")
    return (f"NATS refused an operation for {who}: {refused}. The permissions of this user do not allow it "
            "(see the role table in the README, \"Who may do what\")")


def refused_publish(subject: str) -> str | None:
    """The server's refusal of a publish to `subject` by this process, if it recorded one: a publish the
    permissions forbid is only reported apart (the publish itself just times out), so a writer that
    retries timeouts asks here before retrying what can never succeed."""
    wanted = f'publish to "{subject.lower()}"'
    return next((r for r in reversed(_refusals) if wanted in r.lower()), None)


def _is_auth_refusal(err: BaseException) -> bool:
    return "authorization violation" in str(err).lower()


PING_INTERVAL_S = 2  # a dead node is noticed after MAX_OUTSTANDING_PINGS + 1 intervals unanswered
MAX_OUTSTANDING_PINGS = 2


async def connect(servers: str | Sequence[str] | None = None, *, name: str | None = None,
                  **options: Any) -> NATS:
    """Connect to `servers` (default: `NATS_URL`), reconnecting forever with a short wait.

    `options` are nats-py's `connect` options and override the defaults here."""
    if servers is None:
        servers = servers_from_env()
        if servers is None:
            raise RuntimeError("no NATS server: set NATS_URL or start an EmbeddedNats")
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    opts: dict[str, Any] = {
        "error_cb": _quiet_error_cb,
        "ping_interval": PING_INTERVAL_S,
        "max_outstanding_pings": MAX_OUTSTANDING_PINGS,
        "reconnect_time_wait": 0.25,
        "max_reconnect_attempts": -1,
        "connect_timeout": 5,
        "name": name,
        **Credentials.from_env().connect_options(),
    }
    opts.update(options)
    nc = NATS()
    user_cb = opts["error_cb"]
    refused: list[Exception] = []

    async def error_cb(err: Exception) -> None:
        # nats-py retries a connection the server refused for its credentials forever (reconnects are
        # unlimited): stop at the first refusal, which only other credentials can fix.
        what = _refusal_of(err)
        if what is not None:
            _refusals.append(what)
        if _is_auth_refusal(err):
            if refused:
                return
            refused.append(err)
            nc.options["max_reconnect_attempts"] = 0
            nc.options["allow_reconnect"] = False
        await user_cb(err)

    opts["error_cb"] = error_cb
    try:
        await nc.connect(list(servers), **opts)
    except Exception as e:
        if refused:
            raise refused[0] from e
        raise
    return nc


async def close(nc: NATS, *subs: Subscription | JetStreamContext.PullSubscription) -> None:
    """Unsubscribe `subs` (pull subscriptions above all), then drain the connection."""
    for sub in subs:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    if not nc.is_closed:
        with contextlib.suppress(Exception):
            await nc.drain()


__all__ = ["close", "connect", "explain_refusal", "servers_from_env"]
