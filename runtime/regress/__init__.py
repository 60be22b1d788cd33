"""Regressions over recorded runs: last week's runs driven again on a new bundle, tools served from the log.

- `sets`      — which runs: a `Selection` (agent, run ids, outcome, time window, a seeded sample) resolved
                to a `RunSet`, saved by name in the fleet (`save_set`, `load_set`); `RegressError`: bad input
- `candidate` — what they run on: another bundle folder, or overrides of one (system prompt, model endpoint)
- `recorded`  — what the source run recorded, found by canonical key (`Matcher`, `Recorded`)
- `ports`     — `RegressPorts`: the run driver's ports where a recorded call is served and an unmatched one
                follows its tool's `Rule` (`run`, `error`, `diverge`), nothing reaching the world
- `cache`     — the model reply cache, keyed by the request bytes as sent (`CachedModelClient`)
- `drive`     — each run driven again from its task as a real run in the log, marked as a regression
- `shipped`   — the candidate bundle's files in the fleet's object store, for the hosts that drive its runs
- `fleet`     — the runs driven by the fleet's hosts instead of this process: one job per run, answers back
- `graders`   — exact match, JSON Schema, `.pym` graders, a judge agent; the default: the source's output
- `report`    — per run `same` / `diverged` / `different-output` / `failed`, regressions and fixes (`regress`)
- `page`      — the report as one self-contained HTML file, each changed run beside its source (`report_html`)
- `saved`     — reports kept in the fleet by id, for the inspector (`save_report`, `list_reports`,
                `load_report`)
- `regression` — one regression end to end, everything checked before the first run (`Client.regress`)
"""

from runtime.regress.cache import CachedModelClient, ModelCache
from runtime.regress.candidate import Candidate, load_candidate
from runtime.regress.graders import ExactMatch, Grader, JsonSchema, JudgeGrader, PymGrader, SameAsSource
from runtime.regress.page import render_report, report_html
from runtime.regress.ports import RegressPorts, Rule
from runtime.regress.recorded import Matcher
from runtime.regress.regression import regression
from runtime.regress.report import Report, Row, regress
from runtime.regress.sets import RegressError, RunSet, Selection, load_set, read_ids, save_set, select

__all__ = ["CachedModelClient", "Candidate", "ExactMatch", "Grader", "JsonSchema", "JudgeGrader",
           "Matcher", "ModelCache", "PymGrader", "RegressError", "RegressPorts", "Report", "Row", "Rule",
           "RunSet", "SameAsSource", "Selection", "load_candidate", "load_set", "read_ids", "regress",
           "regression", "render_report", "report_html", "save_set", "select"]
