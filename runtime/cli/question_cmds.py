"""Questions runs ask a person (`ask_human`): `sa questions`, `sa answer` (`Client.questions`,
`RunHandle.answer`).

    sa questions [AGENT] [--json]          questions waiting for an answer: run, call, question, form, age
    sa answer RUN CALL JSON                answer one; JSON is checked against the question's schema
    sa answer RUN CALL --text TEXT         the same with a plain string (no JSON quoting in the shell)

CALL is the call id as `sa questions` prints it (`1.0`) or in full (`<run>/1.0`). `sa answer` checks the
run's log and the question's schema before it sends anything, then waits until the host has recorded the
answer, and the run goes on with it. Exit codes: 0 answered; 1 bad input or not recorded (an unknown run
or call, a question answered already, by a person or by its timeout's default, an answer that does not fit
the schema, a run that ended: the message says which, and nothing was sent); 2 no NATS server.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from runtime.cli.app import app
from runtime.cli.control_cmds import NatsOption, _ago, _run, _short, _times_out, waiting_table
from runtime.cli.where import resolve_nats


@app.command()
def questions(
    agent: Annotated[str | None, typer.Argument(help="Only this agent (bundle or bundle:instance).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON array.")] = False,
    nats_url: NatsOption = None,
) -> None:
    """List the questions runs ask a person (ask_human) that wait for an answer."""
    def row(q: Any, now: float) -> tuple[Any, ...]:
        then = (_short(q.default, 30) if q.has_default else "error") if q.due is not None else ""
        return (q.run_id, q.actor, q.call_id.rsplit("/", 1)[-1], q.question,
                _short(q.schema) if q.schema else "any JSON", _ago(now - q.asked_at),
                _times_out(now, q.due, then, q.run_deadline, "run deadline"))

    waiting_table("questions", nats_url, lambda c: c.questions(agent), as_json=as_json,
                  empty="no questions are waiting for an answer",
                  columns=("run", "agent", "call", "question", "answer schema", "age", "times out"),
                  wide=("question", "answer schema"), row=row)


@app.command()
def answer(
    run: Annotated[str, typer.Argument(help="The run id.")],
    call: Annotated[str, typer.Argument(help="The call id (`1.0`, as `sa questions` shows it).")],
    value: Annotated[str | None, typer.Argument(help="The answer as JSON (`\"yes\"`, `42`, "
                                                     "`{\"approved\": true}`).")] = None,
    text: Annotated[str | None, typer.Option("--text", help="The answer as a plain string instead of "
                                                            "JSON.")] = None,
    nats_url: NatsOption = None,
) -> None:
    """Answer a run's question; the run goes on with the answer."""
    from runtime import events as ev

    if (value is None) == (text is None):
        typer.echo("sa answer: give the answer as JSON (sa answer RUN CALL '\"yes\"') or as text "
                   "(--text yes), one of the two", err=True)
        raise typer.Exit(1)
    given: Any = text
    if value is not None:
        try:
            given = json.loads(value)
        except ValueError as e:
            typer.echo(f"sa answer: the answer is not valid JSON ({e}); quote a string as '\"yes\"', "
                       "or pass it with --text", err=True)
            raise typer.Exit(1) from None
    url = resolve_nats(nats_url, "answer")
    event = _run("answer", url, lambda c: c.get(run).answer(call, given))
    if isinstance(event, ev.QuestionAnswered) and event.by != "timeout":
        typer.echo(f"answered {event.call_id} by {event.by}: {_short(event.answer, 80)}")
        return
    typer.echo(f"sa answer: the question of {event.call_id} was closed otherwise first: {ev.to_json(event)}",
               err=True)
    raise typer.Exit(1)


__all__ = ["answer", "questions"]
