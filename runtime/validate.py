"""A small JSON Schema validator for plain Python data (no dependency): tool arguments and output schemas.

It covers the keywords tool schemas use: type (one or a list), enum, const, properties, required,
additionalProperties, items / prefixItems, minItems / maxItems / uniqueItems, minLength / maxLength,
pattern, minimum / maximum / exclusiveMinimum / exclusiveMaximum / multipleOf, anyOf / oneOf / allOf /
not, and local `$ref`s (`#/$defs/...`, `#/definitions/...`). Annotations (title, description, default,
examples, format, ...) are accepted and ignored. `unsupported_keywords(schema)` names any other keyword,
so an output schema that asks for something this validator would not check is refused up front rather
than silently passed; `schema_problems(schema)` checks the keywords' values (a `type` that is no JSON
type, a `required` that is not a list of names, a `pattern` that does not compile, a `$ref` that does
not resolve), so a schema that would fail every value is refused where it is written, not on every call.

Errors read like `tags[1]: expected string, got integer 3`, with the path from the root.

Why it sits in the pure core and not with the sandbox it was written for: a question's answer is checked
against its schema by the client before it is sent, by the host before it is recorded and by the in-process
loop, and none of them should load Monty (the sandbox package starts it on import) to check a dict.
"""

from __future__ import annotations

import difflib
import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from runtime.jsontypes import is_type, json_type

__all__ = ["describe_value", "schema_problems", "unsupported_keywords", "validate"]

_CHECKED = {
    "type",
    "enum",
    "const",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "anyOf",
    "oneOf",
    "allOf",
    "not",
    "$ref",
    "$defs",
    "definitions",
    "minProperties",
    "maxProperties",
}
_IGNORED = {
    "title",
    "description",
    "default",
    "examples",
    "format",
    "$schema",
    "$id",
    "$comment",
    "deprecated",
    "readOnly",
    "writeOnly",
    "contentMediaType",
    "contentEncoding",
}
_SCHEMA_VALUED = {"additionalProperties", "items", "not"}
_SCHEMA_LISTS = {"anyOf", "oneOf", "allOf", "prefixItems"}
_SCHEMA_MAPS = {"properties", "$defs", "definitions"}


def unsupported_keywords(schema: Any, path: str = "#") -> list[str]:
    """Keywords in `schema` (recursively) this validator does not check, as `path: keyword` strings."""
    found: list[str] = []
    if not isinstance(schema, dict):
        if not isinstance(schema, bool):
            found.append(f"{path}: a schema must be an object or a boolean")
        return found
    for key, value in schema.items():
        if key in _IGNORED:
            continue
        if key not in _CHECKED:
            found.append(f"{path}: {key}")
        elif key in _SCHEMA_VALUED and isinstance(value, (dict, bool)):
            found += unsupported_keywords(value, f"{path}/{key}")
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                found += unsupported_keywords(sub, f"{path}/{key}/{i}")
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                found += unsupported_keywords(sub, f"{path}/{key}/{name}")
    return found


JSON_TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")
_COUNT = {"type": "integer", "minimum": 0}
_SCHEMAS = {"type": "array", "items": {"$ref": "#"}, "minItems": 1}
_NAMED_SCHEMAS = {"type": "object", "additionalProperties": {"$ref": "#"}}
_TEXT = {"type": "string"}
_FLAG = {"type": "boolean"}
_NUMBER = {"type": "number"}
# The metaschema of the keywords this validator checks (JSON Schema 2020-12's rules for their values), itself
# checked by `validate`: why not the `jsonschema` package's metaschema check, this validator is the one that
# runs the schemas (tool arguments, results, answers), so a schema is valid exactly when it can run it.
METASCHEMA: dict[str, Any] = {
    "type": ["object", "boolean"],
    "properties": {
        # which names are JSON types is `schema_problems`'s to say, with the close one
        "type": {"type": ["string", "array"], "items": _TEXT, "minItems": 1, "uniqueItems": True},
        "enum": {"type": "array"},
        "properties": _NAMED_SCHEMAS, "$defs": _NAMED_SCHEMAS, "definitions": _NAMED_SCHEMAS,
        "required": {"type": "array", "items": _TEXT, "uniqueItems": True},
        "additionalProperties": {"$ref": "#"}, "items": {"$ref": "#"}, "not": {"$ref": "#"},
        "prefixItems": _SCHEMAS, "anyOf": _SCHEMAS, "oneOf": _SCHEMAS, "allOf": _SCHEMAS,
        "minItems": _COUNT, "maxItems": _COUNT, "minLength": _COUNT, "maxLength": _COUNT,
        "minProperties": _COUNT, "maxProperties": _COUNT, "uniqueItems": _FLAG,
        "minimum": _NUMBER, "maximum": _NUMBER, "exclusiveMinimum": _NUMBER, "exclusiveMaximum": _NUMBER,
        "multipleOf": {"type": "number", "exclusiveMinimum": 0},
        "pattern": _TEXT, "$ref": _TEXT, "title": _TEXT, "description": _TEXT, "format": _TEXT,
        "$schema": _TEXT, "$id": _TEXT, "$comment": _TEXT,
        "deprecated": _FLAG, "readOnly": _FLAG, "writeOnly": _FLAG,
    },
}


