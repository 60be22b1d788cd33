"""`sa regress`: recorded runs driven again on a candidate bundle, tools served from the log.

    sa regress bundles/shop-next --agent shop --outcome completed --since 7d --sample 200 --save week48
    sa regress bundles/shop-next --set week48 --max-regressions 0         # CI: fail on any regression
    sa regress bundles/shop --set week48 --system "Be brief." --expected expected --json
    sa regress bundles/shop-next --set week48 --html week48.html     # one file to mail or archive
    sa regress bundles/shop-next --set week48 --grader judge:bundles/judge     # a model as judge
    sa regress bundles/shop --set week48 --model-url http://gpu2:8000/v1 --model qwen3 --rule refund=diverge

Where: by the fleet's hosts, in their regression slots and below their production runs, when some host takes
regression jobs (`sa host --regress-slots`, 2 by default); else in this process. `--local` drives them here
whatever the fleet, `--fleet` on the fleet whatever (waiting for a host).

Prints a progress bar (on stderr) while the runs are driven, then a table, one row per run: its verdict
(`same`, `diverged`, `different-output`, `failed`), the seq where it first differs from its source
(`sa replay SOURCE --diff RUN` shows it), turns, tokens and tool calls of both, whether each passes the
graders, and `regression` / `fix`; then the totals. `--json` prints the report as one JSON object instead;
`--html FILE` also writes it as one self-contained page (`runtime.regress.page`): the totals, and each run
that changed beside its source around the first divergence.

Exit codes: 0 done, with at most `--max-regressions` regressions (default 0) and no grader error; 1 more
regressions than that, or a grader failed on some run; 2 bad input (an unknown run or set, runs of another
agent, a candidate that does not load, an unknown rule...): the message says what to fix, nothing is written.
"""

from __future__ import annotations

import json
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.connect import client_for
from runtime.cli.where import resolve_nats
from runtime.client.terminal import console, shown

if TYPE_CHECKING:
    from runtime.regress import Grader, Report

