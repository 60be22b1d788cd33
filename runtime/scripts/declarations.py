"""Reading one grail declaration: an `Input(...)` assignment or an `@external` function, and docstring args.

grail's declarations are Python that never runs in the sandbox: `path: str = Input("path", default=...)`
names an input whose annotation is its type, and an `@external` function is a typed signature with a
stub body that the host implements. These functions read one such statement from the syntax tree into
an `InputSpec` or `ExternalSpec` and report everything that would make it mean something other than it
seems (a default that is not a literal or does not match its type, a missing annotation, a real body
that would never run), so the loader (`runtime.scripts.loader`) only has to find the statements.
"""

from __future__ import annotations

import ast
import re
from typing import Any, Literal, Protocol, TypeGuard

from runtime.scripts.schema import AnnotationError, is_optional, schema_from_annotation
from runtime.scripts.specs import MISSING, ExternalSpec, InputSpec, ParamSpec
from runtime.validate import validate

__all__ = ["docstring_params", "is_grail_name", "is_input_call", "read_external", "read_input"]


ParamKind = Literal["positional_only", "positional", "var_positional", "keyword_only", "var_keyword"]


class Report(Protocol):
    """Where a declaration's problems go: a `check` diagnostic at `line` (and `column`) of the script."""

    def __call__(self, message: str, line: int | None, column: int | None = None) -> None: ...


