"""`sa constraint`: print the exact decoding-constraint fields the runtime would send a model for a set of
tools (from .pym scripts or JSON tool schemas), optionally compiled by xgrammar first."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from runtime.cli.app import app


def _load_tools(paths: list[Path]) -> list[Any]:
    """Tool schemas from .json files (OpenAI `tools` entries or {name, description, parameters})
    and from .pym files or folders (through `runtime.tools.discover_tools`).

    A script that fails to load is an error, not a skip: a constraint printed for a partial tool set
    would mislead exactly when someone is debugging a misbehaving model."""
    from runtime.types import ToolSchema

    tools: list[ToolSchema] = []
    scripts = [p for p in paths if p.suffix != ".json"]
    for path in paths:
        if path.suffix == ".json":
            data = json.loads(path.read_text())
            for item in data if isinstance(data, list) else [data]:
                spec = item.get("function", item)
                tools.append(
                    ToolSchema(spec["name"], spec.get("description", ""), spec.get("parameters") or {})
                )
    if scripts:
        from runtime.tools import discover_tools

        found, failures = discover_tools(scripts)
        if failures:
            lines = "; ".join(f"{f.path}: {f.error.message}" for f in failures)
            raise typer.BadParameter(f"{len(failures)} script(s) failed to load: {lines}")
        tools.extend(tool.schema for tool in found)
    return tools


@app.command("constraint")
def constraint_cmd(
    paths: Annotated[
        list[Path], typer.Argument(help=".pym files, folders of them, or .json tool schema files")
    ],
    adapter: Annotated[
        str, typer.Option("--adapter", "-a", help="model family: qwen3, hermes, function_gemma, openai")
    ] = "qwen3",
    strategy: Annotated[
        str, typer.Option("--strategy", "-s", help="ebnf | structural_tag | json_schema")
    ] = "ebnf",
    parallel: Annotated[bool, typer.Option("--parallel", help="allow several calls in one reply")] = False,
    send_tools: Annotated[
        bool, typer.Option("--send-tools", help="also send tools= to the API (tool_choice auto)")
    ] = False,
    compile_check: Annotated[
        bool, typer.Option("--compile/--no-compile", help="compile with xgrammar first")
    ] = True,
) -> None:
    """Print the exact request fields the runtime would send for these tools (JSON, as on the wire).

    `extra_body` is merged into the request body by the openai client, so its keys are shown at the
    top level, exactly as the server receives them.
    """
    from runtime.model import (
        ConstraintError,
        DecodingConstraint,
        UnknownAdapterError,
        build_constraint,
        compile_constraint,
        get_adapter,
    )

    try:
        family = get_adapter(adapter)
        # any string from the command line: DecodingConstraint rejects an unknown one (ConstraintError)
        constraint = DecodingConstraint(strategy, parallel, send_tools)  # type: ignore[arg-type]
        tools = _load_tools(paths)
        built = build_constraint(family, tools, constraint)
        if compile_check:
            import time

            from runtime.model.constraints import load_xgrammar

            load_xgrammar("--compile")  # imported first: its ~2.5 s import is not compile time

            started = time.perf_counter()
            compile_constraint(built)
            elapsed = (time.perf_counter() - started) * 1000
            typer.echo(
                f"# {built.adapter}/{strategy}: {len(tools)} tools, {built.kind}, digest {built.digest}, "
                f"compiled by xgrammar in {elapsed:.1f} ms",
                err=True,
            )
    except (ConstraintError, UnknownAdapterError, typer.BadParameter, OSError, ValueError, KeyError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    wire = {k: v for k, v in built.extras.items() if k != "extra_body"}
    wire = {**built.extras.get("extra_body", {}), **wire}
    json.dump(wire, sys.stdout, indent=2, ensure_ascii=False)
    sys.stdout.write("\n")