def schema_problems(schema: Any) -> list[str]:
    """Why `schema` is not a JSON Schema this validator can run, as `path: problem` strings ([] if it is):
    a keyword whose value breaks `METASCHEMA`, a `type` that names no JSON type (with the close one), a
    `pattern` that is no regular expression, a `$ref` that does not resolve. Keywords it does not check at
    all are `unsupported_keywords`'s to name."""
    problems = validate(schema, METASCHEMA, max_errors=20)
    for path, node in _subschemas(schema, ""):
        kinds = node.get("type") if isinstance(node, dict) else None
        for kind in kinds if isinstance(kinds, list) else [kinds]:
            if isinstance(kind, str) and kind not in JSON_TYPES:
                close = difflib.get_close_matches(kind, JSON_TYPES, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                problems.append(f"{_where(_keyword(path, 'type'))}{kind!r} is not a JSON type{hint}; the "
                                f"types are {', '.join(JSON_TYPES)}")
        if isinstance(node, dict) and isinstance(node.get("pattern"), str):
            try:
                re.compile(node["pattern"])
            except re.error as e:
                problems.append(f"{_where(_keyword(path, 'pattern'))}not a regular expression: {e}")
        if isinstance(node, dict) and isinstance(node.get("$ref"), str):
            try:
                _resolve_ref(node["$ref"], schema)
            except ValueError as e:
                problems.append(f"{_where(_keyword(path, '$ref'))}{e}")
    return problems


def _keyword(path: str, keyword: str) -> str:
    return f"{path}.{keyword}" if path else keyword


def _subschemas(schema: Any, path: str) -> list[tuple[str, Any]]:
    """`schema` and every schema inside it, each with its path (as `validate` writes paths)."""
    found = [(path, schema)]
    if not isinstance(schema, dict):
        return found
    for key, value in schema.items():
        if key in _SCHEMA_VALUED and isinstance(value, dict):
            found += _subschemas(value, _join(path, key))
        elif key in _SCHEMA_LISTS and isinstance(value, list):
            for i, sub in enumerate(value):
                found += _subschemas(sub, _join(_join(path, key), i))
        elif key in _SCHEMA_MAPS and isinstance(value, dict):
            for name, sub in value.items():
                found += _subschemas(sub, _join(_join(path, key), str(name)))
    return found


def describe_value(value: Any, limit: int = 60) -> str:
    """`integer 3`, `string "abc"`, `array of 4 items`: how a value is named in error messages."""
    kind = json_type(value)
    if kind in ("array", "object"):
        n = len(value)
        return f"{kind} of {n} {'item' if kind == 'array' else 'key'}{'' if n == 1 else 's'}"
    if kind == "null":
        return "null"
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return f"{kind} {text}"


_FAST: dict[Any, Any] = {
    "integer": lambda v: type(v) is int,
    "number": lambda v: type(v) is int or type(v) is float,
    "string": lambda v: type(v) is str,
    "boolean": lambda v: type(v) is bool,
    "null": lambda v: v is None,
}


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{path}.{key}" if path else key
    return f"{path}[{json.dumps(key)}]"


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def validate(value: Any, schema: Any, *, path: str = "", root: Any = None, max_errors: int = 10) -> list[str]:
    """Every way `value` breaks `schema` (at most `max_errors`), as `path: problem` strings; [] if valid."""
    errors: list[str] = []
    _check(value, schema, path, schema if root is None else root, errors, max_errors)
    return errors[:max_errors]


def _resolve_ref(ref: str, root: Any) -> Any:
    if not ref.startswith("#"):
        raise ValueError(f"only local $refs are supported, not {ref!r}")
    node = root
    for part in ref.lstrip("#").strip("/").split("/"):
        if not part:
            continue
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"$ref {ref!r} does not resolve")
        node = node[part]
    return node