_AGO = re.compile(r"^(\d+(?:\.\d+)?)([mhd])$")
_UNIT = {"m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_when(text: str, option: str) -> float:
    """Unix time from `7d` / `12h` / `30m` (that long ago), an ISO date or time (UTC unless it says), or
    unix seconds; ValueError saying what is accepted."""
    ago = _AGO.match(text.strip())
    if ago:
        return time.time() - float(ago.group(1)) * _UNIT[ago.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"{option} takes a time ago (7d, 12h, 30m), an ISO date or time (2026-11-20, "
                         f"2026-11-20T08:00) or unix seconds, not {text!r}") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _pairs(given: list[str], option: str) -> list[tuple[str, str]]:
    out = []
    for item in given:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise ValueError(f"{option} takes TOOL=VALUE, not {item!r}")
        out.append((key.strip(), value.strip()))
    return out


def _graders(expected: str | None, schema: Path | None, pym: list[Path]) -> list[Grader]:
    from runtime.regress import ExactMatch, JsonSchema, JudgeGrader, PymGrader, RegressError

    graders: list[Grader] = []
    if expected:
        graders.append(ExactMatch(expected))
    if schema is not None:
        try:
            graders.append(JsonSchema(json.loads(schema.read_text(encoding="utf-8"))))
        except (OSError, json.JSONDecodeError) as e:
            raise RegressError(f"--schema {schema}: not a readable JSON Schema: {e}") from None
    for given in pym:
        judge = str(given).removeprefix("judge:")
        graders.append(JudgeGrader.load(judge) if judge != str(given) else PymGrader.load(given))
    return graders


@app.command()
def regress(
    candidate: Annotated[Path, typer.Argument(help="The candidate bundle (a folder or its bundle.yaml).")],
    agent: Annotated[str | None, typer.Option("--agent", help="Choose runs of this agent (with the "
                                                              "options below).")] = None,
    set_name: Annotated[str | None, typer.Option("--set", help="Regress this saved set again.")] = None,
    save: Annotated[str | None, typer.Option("--save", help="Save the chosen runs as a set of this "
                                                            "name.")] = None,
    runs: Annotated[list[str] | None, typer.Option("--run", help="A run id to choose (repeatable).")] = None,
    runs_file: Annotated[Path | None, typer.Option("--runs-file", help="A file of run ids, one per "
                                                                       "line.")] = None,
    outcome: Annotated[str | None, typer.Option("--outcome", help="completed, failed or cancelled.")] = None,
    since: Annotated[str | None, typer.Option("--since", help="Runs last changed since then: 7d, 12h, an "
                                                              "ISO time, unix seconds.")] = None,
    until: Annotated[str | None, typer.Option("--until", help="... and before then.")] = None,
    sample: Annotated[int | None, typer.Option("--sample", help="A random sample of N of them.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="The sample's seed (the same seed, the same "
                                                     "runs).")] = 0,
    system: Annotated[str | None, typer.Option("--system", help="Override the candidate's system "
                                                                "prompt.")] = None,
    model_url: Annotated[str | None, typer.Option("--model-url", help="Override the candidate's model "
                                                                      "endpoint (an OpenAI-compatible "
                                                                      "/v1 URL).")] = None,
    model: Annotated[str | None, typer.Option("--model", help="Override the candidate's model name.")] = None,
    rule: Annotated[list[str] | None, typer.Option("--rule", metavar="TOOL=RULE",
                                                   help="What an unrecorded call of TOOL does: run, error or "
                                                        "diverge (repeatable).")] = None,
    ignore: Annotated[list[str] | None, typer.Option("--ignore", metavar="TOOL=KEY",
                                                     help="An argument key of TOOL that does not count when "
                                                          "matching recorded calls (repeatable).")] = None,
    match: Annotated[list[str] | None, typer.Option("--match", metavar="TOOL=FILE.pym",
                                                    help="A .pym function that says when a call of TOOL asks "
                                                         "what a recorded one asked (repeatable).")] = None,
    expected: Annotated[str | None, typer.Option("--expected", metavar="KEY",
                                                 help="Grade: the output equals the task's metadata[KEY].")
                        ] = None,
    schema: Annotated[Path | None, typer.Option("--schema", help="Grade: the output is valid against this "
                                                                 "JSON Schema file.")] = None,
    grader: Annotated[list[Path] | None, typer.Option("--grader", help="Grade with this .pym script, or "
                                                                       "judge:BUNDLE, a judge agent "
                                                                       "(repeatable).")] = None,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Runs driven at once (in process: "
                                                                   "--local).")] = 4,
    local: Annotated[bool, typer.Option("--local", help="Drive the runs in this process, not on the fleet's "
                                                        "hosts.")] = False,
    fleet: Annotated[bool, typer.Option("--fleet", help="Drive the runs on the fleet's hosts, waiting for "
                                                        "one if none takes regression jobs now.")] = False,
    max_regressions: Annotated[int, typer.Option("--max-regressions", help="Exit 1 with more regressions "
                                                                           "than this.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Also write the report as one self-contained "
                                                             "HTML file here.")] = None,
    nats_url: Annotated[str | None, typer.Option("--nats", envvar="NATS_URL")] = None,
) -> None:
    """Drive recorded runs again on CANDIDATE, every recorded tool result served from the log, and report
    run by run what changed."""
    import anyio

    from runtime.regress import RegressError, read_ids

    if local and fleet:
        _usage("--local and --fleet say opposite things: give one (neither: the fleet when a host takes "
               "regression jobs, else here)")
    try:
        chosen = [*(runs or []), *(read_ids(runs_file) if runs_file else ())]
        options: dict[str, Any] = {
            "agent": agent, "set_name": set_name, "save": save, "runs": chosen, "outcome": outcome,
            "since": parse_when(since, "--since") if since else None,
            "until": parse_when(until, "--until") if until else None, "sample": sample, "seed": seed,
            "system_prompt": system, "base_url": model_url, "model": model,
            "rules": dict(_pairs(rule or [], "--rule")), "ignore": _ignored(_pairs(ignore or [], "--ignore")),
            "match": dict(_pairs(match or [], "--match")),
            "graders": _graders(expected, schema, grader or []), "concurrency": concurrency,
            "where": "local" if local else "fleet" if fleet else "auto"}
    except (ValueError, OSError) as e:
        _usage(str(e))
    url = resolve_nats(nats_url, "regress")
    try:
        report = anyio.run(_regress, url, candidate, options, as_json, html, backend="asyncio")
    except RegressError as e:
        _usage(str(e))
    if as_json:
        typer.echo(json.dumps(report.to_json(), default=str))
    else:
        _print(report)
    raise typer.Exit(1 if len(report.regressions) > max_regressions or report.grader_errors else 0)


