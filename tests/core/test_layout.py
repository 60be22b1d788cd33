"""The house by role, kept by a test: no import circle anywhere in `runtime/`, every module on the floor
`docs/reference/layout.md` gives it and importing only its own floor or lower ones, the processes apart
as that page lists them, the pure core and the task format load no I/O library, the processes load no face
and the client no sandbox, and no module outgrows one concept.

The floors are data: the table and the list of processes that stand apart are read from the page, so the page
and the test cannot drift apart, and there is no exception list here. The import graph is read from the
source (every `import`, at module level or inside a function), so a lazy import to dodge a circle or a floor
counts as the edge it is."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNTIME = ROOT / "runtime"
LAYOUT = ROOT / "docs" / "reference" / "layout.md"
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


@dataclass(frozen=True)
class Entry:
    """One name in the floor table: a package (`runtime/nats/`, everything in it) or one module."""

    floor: int  # 0 is the lowest floor
    floor_name: str
    module: str  # dotted: runtime.nats, runtime.types, runtime (the package itself)
    package: bool

    def covers(self, module: str) -> bool:
        return module == self.module or (self.package and module.startswith(self.module + "."))


def _dotted(name: str) -> tuple[str, bool]:
    """The page's way of naming things, as the test reads it: `runtime/nats/` -> (runtime.nats, package),
    `types.py` or `runtime/types.py` -> (runtime.types, module), `__init__.py` -> (runtime, module)."""
    path = name if name.startswith("runtime/") else f"runtime/{name}"
    if path.endswith("/"):
        return path.rstrip("/").replace("/", "."), True
    assert path.endswith(".py"), f"{LAYOUT.name}: {name!r}: name a package `runtime/x/`, a module `x.py`"
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts), False


def _table(text: str) -> list[Entry]:
    """The rows of the page's floor table, lowest floor first; a floor named twice is one floor."""
    lines = text.splitlines()
    header = "|floor|packageormodule|"
    start = next(i for i, line in enumerate(lines) if line.replace(" ", "").startswith(header))
    names: list[str] = []
    out: list[Entry] = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        floor, what = (cell.strip() for cell in line.strip("|").split("|")[:2])
        if floor not in names:
            names.append(floor)
        for name in re.findall(r"`([^`]+)`", what):
            out.append(Entry(names.index(floor), floor, *_dotted(name)))
    return out


def _apart(text: str) -> list[tuple[str, str]]:
    """(who, what it never imports), from the page's lines such as
    "- `runtime/worker/` never imports `runtime/host/`, `runtime/client/`"."""
    out = []
    for who, banned in re.findall(r"^- `([^`]+)` never imports (.+)$", text, flags=re.MULTILINE):
        out += [(_dotted(who)[0], _dotted(name)[0]) for name in re.findall(r"`([^`]+)`", banned)]
    return out


PAGE = LAYOUT.read_text(encoding="utf-8")
TABLE = _table(PAGE)
APART = _apart(PAGE)


def _owners(module: str) -> list[Entry]:
    return [entry for entry in TABLE if entry.covers(module)]


def _floor(module: str) -> Entry:
    (entry,) = _owners(module)
    return entry


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of a module on a higher floor than the importer's."""
    return sorted(f"{m} ({_floor(m).floor_name}) imports {d} ({_floor(d).floor_name})"
                  for m, deps in graph.items() for d in deps if _floor(d).floor > _floor(m).floor)


def _crossings(graph: dict[str, set[str]]) -> list[str]:
    """Every import between processes that stand apart."""
    return sorted(f"{m} imports {d}: {who} never imports {banned}" for who, banned in APART
                  for m, deps in graph.items() if _within(m, who) for d in deps if _within(d, banned))


def test_the_graph_is_read():
    assert "runtime.kernel" in GRAPH["runtime.host.driver"]  # the reader sees a known edge
    assert len(MODULES) > 100


def test_no_import_circle_anywhere():
    assert _cycles() == []


def test_every_module_stands_on_exactly_one_floor():
    lost = sorted(m for m in MODULES if not _owners(m))
    twice = sorted(f"{m}: {[e.module for e in owners]}" for m in MODULES if len(owners := _owners(m)) > 1)
    assert lost == [], f"add each to a row of {LAYOUT.relative_to(ROOT)}"
    assert twice == []


def test_every_name_in_the_table_is_a_module_that_exists():
    assert [e.module for e in TABLE if not any(e.covers(m) for m in MODULES)] == []
    assert [pair for pair in APART if not any(_within(m, p) for p in pair for m in MODULES)] == []


def test_no_module_imports_a_floor_above_its_own():
    assert _upward(GRAPH) == []


def test_the_processes_stand_apart():
    assert APART, f"{LAYOUT.relative_to(ROOT)} lists which processes never import each other"
    assert _crossings(GRAPH) == []


def test_the_checks_see_an_import_up_a_floor_and_across_processes():
    """The table is read (the core under the host, the host under the CLI) and the checks can fail."""
    kernel, host, cli = (_floor(m).floor for m in ("runtime.kernel", "runtime.host.host", "runtime.cli"))
    assert kernel < host < cli
    assert ("runtime.worker", "runtime.host") in APART
    graph = {**GRAPH, "runtime.kernel": GRAPH["runtime.kernel"] | {"runtime.host.driver"},
             "runtime.worker.loop": GRAPH["runtime.worker.loop"] | {"runtime.host.host"}}
    assert _upward(graph) == ["runtime.kernel (core) imports runtime.host.driver (processes)"]
    assert _crossings(graph) == [
        "runtime.worker.loop imports runtime.host.host: runtime.worker never imports runtime.host"]


def test_the_pure_core_and_the_task_format_import_no_io():
    core = ["runtime.types", "runtime.jsontypes", "runtime.events", "runtime.kernel", "runtime.policies",
            "runtime.approval_policy", "runtime.history", "runtime.commands", "runtime.jobs", "runtime.env"]
    code = ("import importlib, sys\n"
            f"for m in {core!r}: importlib.import_module(m)\n"
            "io = ('nats', 'aiohttp', 'openai', 'httpx', 'pydantic_monty', 'anyio', 'torch')\n"
            "print(sorted(m for m in io if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"


def _loaded_by(module: str, prefixes: tuple[str, ...]) -> list[str]:
    """The modules under `prefixes` that importing `module` loads, in a fresh interpreter."""
    code = f"import json, sys, {module}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    return [m for m in json.loads(out.stdout) if any(_within(m, prefix) for prefix in prefixes)]


def test_importing_the_worker_loads_no_host_module():
    assert _loaded_by("runtime.worker", ("runtime.host",)) == []


def test_importing_the_worker_or_the_host_loads_no_opentelemetry():
    """Traces are derived from the log by `sa otel` (a face): a host or a worker does not load the SDK."""
    for process in ("runtime.worker", "runtime.host"):
        assert _loaded_by(process, ("opentelemetry", "runtime.observe")) == [], process


def test_importing_the_client_loads_no_sandbox():
    """A client checks an answer against its question's schema (`runtime.validate`) without Monty."""
    sandbox = ("pydantic_monty", "runtime.scripts", "runtime.scripts.pool", "runtime.scripts.run")
    assert _loaded_by("runtime.client", sandbox) == []


def test_no_module_outgrows_one_concept():
    long = {str(p.relative_to(ROOT)): n for p in RUNTIME.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert set(long) <= LONG_FILES_ALLOWED, long
