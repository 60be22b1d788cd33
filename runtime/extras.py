"""Optional dependency groups: whether one is installed, and a clear error saying how to get it.

Hosts, workers and `sa send` install without the embedded model's stack (torch, transformers, gguf,
safetensors, and xgrammar, which requires torch): with it a host+worker environment is gigabytes, without it
a small fraction of that. Code that needs the `model` extra asks `require("model", what)` before importing
those modules, so a lean install fails with the pip command to run instead of a bare `ModuleNotFoundError`
from deep inside an import.

    require("model", "sa model serve")   # raises MissingExtra when torch & co are not importable
"""

from __future__ import annotations

import importlib.util

DISTRIBUTION = "structured-agents"

#: the import names each extra provides (pyproject.toml's [project.optional-dependencies] installs them)
EXTRAS: dict[str, tuple[str, ...]] = {
    "model": ("torch", "transformers", "gguf", "safetensors", "xgrammar"),
}


class MissingExtra(RuntimeError):
    """A feature needs an optional dependency group that is not installed; the message says how to add it."""

    def __init__(self, extra: str, what: str, modules: list[str]) -> None:
        self.extra = extra
        self.modules = modules
        super().__init__(
            f"{what} needs the '{extra}' extra ({', '.join(modules)} not installed): "
            f"pip install '{DISTRIBUTION}[{extra}]'"
        )


def missing(extra: str) -> list[str]:
    """The import names of `extra` that cannot be imported here (found by spec, without importing them)."""
    out = []
    for name in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):  # a blocked or half-installed package
            found = False
        if not found:
            out.append(name)
    return out


def require(extra: str, what: str) -> None:
    """Raise `MissingExtra` naming `what` and the pip command unless every module of `extra` imports."""
    absent = missing(extra)
    if absent:
        raise MissingExtra(extra, what, absent)
