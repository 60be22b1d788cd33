"""The public API (`runtime.__all__`): every name imports, is what the package's block says it is, and the
names the README's examples use are among them."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import runtime

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_imports_and_is_the_object_its_module_defines():
    assert len(runtime.__all__) == len(set(runtime.__all__))
    for name in runtime.__all__:
        value = getattr(runtime, name)
        module, attribute = runtime._EXPORTS[name]
        if module == "runtime":
            assert value is importlib.import_module(f"runtime.{attribute}")
        else:
            assert value is getattr(importlib.import_module(module), attribute), name


def test_the_type_checking_block_and_all_list_the_same_names():
    tree = ast.parse((ROOT / "runtime" / "__init__.py").read_text())
    block = next(n for n in tree.body
                 if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    written = [a.asname for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names]
    assert written == runtime.__all__
    assert all(a.asname == a.name for n in block.body if isinstance(n, ast.ImportFrom) for a in n.names), \
        "every name is re-exported under its own name (`X as X`)"


def test_an_unknown_name_is_an_attribute_error_naming_it():
    try:
        runtime.NoSuchThing  # noqa: B018
    except AttributeError as e:
        assert "NoSuchThing" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_importing_runtime_loads_no_io_library():
    code = ("import sys, runtime; bad = [m for m in ('nats', 'aiohttp', 'openai', 'pydantic_monty', 'torch') "
            "if m in sys.modules]; print(bad)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_event_types_are_one_namespace_not_top_level_names():
    assert runtime.events.RunStarted.__name__ == "RunStarted"
    assert "RunStarted" not in runtime.__all__ and "Task" not in runtime.__all__