def _ignored(pairs: list[tuple[str, str]]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for tool, key in pairs:
        out.setdefault(tool, []).append(key)
    return out


async def _regress(url: str, candidate: Path, options: dict[str, Any], quiet: bool,
                   html: Path | None) -> Report:
    from rich.progress import Progress

    from runtime.regress import report_html

    async with client_for(url, "regress") as client:
        with Progress(console=console(stderr=True), transient=True, disable=quiet) as progress:
            bar: list[Any] = []

            def started(run_set: Any) -> None:
                bar.append(progress.add_task(f"regressing {len(run_set.runs)} run(s) of {run_set.agent}",
                                             total=len(run_set.runs)))

            def done(_: Any) -> None:
                progress.advance(bar[0])

            report = await client.regress(candidate, on_start=started, on_done=done, **options)
        if html is not None:
            html.write_text(await report_html(client.js, report), encoding="utf-8")
        return report


def _usage(message: str) -> Any:
    typer.echo(f"sa regress: {message}", err=True)
    raise typer.Exit(2)


def _print(report: Report) -> None:
    from rich.table import Table

    out = console()
    table = Table(header_style="bold", expand=False)
    numbers = ("at seq", "turns", "tokens", "tool calls", "seconds")
    for column in ("source run", "regression run", "verdict", *numbers, "pass", "change"):
        table.add_column(column, justify="right" if column in numbers else "left")
    for r in report.rows:
        c = r.candidate

        def pair(field: str, cand: Any = c, row: Any = r) -> str:
            return f"{getattr(row.source, field)} → {getattr(cand, field) if cand else '-'}"

        table.add_row(r.source_run, r.run_id or "-", shown(r.verdict + (f": {r.detail}" if r.detail else "")),
                      "" if r.diverged_at is None else str(r.diverged_at), pair("turns"), pair("tokens"),
                      pair("tool_calls"), pair("wall_s"), f"{'yes' if r.source_pass else 'no'} → "
                                          f"{'yes' if r.candidate_pass else 'no'}", r.change)
    out.print(table)
    counts = ", ".join(f"{n} {verdict}" for verdict, n in report.counts.items() if n)
    out.print(f"{len(report.rows)} run(s) of {report.agent} on candidate {report.candidate}, driven "
              f"{'by the fleet' if report.where == 'fleet' else 'here'}: {counts}")
    source, cand = report.pass_rate("source"), report.pass_rate("candidate")
    out.print(f"pass rate: source {source:.0%}, candidate {cand:.0%}; "
              f"{len(report.regressions)} regression(s), {len(report.fixes)} fix(es); "
              f"tokens: source {report.tokens('source')}, candidate {report.tokens('candidate')}; "
              f"{report.model_calls} model call(s), {report.cached} from the cache"
              + (f"; set {report.set}" if report.set else ""))
    for label, rows in (("regressions", report.regressions), ("fixes", report.fixes)):
        if rows:
            out.print(f"{label}: " + " ".join(r.source_run for r in rows))
    for error in report.grader_errors:
        out.print(shown(f"grader error: {error}", style="red"))
    if report.id:
        out.print(f"report {report.id} kept in the fleet: `sa ui`, /regressions/{report.id}")
