"""A host serving an `ebnf` bundle never imports xgrammar or torch, and still refuses a bad grammar at start.

Why: the ebnf strategy's grammar text is written by xgrammar, whose import pulls in torch and transformers
(~220 MB of a host's ~300 MB). The host gets the texts from a short-lived child interpreter
(`runtime.model.ebnf`) at start, for the full tool set and the forced last turn's, so its memory stays that
of a host with any other strategy. Each check runs in a fresh interpreter: the test process itself has
imported xgrammar (other tests match strings against grammars), which would make it derive in process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from host_helpers import write_bundle

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("xgrammar", "torch", "transformers")


def _python(code: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, **(env or {})}, timeout=300, check=False)


def test_a_host_builds_an_ebnf_bundle_without_importing_xgrammar_or_torch(tmp_path):
    bundle = write_bundle(tmp_path, "calc")  # strategy: ebnf; max_turns 6 with a terminal tool
    code = (
        "import json, sys\n"
        "from runtime.bundle import load_bundle\n"
        "from runtime.host.served import build_agent\n"
        "agent = build_agent(load_bundle(sys.argv[1]))\n"
        "step = agent.step\n"
        "last = step._narrowed[('submit',)]\n"
        f"print(json.dumps({{'loaded': [m for m in {HEAVY!r} if m in sys.modules],\n"
        "                    'grammar': step.extras['extra_body']['structured_outputs']['grammar'],\n"
        "                    'last': last.extras['extra_body']['structured_outputs']['grammar'],\n"
        "                    'prepared': sorted(step._narrowed)}))\n"
    )
    out = _python(code, str(bundle))
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    assert found["loaded"] == []
    assert found["prepared"] == [["submit"]]  # the forced last turn's step, built at start
    # the texts are xgrammar's own: the same as deriving them in process
    from runtime.bundle import load_bundle
    from runtime.model import build_constraint, get_adapter
    from runtime.model.ebnf import derive_here

    loaded = load_bundle(bundle)
    config = loaded.kernel_config()
    built = build_constraint(get_adapter("hermes"), config.tools, loaded.decoding_constraint())
    assert found["grammar"] == built.payload["grammar"]
    assert "submit" in found["last"] and "calculator" not in found["last"]
    (ok, text), = derive_here([json.dumps({"type": "structural_tag", "format": {
        "type": "tags_with_separator", "tags": get_adapter("hermes").call_tags(list(config.tools)),
        "separator": "\n", "at_least_one": True, "stop_after_first": True}})])
    assert ok and text == found["grammar"]


def test_a_grammar_xgrammar_cannot_derive_is_still_refused_with_xgrammars_reason():
    """The child's failure to derive comes back as the same ConstraintError, at start (the agent's step)."""
    code = (
        "import json, sys\n"
        "from runtime.kernel import KernelConfig\n"
        "from runtime.model import ConstraintError, DecodingConstraint, ModelStep, get_adapter\n"
        "from runtime.types import ToolSchema\n"
        "odd = ToolSchema('odd', '', {'type': 'object', 'properties': {'a': {'type': 'frob'}}})\n"
        "submit = ToolSchema('submit', '', {'type': 'object', 'properties': {}})\n"
        "config = KernelConfig(tools=(odd, submit), terminal_tool='submit', max_turns=3)\n"
        "try:\n"
        "    ModelStep.for_config(get_adapter('hermes'), config, DecodingConstraint('ebnf'))\n"
        "except ConstraintError as exc:\n"
        "    print(exc)\n"
        f"print([m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    out = _python(code)
    assert out.returncode == 0, out.stderr
    *lines, loaded = out.stdout.strip().splitlines()
    error = "\n".join(lines)
    assert error.startswith("hermes/ebnf: xgrammar could not build the grammar: ")
    assert 'Unsupported type "frob"' in error
    assert loaded == "[]"


def test_a_host_of_several_ebnf_bundles_derives_all_their_grammars_in_one_child(tmp_path):
    calc = write_bundle(tmp_path, "calc")
    notes = write_bundle(tmp_path, "notes", tools=("note",))
    code = (
        "import json, sys\n"
        "import runtime.model.ebnf as ebnf\n"
        "calls = []\n"
        "real = ebnf.derive_in_child\n"
        "ebnf.derive_in_child = lambda docs: calls.append(len(docs)) or real(docs)\n"
        "from runtime.host.serve import load_agents\n"
        "agents = load_agents(sys.argv[1:])\n"
        "print(json.dumps({'calls': calls, 'agents': sorted(agents),\n"
        f"                  'loaded': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    out = _python(code, str(calc), str(notes))
    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout)
    # one child for both bundles' full tool sets and their forced last turn's (the same `submit` in both)
    assert found == {"calls": [3], "agents": ["calc", "notes"], "loaded": []}
