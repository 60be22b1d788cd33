"""Docs that cannot drift: every `runtime.x.y` a docstring, comment or doc page names resolves to a module
or an attribute of one, and every `runtime/...` file path they name exists. A rename that forgets a
reference fails here, with the file and line of the stale name."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOTTED = re.compile(r"(?<![\w./-])runtime(?:\.[A-Za-z_]\w*)+")
PATH = re.compile(r"(?<![\w./-])runtime/[\w./-]*\w")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md")),
        *sorted((ROOT / "deploy").glob("**/*.md")), ROOT / "bench" / "README.md"]
SOURCES = [*sorted((ROOT / "runtime").rglob("*.py")), *sorted((ROOT / "testbed").glob("*.py")),
           *sorted((ROOT / "bench").glob("*.py"))]


def _resolves(dotted: str) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def _references(files: list[Path]) -> list[tuple[str, int, str, str]]:
    out = []
    for path in files:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            out += [(str(path.relative_to(ROOT)), number, "name", m.group(0).rstrip("."))
                    for m in DOTTED.finditer(line) if not m.group(0).endswith(".py")]  # bench's runtime.py
            out += [(str(path.relative_to(ROOT)), number, "path", m.group(0)) for m in PATH.finditer(line)]
    return out


@pytest.mark.parametrize("where", ["docs", "sources"])
def test_every_runtime_reference_resolves(where):
    refs = _references(DOCS if where == "docs" else SOURCES)
    assert refs, "the scan found no references at all: the patterns are wrong"
    stale = []
    for file, line, kind, ref in refs:
        ok = (ROOT / ref).exists() or (ROOT / (ref + ".py")).exists() if kind == "path" else _resolves(ref)
        if not ok:
            stale.append(f"{file}:{line}: {ref}")
    assert not stale, "stale references (renamed or removed):\n" + "\n".join(stale)
