"""`load_bundle`: read a bundle.yaml, check every section, and resolve it into a `Bundle`, or raise one
`BundleError` listing every problem found.

The file is read and parsed first (an unreadable file, YAML that does not parse, or a document that is
not a mapping stops there: nothing else can be checked). Then the whole document is validated against
`BundleSpec`; its problems are kept and the offending top-level keys dropped, so that every other section
is still checked. Each section's function (`runtime.bundle.sections`, `runtime.bundle.tools`) then returns
its value and its own problems, in file order, and only if there are none is the `Bundle` built, with a
digest of the file and every tool's source.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from runtime.bundle.capacity import budgets_section, endpoint_section, priority_section
from runtime.bundle.mcp import mcp_section
from runtime.bundle.problems import BundleError, Problem, pydantic_problems
from runtime.bundle.resolved import Bundle, BundleTool
from runtime.bundle.schema import BundleSpec
from runtime.bundle.sections import (
    conversation_section,
    data_provider_section,
    externals_section,
    limits_section,
    max_concurrent_tools_section,
    model_section,
    name_section,
    output_models_section,
    policies_section,
    questions_section,
    schedules_section,
    server_section,
    system_prompt_section,
    termination_section,
    timers_section,
    workspace_section,
)
from runtime.bundle.tools import tools_section
from runtime.tools import ScriptTool

__all__ = ["load_bundle"]

_T = TypeVar("_T")


def load_bundle(path: str | Path) -> Bundle:
    """Read, validate and resolve a bundle file (or a folder holding `bundle.yaml`); raise BundleError."""
    p = Path(path)
    if p.is_dir():
        p = p / "bundle.yaml"
    source = str(p)
    raw_text, raw = _read(p)
    spec, problems = _spec(raw)
    root = p.parent.resolve()

    def keep(checked: tuple[_T, list[Problem]]) -> _T:
        value, found = checked
        problems.extend(found)
        return value

    problems += name_section(spec.name)
    problems += model_section(spec.model)
    problems += server_section(spec.model, spec.constraint)
    system_prompt = keep(system_prompt_section(spec, root))
    global_limits = keep(limits_section(spec.limits))
    named = keep(output_models_section(spec.output_models, root))
    found, tool_problems = tools_section(spec.tools, root, global_limits, named)
    problems += tool_problems
    mcp_tools, mcp_problems = mcp_section(spec.mcp, root, global_limits, set(found.tools))
    problems += mcp_problems
    found.tools.update(mcp_tools)
    factory = keep(externals_section(spec.externals, root))
    deadline_s = keep(termination_section(spec.termination, found.tools,
                                          complete=not tool_problems and not mcp_problems))
    problems += max_concurrent_tools_section(spec.max_concurrent_tools)
    problems += conversation_section(spec.conversation)
    policies = keep(policies_section(spec.policies))
    data = keep(data_provider_section(spec.data_provider, spec.workspace, root))
    problems += workspace_section(spec.workspace)
    endpoint = keep(endpoint_section(spec.endpoint))
    budgets = keep(budgets_section(spec.budgets))
    problems += priority_section(spec.priority)
    problems += timers_section(spec.timers, found.tools)
    questions = keep(questions_section(spec.questions, found.tools))
    schedules = keep(schedules_section(spec.schedules, spec.name))
    if problems:
        raise BundleError(source, problems)

    return Bundle(name=spec.name, path=p.resolve(), spec=spec, system_prompt=system_prompt,
                  limits=global_limits, tools=found.tools, data_provider=data, deadline_s=deadline_s,
                  policies=policies, digest=_digest(raw_text, found.tools), approvals=found.approvals,
                  grants=found.grants, factory=factory, endpoint=endpoint, budgets=budgets,
                  schedules=schedules, questions=questions)


def _read(p: Path) -> tuple[str, dict[Any, Any]]:
    """The file's text and its YAML document, which must be a mapping; else BundleError."""
    source = str(p)
    try:
        raw_text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise BundleError(source, [("", f"cannot read the bundle: {e.strerror or e}")]) from None
    try:
        raw = yaml.safe_load(raw_text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else ""
        raise BundleError(source, [(where, f"not valid YAML: {getattr(e, 'problem', e)}")]) from None
    if not isinstance(raw, dict):
        raise BundleError(source, [("", "a bundle is a YAML mapping with at least `name:`")])
    return raw_text, raw


def _spec(raw: dict[Any, Any]) -> tuple[BundleSpec, list[Problem]]:
    """The document as a `BundleSpec`. When it does not validate: its problems, and the spec of the rest
    (the top-level keys with problems dropped, back to their defaults; a bad or missing `name:` as "_"),
    so the sections can still be checked."""
    try:
        return BundleSpec.model_validate(raw), []
    except ValidationError as e:
        problems = pydantic_problems(e, BundleSpec, "")
        bad = {err["loc"][0] for err in e.errors() if err["loc"]}
    rest = {k: v for k, v in raw.items() if k not in bad}
    rest.setdefault("name", "_")
    rest["name"] = rest["name"] if isinstance(rest["name"], str) else "_"
    return BundleSpec.model_validate(rest), problems


def _digest(raw_text: str, tools: dict[str, BundleTool]) -> str:
    """A content hash of the bundle file and every tool's source (by tool name): which version of the
    bundle a run started on, recorded in `run.started`."""
    h = hashlib.sha256(raw_text.encode())
    for name in sorted(tools):
        h.update(name.encode())
        t = tools[name]
        h.update(Path(str(t.path)).read_bytes() if isinstance(t, ScriptTool) else t.content_hash.encode())
    return h.hexdigest()[:16]
