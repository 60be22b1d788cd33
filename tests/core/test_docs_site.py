"""The documentation site and what its pages claim: `make docs` builds (strict, offline), the tutorial shows
its files as they are and its offline commands print what it says, and each reference page names every event
kind, command, metric and bundle key the code has (so a new one cannot go undocumented).

Links, anchors, `runtime.x.y` names, `sa` commands and `make` targets are checked in test_docs_resolve.py."""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from test_docs_resolve import cli_root, split_markdown

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
TUTORIAL = DOCS / "tutorial" / "first-agent.md"


def _page(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None,
                    reason="MkDocs is not installed (the `dev` and `docs` extras have it: `make docs`)")
def test_the_site_builds_strict_and_loads_nothing_from_outside(tmp_path):
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    pages = sorted(site.rglob("*.html"))
    assert site / "index.html" in pages and site / "tutorial" / "first-agent.html" in pages
    fetched = [f"{p.relative_to(site)}: {m}" for p in pages
               for m in re.findall(r"<(?:script|link|img)\b[^>]*(?:src|href)=\"(?:https?:)?//[^\"]+\"",
                                   p.read_text(encoding="utf-8"))]
    assert not fetched, "the site must work offline, but these load from elsewhere:\n" + "\n".join(fetched)
    every_md = {p.relative_to(DOCS).with_suffix(".html") for p in DOCS.rglob("*.md")}
    assert every_md <= {p.relative_to(site) for p in pages}


def _marked_blocks(page: Path, marker: str) -> list[tuple[str, list[str]]]:
    """The fenced blocks of a page right after a `<!-- marker: value -->` line, with the value."""
    text = page.read_text(encoding="utf-8")
    lines = text.splitlines()
    _, blocks = split_markdown(text)
    out = []
    for start, _, body in blocks:
        above = lines[start - 2].strip() if start >= 2 else ""
        if m := re.fullmatch(rf"<!-- {marker}: (.+?) -->", above):
            out.append((m.group(1), body))
    return out


def test_the_tutorial_shows_its_files_as_they_are():
    shown = _marked_blocks(TUTORIAL, "file")
    assert {name for name, _ in shown} == {
        "docs/tutorial/first-agent/bundle.yaml", "docs/tutorial/first-agent/tools/to_fahrenheit.pym",
        "docs/tutorial/first-agent/tools/final_answer.pym"}
    for name, body in shown:
        assert "\n".join(body) == (ROOT / name).read_text(encoding="utf-8").rstrip("\n"), name


def test_the_tutorial_bundle_loads_with_its_two_tools():
    from runtime import load_bundle

    bundle = load_bundle(DOCS / "tutorial" / "first-agent")
    assert bundle.name == "units"
    assert sorted(bundle.tools) == ["final_answer", "to_fahrenheit"]


def _sa(args: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "200", "NO_COLOR": "1"}
    env.pop("NATS_URL", None)
    return subprocess.run([sys.executable, "-c", "from runtime.cli import main; main()", *args],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


def test_the_examples_marked_to_run_print_what_the_page_shows():
    """A block after `<!-- check: runs -->` is a console session: each `$ sa ...` line is run here (commands
    that need no server), must exit 0, and must print the lines shown under it."""
    sessions = [body for page in sorted(DOCS.rglob("*.md")) for what, body in _marked_blocks(page, "check")
                if what == "runs"]
    assert sessions, "no page has a block marked to run"
    ran = 0
    for body in sessions:
        steps: list[tuple[str, list[str]]] = []
        for line in body:
            if line.startswith("$ "):
                steps.append((line[2:], []))
            elif steps:
                steps[-1][1].append(line)
        for command, shown in steps:
            words = shlex.split(command)
            assert words[0] == "sa", f"only `sa` commands run here: {command}"
            done = _sa(words[1:])
            assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stderr}"
            printed = done.stdout.splitlines()
            missing = [line for line in shown if line.strip() and line.rstrip() not in printed]
            assert not missing, (f"{command} did not print:\n" + "\n".join(missing)
                                 + "\nit printed:\n" + done.stdout)
            ran += 1
    assert ran >= 2


def _cli_commands() -> list[str]:
    out: list[str] = []

    def walk(cmd: typing.Any, path: list[str]) -> None:
        for name, sub in cmd.commands.items():
            if hasattr(sub, "commands"):
                if getattr(sub, "invoke_without_command", False):
                    out.append(" ".join([*path, name]))
                walk(sub, [*path, name])
            else:
                out.append(" ".join([*path, name]))

    walk(cli_root(), ["sa"])
    return out


def test_the_cli_reference_names_every_command():
    page = _page("reference/cli.md")
    commands = _cli_commands()
    assert "sa send" in commands and "sa schedule pause" in commands and "sa runs" in commands
    missing = [c for c in commands if f"`{c}`" not in page]
    assert not missing, f"reference/cli.md's table lacks: {missing}"


def test_the_events_reference_names_every_event_kind():
    from runtime import events as ev

    page = _page("reference/events.md")
    kinds = sorted(ev.EVENT_KINDS)
    assert "run.started" in kinds and "question.answered" in kinds
    missing = [k for k in kinds if f"`{k}`" not in page]
    assert not missing, f"reference/events.md lacks the kinds {missing}"


def test_the_metrics_reference_names_exactly_the_metrics_the_code_exposes():
    from runtime.observe.metrics import metric_names

    page = _page("reference/metrics.md")
    written = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in re.findall(r"`(sa_[a-z_]+)`", page)}
    exposed = set(metric_names())
    assert written - exposed == set(), "reference/metrics.md names metrics nobody exposes"
    assert exposed - written == set(), "metrics reference/metrics.md does not name"


def test_the_bundle_reference_names_every_top_level_key():
    from runtime.bundle import BundleSpec

    page = _page("reference/bundle.md")
    table = [line for line in page.splitlines() if line.startswith("| `")]
    keys = [k for line in table for k in re.findall(r"`([a-z_]+(?:\.[a-z_]+)?)`", line.split("|")[1])]
    named = {k.split(".")[0] for k in keys}
    assert set(BundleSpec.model_fields) - named == set(), "keys reference/bundle.md's table does not name"
    assert named - set(BundleSpec.model_fields) == set(), "keys reference/bundle.md names that do not exist"
