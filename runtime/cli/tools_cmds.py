"""`sa tools`, `sa check`, `sa run`: discover, check and run sandboxed `.pym` scripts; `sa check` also checks
bundles (a folder holding bundle.yaml, or the .yaml file) as a host does before serving them, offline.

Exit codes: 0 success; 1 load problems (`tools`, `check`) or a bad command line (`run`: missing script,
malformed --input/--file/--env/--limits); 2 the script ran and returned a tool error (`run`). Warnings (a
script without a docstring) are printed but do not change the exit code.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from runtime.cli.app import app

_JSON = Annotated[bool, typer.Option("--json", help="Machine-readable JSON on stdout.")]


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(f"sa: {message}", err=True)
    return typer.Exit(code)


def _dump(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False, default=str))


@app.command("tools")
def tools_cmd(
    paths: Annotated[list[str], typer.Argument(help="Scripts, directories (searched recursively) or globs.")],
    as_json: _JSON = False,
) -> None:
    """List the tools found in PATHs: name, inputs, description. Load errors are listed; exit 1 if any. A
    bundle (a folder holding bundle.yaml, or the .yaml file) lists every tool it gives its agent, each with
    its kind (an MCP tool: its server, the server's name for it and its effect class)."""
    from runtime.tools import discover_tools

    bundles = [p for p in paths if _is_bundle(p)]
    if bundles:
        raise typer.Exit(_list_bundles(bundles, as_json))
    tools, failures = discover_tools(paths)
    if as_json:
        _dump(
            {
                "tools": [{**t.schema.to_openai(), "description_source": t.description_source}
                          for t in tools],
                "errors": [f.to_dict() for f in failures],
            }
        )
    else:
        from rich.console import Console
        from rich.table import Table

        console = Console()
        if tools:
            table = Table(show_lines=False)
            table.add_column("tool", style="bold")
            table.add_column("inputs")
            table.add_column("externals")
            table.add_column("description")
            for t in tools:
                inputs = []
                for spec in t.script.inputs.values():
                    mark = "" if spec.required else "?"
                    inputs.append(f"{spec.name}{mark}: {spec.annotation}")
                source = "" if t.description_source == "docstring" else f" ({t.description_source})"
                table.add_row(
                    t.name,
                    "\n".join(inputs) or "-",
                    "\n".join(t.script.externals) or "-",
                    t.schema.description + source,
                )
            console.print(table)
        else:
            console.print("no tools found")
        for f in failures:
            typer.echo(str(f), err=True)
        if failures:
            typer.echo(f"{len(failures)} script(s) failed to load", err=True)
    raise typer.Exit(1 if failures else 0)


def _bundle_tools(path: str) -> list[dict[str, Any]]:
    """Every tool a bundle gives its agent: name, kind, description, parameters, and for an MCP tool its
    server, the server's own name for it, its effect (`repeatable` or `once`) and, for a `once` tool, what a
    call in doubt does (`in_doubt`: fail, ask, recall). Raises BundleError."""
    from runtime.bundle import load_bundle
    from runtime.tools.agent_tool import AgentTool
    from runtime.tools.hosted import HostedPythonTool
    from runtime.tools.mcp import McpTool

    rows: list[dict[str, Any]] = []
    for t in load_bundle(path).tools.values():
        row: dict[str, Any] = {"name": t.name, "description": t.schema.description,
                               "parameters": t.schema.parameters}
        if isinstance(t, McpTool):
            row.update(kind="mcp", server=t.server.name, remote=t.remote, effect=t.effect,
                       in_doubt=None if t.repeatable else t.in_doubt)
        else:
            row["kind"] = ("agent" if isinstance(t, AgentTool)
                           else "python" if isinstance(t, HostedPythonTool) else "script")
        rows.append(row)
    return rows


def _list_bundles(paths: list[str], as_json: bool) -> int:
    """`sa tools BUNDLE...`: each bundle's tools as a table (or JSON); 1 if a bundle does not load."""
    from runtime.bundle import BundleError

    listed: list[dict[str, Any]] = []
    failed = 0
    for path in paths:
        try:
            listed.append({"bundle": path, "tools": _bundle_tools(path)})
        except BundleError as e:
            failed += 1
            listed.append({"bundle": path, "tools": [], "problems": [{"path": w, "message": m}
                                                                       for w, m in e.problems]})
    if as_json:
        _dump({"bundles": listed})
        return 1 if failed else 0
    from rich.console import Console
    from rich.table import Table

    console = Console()
    for b in listed:
        table = Table(title=b["bundle"])
        for column in ("tool", "kind", "inputs", "effect", "description"):
            table.add_column(column, style="bold" if column == "tool" else None)
        for t in b["tools"]:
            kind = f"mcp: {t['server']}/{t['remote']}" if t["kind"] == "mcp" else t["kind"]
            inputs = ", ".join(t["parameters"].get("properties", {})) or "-"
            effect = t.get("effect", "-") + (f" (in doubt: {t['in_doubt']})" if t.get("in_doubt") else "")
            table.add_row(t["name"], kind, inputs, effect, t["description"])
        if b["tools"]:
            console.print(table)
        for p in b.get("problems", []):
            typer.echo(f"{b['bundle']}: {p['path']}: {p['message']}", err=True)
    return 1 if failed else 0


def _is_bundle(path: str) -> bool:
    """A bundle folder (it holds bundle.yaml) or a YAML file: checked as a bundle, never as a script."""
    p = Path(path)
    return (p.is_dir() and (p / "bundle.yaml").is_file()) or p.suffix in (".yaml", ".yml")


def _check_bundles(paths: list[str]) -> list[dict[str, Any]]:
    """Each bundle as a host would build it (`runtime.bundle.check_bundle`): its problems and warnings."""
    from runtime.bundle import BundleError, check_bundle

    out: list[dict[str, Any]] = []
    for path in paths:
        try:
            _, warnings = check_bundle(path)
        except BundleError as e:
            out.append({"bundle": e.source, "problems": [{"path": where, "message": message}
                                                         for where, message in e.problems], "warnings": []})
            continue
        source = str(Path(path) / "bundle.yaml" if Path(path).is_dir() else Path(path))
        out.append({"bundle": source, "problems": [], "warnings": warnings})
    return out


@app.command("check")
def check_cmd(
    paths: Annotated[list[str], typer.Argument(
        help="Scripts, directories (searched recursively) or globs; a bundle folder or bundle.yaml is "
             "checked as a host would load it (every section, tool and schema, the kernel config, the "
             "decoding constraint).")],
    as_json: _JSON = False,
    monty: Annotated[bool, typer.Option(help="Also feed each script to Monty's parser (not run).")] = True,
    types: Annotated[
        bool, typer.Option("--types", help="Also run Monty's type checker (ty) on each script.")
    ] = False,
) -> None:
    """Check scripts and bundles without running them: file:line diagnostics for scripts, file: yaml path:
    problem for bundles; exit 0 when all are clean, else 1."""
    import asyncio

    from runtime.scripts import diagnose, load, shutdown
    from runtime.tools import expand_paths, script_tool_diagnostics, script_tool_warnings

    bundles = _check_bundles([p for p in paths if _is_bundle(p)])
    paths = [p for p in paths if not _is_bundle(p)]
    files, missing = expand_paths(paths) if paths else ([], [])
    warned: list[dict[str, Any]] = []

    async def check_all() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = []
        try:
            for f in files:
                try:
                    script = load(f)
                except (OSError, UnicodeDecodeError) as e:
                    found.append(
                        {
                            "kind": "check",
                            "message": f"cannot read the script: {e}",
                            "line": None,
                            "file": str(f),
                            "column": None,
                        }
                    )
                    continue
                diags = script_tool_diagnostics(script)
                if (monty or types) and script.ok:
                    diags += await diagnose(script, use_monty=monty, types=types)
                found += [d.to_dict() for d in sorted(diags, key=lambda d: (d.line or 0, d.column or 0))]
                warned.extend(w.to_dict() for w in script_tool_warnings(script))
        finally:
            await shutdown()
        return found

    problems: list[dict[str, Any]] = [
        {"kind": m.error.kind, "message": m.error.message, "line": None, "file": m.path, "column": None}
        for m in missing
    ]
    if files:
        problems += asyncio.run(check_all())
    bad_bundles = [b for b in bundles if b["problems"]]
    if as_json:
        _dump({"checked": [str(f) for f in files], "diagnostics": problems, "warnings": warned,
               "bundles": bundles})
    else:
        for b in bundles:
            for w in b["warnings"]:
                typer.echo(f"warning: {w}")
            for p in b["problems"]:
                typer.echo(f"{b['bundle']}: {p['path']}: {p['message']}" if p["path"] else
                           f"{b['bundle']}: {p['message']}")
        for w in warned:
            typer.echo(f"{w['file']}" + (f":{w['line']}" if w["line"] else "") + f": warning: {w['message']}")
        for d in problems:
            where = (
                d["file"]
                + (f":{d['line']}" if d["line"] else "")
                + (f":{d['column']}" if d["column"] else "")
            )
            typer.echo(f"{where}: {d['kind']} error: {d['message']}")
        bad = len({d["file"] for d in problems}) + len(bad_bundles)
        checked = f"{len(files)} script(s)" + (f" and {len(bundles)} bundle(s)" if bundles else "")
        warnings = len(warned) + sum(len(b["warnings"]) for b in bundles)
        typer.echo(
            f"{checked} checked, {bad} with problems"
            if problems or bad_bundles
            else f"{checked} checked, all clean"
            + (f" ({warnings} warning(s))" if warnings else ""),
            err=True,
        )
    raise typer.Exit(1 if problems or bad_bundles else 0)


def _pairs(values: list[str], option: str) -> list[tuple[str, str]]:
    out = []
    for v in values:
        key, sep, rest = v.partition("=")
        if not sep or not key:
            raise _fail(f"{option} expects NAME=VALUE, got {v!r}")
        out.append((key, rest))
    return out


def _read_files(pairs: list[tuple[str, str]]) -> dict[str, str | bytes]:
    files: dict[str, str | bytes] = {}

    def content(p: Path) -> str | bytes:
        data = p.read_bytes()
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            return data

    for vpath, hpath in pairs:
        host = Path(hpath).expanduser()
        vroot = vpath if vpath.startswith("/") else "/" + vpath
        if host.is_dir():
            for f in sorted(host.rglob("*")):
                if f.is_file():
                    files[f"{vroot.rstrip('/')}/{f.relative_to(host).as_posix()}"] = content(f)
        elif host.is_file():
            files[vroot] = content(host)
        else:
            raise _fail(f"--file {vpath}={hpath}: no such file or directory on the host")
    return files


def _input_values(script: Any, pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """`--input NAME=VALUE`s as the script's inputs: JSON, else plain text for a string; a string input
    keeps the text as given (`--input name=123` means the text "123")."""
    values: dict[str, Any] = {}
    for name, raw in pairs:
        spec = script.inputs.get(name)
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw  # plain text for a string input
        if (
            spec is not None
            and spec.schema.get("type") in ("string", ["string", "null"])
            and not isinstance(value, str)
        ):
            value = raw
        values[name] = value
    return values


def _stubs(pairs: list[tuple[str, str]]) -> dict[str, Any]:
    """`--external NAME=JSON`s as stub functions returning that value (plain text if it is not JSON)."""
    stubs: dict[str, Any] = {}
    for name, raw in pairs:
        try:
            returned = json.loads(raw)
        except json.JSONDecodeError:
            returned = raw

        def stub(*_args: Any, _value: Any = returned, **_kwargs: Any) -> Any:
            return _value

        stubs[name] = stub
    return stubs


@app.command("run")
def run_cmd(
    script_path: Annotated[str, typer.Argument(metavar="SCRIPT", help="The .pym script to run.")],
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--input",
            "-i",
            metavar="NAME=JSON",
            help="An input; the value is JSON, or plain text for a string.",
        ),
    ] = None,
    files: Annotated[
        list[str] | None,
        typer.Option(
            "--file",
            "-f",
            metavar="VPATH=HOSTPATH",
            help="A host file (or directory) the script sees, read-only, at VPATH.",
        ),
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", metavar="K=V", help="An environment variable.")
    ] = None,
    externals: Annotated[
        list[str] | None,
        typer.Option(
            "--external", "-x", metavar="NAME=JSON", help="Stub an @external: it returns this JSON value."
        ),
    ] = None,
    limits: Annotated[
        str, typer.Option(help="strict, default, permissive, or a JSON object of limits.")
    ] = "default",
    as_json: _JSON = False,
) -> None:
    """Run a script in the sandbox and print its result. A tool error exits 2 (with --json, as
    {"error": {"kind", "message", "line", "detail"}})."""
    import asyncio

    from runtime.scripts import Limits, LimitsError, load, shutdown

    try:
        script = load(script_path)
    except OSError as e:
        raise _fail(f"cannot read {script_path}: {e.strerror or e}") from None
    try:
        resolved = Limits.resolve(limits)
    except LimitsError as e:
        raise _fail(f"--limits: {e}") from None

    values = _input_values(script, _pairs(inputs or [], "--input"))
    stubs = _stubs(_pairs(externals or [], "--external"))
    environ = dict(_pairs(env or [], "--env"))
    virtual = _read_files(_pairs(files or [], "--file"))

    def on_event(event: Any) -> None:
        if event.kind == "printed" and event.text:
            sys.stderr.write(event.text)
            sys.stderr.flush()

    async def main() -> Any:
        try:
            return await script.run(
                values,
                externals=stubs or None,
                files=virtual,
                environ=environ,
                limits=resolved,
                on_event=on_event,
            )
        finally:
            await shutdown()

    result = asyncio.run(main())
    if result.error is not None:
        if as_json:
            _dump({"error": result.error.to_dict()})
        else:
            err = result.error
            kind = err.kind + (f"/{err.detail}" if err.detail else "")
            where = f"{script.filename}:{err.line}" if err.line else script.filename
            typer.echo(f"{where}: {kind} error: {err.message}", err=True)
        raise typer.Exit(2)
    if as_json:
        _dump({"output": result.output, "duration_ms": result.duration_ms})
    elif isinstance(result.output, str):
        typer.echo(result.output)
    else:
        _dump(result.output)
