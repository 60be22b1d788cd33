"""Graders: whether a run's ending is good, asked of the source run and of its regression alike.

    graders = [ExactMatch("expected"), JsonSchema({"type": "object", "required": ["answer"]}),
               PymGrader.load("graders/polite.pym"), JudgeGrader.load("bundles/judge")]

A regression is a run that passes under the source and fails under the candidate; a fix, the other way round
(`runtime.regress.report`). A run passes when every grader passes it. Without graders, `SameAsSource` is the
one: the source passes when it completed, the candidate when it completed with the source's output, so any
change of output is a regression (what a CI gate on "nothing changes" wants).

* `ExactMatch(key)` — the output equals the task's ground truth, `metadata[key]` of its `run.started`
  (equal as canonical JSON; `field` compares one key of an object output). A task without that key fails,
  saying so.
* `JsonSchema(schema)` — the output is valid against a JSON Schema (`runtime.validate`).
* `PymGrader(path)` — a `.pym` script, pure and sandboxed like any tool: its `Input`s are taken from
  `output`, `expected` (the ground truth, `metadata["expected"]`), `input` (the task) and `status`, whichever
  it declares; it ends with `True`/`False` or `{"pass": bool, "reason": str}`. A script that does not load is
  refused before any run starts; one that fails on a run is a grader error, reported with that run (the run
  counts as not passing).
* `JudgeGrader(bundle)` — a model as judge: a judge agent (a bundle, run in this process by
  `runtime.agent.Agent`, the one driver) is given the task, the source's output and the candidate's, and ends
  with its terminal tool's `{"better": "source" | "candidate" | "same", "why": str}`. The candidate passes
  unless the judge prefers the source; the source passes when it completed (it is what the judge compares
  with). A judge that fails, or ends with anything else, is a grader error of that run, saying what it did:
  never a crash of the regression. A judge bundle that does not load, or has no terminal tool, is refused
  before any run starts. `bundles/judge` is one.

Every grader passes nothing that did not complete: a failed or cancelled run has no output to grade.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runtime.regress.recorded import canonical
from runtime.regress.sets import RegressError


@dataclass(frozen=True)
class Ending:
    """What a grader sees of a run: how it ended, its output, its task (input and metadata)."""

    status: str
    output: Any
    input: str
    metadata: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Grade:
    passed: bool
    reason: str = ""
    error: str | None = None  # the grader itself failed (a `.pym` grader that raised)


class Grader(Protocol):
    @property
    def name(self) -> str: ...

    async def grade(self, ending: Ending, source: Ending) -> Grade: ...


def _not_completed(ending: Ending) -> Grade | None:
    return None if ending.status == "completed" else Grade(False, f"the run {ending.status}")


class SameAsSource:
    """The default: the candidate must complete with the source's output (see the module docstring)."""

    name = "same-output"

    async def grade(self, ending: Ending, source: Ending) -> Grade:
        if (bad := _not_completed(ending)) is not None:
            return bad
        if ending is source:
            return Grade(True)
        same = canonical(ending.output) == canonical(source.output)
        return Grade(same, "" if same else "the output differs from the source's")


@dataclass(frozen=True)
class ExactMatch:
    """The output (or its `field`) equals the task's `metadata[key]`."""

    key: str = "expected"
    field: str | None = None
    name: str = "exact"

    async def grade(self, ending: Ending, source: Ending) -> Grade:
        if (bad := _not_completed(ending)) is not None:
            return bad
        if self.key not in ending.metadata:
            return Grade(False, f"the task has no metadata[{self.key!r}] to compare with")
        value = ending.output
        if self.field is not None:
            value = value.get(self.field) if isinstance(value, dict) else None
        same = canonical(value) == canonical(ending.metadata[self.key])
        return Grade(same, "" if same else f"{value!r} is not the expected {ending.metadata[self.key]!r}")


@dataclass(frozen=True)
class JsonSchema:
    """The output is valid against `schema`."""

    schema: dict[str, Any]
    name: str = "schema"

    async def grade(self, ending: Ending, source: Ending) -> Grade:
        from runtime.validate import validate

        if (bad := _not_completed(ending)) is not None:
            return bad
        problems = validate(ending.output, self.schema, path="output")
        return Grade(not problems, "; ".join(problems))


