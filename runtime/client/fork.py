"""Fork: a new run that goes on from any past point of a recorded run, re-firing nothing before it.

    forked = await fork(js, "r3f2…", at_seq=9)                                   # same run, from seq 9
    forked = await fork(js, run, 9, OutputEdit(call_id="2.0", output={"sum": 5}))  # "what if it had said 5"
    forked = await fork(js, run, 4, ReplyEdit(content="", calls=(EditedCall("add", {"a": 1, "b": 2}),)))
    forked = await fork(js, run, 9, BundleEdit(digest=b.digest, path=str(b.path)))   # another version
    forked = await fork(js, run, 9, SystemEdit(system_prompt="Answer in French."))

A fork keeps the source's events with `seq < at_seq`, re-addressed to the new run with every id the
kernel derives (model request ids, tool call ids) re-derived through `kernel.rebase_id`, so folded it is
exactly the state the source had at that point: the recorded model replies and tool results are reused,
and a host driving the fork performs only what `kernel.decide` finds pending there. Its first event is a
`run.forked` (a `run.started` that also names the source run, the fork point and the edit), with the
same task and bundle version as the source unless the edit says otherwise; the seqs of the copied events
stay the source's, so two runs can be compared seq by seq (`diff`).

Edits at the fork point. `OutputEdit` records the result of a call the model made but whose result is
not in the kept prefix (checked against the tool's output model when the bundle is at hand) as its
`tool.completed`, instead of running the tool. `ReplyEdit` records the reply to the model request the
prefix ends waiting for, as its `model.responded` (tool names and arguments checked against the tools'
schemas). `BundleEdit` and `SystemEdit` change what the fork goes on with; hosts resume a run only on its
own bundle version (or any, with `resume: latest`), so a fork onto another version is driven by a host
that has it loaded.

Where a fork may be made (`fork_points`): after the first event and before the run's ending, but never
inside one tool run's report (a redelivery's `tool.redelivered` and, in logs written before the outcome
carried its script run, a worker's `script.*` events land together with the call's outcome; a fork between
them would record a script that ran and re-run it). Seqs count log entries: a script run carried by its
outcome is part of that one entry. Anything else is refused with a `ForkError` that says which seqs are
valid, and nothing is written.

Then the fork is registered like any run (the `runs` index with `forked_from`/`forked_at`, and its
partition's `active` key) and the host serving that partition is told with a `resume` command on the
actor's task subject, so it starts at once, with no restart; if no host serves the partition yet, the
next one to take it over finds it in `active`. The log is written before the registration, so a fork
interrupted halfway is never driven.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.js import JetStreamContext
from nats.js.errors import KeyNotFoundError, NotFoundError

from runtime import events as ev
from runtime import kernel
from runtime.events import BundleEdit, EditedCall, ForkEdit, OutputEdit, ReplyEdit, SystemEdit
from runtime.log import LogRejected, RunHistory, RunLog, rebased
from runtime.types import Usage


class ForkError(ValueError):
    """A fork that cannot be made as asked (unknown run, invalid seq, bad edit); nothing was written."""


@dataclass(frozen=True)
class Forked:
    """A fork as written: the new run, where it came from, and the actor and partition that drive it."""

    run_id: str
    source_run: str
    at_seq: int
    actor: str
    partition: int
    events: int  # how many events its log holds now (the kept prefix, `run.forked` included, and the edit)


def new_fork_id() -> str:
    """A fresh run id for a fork (forks of one point are different runs, so it is not derived)."""
    return "r" + uuid.uuid4().hex[:16]


# ── where a fork may be made ──────────────────────────────────────────────────────────────────────────

# what precedes a call's outcome as part of one report (script.* only in logs from before `ScriptRun`)
_REPORT = (ev.ScriptStarted, ev.ScriptPrinted, ev.ScriptCompleted, ev.ScriptFailed, ev.ToolRedelivered)


def fork_points(events: Sequence[ev.Event]) -> list[int]:
    """The valid `at_seq` values of a run whose log is `events`: a fork keeps the events before it."""
    end = len(events)
    if events and ev.kind_of(events[-1]) in ("run.completed", "run.failed", "run.cancelled"):
        end -= 1  # keeping the ending would leave nothing to do
    return [at for at in range(1, end + 1) if not _splits_report(events, at)]


def _splits_report(events: Sequence[ev.Event], at: int) -> bool:
    """True if seq `at` is inside one tool run's report: after a `script.*` or `tool.redelivered` of a call
    whose report goes on."""
    if at >= len(events) or not isinstance(events[at - 1], _REPORT):
        return False
    nxt = events[at]
    call_id = getattr(events[at - 1], "call_id", None)
    return isinstance(nxt, (*_REPORT, ev.ToolCompleted, ev.ToolFailed)) and nxt.call_id == call_id


def ranges(seqs: Sequence[int]) -> str:
    """`[1, 2, 3, 5, 7, 8]` -> "1-3, 5, 7-8": how an error names valid seqs."""
    out: list[str] = []
    start = prev = None
    for s in [*seqs, None]:
        if s is not None and prev is not None and s == prev + 1:
            prev = s
            continue
        if start is not None:
            out.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = s
    return ", ".join(out) or "none"


# ── the fork's events (pure) ──────────────────────────────────────────────────────────────────────────


def plan(source: RunHistory, at_seq: int, new_run: str, edit: ForkEdit | None = None, *,
         config: kernel.KernelConfig | None = None, output_model: Any = None, now: float | None = None,
         conversation: kernel.Conversation | None = None) -> list[ev.Event]:
    """The fork's whole log, stamped, or a `ForkError` saying what is wrong. Pure: `config` is the
    source's kernel config when known (tool schemas for checking a `ReplyEdit`), `output_model` the
    edited call's output model when known (for an `OutputEdit`)."""
    events, run = source.events, source.run_id
    if not events:
        raise ForkError(f"run {run!r} has no events: nothing to fork (see `sa runs`)")
    points = fork_points(events)
    if at_seq not in points:
        hint = ""
        if isinstance(edit, OutputEdit):  # say where this call's output can be replaced
            hint = " (" + _no_pending_call(source, _call_id(edit.call_id, run, new_run).rsplit("/", 1)[-1],
                                           at_seq).split("; ", 1)[-1] + ")"
        raise ForkError(_bad_point(source, at_seq, points) + hint)
    first = events[0]
    if not isinstance(first, ev.RunStarted):
        raise ForkError(f"run {run!r} does not start with run.started (seq 0 is {ev.kind_of(first)})")
    system = first.system_prompt if isinstance(first, ev.RunForked) else None
    digest = first.bundle_digest
    if isinstance(edit, SystemEdit):
        system = edit.system_prompt
    elif isinstance(edit, BundleEdit):
        digest = edit.digest
    elif isinstance(edit, OutputEdit):
        edit = msgspec.structs.replace(edit, call_id=_call_id(edit.call_id, run, new_run))
    head = ev.RunForked(
        run_id=new_run, seq=0, ts=time.time() if now is None else now, actor=source.actor, input=first.input,
        instance=first.instance, timeout_s=first.timeout_s, metadata=dict(first.metadata),
        bundle_digest=digest, source_run=run, source_seq=at_seq, edit=edit, system_prompt=system,
        # a run in a thread: the fork continues the same conversation, by the same reference (it is not
        # a run of the thread itself: the thread's next run still continues the thread's latest run)
        previous_run=first.previous_run, previous_seq=first.previous_seq, summary=first.summary,
        summarised=first.summarised)
    kept: list[ev.Event] = [head]
    kept += [ev.stamp(rebased(e, run, new_run), seq=e.seq, actor=source.actor) for e in events[1:at_seq]]
    state = kernel.fold(config or kernel.KernelConfig(), kept, conversation)
    if isinstance(edit, OutputEdit):
        kept.append(_output(source, state, edit, at_seq, output_model, head.ts))
    elif isinstance(edit, ReplyEdit):
        kept.append(_reply(source, state, edit, at_seq, config, head.ts))
    kernel.fold(config or kernel.KernelConfig(), kept, conversation)  # a fork that cannot fold is a bug here
    return kept


