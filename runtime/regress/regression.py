"""One regression, end to end: choose the runs (or read a saved set), load the candidate, drive, report.

    report = await regression(js, "bundles/shop-next", agent="shop", outcome="completed", sample=200,
                              save="shop-week-48")
    report = await regression(js, "bundles/shop-next", set_name="shop-week-48")      # the same runs again

What `Client.regress` and `sa regress` call. Everything that can be refused is checked before the first run
is driven (the selection or set, the candidate, the graders, the rules), so bad input writes nothing: no
regression run, no set. A regression that is done keeps its report in the fleet (`runtime.regress.saved`),
where the inspector lists it.

Where the runs are driven (`where`): `fleet`, by the fleet's hosts in their regression slots, below their
production runs (`runtime.regress.fleet`); `local`, here, in this process (`runtime.regress.drive`); `auto`
(the default), on the fleet when some host takes regression jobs now, else here. Each run is driven by the
same function either way, so the report is the same; only the graders always run here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from nats.js import JetStreamContext

from runtime.regress.cache import ModelCache
from runtime.regress.candidate import load_candidate
from runtime.regress.drive import Driven, drive_all
from runtime.regress.fleet import drive_on_fleet, fleet_serves
from runtime.regress.graders import Grader
from runtime.regress.ports import Rule
from runtime.regress.recorded import Matcher, PymCompare
from runtime.regress.report import Report, report_of
from runtime.regress.saved import save_report
from runtime.regress.sets import RegressError, RunSet, Selection, load_set, save_set, select
from runtime.regress.shipped import ship

WHERE = ("auto", "fleet", "local")


def rules_of(given: Mapping[str, str | Rule] | None, tools: Sequence[str]) -> dict[str, Rule]:
    """Per-tool rules as given (`{"refund": "diverge"}`), checked against the candidate's tools."""
    out: dict[str, Rule] = {}
    for tool, rule in (given or {}).items():
        if tool not in tools:
            raise RegressError(f"a rule names tool {tool!r}, which the candidate does not have; its tools: "
                               f"{', '.join(sorted(tools))}")
        try:
            out[tool] = Rule(rule)
        except ValueError:
            raise RegressError(f"unknown rule {rule!r} for {tool}: choose run, error or diverge") from None
    return out


async def regression(js: JetStreamContext, candidate_path: str | Path, *, agent: str | None = None,
                     set_name: str | None = None, runs: Sequence[str] = (), outcome: str | None = None,
                     since: float | None = None, until: float | None = None, sample: int | None = None,
                     seed: int = 0, save: str | None = None, system_prompt: str | None = None,
                     base_url: str | None = None, model: str | None = None, model_url: str | None = None,
                     rules: Mapping[str, str | Rule] | None = None,
                     ignore: Mapping[str, Sequence[str]] | None = None,
                     match: Mapping[str, str | Path] | None = None, graders: Sequence[Grader] = (),
                     concurrency: int = 4, on_start: Callable[[RunSet], Any] | None = None,
                     on_done: Callable[[Driven], Any] | None = None, where: str = "auto") -> Report:
    """Regress a saved set (`set_name`) or a selection of `agent`'s runs (saved as `save` when given) on the
    candidate bundle at `candidate_path` with its overrides; `rules`, `ignore` (argument keys) and `match`
    (`.pym` matchers) per tool; driven `where` (see the module docstring; `concurrency` is how many at once
    here). `RegressError` for bad input, nothing written."""
    if where not in WHERE:
        raise RegressError(f"where must be one of {', '.join(WHERE)}, not {where!r}")
    if set_name is not None:
        if any(v is not None for v in (outcome, since, until, sample)) or runs:
            raise RegressError("a saved set is regressed as it was saved: give a set or a selection, not "
                               "both")
        run_set = await load_set(js, set_name)
        if agent is not None and agent != run_set.agent:
            raise RegressError(f"set {set_name!r} holds runs of agent {run_set.agent!r}, not {agent!r}")
    elif agent is None:
        raise RegressError("say which runs: an agent (with a selection) or a saved set")
    else:
        run_set = await select(js, Selection(agent=agent, runs=tuple(runs), outcome=outcome, since=since,
                                             until=until, sample=sample, seed=seed), name=save or "")
    cache = ModelCache(js)
    candidate = await load_candidate(candidate_path, run_set.agent, cache, system_prompt=system_prompt,
                                     base_url=base_url, model=model, model_url=model_url)
    try:
        checked = rules_of(rules, [s.name for s in candidate.bundle.tool_schemas()])  # ask_human too
        names = [s.name for s in candidate.bundle.tool_schemas()]
        for tool in [*(ignore or {}), *(match or {})]:
            if tool not in names:
                raise RegressError(f"--ignore/--match name tool {tool!r}, which the candidate does not have; "
                                   f"its tools: {', '.join(sorted(names))}")
        matcher = Matcher({tool: frozenset(keys) for tool, keys in (ignore or {}).items()},
                          {tool: PymCompare.load(path) for tool, path in (match or {}).items()})
        on_fleet = where == "fleet" or (where == "auto" and await fleet_serves(js))
        shipped = await ship(js, candidate.bundle) if on_fleet else None  # refused before anything is saved
        if save is not None and set_name is None:
            run_set = await save_set(js, save, run_set)
        if on_start is not None:
            on_start(run_set)
        if shipped is not None:
            driven = await drive_on_fleet(js, run_set, candidate, shipped=shipped, rules=checked,
                                          ignore=ignore, match=match, on_done=on_done)
        else:
            driven = await drive_all(js, run_set, candidate, rules=checked, matcher=matcher,
                                     concurrency=concurrency, on_done=on_done)
        report = await report_of(run_set, candidate, driven, graders=graders, concurrency=concurrency)
        report.where = "fleet" if shipped is not None else "local"
        report.id = await save_report(js, report)
        return report
    finally:
        await candidate.aclose()


__all__ = ["regression", "rules_of"]
