"""Which recorded runs a regression drives again: a selection, resolved to run ids, saved as a named set.

    chosen = await select(js, Selection(agent="shop", outcome="completed", since=t0, sample=200, seed=7))
    await save_set(js, "shop-week-48", chosen)          # the same runs, for every later regression
    again = await load_set(js, "shop-week-48")

A selection reads the runs index (`runs`: what hosts write for every production run), so it sees production
runs only: regression runs are never indexed (`runtime.regress.drive`). By agent always (a set holds runs of
one agent, since one candidate bundle drives them all), then by explicit run ids (a list, or a file of them),
outcome, a time window on when the run last changed, and a random sample of N drawn with a seed (the same seed
draws the same runs). Only finished runs are chosen: a run still going has no ending to compare with.

Bad input is refused before anything is written, saying what to fix: a run id the log does not know, a run of
another agent, a regression run (regress its source instead), a selection that matches nothing.

Why a KV bucket for sets (`regress_sets`, key = the set's name, value = JSON) and not a file: a set names runs
in the fleet's log, so it belongs beside them, and whoever regresses it next (a CI job, a colleague) reads it
from the fleet without being handed a file; JSON so `nats kv get regress_sets NAME` is readable as it is. A
file of run ids is still accepted as input (`Selection.runs`, `read_ids`).
"""

from __future__ import annotations

import json
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from runtime import events as ev
from runtime.log import RunLog
from runtime.nats.kv import fleet_kv, kv_entries, runs_kv
from runtime.nats.records import RunIndex

SETS_BUCKET = "regress_sets"
OUTCOMES = ("completed", "failed", "cancelled")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class RegressError(ValueError):
    """A regression that cannot be made as asked (a bad selection, set, candidate or grader); nothing was
    written."""


@dataclass(frozen=True)
class Selection:
    """What runs to choose (see the module docstring); times are unix seconds."""

    agent: str
    runs: tuple[str, ...] = ()
    outcome: str | None = None
    since: float | None = None
    until: float | None = None
    sample: int | None = None
    seed: int = 0


@dataclass(frozen=True)
class RunSet:
    """Recorded runs of one agent, in a fixed order: what a regression drives again."""

    name: str
    agent: str
    runs: tuple[str, ...]
    selection: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "runs": list(self.runs)}


def read_ids(path: str | Path) -> tuple[str, ...]:
    """Run ids from a file: one per line (or separated by spaces or commas); `#` starts a comment."""
    text = Path(path).read_text(encoding="utf-8")
    ids = [tok for line in text.splitlines() for tok in re.split(r"[\s,]+", line.split("#", 1)[0]) if tok]
    return tuple(dict.fromkeys(ids))


def _agent_of(actor: str) -> str:
    return actor.split(":")[0]


async def select(js: JetStreamContext, selection: Selection, *, name: str = "") -> RunSet:
    """The runs `selection` chooses, checked (`RegressError` says what is wrong), oldest first."""
    if selection.outcome is not None and selection.outcome not in OUTCOMES:
        raise RegressError(f"unknown outcome {selection.outcome!r}: choose one of {', '.join(OUTCOMES)}")
    if selection.sample is not None and selection.sample < 1:
        raise RegressError(f"a sample takes at least one run, not {selection.sample}")
    listed = await kv_entries(await runs_kv(js))
    index = {key: RunIndex.decode(e.value) for key, e in listed.items() if e.value}
    if selection.runs:
        entries = {run: index.get(run) or await _unindexed(js, run) for run in selection.runs}
        for run, ix in entries.items():
            if _agent_of(ix.actor) != selection.agent:
                raise RegressError(f"run {run} belongs to agent {_agent_of(ix.actor)!r}, not "
                                   f"{selection.agent!r}: a set holds runs of one agent")
            if ix.status not in OUTCOMES:
                raise RegressError(f"run {run} has not ended (it is {ix.status}): only finished runs can be "
                                   "regressed")
    else:
        entries = {run: ix for run, ix in index.items()
                   if _agent_of(ix.actor) == selection.agent and ix.status in OUTCOMES}
    chosen = [(ix.updated, run) for run, ix in entries.items()
              if (selection.outcome is None or ix.status == selection.outcome)
              and (selection.since is None or ix.updated >= selection.since)
              and (selection.until is None or ix.updated < selection.until)]
    if not chosen:
        raise RegressError(f"no finished run of agent {selection.agent!r} matches the selection "
                           f"({_described(selection)}): see `sa runs {selection.agent}`")
    chosen.sort()
    if selection.sample is not None and selection.sample < len(chosen):
        chosen = sorted(random.Random(selection.seed).sample(chosen, selection.sample))
    return RunSet(name=name, agent=selection.agent, runs=tuple(run for _, run in chosen),
                  selection={k: v for k, v in asdict(selection).items() if v not in (None, ())},
                  created=time.time())


