"""Finding tools: every `.pym` under some paths becomes a `ScriptTool`, or a `LoadFailure` saying why not.

Paths may be files, folders (searched recursively) or globs. Nothing is skipped silently: a path that
matches nothing, an unreadable file, a script with diagnostics or a name already taken each come back as
a `LoadFailure` beside the tools, so `sa tools check`, bundles and workers report every problem at once.
"""

from __future__ import annotations

import glob
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from runtime.scripts import Limits, load
from runtime.tools.schemas import LoadFailure, ScriptLoadError
from runtime.tools.script import ScriptTool
from runtime.types import ToolError

__all__ = ["discover_tools", "expand_paths"]


def expand_paths(paths: Iterable[str | Path] | str | Path) -> tuple[list[Path], list[LoadFailure]]:
    """The `.pym` files under `paths` (each once, in order), and a `LoadFailure` per path that has none."""
    if isinstance(paths, (str, Path)):
        paths = [paths]
    files: list[Path] = []
    failures: list[LoadFailure] = []
    for item in paths:
        text = str(item)
        if any(ch in text for ch in "*?["):
            matches = sorted(Path(p) for p in glob.glob(text, recursive=True) if p.endswith(".pym"))
            if not matches:
                failures.append(LoadFailure(text, ToolError("check", f"no .pym files match {text!r}")))
            files += matches
            continue
        p = Path(text)
        if p.is_dir():
            found = sorted(p.rglob("*.pym"))
            if not found:
                failures.append(LoadFailure(text, ToolError("check", f"no .pym files in directory {text!r}")))
            files += found
        elif p.is_file():
            files.append(p)
        else:
            failures.append(LoadFailure(text, ToolError("check", f"no such file or directory: {text!r}")))
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique, failures


def discover_tools(
    paths: Iterable[str | Path] | str | Path,
    limits: Limits | str | dict[str, Any] | None = None,
    *,
    output_models: Mapping[str, Any] | None = None,
    externals: Mapping[str, Callable[..., Any]] | None = None,
) -> tuple[list[ScriptTool], list[LoadFailure]]:
    """Load every `.pym` under `paths` (files, directories searched recursively, or globs).

    Returns the tools (sorted by path) and, separately, a `LoadFailure` for every script that could not
    become a tool (parse/check errors, tool-rule violations, duplicate names, unreadable files, paths that
    match nothing). `output_models` maps tool names to output models; `externals` offers host functions
    by name (each tool receives the ones it declares).
    """
    files, failures = expand_paths(paths)
    resolved = Limits.resolve(limits)
    tools: list[ScriptTool] = []
    by_name: dict[str, str] = {}
    for f in files:
        try:
            script = load(f)
        except (OSError, UnicodeDecodeError) as e:
            failures.append(LoadFailure(str(f), ToolError("check", f"cannot read the script: {e}")))
            continue
        declared = {n: externals[n] for n in script.externals if externals and n in externals}
        try:
            tool = ScriptTool(
                script,
                limits=resolved,
                output_model=(output_models or {}).get(script.name),
                externals=declared,
            )
        except ScriptLoadError as e:
            failures.append(e.failure)
            continue
        if tool.name in by_name:
            failures.append(
                LoadFailure(
                    str(f),
                    ToolError(
                        "check",
                        f"tool name {tool.name!r} is already used by "
                        f"{by_name[tool.name]}; tool names must be unique",
                    ),
                )
            )
            continue
        by_name[tool.name] = str(f)
        tools.append(tool)
    return tools, failures
