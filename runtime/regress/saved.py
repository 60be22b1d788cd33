"""Regression reports kept in the fleet, so a report outlives the process that made it.

    report_id = await save_report(js, report)    # what `regression` does when a regression is done
    await list_reports(js)                        # newest first: what each regressed, on what, how it went
    await load_report(js, report_id)              # the report as `Report.to_json` wrote it

Why: a regression is driven by whatever process calls `sa regress` (a CI job, a laptop), and its report
would die with that process; the inspector (`sa ui`) lists the reports and shows one with its runs side by
side, linked to each run's own page, so it reads them from the fleet, beside the sets and the runs they name.

Why a KV bucket (`regress_reports`, key = the report's id, value = JSON) and not the event log: a report is
derived data, a summary of runs that are in the log already (each regression run marked with its source,
set and candidate), and can be made again from them; JSON so `nats kv get regress_reports ID` is readable.
The id is the time it was saved and what it regressed (`20261129T081500-123-week48`), so ids sort by time.
Reading creates nothing: a fleet where no regression ever finished has no bucket and no report.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from nats.js.kv import KeyValue

from runtime.nats.kv import fleet_kv, kv_entries
from runtime.regress.report import Report

REPORTS_BUCKET = "regress_reports"
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_ID = re.compile(r"^[A-Za-z0-9_-]{1,120}$")


class NoReport(LookupError):
    """No saved report by that id (the message names where to find ids)."""


def report_id(report: Report, made_at: float) -> str:
    """The id a report is saved under: when, to the millisecond, then the set's name (or the agent's)."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(made_at)) + f"-{int(made_at * 1000) % 1000:03d}"
    return f"{stamp}-{_UNSAFE.sub('_', report.set or report.agent)[:64]}"


async def save_report(js: JetStreamContext, report: Report, *, made_at: float | None = None) -> str:
    """Keep `report` in the fleet; its id."""
    made_at = time.time() if made_at is None else made_at
    key = report_id(report, made_at)
    value = {"id": key, "made_at": made_at, **report.to_json()}
    await (await fleet_kv(js, REPORTS_BUCKET)).put(key, json.dumps(value, default=str).encode())
    return key


async def _bucket(js: JetStreamContext) -> KeyValue | None:
    try:
        return await js.key_value(REPORTS_BUCKET)
    except BucketNotFoundError:
        return None


def summary(data: dict[str, Any]) -> dict[str, Any]:
    """What a list of reports shows of one: everything but its rows."""
    return {k: v for k, v in data.items() if k not in ("rows", "grader_errors")} | {
        "grader_errors": len(data.get("grader_errors") or ())}


async def list_reports(js: JetStreamContext) -> list[dict[str, Any]]:
    """Every saved report's `summary`, newest first."""
    kv = await _bucket(js)
    if kv is None:
        return []
    out = [summary(json.loads(e.value)) for e in (await kv_entries(kv)).values() if e.value]
    return sorted(out, key=lambda d: d["id"], reverse=True)


async def load_report(js: JetStreamContext, key: str) -> dict[str, Any]:
    """The saved report `key` whole (`Report.to_json` with its id and when it was made); `NoReport`."""
    if not _ID.match(key):
        raise NoReport(f"{key!r} is not a report id (letters, digits, - and _; see /regressions)")
    kv = await _bucket(js)
    try:
        entry = await kv.get(key) if kv is not None else None
    except KeyNotFoundError:
        entry = None
    if entry is None or not entry.value:
        raise NoReport(f"no saved report {key!r} (the regressions page lists them)")
    data: dict[str, Any] = json.loads(entry.value)
    return data


__all__ = ["REPORTS_BUCKET", "NoReport", "list_reports", "load_report", "report_id", "save_report", "summary"]