def _where(path: str) -> str:
    return f"{path}: " if path else ""


def _check(value: Any, schema: Any, path: str, root: Any, errors: list[str], cap: int) -> None:
    """Append to `errors` every way `value` at `path` breaks `schema`, until there are `cap` of them."""
    if len(errors) >= cap:
        return
    if schema is True or schema == {}:
        return
    if schema is False:
        errors.append(f"{_where(path)}no value is allowed here")
        return
    if not isinstance(schema, dict):
        return
    if "$ref" in schema:
        _check(value, _resolve_ref(schema["$ref"], root), path, root, errors, cap)
    where = _where(path)
    if not _check_kind(value, schema, where, errors):
        return
    if isinstance(value, str):
        _check_string(value, schema, where, errors)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        _check_number(value, schema, where, errors)
    if isinstance(value, (list, tuple, set, frozenset)):
        _check_array(list(value), schema, path, root, errors, cap)
    if isinstance(value, dict):
        _check_object(value, schema, path, root, errors, cap)
    _check_combined(value, schema, path, root, errors, cap)


def _check_kind(value: Any, schema: dict[str, Any], where: str, errors: list[str]) -> bool:
    """False, after recording why, when `value` has none of the schema's types, is not one of its `enum`
    or is not its `const`: the value's other keywords are then not checked, since their messages would
    only repeat this one in other words."""
    kind = schema.get("type")
    if kind is not None:
        kinds = kind if isinstance(kind, list) else [kind]
        if not any(is_type(value, k) for k in kinds):
            wanted = " or ".join(kinds)
            errors.append(f"{where}expected {wanted}, got {describe_value(value)}")
            return False
    if "enum" in schema and not any(_equal(value, v) for v in schema["enum"]):
        allowed_values = ", ".join(json.dumps(v) for v in schema["enum"])
        errors.append(f"{where}must be one of {allowed_values}, got {describe_value(value)}")
        return False
    if "const" in schema and not _equal(value, schema["const"]):
        errors.append(f"{where}must be {json.dumps(schema['const'])}, got {describe_value(value)}")
        return False
    return True


def _check_string(value: str, schema: dict[str, Any], where: str, errors: list[str]) -> None:
    if "minLength" in schema and len(value) < schema["minLength"]:
        errors.append(f"{where}must be at least {schema['minLength']} characters long")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{where}must be at most {schema['maxLength']} characters long, got {len(value)}")
    if "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append(f"{where}must match the pattern {schema['pattern']!r}, got {describe_value(value)}")


# (keyword, the comparison that breaks it, how the message states the bound); a comparison with NaN is
# false, so NaN breaks no bound
_BOUNDS: tuple[tuple[str, Callable[[Any, Any], bool], str], ...] = (
    ("minimum", operator.lt, ">="),
    ("maximum", operator.gt, "<="),
    ("exclusiveMinimum", operator.le, ">"),
    ("exclusiveMaximum", operator.ge, "<"),
)


def _check_number(value: float, schema: dict[str, Any], where: str, errors: list[str]) -> None:
    for keyword, breaks, sign in _BOUNDS:
        if keyword in schema and breaks(value, schema[keyword]):
            errors.append(f"{where}must be {sign} {schema[keyword]}, got {value}")
    if "multipleOf" in schema and math.isfinite(value):
        q = value / schema["multipleOf"]
        if abs(q - round(q)) > 1e-9:
            errors.append(f"{where}must be a multiple of {schema['multipleOf']}, got {value}")