def _bad_point(source: RunHistory, at_seq: int, points: list[int]) -> str:
    n = len(source.events)
    where = f"run {source.run_id} has {n} event(s), seq 0-{n - 1}; --at S keeps the events before seq S"
    if not points:
        return f"{where}, and none of its points can be forked: valid seqs: none"
    if at_seq < 1:
        why = "a fork keeps at least the run's first event"
    elif at_seq > n:
        why = f"seq {at_seq} is past the end"
    elif at_seq == n or at_seq > points[-1]:
        why = f"the run ended at seq {n - 1}: a fork that keeps its ending has nothing left to do"
    else:
        call = str(getattr(source.events[at_seq - 1], "call_id", "?")).rsplit("/", 1)[-1]
        why = (f"seq {at_seq} is inside the report of one tool run (call {call}: its script events and "
               "outcome land together)")
    return f"cannot fork at {at_seq}: {why}. {where}; valid seqs: {ranges(points)}"


def _call_id(given: str, source: str, new_run: str) -> str:
    """A call id as a user may give it ("2.0", "<source>/2.0" or "<fork>/2.0") in the fork's form."""
    short = given
    for prefix in (f"{source}/", f"{new_run}/"):
        short = short.removeprefix(prefix)
    if "/" in short:
        raise ForkError(f"call {given!r} is not a call of run {source}: give it as shown by `sa replay "
                        f"{source}` (for example 2.0, turn 2's first call)")
    return f"{new_run}/{short}"