async def _unindexed(js: JetStreamContext, run: str) -> RunIndex:
    """A run id the index does not list: known to the log (an index entry purged or never written), or not."""
    try:
        history = await RunLog(js).read(run)
    except ValueError as e:  # not a valid run id at all
        raise RegressError(f"{run!r} is not a run id: {e}") from None
    if not history.events:
        raise RegressError(f"no run {run!r}: the log has no events for it (see `sa runs`)")
    first, last = history.events[0], history.events[-1]
    if isinstance(first, ev.RunStarted) and first.regression is not None:
        raise RegressError(f"run {run} is a regression run (of run {first.regression.source_run}): regress "
                           "its source instead")
    status = ev.kind_of(last).removeprefix("run.") if ev.kind_of(last).removeprefix("run.") in OUTCOMES \
        else "running"
    return RunIndex(status=status, actor=history.actor, partition=0, updated=last.ts)


def _described(selection: Selection) -> str:
    parts = [f"{len(selection.runs)} given run id(s)"] if selection.runs else []
    parts += [f"outcome {selection.outcome}"] if selection.outcome else []
    parts += [f"since {time.strftime('%Y-%m-%d %H:%M', time.gmtime(selection.since))} UTC"] \
        if selection.since is not None else []
    parts += [f"until {time.strftime('%Y-%m-%d %H:%M', time.gmtime(selection.until))} UTC"] \
        if selection.until is not None else []
    return ", ".join(parts) or "any finished run"


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise RegressError(f"a set's name is 1-64 letters, digits, '-' or '_', not {name!r}")
    return name


async def save_set(js: JetStreamContext, name: str, runs: RunSet) -> RunSet:
    """Store `runs` as the set `name` (replacing a set of that name); the set as saved."""
    saved = RunSet(check_name(name), runs.agent, runs.runs, runs.selection, runs.created or time.time())
    await (await fleet_kv(js, SETS_BUCKET)).put(name, json.dumps(saved.to_json()).encode())
    return saved


async def _sets(js: JetStreamContext) -> KeyValue | None:
    """The sets bucket if any set was ever saved (reading creates nothing)."""
    try:
        return await js.key_value(SETS_BUCKET)
    except BucketNotFoundError:
        return None


async def load_set(js: JetStreamContext, name: str) -> RunSet:
    """The saved set `name`; `RegressError` naming the sets there are when there is none."""
    kv = await _sets(js)
    try:
        entry = await kv.get(check_name(name)) if kv is not None else None
    except KeyNotFoundError:
        entry = None
    if entry is None or not entry.value:
        known = sorted(await list_sets(js))
        raise RegressError(f"no saved set {name!r}; saved sets: {', '.join(known) or 'none'} (save one with "
                           "`sa regress ... --save NAME`)")
    data = json.loads(entry.value)
    return RunSet(data["name"], data["agent"], tuple(data["runs"]), data.get("selection") or {},
                  data.get("created", 0.0))


async def list_sets(js: JetStreamContext) -> list[str]:
    """The names of the saved sets."""
    kv = await _sets(js)
    return sorted(key for key, e in (await kv_entries(kv)).items() if e.value) if kv is not None else []


__all__ = ["OUTCOMES", "SETS_BUCKET", "RegressError", "RunSet", "Selection", "check_name", "list_sets",
           "load_set", "read_ids", "save_set", "select"]
