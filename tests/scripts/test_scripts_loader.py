"""Loading .pym scripts: grail syntax, declarations, the line-preserving transform, the static check."""

import textwrap

import pytest

from runtime.scripts import MISSING, Script, load, loads

SUMMARIZE = textwrap.dedent('''\
    """Summarize a file and post the summary.

    Reads the file, asks the LLM for a summary, returns a dict.

    Args:
        path: the file to read
        max_words: longest summary
            in words
    """

    from grail import external, Input
    from typing import Any

    path: str = Input("path")
    max_words: int = Input("max_words", default=50)
    tags: list[str] | None = Input("tags", description="labels to attach")
    mode: str = Input("mode", default="short")


    @external
    async def read_file(path: str) -> str:
        """Read a file from the workspace."""
        ...


    @external
    async def ask_llm(prompt: str, /, model: str = "m", *args: Any,
                      temperature: float = 0.0, **extra: Any) -> str:
        ...


    @external
    def word_count(text: str) -> int:
        pass


    text = await read_file(path)
    summary = await ask_llm(text)
    {"path": path, "summary": summary, "words": word_count(summary), "tags": tags or []}
''')


def test_declarations_are_read():
    s = loads(SUMMARIZE, name="summarize")
    assert s.ok, s.diagnostics
    assert s.name == "summarize"
    assert s.docstring.startswith("Summarize a file")
    assert s.description == "Summarize a file and post the summary."
    assert list(s.inputs) == ["path", "max_words", "tags", "mode"]
    path, max_words, tags, mode = s.inputs.values()
    assert (path.annotation, path.required, path.default, path.line) == ("str", True, MISSING, 14)
    assert path.description == "the file to read"
    assert (max_words.required, max_words.default) == (False, 50)
    assert max_words.description == "longest summary in words"
    assert (tags.annotation, tags.required, tags.default) == ("list[str] | None", False, None)
    assert tags.description == "labels to attach"
    assert mode.default == "short"
    # grail's attribute names
    assert path.type_annotation == "str" and path.lineno == 14

    assert list(s.externals) == ["read_file", "ask_llm", "word_count"]
    rf, ask, wc = s.externals.values()
    assert rf.is_async and not wc.is_async
    assert rf.returns == "str" and rf.return_type == "str"
    assert rf.docstring == "Read a file from the workspace."
    assert rf.line == 20
    assert [(p.name, p.kind, p.annotation, p.default) for p in ask.parameters] == [
        ("prompt", "positional_only", "str", None),
        ("model", "positional", "str", "'m'"),
        ("args", "var_positional", "Any", None),
        ("temperature", "keyword_only", "float", "0.0"),
        ("extra", "var_keyword", "Any", None),
    ]
    assert ask.signature() == (
        "async def ask_llm(prompt: str, /, model: str = 'm', *args: Any, "
        "temperature: float = 0.0, **extra: Any) -> str"
    )
    assert "def word_count(text: str) -> int: ..." in s.stubs()


def test_transform_keeps_every_line_number():
    s = loads(SUMMARIZE)
    src_lines = SUMMARIZE.splitlines()
    code_lines = s.code.splitlines()
    assert len(code_lines) == len(src_lines)
    for i, (a, b) in enumerate(zip(src_lines, code_lines, strict=True), start=1):
        assert b in ("", a), f"line {i} changed: {a!r} -> {b!r}"
    # declarations are gone, the body is intact at its own line
    assert "Input(" not in s.code and "grail" not in s.code and "@external" not in s.code
    body = SUMMARIZE.splitlines().index("text = await read_file(path)")
    assert code_lines[body] == "text = await read_file(path)"
    assert "from typing import Any" in s.code


def test_load_from_file_uses_stem_and_path(tmp_path):
    f = tmp_path / "my_tool.pym"
    f.write_text('"""Doc."""\n1 + 1\n')
    s = load(f)
    assert isinstance(s, Script)
    assert s.name == "my_tool" and s.path == str(f) and s.filename == str(f)
    assert len(s.content_hash) == 16
    assert s.content_hash == loads('"""Doc."""\n1 + 1\n').content_hash


def test_load_missing_file_raises_oserror(tmp_path):
    with pytest.raises(OSError):
        load(tmp_path / "nope.pym")


def test_parse_error_is_a_diagnostic_with_line():
    s = loads("x = 1\ny = (2 +\n", name="bad")
    assert not s.ok and not s.parsed
    (d,) = s.diagnostics
    assert d.kind == "parse" and d.line == 2 and d.file == "bad.pym"
    assert "never closed" in d.message
    assert str(d).startswith("bad.pym:2:")


