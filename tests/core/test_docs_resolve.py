"""Docs that cannot drift: every `runtime.x.y` a docstring, comment or doc page names resolves to a module
or an attribute of one, and every `runtime/...` file path they name exists; in README.md and docs/, every
relative link and #anchor resolves, every `sa ...` command in their code names a real command and options it
takes (by the real CLI's parser: nothing is run), and every `make TARGET` is a Makefile target. A rename that
forgets a reference fails here, with the file and line of the stale name."""

from __future__ import annotations

import functools
import importlib
import re
import typing
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


# ── links, `sa` commands and `make` targets in README.md and docs/ ──────────────────────────────────────────
#
# The pages under docs/ are the site `make docs` builds (mkdocs.yml): a link from one of them must stay inside
# docs/, since nothing else is published. README.md is read on the repository's page, so its links may name
# any file of the repository. An #anchor must name a heading of the page it points to, slugged as MkDocs'
# table of contents slugs it (which is GitHub's slug for the plain headings these pages use).

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]
FENCE = re.compile(r"^(```+|~~~+)(.*)$")
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def slug(heading: str) -> str:
    """A heading's anchor as MkDocs' `toc` extension makes it (markdown.extensions.toc.slugify) from the
    heading's text: markup gone, accents dropped, anything but word characters, spaces and hyphens removed."""
    import unicodedata

    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[*_]{1,2}([^*_]+)[*_]{1,2}", r"\1", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def split_markdown(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, list[str]]]]:
    """The prose lines (inline code kept) and the fenced code blocks (start line, info string, lines)."""
    prose: list[tuple[int, str]] = []
    blocks: list[tuple[int, str, list[str]]] = []
    fence: str | None = None
    for number, line in enumerate(text.splitlines(), 1):
        m = FENCE.match(line.strip())
        if fence is None and m:
            fence = m.group(1)
            blocks.append((number, m.group(2).strip(), []))
        elif fence is not None and line.strip().startswith(fence) and not line.strip().strip(fence[0]):
            fence = None
        elif fence is not None:
            blocks[-1][2].append(line)
        else:
            prose.append((number, line))
    return prose, blocks


def anchors(page: Path) -> list[str]:
    prose, _ = split_markdown(page.read_text(encoding="utf-8"))
    return [slug(m.group(2)) for _, line in prose if (m := HEADING.match(line))]


def broken_links(page: Path, root: Path) -> list[str]:
    """Every relative link and image of a page that names no file (or a file outside `root`), or an #anchor
    its page does not have."""
    prose, _ = split_markdown(page.read_text(encoding="utf-8"))
    out = []
    for number, line in prose:
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            target = m.group(1)
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not dest.exists():
                out.append(f"{where}: no such file")
            elif not dest.is_relative_to(root):
                inside = root.relative_to(ROOT) or "."
                out.append(f"{where}: outside {inside}/, which the site does not publish")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                out.append(f"{where}: no heading with the anchor #{anchor} in {dest.relative_to(ROOT)}")
    return out


def test_every_link_resolves_to_a_file_and_heading():
    problems = broken_links(ROOT / "README.md", ROOT)
    for page in PAGES[1:]:
        problems += broken_links(page, ROOT / "docs")
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_no_page_has_two_headings_with_one_anchor():
    twice = [f"{p.relative_to(ROOT)}: #{a}" for p in PAGES
             for a in set(anchors(p)) if anchors(p).count(a) > 1]
    assert not twice, "a link to these anchors could reach only the first heading:\n" + "\n".join(twice)


SHELL_INFO = {"", "sh", "bash", "shell", "console", "text"}


def code_lines(page: Path) -> list[tuple[int, str]]:
    """The lines of a page that are shell: every line of a shell (or unmarked) code block, and every inline
    code span of the prose, each with its line number."""
    prose, blocks = split_markdown(page.read_text(encoding="utf-8"))
    out = [(start + i + 1, line) for start, info, lines in blocks if info in SHELL_INFO
           for i, line in enumerate(lines)]
    return out + [(number, span) for number, line in prose for span in re.findall(r"`([^`]+)`", line)]


def sa_commands(line: str) -> list[list[str]]:
    """The `sa ...` commands a line of shell holds, as tokens without the `sa` (a comment cut off; several
    commands on a line are separated by `·`, ` / `, `;` or `&&`; a `$ ` prompt is allowed)."""
    line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
    out = []
    for part in re.split(r"\s(?:·|/|;|&&)\s|;\s", line):
        tokens = part.strip().removeprefix("$ ").split()
        if len(tokens) >= 2 and tokens[0] == "sa" and not tokens[1].startswith(("(", ")")):
            out.append(tokens[1:])
    return out


@functools.cache
def cli_root() -> typing.Any:
    """`sa` as the real CLI's click command tree (typer vendors click: reached through typer's own API)."""
    import typer.main

    from runtime.cli import app

    return typer.main.get_command(app)


