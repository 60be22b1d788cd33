"""A regression's report as one self-contained HTML file (`sa regress ... --html report.html`).

    html = await report_html(js, report)          # reads both runs of every changed row from the log
    html = render_report(report, events_by_run)   # the same, from events already in hand (pure)

The page holds the totals (pass rate of source and candidate, regressions and fixes by run, the token, turn
and tool-call deltas, the model calls and how many the cache answered), a table of every run, and then one
section per run that changed (a `same` run is a row of the table, no more): its verdict, the first seq where
it differs from its source, and the two runs' timelines side by side around that seq, as
`sa replay SOURCE --diff RUN` lines them up (`runtime.client.diff`: events of the same kind
beside each other, the event one side lacks beside a gap), each event described as `sa replay` describes it
(`runtime.client.describe`).

Why it is safe to open, mailed or archived, anywhere: every text from a run (a task, a model's reply, a tool's
output, an error) is HTML-escaped before it is written, so a reply holding `<script>` is text on the page;
the file has no script at all, its one stylesheet is inline, and a Content-Security-Policy in it allows no
network access and only that stylesheet (by its hash), so a tag smuggled in by some future rendering bug could
neither run nor fetch anything. Its only links are fragment links (`#run-...`) within the page.
"""

from __future__ import annotations

import base64
import hashlib
import time
from collections.abc import Mapping, Sequence
from html import escape

from nats.js import JetStreamContext

from runtime import events as ev
from runtime.client.describe import describe
from runtime.client.diff import aligned, diverge
from runtime.log import RunLog
from runtime.regress.report import Report, Row, behaviour

BEFORE = 3  # shared events shown before the first divergence
AFTER = 12  # aligned rows shown from it on

_CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#1d1d1f;background:#fff}
h1{font-size:1.4em;margin:0 0 .3em}h2{font-size:1.15em;margin:1.5em 0 .4em}h3{font-size:1em;margin:0}
table{border-collapse:collapse;margin:.4em 0}th,td{border:1px solid #d0d0d5;padding:.2em .5em;
vertical-align:top;text-align:left}th{background:#f2f2f5}td.n{text-align:right;font-variant-numeric:tabular-nums}
.mono,code{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:.92em}
.v-same{color:#1a7f37}.v-diverged{color:#9a6700}.v-different-output,.v-failed{color:#cf222e}
.regression{background:#ffebe9}.fix{background:#dafbe1}.muted{color:#6e7781}
section.run{border-top:2px solid #d0d0d5;margin-top:1.2em;padding-top:.6em}
tr.first td{border-top:2px solid #cf222e}tr.shared td{color:#6e7781}td.gap{background:#f6f8fa}
td.detail{max-width:38em;white-space:pre-wrap;word-break:break-word}
"""


def _hash(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode()


def _e(value: object) -> str:
    return escape(str(value), quote=True)


def _anchor(run_id: str) -> str:
    return "run-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in run_id)


def _delta(source: float, candidate: float) -> str:
    d = candidate - source
    return f"{source:g} → {candidate:g} ({'+' if d >= 0 else ''}{d:g})"


def _totals(report: Report) -> str:
    def total(side: str, field: str) -> int:
        sides = [r.source if side == "source" else r.candidate for r in report.rows]
        return sum(getattr(s, field) for s in sides if s is not None)

    counts = ", ".join(f"{n} {verdict}" for verdict, n in report.counts.items() if n) or "no run"
    rows = [("runs", f"{len(report.rows)} of {_e(report.agent)}: {_e(counts)}"),
            ("pass rate", f"source {report.pass_rate('source'):.0%} → candidate "
                          f"{report.pass_rate('candidate'):.0%}"),
            ("regressions", _links(report.regressions)), ("fixes", _links(report.fixes)),
            ("tokens", _delta(total("source", "tokens"), total("candidate", "tokens"))),
            ("turns", _delta(total("source", "turns"), total("candidate", "turns"))),
            ("tool calls", _delta(total("source", "tool_calls"), total("candidate", "tool_calls"))),
            ("model calls", f"{report.model_calls} to the model, {report.cached} from the cache")]
    if report.grader_errors:
        rows.append(("grader errors", "<br>".join(_e(e) for e in report.grader_errors)))
    body = "".join(f"<tr><th>{k}</th><td>{v}</td></tr>" for k, v in rows)
    return f'<table id="totals">{body}</table>'


def _links(rows: Sequence[Row]) -> str:
    if not rows:
        return '<span class="muted">none</span>'
    return " ".join(f'<a class="mono" href="#{_anchor(r.source_run)}">{_e(r.source_run)}</a>' for r in rows)


def _runs_table(report: Report) -> str:
    head = "".join(f"<th>{h}</th>" for h in ("source run", "regression run", "verdict", "at seq", "turns",
                                             "tokens", "tool calls", "pass", "change"))
    body = []
    for r in report.rows:
        c = r.candidate

        def pair(field: str, row: Row = r, cand: object = c) -> str:
            return f"{getattr(row.source, field)} → {getattr(cand, field) if cand is not None else '-'}"

        at = "" if r.diverged_at is None else r.diverged_at
        body.append(
            f'<tr class="{r.change}"><td class="mono">{_linked(r)}</td>'
            f'<td class="mono">{_e(r.run_id or "-")}</td>'
            f'<td class="v-{r.verdict}">{_e(r.verdict)}</td><td class="n">{at}</td>'
            f'<td class="n">{pair("turns")}</td><td class="n">{pair("tokens")}</td>'
            f'<td class="n">{pair("tool_calls")}</td>'
            f"<td>{'yes' if r.source_pass else 'no'} → {'yes' if r.candidate_pass else 'no'}</td>"
            f"<td>{r.change}</td></tr>")
    return f'<table id="runs"><tr>{head}</tr>{"".join(body)}</table>'


def _linked(row: Row) -> str:
    """A run's id, linked to its section when it has one (a run that changed)."""
    if row.verdict == "same":
        return _e(row.source_run)
    return f'<a href="#{_anchor(row.source_run)}">{_e(row.source_run)}</a>'


def _cells(e: ev.Event | None) -> str:
    if e is None:
        return '<td class="gap"></td>' * 3
    return (f'<td class="n">{e.seq}</td><td class="mono">{_e(ev.kind_of(e))}</td>'
            f'<td class="detail">{_e(describe(e))}</td>')


def _side_by_side(row: Row, source: Sequence[ev.Event], candidate: Sequence[ev.Event]) -> str:
    """The two timelines around the first divergence: the last shared events once per side, then the
    differing ones as the diff lines them up."""
    assert row.run_id is not None
    d = diverge(row.source_run, source, row.run_id, candidate, fact_of=behaviour)
    xa, xb = ev.expand_all(source), ev.expand_all(candidate)
    same = len(xa) - len(d.a_detail)
    lines = [f'<tr class="shared">{_cells(a)}{_cells(b)}</tr>'
             for a, b in zip(xa[max(0, same - BEFORE):same], xb[max(0, same - BEFORE):same], strict=False)]
    pairs = aligned(d.a_detail, d.b_detail)
    for i, (a, b) in enumerate(pairs[:AFTER]):
        lines.append(f'<tr{" class=first" if i == 0 else ""}>{_cells(a)}{_cells(b)}</tr>')
    more = len(pairs) - AFTER
    if more > 0:
        lines.append(f'<tr><td colspan="6" class="muted">{more} more row(s): sa replay {_e(row.source_run)} '
                     f'--diff {_e(row.run_id)}</td></tr>')
    head = "".join(f'<th>seq</th><th>{_e(run)}</th><th>detail</th>' for run in (row.source_run, row.run_id))
    return f'<table class="timelines"><tr>{head}</tr>{"".join(lines)}</table>'


def _run_section(row: Row, events: Mapping[str, Sequence[ev.Event]]) -> str:
    at = "" if row.diverged_at is None else f' · first divergence at seq <b class="seq">{row.diverged_at}</b>'
    parts = [f'<section class="run" id="{_anchor(row.source_run)}"><h3><span class="mono">'
             f'{_e(row.source_run)}</span> → <span class="mono">{_e(row.run_id or "-")}</span>: '
             f'<span class="v-{row.verdict} verdict">{_e(row.verdict)}</span>{at}'
             + (f" · <b>{row.change}</b>" if row.change else "") + "</h3>"]
    for label, text in (("detail", row.detail), ("why it did not pass", "; ".join(row.reasons)),
                        ("grader errors", "; ".join(row.grader_errors)),
                        ("tools with no recorded match", ", ".join(row.unmatched))):
        if text:
            parts.append(f"<p><b>{label}:</b> {_e(text)}</p>")
    if row.candidate is not None and row.candidate.output != row.source.output:
        parts.append(f'<p><b>output:</b> <code>{_e(row.source.output)}</code> → '
                     f'<code>{_e(row.candidate.output)}</code></p>')
    if row.run_id is not None and row.verdict != "same" and row.run_id in events:
        parts.append(_side_by_side(row, events.get(row.source_run, ()), events[row.run_id]))
    return "".join(parts) + "</section>"


def render_report(report: Report, events: Mapping[str, Sequence[ev.Event]], *,
                  made_at: float | None = None) -> str:
    """The whole HTML document of `report`; `events` holds both runs' events (payloads resolved) by run id."""
    title = f"regression of {report.set or report.agent} on {report.candidate}"
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(made_at if made_at is not None else time.time()))
    csp = f"default-src 'none'; style-src '{_hash(_CSS)}'; base-uri 'none'; form-action 'none'"
    body = [f"<h1>{_e(title)}</h1>", f'<p class="muted">{_e(when)} · candidate <span class="mono">'
            f'{_e(report.candidate)}</span>' + (f" · set {_e(report.set)}" if report.set else "") + "</p>",
            "<h2>Totals</h2>", _totals(report), "<h2>Runs</h2>", _runs_table(report),
            *(_run_section(r, events) for r in report.rows if r.verdict != "same")]
    return (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{csp}">\n'
            f"<title>{_e(title)}</title><style>{_CSS}</style></head>\n<body>\n" + "\n".join(body)
            + "\n</body></html>\n")


async def report_html(js: JetStreamContext, report: Report) -> str:
    """`render_report` with both runs of every changed row read from the log."""
    log = RunLog(js)
    events: dict[str, Sequence[ev.Event]] = {}
    for row in report.rows:
        if row.run_id is not None and row.verdict != "same":
            for run in (row.source_run, row.run_id):
                events[run] = (await log.read(run)).events
    return render_report(report, events)


__all__ = ["render_report", "report_html"]