def _output(source: RunHistory, state: kernel.State, edit: OutputEdit, at_seq: int, output_model: Any,
            ts: float) -> ev.Event:
    short = edit.call_id.rsplit("/", 1)[-1]
    turn = state.turn
    call = turn.call(edit.call_id) if turn is not None else None
    if call is None or turn is None or edit.call_id in turn.results:
        raise ForkError(_no_pending_call(source, short, at_seq))
    if output_model is not None:
        from runtime.scripts.output import check_output

        checked, error = check_output(edit.output, output_model)
        if error is not None:
            raise ForkError(f"the output given for call {short} ({call.name}) is not valid for the tool: "
                            f"{error.message.replace('the script', 'the edited')}")
        edit_output = checked
    else:
        edit_output = edit.output
    return ev.ToolCompleted(run_id=state.run_id, seq=at_seq, ts=ts, actor=source.actor,
                            call_id=edit.call_id, tool=call.name, output=edit_output)


def _no_pending_call(source: RunHistory, short: str, at_seq: int) -> str:
    """Why no result can be given for call `short` at `at_seq`, and where it could."""
    call_id = f"{source.run_id}/{short}"
    replied = next((e.seq for e in source.events if isinstance(e, ev.ModelResponded)
                    and any(c.id == call_id for c in e.calls)), None)
    if replied is None:
        calls = [f"{c.id.rsplit('/', 1)[-1]} {c.name}" for e in source.events
                 if isinstance(e, ev.ModelResponded) for c in e.calls]
        return (f"run {source.run_id} has no call {short!r}; its calls: {', '.join(calls) or 'none'}")
    result = next((e.seq for e in source.events if isinstance(e, ev.ToolCompleted | ev.ToolFailed)
                   and e.call_id == call_id), len(source.events))
    valid = [p for p in fork_points(source.events) if replied < p <= result]
    return (f"call {short} has no pending result at seq {at_seq}: the model made it at seq {replied}"
            + (f" and its result is at seq {result}" if result < len(source.events) else "")
            + f"; to give it another output, fork at one of {ranges(valid)}")


def _reply(source: RunHistory, state: kernel.State, edit: ReplyEdit, at_seq: int,
           config: kernel.KernelConfig | None, ts: float) -> ev.Event:
    turn = state.turn
    if turn is None or not turn.requested or turn.responded:
        waiting = [e.seq + 1 for e in source.events if isinstance(e, ev.ModelRequested)]
        valid = [p for p in fork_points(source.events) if p in waiting]
        raise ForkError(f"seq {at_seq} does not follow a model request waiting for its reply: a reply edit "
                        f"answers one; fork right after a model.requested, at one of {ranges(valid)}")
    if config is not None:
        _check_calls(edit.calls, config)
    calls = kernel.tool_calls(state.run_id, turn.number, [(c.name, dict(c.arguments)) for c in edit.calls])
    return ev.ModelResponded(
        run_id=state.run_id, seq=at_seq, ts=ts, actor=source.actor,
        request_id=kernel.model_request_id(state.run_id, turn.number, turn.attempt), turn=turn.number,
        text=edit.content, content=edit.content, calls=calls, usage=Usage(), finish_reason="edited")


def _check_calls(calls: Sequence[EditedCall], config: kernel.KernelConfig) -> None:
    from runtime.validate import validate

    tools = {t.name: t for t in config.tools}
    for i, call in enumerate(calls):
        tool = tools.get(call.name)
        if tool is None:
            raise ForkError(f"the edited reply's call {i} names tool {call.name!r}, which the agent does not "
                            f"have; its tools: {', '.join(sorted(tools)) or 'none'}")
        problems = validate(call.arguments, tool.parameters, path="arguments")
        if problems:
            raise ForkError(f"the edited reply's call {i} ({call.name}) has invalid arguments: "
                            + "; ".join(problems))


# ── writing a fork ────────────────────────────────────────────────────────────────────────────────────


