"""Type annotations -> JSON Schema, for `.pym` `Input()` declarations (annotation source text) and for
Python callables (real typing objects). Both follow one table:

    str / int / float / bool     -> "string" / "integer" / "number" / "boolean"
    list[X], tuple[X, ...], set[X] -> {"type": "array", "items": X}   (set adds "uniqueItems")
    tuple[A, B]                  -> an array of exactly those items ("prefixItems")
    dict[str, X]                 -> {"type": "object", "additionalProperties": X}
    X | None, Optional[X]        -> X made nullable (and the input is not required)
    X | Y, Union[X, Y]           -> {"anyOf": [X, Y]}
    Literal["a", "b"]            -> {"enum": ["a", "b"]}
    Any, object                  -> {} (any JSON value)
    None                         -> {"type": "null"}

An annotation outside the table raises `AnnotationError` naming it: the loader turns that into a check
error at the declaration's line, never a silent "string".
"""

from __future__ import annotations

import ast
import collections.abc as cabc
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["AnnotationError", "is_optional", "nullable", "schema_from_annotation", "schema_from_type"]


class AnnotationError(ValueError):
    """An annotation that has no JSON Schema mapping (the message says which part and what is supported)."""


SUPPORTED = (
    "str, int, float, bool, None, Any, list[X], tuple[X, ...], set[X], dict[str, X], X | None, "
    "Optional[X], X | Y, Union[...], Literal[...]"
)