_SECTION = re.compile(r"^(Args|Arguments|Inputs|Parameters|Params)\s*:\s*$", re.IGNORECASE)
_ARG_LINE = re.compile(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


def docstring_params(docstring: str | None) -> dict[str, str]:
    """Descriptions from a Google-style `Args:` (or `Inputs:`) section: `name (type): text`."""
    out: dict[str, str] = {}
    if not docstring:
        return out
    lines = docstring.splitlines()
    in_section = False
    base_indent = None
    current: str | None = None
    for line in lines:
        if _SECTION.match(line.strip()) and not line.startswith((" ", "\t")):
            in_section, base_indent, current = True, None, None
            continue
        if not in_section:
            continue
        if not line.strip():
            current = None
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_section = False
            continue
        if base_indent is None:
            base_indent = indent
        if indent == base_indent and (m := _ARG_LINE.match(line.strip())):
            current = m.group(1)
            out[current] = m.group(2).strip()
        elif current is not None and indent > base_indent:
            out[current] = (out[current] + " " + line.strip()).strip()
    return out


def is_grail_name(node: ast.expr, name: str) -> bool:
    """`name` or `grail.name`: how a script refers to `Input` and `external`."""
    return (isinstance(node, ast.Name) and node.id == name) or (
        isinstance(node, ast.Attribute)
        and node.attr == name
        and isinstance(node.value, ast.Name)
        and node.value.id == "grail"
    )


def is_input_call(node: ast.AST | None) -> TypeGuard[ast.Call]:
    """An `Input(...)` call."""
    return isinstance(node, ast.Call) and is_grail_name(node.func, "Input")


def param_spec(arg: ast.arg, kind: ParamKind, default: ast.expr | None = None) -> ParamSpec:
    """One `@external` parameter as declared: its annotation and default as source text."""
    return ParamSpec(
        arg.arg,
        ast.unparse(arg.annotation) if arg.annotation else None,
        kind,
        ast.unparse(default) if default is not None else None,
        default is not None,
    )


def read_input(
    stmt: ast.AnnAssign | ast.Assign, arg_docs: dict[str, str], report: Report
) -> InputSpec | None:
    """One `name: T = Input("name", default=..., description=...)` declaration as an `InputSpec` (None when it
    is too broken to describe); every problem goes to `report`."""
    call = stmt.value
    assert isinstance(call, ast.Call)
    line = stmt.lineno
    if isinstance(stmt, ast.Assign):
        target = stmt.targets[0] if len(stmt.targets) == 1 else None
        var = target.id if isinstance(target, ast.Name) else "<name>"
        report(
            f'input {var!r} has no type annotation; write `{var}: str = Input("{var}")` '
            "(the annotation becomes the tool's parameter type)",
            line,
        )
        return None
    if not isinstance(stmt.target, ast.Name):
        report("an Input(...) must be assigned to a plain name", line)
        return None
    var = stmt.target.id
    _check_input_name(call, var, line, report)
    default, description = _input_keywords(call, var, line, report)

    annotation = ast.unparse(stmt.annotation)
    try:
        schema = schema_from_annotation(stmt.annotation)
    except AnnotationError as e:
        report(f"input {var!r}: {e}", line, stmt.annotation.col_offset + 1)
        schema = {}
    optional = is_optional(schema)
    if default is not MISSING:
        problems = validate(default, schema)
        if problems:
            report(
                f"the default of input {var!r} does not match its annotation {annotation}: {problems[0]}",
                line,
            )
    elif optional:
        default = None
    return InputSpec(
        name=var,
        annotation=annotation,
        required=default is MISSING,
        default=default,
        description=description or arg_docs.get(var),
        line=line,
        schema=schema,
    )


def _check_input_name(call: ast.Call, var: str, line: int, report: Report) -> None:
    """`Input("name")`: one positional argument, the name as a string literal, the same as the variable."""
    key: str | None = var
    if call.args:
        first = call.args[0]
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            key = first.value
        else:
            report(
                f"Input's first argument must be the input's name as a string literal: Input(\"{var}\")",
                line,
            )
            key = None
        if len(call.args) > 1:
            report(
                f'pass the default by keyword: Input("{var}", default={ast.unparse(call.args[1])})',
                line,
            )
    if key is not None and key != var:
        report(
            f"Input name {key!r} differs from its variable {var!r}; they must match: "
            f'`{var}: ... = Input("{var}")`',
            line,
        )


def _input_keywords(call: ast.Call, var: str, line: int, report: Report) -> tuple[Any, str | None]:
    """`Input(..., default=<literal>, description="...")`: (the default or MISSING, the description)."""
    default: Any = MISSING
    description: str | None = None
    for kw in call.keywords:
        if kw.arg == "default":
            try:
                default = ast.literal_eval(kw.value)
            except (ValueError, SyntaxError, TypeError):
                report(
                    f"the default of input {var!r} must be a literal (a number, string, "
                    f"list, dict, True/False/None), not `{ast.unparse(kw.value)}`",
                    line,
                )
        elif kw.arg == "description":
            if isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                description = " ".join(kw.value.value.split())
            else:
                report(f"the description of input {var!r} must be a string literal", line)
        else:
            report(
                f"Input() has no argument {kw.arg!r}; it accepts a name, default= and description=",
                line,
            )
    return default, description


def read_external(fn: ast.FunctionDef | ast.AsyncFunctionDef, report: Report) -> ExternalSpec:
    """One `@external` function as an `ExternalSpec`; missing annotations and a real body go to `report`."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [
        param_spec(arg, "positional_only" if i < len(a.posonlyargs) else "positional", defaults[i])
        for i, arg in enumerate(positional)
    ]
    if a.vararg:
        params.append(param_spec(a.vararg, "var_positional"))
    params += [param_spec(arg, "keyword_only", d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True)]
    if a.kwarg:
        params.append(param_spec(a.kwarg, "var_keyword"))

    start = min([fn.lineno] + [d.lineno for d in fn.decorator_list])
    for p in params:
        if p.annotation is None:
            report(
                f"parameter {p.name!r} of @external {fn.name!r} has no type annotation; "
                "annotate every parameter (e.g. `path: str`)",
                fn.lineno,
            )
    if fn.returns is None:
        report(
            f"@external {fn.name!r} has no return annotation; add one (e.g. `-> str`, or `-> None`)",
            fn.lineno,
        )

    body = list(fn.body)
    if (
        body
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    if not all(is_stub_statement(s) for s in body):
        real = next(s for s in body if not is_stub_statement(s))
        report(
            f"@external {fn.name!r} has a real body (line {real.lineno}); an external's body "
            "never runs — the host supplies the implementation. Replace the body with "
            "`...` (a docstring may stay)",
            real.lineno,
        )
    return ExternalSpec(
        name=fn.name,
        parameters=tuple(params),
        returns=ast.unparse(fn.returns) if fn.returns else None,
        is_async=isinstance(fn, ast.AsyncFunctionDef),
        docstring=ast.get_docstring(fn),
        line=start,
        end_line=fn.end_lineno or fn.lineno,
    )


def is_stub_statement(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Pass):
        return True
    if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and stmt.value.value is Ellipsis:
        return True
    if isinstance(stmt, ast.Raise) and stmt.exc is not None:
        exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False