async def fork(js: JetStreamContext, run_id: str, at_seq: int, edit: ForkEdit | None = None, *,
               bundle: Any = None, new_run: str | None = None, source: RunHistory | None = None) -> Forked:
    """Write a fork of `run_id` that keeps its events before `at_seq` (with `edit` applied), register it
    and tell the host serving it. `bundle` (a loaded bundle of the source's agent) checks edits against
    its tools; without it the bundle the runs index names is loaded if it can be, else edits are checked
    for their place only. Raises `ForkError` (nothing written) when the fork cannot be made as asked."""
    from runtime.commands import publish_command
    from runtime.nats.kv import fleet_kv, runs_kv
    from runtime.nats.records import RunIndex
    from runtime.nats.subjects import ACTIVE_BUCKET, active_key, partition_of
    from runtime.nats.topology import read_topology

    runs = RunLog(js)
    source = source or await runs.read(run_id)
    if not source.events:
        raise ForkError(f"no run {run_id!r} (no events): see `sa runs` for the run ids")
    index_kv = await runs_kv(js)
    if isinstance(edit, BundleEdit):
        bundle = _edited_bundle(edit, source.actor)  # the edit is checked against what the fork goes on with
    elif bundle is None:
        bundle = await _indexed_bundle(index_kv, run_id)
    config = bundle.kernel_config() if bundle is not None else None
    output_model = None
    if isinstance(edit, OutputEdit) and bundle is not None:
        tool = _tool_of(source, edit.call_id)
        output_model = bundle.output_model_for(tool) if tool else None
    new_run = new_run or new_fork_id()
    conversation = None
    if isinstance(source.events[0], ev.RunStarted) and source.events[0].previous_run is not None:
        from runtime.log.threads import conversation_for

        conversation = await conversation_for(runs, config or kernel.KernelConfig(), source.events)
    events = plan(source, at_seq, new_run, edit, config=config, output_model=output_model,
                  conversation=conversation)
    try:
        written = await runs.write_run(events)
    except LogRejected as e:  # e.g. a user whose role may not write events
        raise ForkError(f"the fork could not be written: {e}") from None
    partitions = (await read_topology(js)).partitions
    partition = partition_of(source.actor, partitions)
    path = edit.path if isinstance(edit, BundleEdit) and edit.path else \
        (str(bundle.path) if bundle is not None else None)
    await index_kv.put(new_run, RunIndex(
        actor=source.actor, status="running", partition=partition, last_seq=written.last_seq,
        seq=written.events[-1].seq,
        updated=time.time(), bundle=path, forked_from=run_id, forked_at=at_seq).encode())
    active = await fleet_kv(js, ACTIVE_BUCKET)
    await active.put(active_key(partition, new_run), source.actor.encode())
    await publish_command(js, source.actor, ev.Resume(run_id=new_run))
    return Forked(new_run, run_id, at_seq, source.actor, partition, len(events))


def _tool_of(source: RunHistory, call_id: str) -> str | None:
    short = call_id.rsplit("/", 1)[-1]
    for e in source.events:
        if isinstance(e, ev.ModelResponded):
            for c in e.calls:
                if c.id.rsplit("/", 1)[-1] == short:
                    return c.name
    return None


def _edited_bundle(edit: BundleEdit, actor: str) -> Any:
    """The bundle a `BundleEdit` names, loaded and checked to be a version of the run's own agent; None
    when the edit gives only a digest (a host that has that version loaded will drive the fork)."""
    from runtime.bundle import BundleError, load_bundle
    from runtime.commands import split_actor

    if not edit.path:
        return None
    try:
        bundle = load_bundle(edit.path)
    except (BundleError, OSError) as e:
        raise ForkError(f"the bundle to go on with cannot be loaded: {e}") from None
    agent = split_actor(actor)[0]
    if bundle.name != agent:
        raise ForkError(f"the bundle at {edit.path} defines agent {bundle.name!r}; the run belongs to "
                        f"{agent!r}: a fork goes on with a version of its own agent")
    if bundle.digest != edit.digest:
        raise ForkError(f"the bundle at {edit.path} is version {bundle.digest}, not {edit.digest} as the "
                        "edit says: give the digest of the bundle at that path")
    return bundle


async def _indexed_bundle(index_kv: Any, run_id: str) -> Any:
    """The loaded bundle the runs index names for `run_id`, or None if it cannot be loaded from here."""
    from runtime.bundle import BundleError, load_bundle
    from runtime.nats.records import RunIndex

    try:
        entry = await index_kv.get(run_id)
    except (KeyNotFoundError, NotFoundError):
        return None
    ix = RunIndex.decode(entry.value) if entry.value else None
    if ix is None or not ix.bundle:
        return None
    try:
        return load_bundle(ix.bundle)
    except (BundleError, OSError):
        return None


__all__ = ["BundleEdit", "EditedCall", "ForkEdit", "ForkError", "Forked", "OutputEdit", "ReplyEdit",
           "SystemEdit", "fork", "fork_points", "new_fork_id", "plan", "ranges"]