def _messages(src: str) -> list[tuple[int | None, str]]:
    return [(d.line, d.message) for d in loads(src, name="t").diagnostics]


@pytest.mark.parametrize(
    ("src", "line", "fragment"),
    [
        ('from grail import Input\nx: int = Input("y")\n', 2, "differs from its variable"),
        ('from grail import Input\nx = Input("x")\n', 2, "no type annotation"),
        ('from grail import Input\nx: int = Input("x", default=len("a"))\n', 2, "must be a literal"),
        ('from grail import Input\nx: int = Input("x", default="a")\n', 2, "does not match its annotation"),
        ('from grail import Input\nx: int = Input("x", 3)\n', 2, "pass the default by keyword"),
        ('from grail import Input\nx: int = Input("x", help="h")\n', 2, "no argument 'help'"),
        ('from grail import Input\nx: bytes = Input("x")\n', 2, "no JSON Schema mapping"),
        ('from grail import Input\nx: int = Input("x"); y = 1\n', 2, "shares its line"),
        ('from grail import Input\nx: int = Input("x")\nx: int = Input("x")\n', 3, "declared twice"),
        ('from grail import Input\ndef f():\n    x: int = Input("x")\n', 3, "top-level declaration"),
        ("from grail import external\n@external\ndef f(a: int) -> int:\n    return a\n", 4, "real body"),
        ("from grail import external\n@external\ndef f(a) -> int: ...\n", 3, "parameter 'a'"),
        ("from grail import external\n@external\ndef f(a: int): ...\n", 3, "no return annotation"),
        ("from grail import external\ndef g():\n    @external\n    def f() -> int: ...\n", 4, "top level"),
        ("from grail import Input, Secret\n", 1, "grail has no 'Secret'"),
        ("import grail\n", 1, "from grail import external, Input"),
        ("import enum\n", 1, "module 'enum' cannot be imported"),
        ("from typing import TypedDict\n", 1, "typing.TypedDict"),
        ("import dataclasses\ndataclasses.asdict(1)\n", 2, "dataclasses.asdict"),
        ("class E(Exception):\n    pass\n", 1, "class inheritance"),
        ("class A:\n    @property\n    def x(self):\n        return 1\n", 2, "@property"),
        ("def g():\n    yield 1\n", 2, "yield"),
        ("x = 1\ndel x\n", 2, "del"),
        ("async def f():\n    async for x in y:\n        pass\n", 2, "async for"),
        ("async def f():\n    async with y:\n        pass\n", 2, "async with"),
        ("try:\n    pass\nexcept* ValueError:\n    pass\n", 1, "try/except*"),
        ("dir()\n", 1, "builtin 'dir'"),
        ("import sys\nsys.exit(1)\n", 2, "sys.exit"),
        ("from . import x\n", 1, "relative imports"),
        (
            "from grail import external\n@external\ndef f() -> int: ...\ndef f():\n    return 1\n",
            4,
            "hide the host",
        ),
    ],
)
def test_static_check_reports_file_and_line(src, line, fragment):
    found = _messages(src)
    assert any(ln == line and fragment in msg for ln, msg in found), found


def test_check_does_not_flag_valid_scripts():
    src = textwrap.dedent('''\
        """Fine."""
        from grail import Input
        import json, re, math
        from dataclasses import dataclass, field
        import os.path
        from collections import Counter

        input: str = Input("input")   # shadows the builtin: allowed because the script defines it

        @dataclass
        class P:
            x: int
            tags: list = field(default_factory=list)

        def f(n):
            return [i * i for i in range(n)]

        match input:
            case "a":
                r = 1
            case _:
                r = 2
        {"p": P(1).x, "f": f(3), "r": r, "j": json.dumps([1]), "c": Counter("aab")["a"],
         "e": os.path.join("a", "b")}
    ''')
    s = loads(src)
    assert s.ok, s.diagnostics


def test_optional_input_without_default_is_not_required():
    s = loads('from grail import Input\nfrom typing import Optional\nq: Optional[int] = Input("q")\n')
    assert s.ok
    assert s.inputs["q"].required is False and s.inputs["q"].default is None


def test_errors_report_every_problem_at_run():
    s = loads('from grail import Input\nx: int = Input("y")\nimport enum\n', name="two")
    result = s.error()
    assert result is not None and result.error.kind == "check" and result.error.line == 2
    assert "2 problems" in result.error.message and "line 3" in result.error.message