class PymGrader:
    """A `.pym` grader script (see the module docstring)."""

    def __init__(self, script: Any, name: str) -> None:
        self.script, self.name = script, name

    @classmethod
    def load(cls, path: str | Path) -> PymGrader:
        from runtime.scripts import load

        try:
            script = load(path)
        except OSError as e:
            raise RegressError(f"the grader {path} cannot be read: {e}") from None
        if not script.ok:
            raise RegressError(f"the grader {path} does not load: "
                               + "; ".join(f"line {d.line}: {d.message}" if d.line else d.message
                                           for d in script.diagnostics))
        if script.externals:
            raise RegressError(f"the grader {path} declares externals ({', '.join(script.externals)}): a "
                               "grader is pure, data in and a verdict out")
        return cls(script, Path(path).stem)

    async def grade(self, ending: Ending, source: Ending) -> Grade:
        if (bad := _not_completed(ending)) is not None:
            return bad
        given = {"output": ending.output, "expected": ending.metadata.get("expected"), "input": ending.input,
                 "status": ending.status}
        result = await self.script.run({k: v for k, v in given.items() if k in self.script.inputs})
        if result.error is not None:
            error = result.error
            return Grade(False, error=f"grader {self.name} failed: {error.kind}: {error.message}"
                                      + (f" (line {error.line})" if error.line else ""))
        verdict = result.output
        if isinstance(verdict, bool):
            return Grade(verdict)
        if isinstance(verdict, dict) and isinstance(verdict.get("pass"), bool):
            return Grade(verdict["pass"], str(verdict.get("reason") or ""))
        return Grade(False, error=f"grader {self.name} returned {verdict!r}: end with True/False or "
                                  '{"pass": bool, "reason": str}')


BETTER = ("source", "candidate", "same")


class JudgeGrader:
    """A model-as-judge grader (see the module docstring)."""

    def __init__(self, bundle: Any, *, client: Any = None) -> None:
        self.bundle, self.client = bundle, client
        self.name = f"judge {bundle.name}"

    @classmethod
    def load(cls, path: str | Path, *, client: Any = None) -> JudgeGrader:
        """The judge bundle at `path` (`client`: a model client to use instead of the bundle's own)."""
        from runtime.bundle import BundleError, load_bundle

        try:
            bundle = load_bundle(path)
        except (BundleError, OSError) as e:
            raise RegressError(f"the judge bundle at {path} does not load: {e}") from None
        if bundle.spec.termination.terminal_tool is None:
            raise RegressError(f"the judge bundle at {path} has no terminal tool: give it one (termination: "
                               '{terminal_tool: verdict}) that returns {"better": "source" | "candidate" | '
                               '"same", "why": str}')
        return cls(bundle, client=client)

    def prompt(self, ending: Ending, source: Ending) -> str:
        """The judge's task: the agent's task and the two outputs, each as JSON."""
        def shown(value: Any) -> str:
            return json.dumps(value, ensure_ascii=False, default=str, indent=1)

        return (f"The task the agent was given:\n{ending.input}\n\nThe source output (before):\n"
                f"{shown(source.output)}\n\nThe candidate output (now):\n{shown(ending.output)}\n\n"
                "Which does the task better? End with "
                f"{self.bundle.spec.termination.terminal_tool}(better=source|candidate|same, why=...).")

    async def grade(self, ending: Ending, source: Ending) -> Grade:
        from runtime.agent import Agent

        if (bad := _not_completed(ending)) is not None:
            return bad
        if ending is source:
            return Grade(True)
        try:
            async with Agent(self.bundle, client=self.client) as agent:
                outcome = await agent.run(self.prompt(ending, source))
        except Exception as e:  # a judge that cannot run is this run's grader error, never the regression's
            return Grade(False, error=f"{self.name} could not run: {type(e).__name__}: {e}")
        if outcome.status != "completed":
            return Grade(False, error=f"{self.name} {outcome.status}: {outcome.reason or 'no reason given'}")
        verdict = outcome.output
        if not (isinstance(verdict, dict) and verdict.get("better") in BETTER
                and isinstance(verdict.get("why"), str)):
            return Grade(False, error=f"{self.name} returned {verdict!r}: its terminal tool must return "
                                      '{"better": "source" | "candidate" | "same", "why": str}')
        if verdict["better"] == "source":
            return Grade(False, f"the judge prefers the source's output: {verdict['why']}")
        return Grade(True, verdict["why"])


async def grade_all(graders: Sequence[Grader], ending: Ending,
                    source: Ending) -> tuple[bool, list[str], list[str]]:
    """Whether `ending` passes every grader; the reasons it did not; the graders' own errors."""
    reasons: list[str] = []
    errors: list[str] = []
    passed = True
    for grader in graders or (SameAsSource(),):
        grade = await grader.grade(ending, source)
        passed &= grade.passed
        if not grade.passed and grade.reason:
            reasons.append(f"{grader.name}: {grade.reason}")
        if grade.error:
            errors.append(grade.error)
    return passed, reasons, errors


__all__ = ["BETTER", "Ending", "ExactMatch", "Grade", "Grader", "JsonSchema", "JudgeGrader", "PymGrader",
           "SameAsSource", "grade_all"]
