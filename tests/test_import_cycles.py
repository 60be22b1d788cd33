"""No import circles inside `runtime/scripts/` and `runtime/bundle/`.

A circle between modules makes each one's meaning depend on the order Python happens to load them in, and
hides which module is the lower floor. The check reads every `import` statement with `ast` (at module level,
under `if TYPE_CHECKING:` and inside functions alike: a lazy import is still a dependency) and looks for a
cycle among the package's own modules. A package's `__init__` re-exports its modules, so it is left out:
an edge into it would be a cycle by construction, and `test_no_module_imports_its_own_package` forbids that
edge instead.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("runtime.scripts", "runtime.bundle")


def _modules(package: str) -> dict[str, Path]:
    """Every module of `package` (not its `__init__`), by dotted name."""
    folder = ROOT.joinpath(*package.split("."))
    return {f"{package}.{p.stem}": p for p in sorted(folder.glob("*.py")) if p.stem != "__init__"}


def _imports(module: str, path: Path) -> set[str]:
    """The dotted names `module` imports anywhere in its file (each `from X import y` as X and X.y)."""
    found: set[str] = set()
    package = module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{parent}.{base}" if base else parent
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph(package: str) -> dict[str, set[str]]:
    modules = _modules(package)
    return {m: _imports(m, p) & set(modules) for m, p in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` as a path that ends where it starts, or None (a depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt):], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)) is not None:
            return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    graph = _graph(package)
    assert len(graph) > 1
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_imports_its_own_package(package: str) -> None:
    """`from runtime.scripts import X` inside runtime/scripts/ would import every module through __init__."""
    offenders = [m for m, p in _modules(package).items() if package in _imports(m, p)]
    assert offenders == []
