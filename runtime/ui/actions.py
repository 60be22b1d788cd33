"""What a page may change: fork a run, cancel it, approve or deny a waiting call, answer a question, through
`RunHandle`; send a dead letter back to the workers, through `Client`.

These are `sa fork`, `sa cancel`, `sa approve`, `sa deny` and `sa answer` (`runtime.client.fork`,
`runtime.client.control`, reached through the run's handle), so a page's command is checked the same way
and refused with the same message (a `ValueError`: the routes answer it with 400). What is the page's own:

* the edits a page may ask a fork for (`web_edit`): not `bundle`, which names a file on the server's disk
  to load, a thing for the command line (`sa fork --bundle PATH`), not for anyone who can reach the page;
* who the log records as having acted (`web_operator`): the inspector has no login, so it names itself
  and the account it runs as, never a person it cannot know;
* a bound on a fork's wait: a write the server refuses (a NATS user whose role may not write events) is
  retried by the run log as if NATS were down, so without one the page would hang.

The NATS user the inspector connects as bounds what these can do: on a secured server the host records
that user, and a role that may not do something is refused by NATS, whatever the page asks.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import msgspec

from runtime import events as ev
from runtime.client import Client
from runtime.client.control import operator
from runtime.nats.subjects import check_token
from runtime.ui import views

FORK_WAIT_S = 30.0
REPLAY_WAIT_S = 10.0

# The edits a page may ask for (see the module docstring for why not `bundle`).
WEB_EDITS: dict[str, type[ev.OutputEdit | ev.ReplyEdit | ev.SystemEdit]] = {
    "output": ev.OutputEdit, "reply": ev.ReplyEdit, "system": ev.SystemEdit}


class Gone(LookupError):
    """What the page asked to act on is not there (any more); the message says so."""


class Refused(PermissionError):
    """NATS refused what the page asked for (this app's NATS user lacks the permission), or never
    answered; the message says which."""


def web_edit(raw: Any) -> ev.ForkEdit | None:
    """The fork edit of a page's request (None for none); ValueError saying what is wrong with it."""
    if raw is None:
        return None
    kind = raw.get("kind") if isinstance(raw, dict) else None
    if kind not in WEB_EDITS:
        raise ValueError(f'"edit" must be an object whose "kind" is one of {", ".join(WEB_EDITS)}, not '
                         f"{json.dumps(kind if isinstance(raw, dict) else raw)}")
    try:
        return msgspec.convert(raw, WEB_EDITS[kind])
    except msgspec.ValidationError as e:
        raise ValueError(f"the {kind} edit is not valid: {e}") from None


def web_operator() -> str:
    """The `by` of a command sent from a page (see the module docstring)."""
    return f"sa ui ({operator()})"


class Actions:
    """The page's commands over one client; each returns what the page shows of its result."""

    def __init__(self, client: Client, *, fork_wait: float = FORK_WAIT_S) -> None:
        self.client = client
        self.fork_wait = fork_wait

    async def fork(self, run_id: str, at_seq: int, edit: ev.ForkEdit | None = None) -> dict[str, Any]:
        """A new run from `run_id`'s events before `at_seq` (with `edit`); `ForkError` says what to
        change, `Refused` that NATS did not let the inspector write it in time."""
        check_token(run_id, "run id")
        with anyio.move_on_after(self.fork_wait) as waited:
            forked = await self.client.get(run_id).fork(at_seq, edit)
        if waited.cancelled_caught:
            raise Refused(f"the fork was not written within {self.fork_wait:g} s: the NATS user `sa ui` runs "
                          "as may not write events (forking needs the host or admin role), or NATS does "
                          "not answer; a fork left halfway is never driven")
        return {"run_id": forked.run_id, "source_run": run_id, "at_seq": at_seq}

    async def cancel(self, run_id: str, reason: str) -> dict[str, Any]:
        """End the run; its ending as recorded (`ControlError` if it had already ended)."""
        ended = await self.client.get(check_token(run_id, "run id")).cancel(reason, by=web_operator())
        return {"event": views.event_view(ended, ended.ts)}

    async def approve(self, run_id: str, call_id: str, *, arguments: dict[str, Any] | None,
                      note: str) -> dict[str, Any]:
        """Let a waiting call run (with `arguments` instead of the model's); the verdict recorded."""
        verdict = await self.client.get(check_token(run_id, "run id")).approve(
            call_id, arguments=arguments, note=note, by=web_operator())
        return {"event": views.event_view(verdict, verdict.ts)}

    async def deny(self, run_id: str, call_id: str, reason: str) -> dict[str, Any]:
        """Refuse a waiting call; the model reads `reason`. The verdict recorded."""
        handle = self.client.get(check_token(run_id, "run id"))
        verdict = await handle.deny(call_id, reason, by=web_operator())
        return {"event": views.event_view(verdict, verdict.ts)}

    async def answer(self, run_id: str, call_id: str, answer: Any) -> dict[str, Any]:
        """Answer a run's question (checked against its schema: `ControlError` says what does not fit);
        what the host recorded."""
        handle = self.client.get(check_token(run_id, "run id"))
        recorded = await handle.answer(call_id, answer, by=web_operator())
        return {"event": views.event_view(recorded, recorded.ts)}

    async def replay_dead_letter(self, seq: int) -> dict[str, Any]:
        """Send dead letter `seq` back to its tool's workers (`sa dlq replay SEQ`); `Gone` if there is none,
        `Refused` if NATS did not let it through in time."""
        with anyio.move_on_after(REPLAY_WAIT_S) as waited:
            try:
                dead = await self.client.replay_dead_letter(seq)
            except KeyError as e:
                raise Gone(f"{e.args[0]}: it was replayed or purged already (reload the fleet)") from None
        if waited.cancelled_caught:
            raise Refused(f"the replay was not done within {REPLAY_WAIT_S:g} s: the NATS user `sa ui` runs "
                          "as may not publish tool jobs or delete dead letters, or NATS does not answer")
        replayed = {k: v for k, v in dead.to_dict().items() if k != "job"}
        return {"replayed": replayed, "tool": dead.subject}


__all__ = ["FORK_WAIT_S", "REPLAY_WAIT_S", "WEB_EDITS", "Actions", "Gone", "Refused", "web_edit",
           "web_operator"]
