"""The `ebnf` strategy's grammar text, derived by xgrammar in a short-lived child process.

Why a child: the grammar is xgrammar's EBNF of a calls-only structural tag (typed argument rules from each
tool's JSON schema), and only xgrammar writes it. Importing xgrammar pulls in torch and transformers: about
220 MB of resident memory and 2.5 s, which a host kept for its whole life although it needs the text once,
at start (the server compiles the grammar, not the host). So the host asks a child interpreter for the
texts of every tool set it will send (the full set and the forced last turn's, in one child), keeps the
texts, and the child's memory goes back to the system when it exits.

    texts = derive([fmt_json, ...])   # -> [(True, ebnf_text) | (False, xgrammar's error), ...]

A process that has already imported xgrammar (the embedded model server, `sa constraint --compile`, the
tests that match strings against grammars) derives in process: the import is paid for there, and the text
is the same either way (same library, same call).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence

#: seconds a child may take (its import of xgrammar and torch is ~2.5 s on an idle machine)
CHILD_TIMEOUT = 300.0

# What the child runs: read a JSON list of structural-tag documents on stdin, answer one [ok, text] each.
# Plain xgrammar, nothing of the runtime: the child needs no path to this package.
_CHILD = """\
import json, sys
import xgrammar
out = []
for doc in json.load(sys.stdin):
    try:
        out.append([True, str(xgrammar.Grammar.from_structural_tag(doc))])
    except Exception as exc:
        out.append([False, str(exc)])
json.dump(out, sys.stdout)
"""


def derive_here(docs: Sequence[str]) -> list[tuple[bool, str]]:
    """Each structural-tag document's EBNF (or xgrammar's error), derived in this process."""
    import xgrammar

    out: list[tuple[bool, str]] = []
    for doc in docs:
        try:
            out.append((True, str(xgrammar.Grammar.from_structural_tag(doc))))
        except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses with the reason
            out.append((False, str(exc)))
    return out


def derive_in_child(docs: Sequence[str]) -> list[tuple[bool, str]]:
    """The same as `derive_here`, computed by a child interpreter (this one's executable and environment).

    Raises RuntimeError when the child itself fails (not a grammar error: those come back as values)."""
    try:
        done = subprocess.run([sys.executable, "-c", _CHILD], input=json.dumps(list(docs)), text=True,
                              capture_output=True, timeout=CHILD_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"the grammar child did not answer within {CHILD_TIMEOUT:.0f} s") from None
    if done.returncode != 0:
        tail = done.stderr.strip().splitlines()[-1:] or [f"exit status {done.returncode}"]
        raise RuntimeError(f"the grammar child failed: {tail[0]}")
    return [(bool(ok), str(text)) for ok, text in json.loads(done.stdout)]


def derive(docs: Sequence[str]) -> list[tuple[bool, str]]:
    """Each document's EBNF or error: in process when xgrammar is already imported, else in a child."""
    if not docs:
        return []
    return derive_here(docs) if "xgrammar" in sys.modules else derive_in_child(docs)


__all__ = ["derive", "derive_here", "derive_in_child"]
