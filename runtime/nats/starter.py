"""What the starter of a run may ask the hosts about it: follow its events and cancel it, proved by a key.

    key = start_key(secret, run_id)                     # the starter's; never stored, never shown
    metadata = {START_KEY_META: key_digest(key)}         # in the task: the host records it in run.started
    subject = starter_subject(actor, "follow")           # starter.<actor>.follow / starter.<actor>.cancel
    data = StarterRequest(run_id=run_id, key=key, after=4, wait_s=20).encode()

Why: a publisher's credentials may publish a task and nothing else (`runtime.nats.auth`): no read of EVENTS,
no command. A process that hands work to the fleet for someone else (`sa mcp serve`) still needs what it
started: the progress, the output, the cancel. Widening the publisher role to read EVENTS would let it read
every run; letting it publish commands would let it cancel every run. So the hosts answer for the run,
and only to its starter: the task carries the digest of a key only the starter holds
(`START_KEY_META` in its metadata, hence in `run.started`), and a request on ``starter.<actor>.<op>``
(core NATS, a queue group of the hosts: any live host answers, none holds state about it) carries the
key itself; the host answers only when the key's digest is the one the run started with. The run's events
come back on the requester's own reply inbox, which only its NATS user may subscribe to.

Why a digest in the log and the key on the wire: the log is read by operators, and a digest does not
give them the key (not that they need it: they may read and cancel runs anyway). Requests travel only to
hosts (no other role may subscribe to ``starter.>``), and replies only to the requester's inbox.

What the key does not stop (said, not hidden): a publisher who knows another's task id may publish that
task first, with its own key; the run is then its own, and the other's call is told the run was started
with another key. Keys are derived from a secret per starter and the run id, so they never repeat across
runs, and a task id the starter derives itself cannot be guessed.

A follow request is answered by a stream of replies on the request's reply subject: each event of the run
whose seq is above `after`, one per message, in order (the terminal one resolved from the payload store,
since a publisher may not read it), then one ``done`` reply when the run ended or `wait_s` passed. Core
NATS may drop messages to a slow reader, so a reader checks that seqs follow on, and asks again from the
last one it holds when they do not, or when no ``done`` comes (the answering host died).
"""

from __future__ import annotations

import hashlib
import hmac

import msgspec

from runtime.nats.subjects import check_token

STARTER_PREFIX = "starter"  # starter.<actor>.follow, starter.<actor>.cancel (core NATS, never stored)
STARTER_OPS = ("follow", "cancel")
STARTER_QUEUE = "starter-hosts"  # the queue group the hosts answer in: one host answers each request
START_KEY_META = "sa.start_key"  # the task metadata (and run.started's) holding the key's digest
STARTER_OPERATOR = "starter"  # the operator token a starter's cancel travels under: recorded as its `by`
MAX_WAIT_S = 60.0  # the longest a follow request is answered for; a reader asks again after it


class StarterRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request of a run's starter: follow (`after`, `wait_s`) or cancel (`reason`)."""

    run_id: str
    key: str
    after: int = -1  # follow: the events whose seq is above this one (-1: from the first)
    wait_s: float = 0.0  # follow: how long to wait for more (0: only what the log holds now)
    reason: str = ""  # cancel: recorded in run.cancelled

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)


class StarterReply(msgspec.Struct, frozen=True, kw_only=True):
    """One reply: an event of the run, as stored (`runtime.events`); or the end of the answer (`done`),
    with `started` False when the run has no event yet (its task still queued: ask again); or why the
    request is refused (`error`, a sentence for a person), with `retry` when asking again may work (the
    host was busy or could not read the log)."""

    event: bytes | None = None
    done: bool = False
    started: bool = True
    error: str | None = None
    retry: bool = False

    def encode(self) -> bytes:
        return msgspec.msgpack.encode(self)


def decode_request(data: bytes) -> StarterRequest:
    return msgspec.msgpack.decode(data, type=StarterRequest)


def decode_reply(data: bytes) -> StarterReply:
    return msgspec.msgpack.decode(data, type=StarterReply)


def starter_subject(actor: str, op: str) -> str:
    """Where a starter asks `op` (follow or cancel) of a run of `actor`."""
    if op not in STARTER_OPS:
        raise ValueError(f"unknown starter request {op!r}: use one of {', '.join(STARTER_OPS)}")
    return f"{STARTER_PREFIX}.{check_token(actor, 'agent')}.{op}"


def start_key(secret: bytes, run_id: str) -> str:
    """The key of `run_id` for the starter holding `secret`: the same for every call naming that run."""
    return hmac.new(secret, run_id.encode(), hashlib.blake2b).hexdigest()


def key_digest(key: str) -> str:
    """What the run records of its key (`START_KEY_META`): enough to check a key, useless to forge one."""
    return hashlib.blake2b(key.encode(), digest_size=16, person=b"sa-start-key").hexdigest()


def proves(key: str, recorded: object) -> bool:
    """Whether `key` is the one whose digest the run recorded (compared in constant time)."""
    return isinstance(recorded, str) and hmac.compare_digest(key_digest(key), recorded)


__all__ = ["MAX_WAIT_S", "STARTER_OPERATOR", "STARTER_OPS", "STARTER_PREFIX", "STARTER_QUEUE",
           "START_KEY_META", "StarterReply", "StarterRequest", "decode_reply", "decode_request", "key_digest",
           "proves", "start_key", "starter_subject"]