def sa_problems(tokens: list[str]) -> list[str]:
    """What is wrong with `sa <tokens>` by the real CLI's parser (nothing is run): a subcommand that does not
    exist, or a --flag the command does not take. `a|b` offers alternatives; placeholders (RUN, [--json]) are
    allowed wherever the command takes arguments."""
    root = cli_root()
    root_flags = {o for p in root.params for o in p.opts}

    def flags(cmd: typing.Any) -> set[str]:
        return {o for p in cmd.params for o in [*p.opts, *getattr(p, "secondary_opts", [])]} | {"--help"}

    problems = []
    cmd, path, rest = root, ["sa"], list(tokens)
    while rest and rest[0].startswith("--") and rest[0].split("=")[0] in root_flags:  # sa --user U send ...
        rest = rest[2:] if "=" not in rest[0] else rest[1:]
    while rest and hasattr(cmd, "get_command") and not rest[0].startswith(("-", "[")):
        if re.fullmatch(r"[A-Z][A-Z_]*", rest[0]):  # `sa COMMAND --help`: a placeholder for any command
            return problems
        names = rest[0].split("|")
        subs = [cmd.get_command(cmd.context_class(cmd), n) for n in names]
        if all(s is None for s in subs) and cmd is not root and getattr(cmd, "invoke_without_command", False):
            break  # `sa runs demo`: an argument of the group itself
        problems += [f"`{' '.join([*path, n])}`: no such command" for n, s in zip(names, subs, strict=True)
                     if s is None]
        if any(s is None for s in subs):
            return problems
        rest.pop(0)
        path.append(names[0])
        cmd = subs[0]
        if len(subs) > 1:  # alternatives end the path: `sa schedule pause|resume|delete NAME`
            break
    known = flags(cmd) | root_flags
    for token in rest:
        for flag in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", token.split("=")[0]):
            if flag not in known and not (token.startswith("'") or token.startswith('"')):
                problems.append(f"`{' '.join(path)}` has no option {flag}")
    return problems


def test_every_sa_command_in_the_docs_is_a_real_command_with_real_options():
    problems = [f"{page.relative_to(ROOT)}:{number}: {problem}"
                for page in PAGES for number, line in code_lines(page)
                for tokens in sa_commands(line) for problem in sa_problems(tokens)]
    assert not problems, "\n".join(problems)


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return {t for line in text.splitlines() if (m := re.match(r"^([\w.-]+(?:\s+[\w.-]+)*)\s*:(?!=)", line))
            for t in m.group(1).split()}


def test_every_make_target_in_the_docs_exists():
    targets = make_targets()
    missing = [f"{page.relative_to(ROOT)}:{number}: make {t}" for page in PAGES
               for number, line in code_lines(page)
               for t in re.findall(r"(?:^|[\s;(]|&&)make\s+([a-z][\w-]*)", line) if t not in targets]
    assert not missing, "no such Makefile target:\n" + "\n".join(missing)


def test_the_checks_catch_mistakes(tmp_path):
    """Each check fails on the mistake it is for, so a pattern that silently matches nothing is caught."""
    assert sa_problems(["replay", "RUN", "--verify"]) == []
    assert sa_problems(["schedule", "pause|resume|delete", "NAME"]) == []
    assert sa_problems(["runs", "demo", "--json"]) == []
    assert sa_problems(["--user", "alice", "send", "demo", "hi"]) == []
    assert sa_problems(["COMMAND", "--help"]) == []
    assert sa_problems(["replya", "RUN"]) == ["`sa replya`: no such command"]
    assert sa_problems(["schedule", "pause|stop", "NAME"]) == ["`sa schedule stop`: no such command"]
    assert sa_problems(["replay", "RUN", "[--verfy]"]) == ["`sa replay` has no option --verfy"]
    assert sa_commands("sa tools / sa check agents   # sa nothing") == [["tools"], ["check", "agents"]]
    assert sa_commands("$ sa fork r1 --at 3 · sa replay r1 --diff r2") == [
        ["fork", "r1", "--at", "3"], ["replay", "r1", "--diff", "r2"]]
    assert "demo" in make_targets() and "test" in make_targets() and "docs" in make_targets()
    assert slug("Writing a `.pym` tool") == "writing-a-pym-tool"
    assert slug("Time travel: fork a run from any event") == "time-travel-fork-a-run-from-any-event"
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "a.md").write_text(
        "# A page\n\n## Its part\n\n[ok](b.md#b) [ok](#its-part) `[not a link](x.md)`\n"
        "[gone](c.md) [no anchor](b.md#nope) [outside](../x.md)\n```\n[in code](d.md)\n```\n")
    (docs / "b.md").write_text("# B\n")
    (tmp_path / "x.md").write_text("# X\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        problems = broken_links(docs / "a.md", docs)
    finally:
        ROOT = saved
    assert [p.split(": ", 1)[1] for p in problems] == [
        "c.md: no such file", "b.md#nope: no heading with the anchor #nope in docs/b.md",
        "../x.md: outside docs/, which the site does not publish"]