def _check_array(items: list[Any], schema: dict[str, Any], path: str, root: Any, errors: list[str],
                 cap: int) -> None:
    where = _where(path)
    if "minItems" in schema and len(items) < schema["minItems"]:
        errors.append(f"{where}must have at least {schema['minItems']} items, got {len(items)}")
    if "maxItems" in schema and len(items) > schema["maxItems"]:
        errors.append(f"{where}must have at most {schema['maxItems']} items, got {len(items)}")
    if schema.get("uniqueItems"):
        _check_unique(items, path, errors)
    prefix = schema.get("prefixItems", [])
    for i, sub in enumerate(prefix[: len(items)]):
        _check(items[i], sub, _join(path, i), root, errors, cap)
    rest = schema.get("items")
    if rest is not None:
        _check_rest(items, len(prefix), rest, path, root, errors, cap)


def _check_unique(items: list[Any], path: str, errors: list[str]) -> None:
    """The first item equal to an earlier one, if any (one error: the rest would say the same)."""
    seen: list[Any] = []
    for i, item in enumerate(items):
        if any(_equal(item, s) for s in seen):
            errors.append(f"{_where(_join(path, i))}duplicate item {describe_value(item)}")
            return
        seen.append(item)


def _check_rest(items: list[Any], start: int, rest: Any, path: str, root: Any, errors: list[str],
                cap: int) -> None:
    """The items after the `prefixItems` (from `start`) against `items`."""
    if rest is False:
        if start < len(items):
            errors.append(f"{_where(path)}has {len(items)} items, at most {start} are allowed")
        return
    one_type = rest.get("type") if isinstance(rest, dict) and len(rest) == 1 else None
    fast = _FAST.get(one_type) if isinstance(one_type, str) else None  # `type: [a, b]` takes the full check
    for i in range(start, len(items)):
        if fast is not None and fast(items[i]):  # a plain scalar of the one type asked: no path to build
            continue
        _check(items[i], rest, _join(path, i), root, errors, cap)
        if len(errors) >= cap:
            return


def _check_object(value: dict[Any, Any], schema: dict[str, Any], path: str, root: Any, errors: list[str],
                  cap: int) -> None:
    where = _where(path)
    props = schema.get("properties", {})
    for name in schema.get("required", []):
        if name not in value:
            errors.append(f"{_where(_join(path, name))}missing required property")
    if "minProperties" in schema and len(value) < schema["minProperties"]:
        errors.append(f"{where}must have at least {schema['minProperties']} properties")
    if "maxProperties" in schema and len(value) > schema["maxProperties"]:
        errors.append(f"{where}must have at most {schema['maxProperties']} properties")
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        sub_path = _join(path, str(key))
        if key in props:
            _check(item, props[key], sub_path, root, errors, cap)
        elif extra is False:
            allowed = ", ".join(props) or "none"
            errors.append(f"{_where(sub_path)}unexpected property (allowed: {allowed})")
        elif isinstance(extra, dict):
            _check(item, extra, sub_path, root, errors, cap)


def _check_combined(value: Any, schema: dict[str, Any], path: str, root: Any, errors: list[str],
                    cap: int) -> None:
    """`allOf`, `anyOf` / `oneOf` and `not`: the value against other whole schemas."""
    where = _where(path)
    for sub in schema.get("allOf", []):
        _check(value, sub, path, root, errors, cap)
    if "anyOf" in schema or "oneOf" in schema:
        options = schema.get("anyOf") or schema.get("oneOf") or []
        results = [validate(value, sub, path=path, root=root, max_errors=3) for sub in options]
        passing = sum(1 for r in results if not r)
        if passing == 0:
            best = min(results, key=len) if results else []
            detail = f" ({'; '.join(best)})" if best else ""
            errors.append(f"{where}does not match any allowed form{detail}")
        elif "oneOf" in schema and passing > 1:
            errors.append(f"{where}matches {passing} forms where exactly one is required")
    if "not" in schema and not validate(value, schema["not"], path=path, root=root, max_errors=1):
        errors.append(f"{where}matches a form that is not allowed")
