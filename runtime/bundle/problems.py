"""What is wrong with a bundle: `Problem`s named by YAML path, and the one `BundleError` that lists them.

Loading a bundle collects every problem it can find before it gives up, so a user fixes a bundle in one
pass instead of one error per run of `sa up`. Each section's function returns its own problems as
`(yaml path, message)` pairs, the message saying what is wrong and what is allowed; `load_bundle` raises
them all as one `BundleError` whose lines read `<file>: <yaml path>: <message>`. This module also turns
pydantic's validation errors into problems of the same form, with the allowed keys and a "did you mean"
hint for an unknown key.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any, TypeVar, get_args

from pydantic import BaseModel, ValidationError

__all__ = ["UNREACHABLE", "BundleError", "Problem", "did_you_mean", "pydantic_problems", "validate"]

Problem = tuple[str, str]  # (yaml path, what is wrong; what is allowed); path "" for the whole file
UNREACHABLE = "cannot be reached"  # in the problem of an MCP server that could not be started or listed now

_Model = TypeVar("_Model", bound=BaseModel)


class BundleError(ValueError):
    """An invalid bundle: every problem found, each as (yaml path, message)."""

    def __init__(self, source: str, problems: list[tuple[str, str]]) -> None:
        self.source = source
        self.problems = problems
        lines = [f"{source}: {path}: {msg}" if path else f"{source}: {msg}" for path, msg in problems]
        super().__init__("\n".join(lines))

    def outside(self) -> list[str]:
        """The problems, as lines, when every one lies in what the bundle talks to rather than in the bundle
        (an MCP server that cannot be reached now, a model server that cannot enforce its strategy), else
        []. A host leaves such a bundle out and serves the others (`runtime.host.load_agents`); `sa up`
        checks bundles the same way before it starts anything."""
        found = [f"{where}: {message}" for where, message in self.problems
                 if where == "model.server" or (where.startswith("mcp.") and UNREACHABLE in message)]
        return found if found and len(found) == len(self.problems) else []


def did_you_mean(word: str, allowed: Iterable[str]) -> str:
    """` (did you mean 'x'?)` for the allowed word closest to a misspelt one, or "" when none is close."""
    close = difflib.get_close_matches(word, list(allowed), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _path_str(loc: tuple[Any, ...], base: str = "") -> str:
    out = base
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The keys allowed at `loc` (the parent of an unknown key), walking nested models."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or current is None:
            continue
        info = getattr(current, "model_fields", {}).get(part)
        ann = getattr(info, "annotation", None)
        models = [a for a in (ann, *get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)]
        current = models[0] if models else None  # `X | None` of a model: the model
    return list(getattr(current, "model_fields", {})) if current is not None else []


def _belongs_elsewhere(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """` (did you mean 'termination.max_turns'?)` for an unknown key that is (close to) a key of a section
    nested below where it was written, or "": `max_turn:` at the top of a bundle belongs in `termination:`."""
    current: Any = model
    for part in loc[:-1]:  # the model the key was written in
        if isinstance(part, int) or current is None:
            continue
        info = getattr(current, "model_fields", {}).get(part)
        ann = getattr(info, "annotation", None)
        current = next((a for a in (ann, *get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)),
                       None)
    nested: dict[str, str] = {}  # key -> its dotted path, one level down
    for name, info in getattr(current, "model_fields", {}).items():
        ann = info.annotation
        for sub in (a for a in (ann, *get_args(ann)) if isinstance(a, type) and issubclass(a, BaseModel)):
            for key in sub.model_fields:
                nested.setdefault(key, f"{name}.{key}")
    close = difflib.get_close_matches(str(loc[-1]), list(nested), n=1, cutoff=0.8)
    return f" (did you mean {nested[close[0]]!r}?)" if close else ""


def pydantic_problems(err: ValidationError, model: type[BaseModel], base: str) -> list[Problem]:
    """Each of pydantic's errors as a problem at its YAML path under `base`."""
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        path = _path_str(loc, base)
        if e["type"] == "extra_forbidden":
            allowed = _allowed_fields(model, loc[:-1])
            hint = did_you_mean(str(loc[-1]), allowed) or _belongs_elsewhere(model, loc)
            problems.append((path, f"unknown key{hint}; allowed keys: {', '.join(allowed)}"))
        elif e["type"] == "missing":
            problems.append((path, "required key is missing"))
        else:
            got = e.get("input")
            problems.append((path, f"{e['msg']} (got {got!r:.60})"))
    return problems


def validate(model: type[_Model], data: Any, base: str, problems: list[Problem]) -> _Model | None:
    """`data` as a `model`, or None after recording its problems (at paths under `base`)."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems.extend(pydantic_problems(e, model, base))
        return None
