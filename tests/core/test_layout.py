"""The house by role, kept by a test: no import circle anywhere in `runtime/`, each process imports only
its own floor or lower ones (the worker never the host, the host never the client or the CLI, nothing
the CLI), the pure core and the task format load no I/O library, and no module outgrows one concept.

The import graph is read from the source (every `import`, at module level or inside a function), so a
lazy import to dodge a circle counts as the edge it is."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime"
LONG_FILES_ALLOWED = {"runtime/kernel.py", "runtime/events.py"}  # each one concept: the Decider, the schema
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    out = {}
    for path in RUNTIME.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {r for a in node.names if (r := _resolve(a.name)) and a.name.startswith("runtime")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            if source.startswith("runtime"):
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    target = full if full in MODULES else _resolve(source)
                    if target:
                        out.add(target)
    out.discard(module)
    return out


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _cycles() -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in GRAPH.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):  # the graph is a few hundred modules deep at most: the default limit holds
        if v not in index:
            visit(v)
    return found


def _importers_of(prefix: str) -> dict[str, set[str]]:
    return {m: {d for d in deps if d == prefix or d.startswith(prefix + ".")}
            for m, deps in GRAPH.items()}


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_graph_is_read():
    assert "runtime.kernel" in GRAPH["runtime.host.driver"]  # the reader sees a known edge
    assert len(MODULES) > 100


def test_no_import_circle_anywhere():
    assert _cycles() == []


def test_each_process_imports_only_its_floor_or_lower():
    rules = [  # (who, what it must not import, why)
        ("runtime.worker", "runtime.host", "the worker never imports the host"),
        ("runtime.host", "runtime.client", "the host never imports the client"),
        ("runtime.host", "runtime.worker", "the host never imports the worker"),
        ("runtime.worker", "runtime.client", "the worker never imports the client"),
        ("runtime.client", "runtime.host", "the client reaches hosts through NATS, never their code"),
    ]
    broken = [f"{m} imports {d}: {why}" for who, banned, why in rules for m, deps in GRAPH.items()
              if _within(m, who) for d in deps if _within(d, banned)]
    broken += [f"{m} imports {d}: nothing imports the CLI" for m, deps in GRAPH.items()
               if not _within(m, "runtime.cli") for d in deps if _within(d, "runtime.cli")]
    assert broken == []


def test_the_pure_core_and_the_task_format_import_no_io():
    core = ["runtime.types", "runtime.jsontypes", "runtime.events", "runtime.kernel", "runtime.policies",
            "runtime.approval_policy", "runtime.history", "runtime.commands", "runtime.jobs", "runtime.env"]
    code = ("import importlib, sys\n"
            f"for m in {core!r}: importlib.import_module(m)\n"
            "io = ('nats', 'aiohttp', 'openai', 'httpx', 'pydantic_monty', 'anyio', 'torch')\n"
            "print(sorted(m for m in io if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_importing_the_worker_loads_no_host_module():
    code = "import sys, runtime.worker; print([m for m in sys.modules if m.startswith('runtime.host')])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def test_no_module_outgrows_one_concept():
    long = {str(p.relative_to(ROOT)): n for p in RUNTIME.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert set(long) <= LONG_FILES_ALLOWED, long