_SCALARS = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "Any": {},
    "object": {},
    "None": {"type": "null"},
    "NoneType": {"type": "null"},
}
_ARRAYS = {"list", "List", "Sequence", "tuple", "Tuple", "set", "Set", "frozenset", "FrozenSet"}
_OBJECTS = {"dict", "Dict", "Mapping"}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` that also accepts null."""
    if not schema or schema.get("type") == "null":
        return dict(schema)
    if "enum" in schema:
        out = dict(schema)
        if None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return out
    kind = schema.get("type")
    if isinstance(kind, str):
        return {**schema, "type": [kind, "null"]}
    if isinstance(kind, list):
        return schema if "null" in kind else {**schema, "type": [*kind, "null"]}
    if "anyOf" in schema:
        if {"type": "null"} in schema["anyOf"]:
            return schema
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    return {"anyOf": [schema, {"type": "null"}]}


def is_optional(schema: dict[str, Any]) -> bool:
    """True when the schema accepts null (so an input with it is not required)."""
    if not schema:
        return True
    kind = schema.get("type")
    if kind == "null" or (isinstance(kind, list) and "null" in kind):
        return True
    if "enum" in schema and None in schema["enum"]:
        return True
    return any(is_optional(s) for s in schema.get("anyOf", ()))


def _union(members: list[dict[str, Any]]) -> dict[str, Any]:
    has_null = any(m == {"type": "null"} for m in members)
    rest: list[dict[str, Any]] = []
    for m in members:
        if m != {"type": "null"} and m not in rest:
            rest.append(m)
    if any(m == {} for m in rest):
        return {}
    if not rest:
        return {"type": "null"}
    if len(rest) == 1:
        base = rest[0]
    elif all(set(m) == {"type"} and isinstance(m["type"], str) for m in rest):
        base = {"type": [m["type"] for m in rest]}
    elif all(set(m) == {"enum"} for m in rest):
        base = {"enum": [v for m in rest for v in m["enum"]]}
    else:
        base = {"anyOf": rest}
    return nullable(base) if has_null else base


def _array(kind: str, items: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "array"}
    if items is not None and items != {}:
        out["items"] = items
    if kind in {"set", "Set", "frozenset", "FrozenSet"}:
        out["uniqueItems"] = True
    return out


def _fixed_tuple(items: list[dict[str, Any]]) -> dict[str, Any]:
    """`tuple[A, B]`: an array of exactly these items, in this order."""
    return {"type": "array", "prefixItems": items, "minItems": len(items), "maxItems": len(items)}


def _object(key: dict[str, Any] | None, value: dict[str, Any] | None, shown: str) -> dict[str, Any]:
    if key is not None and key not in ({"type": "string"}, {}):
        raise AnnotationError(f"{shown}: JSON object keys are strings, so use dict[str, ...]")
    out: dict[str, Any] = {"type": "object"}
    if value is not None and value != {}:
        out["additionalProperties"] = value
    return out


# ---- annotation source text (the .pym path) ---------------------------------------------------------


def schema_from_annotation(annotation: str | ast.expr) -> dict[str, Any]:
    """JSON Schema for an annotation given as source text or an `ast` expression."""
    if isinstance(annotation, str):
        try:
            node = ast.parse(annotation.strip(), mode="eval").body
        except SyntaxError:
            raise AnnotationError(f"annotation {annotation!r} does not parse") from None
    else:
        node = annotation
    return _from_ast(node)


def _name_of(node: ast.expr) -> str | None:
    """`list`, `typing.List`, `t.Optional` -> the last name."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return node.attr
    return None


def _literal_value(node: ast.expr) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, bool, type(None))):
        return node.value
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, ast.USub)
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, (int, float))
        and not isinstance(node.operand.value, bool)
    ):
        return -node.operand.value
    raise AnnotationError(
        f"Literal[...] values must be str, int, float, bool or None, not {ast.unparse(node)}"
    )


def _from_ast(node: ast.expr) -> dict[str, Any]:
    shown = ast.unparse(node)
    if isinstance(node, ast.Constant):
        if node.value is None:
            return {"type": "null"}
        if isinstance(node.value, str):  # a quoted forward reference: "int"
            return schema_from_annotation(node.value)
        raise AnnotationError(f"{shown!r} is not a type")
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([_from_ast(node.left), _from_ast(node.right)])
    name = _name_of(node)
    if name is not None:
        if name in _SCALARS:
            return dict(_SCALARS[name])
        if name in _ARRAYS:
            return _array(name, None)
        if name in _OBJECTS:
            return {"type": "object"}
        raise AnnotationError(f"type {shown!r} has no JSON Schema mapping; supported: {SUPPORTED}")
    if isinstance(node, ast.Subscript):
        base = _name_of(node.value) or ""
        generic = _AST_GENERICS.get(base)
        if generic is None:
            raise AnnotationError(f"type {shown!r} has no JSON Schema mapping; supported: {SUPPORTED}")
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        return generic(base, args, shown)
    raise AnnotationError(f"{shown!r} is not a supported type annotation; supported: {SUPPORTED}")


# One function per generic written `base[args]` in source text: (base, its argument nodes, the whole
# annotation as written, for messages) -> the schema.


def _ast_array(base: str, args: list[ast.expr], shown: str) -> dict[str, Any]:
    if len(args) != 1:
        raise AnnotationError(f"{shown}: {base}[...] takes one item type")
    return _array(base, _from_ast(args[0]))


def _ast_tuple(base: str, args: list[ast.expr], shown: str) -> dict[str, Any]:
    if len(args) == 2 and isinstance(args[1], ast.Constant) and args[1].value is Ellipsis:
        return _array(base, _from_ast(args[0]))
    return _fixed_tuple([_from_ast(a) for a in args])


def _ast_object(base: str, args: list[ast.expr], shown: str) -> dict[str, Any]:
    if len(args) != 2:
        raise AnnotationError(f"{shown}: dict[...] takes a key and a value type")
    return _object(_from_ast(args[0]), _from_ast(args[1]), shown)


def _ast_optional(base: str, args: list[ast.expr], shown: str) -> dict[str, Any]:
    if len(args) != 1:
        raise AnnotationError(f"{shown}: Optional[...] takes one type")
    return nullable(_from_ast(args[0]))


def _ast_union(base: str, args: list[ast.expr], shown: str) -> dict[str, Any]:
    return _union([_from_ast(a) for a in args])


def _ast_literal(base: str, args: list[ast.expr], shown: str) -> dict[str, Any]:
    return {"enum": [_literal_value(a) for a in args]}


def _ast_annotated(base: str, args: list[ast.expr], shown: str) -> dict[str, Any]:
    return _from_ast(args[0])  # the metadata after the type says nothing JSON Schema can use


_AST_GENERICS: dict[str, Callable[[str, list[ast.expr], str], dict[str, Any]]] = {
    **dict.fromkeys(("list", "List", "Sequence", "set", "Set", "frozenset", "FrozenSet"), _ast_array),
    **dict.fromkeys(("tuple", "Tuple"), _ast_tuple),
    **dict.fromkeys(_OBJECTS, _ast_object),
    "Optional": _ast_optional,
    "Union": _ast_union,
    "Literal": _ast_literal,
    "Annotated": _ast_annotated,
}


# ---- typing objects (the Python callable path) ------------------------------------------------------


def schema_from_type(tp: Any) -> dict[str, Any]:
    """JSON Schema for a real type hint (`int`, `list[str]`, `Optional[int]`, `Literal[...]`)."""
    bare = _bare_type(tp)
    if bare is not None:
        return bare
    if isinstance(tp, str):
        return schema_from_annotation(tp)
    origin = typing.get_origin(tp)
    generic = _TYPE_GENERICS.get(origin) if origin is not None else None
    if generic is None:
        shown = getattr(tp, "__name__", None) or repr(tp)
        raise AnnotationError(f"type {shown!r} has no JSON Schema mapping; supported: {SUPPORTED}")
    return generic(tp, typing.get_args(tp))


_TYPE_SCALARS: dict[Any, dict[str, Any]] = {
    bool: {"type": "boolean"},
    int: {"type": "integer"},
    float: {"type": "number"},
    str: {"type": "string"},
}


def _bare_type(tp: Any) -> dict[str, Any] | None:
    """The schema of a hint that is one name with no arguments (`int`, `None`, `Any`, a bare `list`), or
    None for anything else."""
    if tp is Any or tp is object:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    if not isinstance(tp, type):
        return None
    if tp in _TYPE_SCALARS:
        return dict(_TYPE_SCALARS[tp])
    if tp in (list, tuple, set, frozenset):
        return _array(tp.__name__, None)
    if tp is dict:
        return {"type": "object"}
    return None


# One function per generic origin (`typing.get_origin`): (the hint, its arguments) -> the schema.


def _type_annotated(tp: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    return schema_from_type(args[0])


def _type_union(tp: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    return _union([schema_from_type(a) for a in args])


def _type_literal(tp: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    for a in args:
        if not isinstance(a, (str, int, float, bool, type(None))):
            raise AnnotationError(f"Literal values must be str, int, float, bool or None, not {a!r}")
    return {"enum": list(args)}


def _type_array(tp: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """`list[X]`, `set[X]`, `frozenset[X]` and `Sequence[X]` (an array like a list)."""
    origin = typing.get_origin(tp)
    kind = origin.__name__ if origin in (list, set, frozenset) else "list"
    return _array(kind, schema_from_type(args[0]) if args else None)


def _type_tuple(tp: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    if len(args) == 2 and args[1] is Ellipsis:
        return _array("tuple", schema_from_type(args[0]))
    return _fixed_tuple([schema_from_type(a) for a in args])


def _type_dict(tp: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """`dict[K, V]` (a `None` in either place is read as not given)."""
    key, value = (*args, None, None)[:2]
    return _object(
        schema_from_type(key) if key is not None else None,
        schema_from_type(value) if value is not None else None,
        repr(tp),
    )


def _type_mapping(tp: Any, args: tuple[Any, ...]) -> dict[str, Any]:
    """`Mapping[K, V]`."""
    key = schema_from_type(args[0]) if args else None
    value = schema_from_type(args[1]) if len(args) > 1 else None
    return _object(key, value, repr(tp))


_TYPE_GENERICS: dict[Any, Callable[[Any, tuple[Any, ...]], dict[str, Any]]] = {
    typing.Annotated: _type_annotated,
    typing.Union: _type_union,
    types.UnionType: _type_union,
    typing.Literal: _type_literal,
    list: _type_array,
    set: _type_array,
    frozenset: _type_array,
    cabc.Sequence: _type_array,
    tuple: _type_tuple,
    dict: _type_dict,
    cabc.Mapping: _type_mapping,
}
