"""What `pip install structured-agents` ships: the runtime, and of `runtime.testing` only what users test
their bundles with (the scripted model server and its reply helpers). This repository's own fault rig
(`testbed/`: network namespaces, the latency proxy, fleets of `sa` processes, the checker) stays beside the
tests and benches, out of the wheel; these tests fail if it comes back into `runtime/` or into the wheel."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the user-facing test doubles; a new module here ships to every user: add it only if users need it
USER_TESTING = {"__init__.py", "capacity.py", "scripted_model.py"}
# rig modules whose names nothing in the runtime shares (`fleet` and `scripts` name runtime modules too)
RIG = {"netns", "netbed", "netfaults", "checker", "latency"}


def test_runtime_testing_holds_only_what_users_test_their_bundles_with():
    assert {p.name for p in (ROOT / "runtime" / "testing").glob("*.py")} == USER_TESTING
    assert RIG | {"fleet", "scripts"} <= {p.stem for p in (ROOT / "testbed").glob("*.py")}


def test_no_shipped_module_imports_the_rig():
    """A shipped module that imported `testbed` would fail on every user's machine."""
    offenders = []
    for path in (ROOT / "runtime").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names
                          if n.split(".")[0] in ("testbed", "tests")]
    assert offenders == []


def test_the_package_finder_ships_the_runtime_only():
    from setuptools import find_packages

    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    packages = find_packages(str(ROOT), include=found.get("include", ["*"]), exclude=found.get("exclude", ()))
    assert "runtime" in packages and "runtime.testing" in packages
    assert [p for p in packages if p.split(".")[0] != "runtime"] == []


def test_the_built_wheel_holds_no_rig_module(tmp_path: Path):
    """The wheel itself, built from a copy of the sources with `testbed/` beside `runtime/` as in the repo."""
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("runtime", "testbed"):
        shutil.copytree(ROOT / name, source / name, ignore=ignore)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(source)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("*.whl")
    files = zipfile.ZipFile(wheel).namelist()
    modules = [f for f in files if f.endswith(".py")]
    assert "runtime/testing/scripted_model.py" in modules and "runtime/kernel.py" in modules
    assert [f for f in modules if not f.startswith("runtime/")] == []
    shipped_testing = {f.rpartition("/")[2] for f in modules if f.startswith("runtime/testing/")}
    assert shipped_testing == USER_TESTING
    assert [f for f in modules if Path(f).stem in RIG] == []  # nor elsewhere in the runtime
