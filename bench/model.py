"""Speed of the embedded model server's engine: load, decode with and without a grammar, mask cost, compile.

Run: `.venv/bin/python bench/model.py [--tokens 64] [--reps 3] [--cold]`. It drives `Engine` in-process (no
HTTP) so the numbers are the model's and the grammar's, not the network's. The machine's load average is
printed first because on a shared 2-core box other processes change these numbers several-fold.

Aims from issue 4: >= 20 tok/s greedy and <= 10 % per-token grammar overhead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# `python bench/model.py` puts bench/ first on sys.path, where bench/runtime.py would shadow the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from runtime.modelserver.engine import Engine, SamplingParams  # noqa: E402
from runtime.modelserver.grammar import Constraint, GrammarCache  # noqa: E402
from runtime.modelserver.weights import CACHE_ENV, load_model  # noqa: E402


def _tool(name: str, props: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "name": {"const": name},
            "arguments": {
                "type": "object",
                "properties": props,
                "required": list(props),
                "additionalProperties": False,
            },
        },
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


S40 = {"type": "string", "minLength": 1, "maxLength": 40}
TOOLS_SCHEMA = {
    "anyOf": [
        _tool("get_weather", {"city": S40, "unit": {"enum": ["celsius", "fahrenheit"]}}),
        _tool("search_web", {"query": S40, "max_results": {"type": "integer", "minimum": 1, "maximum": 10}}),
        _tool("read_file", {"path": S40}),
    ]
}
TEN_TOOLS_SCHEMA = {"anyOf": [_tool(f"tool_{i}", {"a": S40, "b": {"type": "integer"}}) for i in range(10)]}
EBNF = r"""
root ::= "<tool_call>" call "</tool_call>"
call ::= weather | read
weather ::= "{\"name\": \"get_weather\", \"arguments\": {\"city\": " s "}}"
read ::= "{\"name\": \"read_file\", \"arguments\": {\"path\": " s "}}"
s ::= "\"" [a-zA-Z0-9 ,./_-]{1,40} "\""
"""
SYSTEM = (
    "You are a function-calling assistant. Answer with one tool call as JSON. Tools: "
    "get_weather(city, unit), search_web(query, max_results), read_file(path)."
)
FREE_PROMPT = "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle."
TOOL_PROMPT = "What's the weather in Paris right now?"


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _decode(engine: Engine, prompt: list[int], tokens: int, grammar: Any) -> tuple[float, float, float, int]:
    """(tok/s, decode seconds, mask seconds per token, tokens) for one greedy generation.

    Without a grammar EOS is ignored so that every run decodes exactly `tokens` tokens.
    """
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=grammar is None)
    for _ in engine.generate(prompt, params, grammar):
        pass
    s = engine.stats
    n = max(s.completion_tokens, 1)
    return n / s.decode_seconds, s.decode_seconds, s.mask_seconds / n, n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=64, help="max new tokens per decode")
    p.add_argument("--reps", type=int, default=3, help="repetitions (the median is reported)")
    p.add_argument("--cold", action="store_true", help="also time a cold GGUF conversion into a temp cache")
    a = p.parse_args()

    rows: list[tuple[str, str]] = [("load average at start (1/5/15 min)", _loadavg())]
    if a.cold:
        with tempfile.TemporaryDirectory() as tmp:
            old = os.environ.get(CACHE_ENV)
            os.environ[CACHE_ENV] = tmp
            try:
                cold = load_model()
            finally:
                if old is None:
                    os.environ.pop(CACHE_ENV)
                else:
                    os.environ[CACHE_ENV] = old
            rows.append(("load, cold (GGUF -> safetensors conversion)", f"{cold.load_seconds:.2f} s"))
            del cold
    first = load_model()
    label = "load, cold (cache was empty: converted)" if first.converted else "load, cached safetensors"
    if a.cold:
        label += " (imports already warm)"
    rows.append((label, f"{first.load_seconds:.2f} s"))
    if first.converted:
        again = load_model()
        rows.append(("load, cached safetensors", f"{again.load_seconds:.2f} s"))
    import torch

    rows.append(("torch threads", str(torch.get_num_threads())))
    engine = Engine(first)

    # grammar compile on the real 49k vocabulary (fresh cache each, so nothing is reused)
    for name, c in [
        ("3-tool JSON schema", Constraint("json", json.dumps(TOOLS_SCHEMA))),
        ("10-tool JSON schema", Constraint("json", json.dumps(TEN_TOOLS_SCHEMA))),
        ("EBNF (2 tools, hermes tags)", Constraint("grammar", EBNF)),
    ]:
        cache = GrammarCache(engine.tokenizer_info)
        t = time.perf_counter()
        cache.compile(c)
        cold_ms = (time.perf_counter() - t) * 1000
        t = time.perf_counter()
        cache.compile(c)
        hit_ms = (time.perf_counter() - t) * 1000
        rows.append((f"compile {name}", f"{cold_ms:.0f} ms (cached: {hit_ms:.3f} ms)"))

    free = engine.render_prompt([{"role": "user", "content": FREE_PROMPT}])
    tool = engine.render_prompt(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TOOL_PROMPT}]
    )
    grammar = engine.grammars.compile(Constraint("json", json.dumps(TOOLS_SCHEMA)))
    _decode(engine, free, 8, None)  # warm-up: first forwards allocate and pick kernels

    def med(xs: list[tuple[float, float, float, int]], i: int) -> float:
        return statistics.median(x[i] for x in xs)

    threads_default = torch.get_num_threads()
    for threads in sorted({1, 2, threads_default}):
        torch.set_num_threads(threads)
        plain = [_decode(engine, free, a.tokens, None) for _ in range(a.reps)]
        rows.append(
            (f"greedy decode, no grammar, {a.tokens} tok, {threads} thread(s)", f"{med(plain, 0):.1f} tok/s")
        )
    torch.set_num_threads(threads_default)

    first_token = []
    for _ in range(a.reps):
        _decode(engine, tool, 1, None)
        first_token.append(engine.stats.first_token_seconds)
    n_masked = _decode(engine, tool, a.tokens, grammar)[3]
    masked, plain_tool = [], []
    for _ in range(a.reps):  # interleaved, so load from other processes hits both sides alike
        masked.append(_decode(engine, tool, a.tokens, grammar))
        # n+1 plain tokens = the same number of forwards and picks as n grammar tokens plus their EOS
        plain_tool.append(_decode(engine, tool, n_masked + 1, None))
    rows.append(
        (f"greedy decode, tool prompt, no grammar ({n_masked + 1} tok)", f"{med(plain_tool, 0):.1f} tok/s")
    )
    rows.append(
        (f"greedy decode, tool prompt, 3-tool JSON schema ({n_masked} tok)", f"{med(masked, 0):.1f} tok/s")
    )
    overhead = (med(masked, 1) / med(plain_tool, 1) - 1) * 100  # same forwards: compare total decode time
    rows.append(("grammar overhead per token, end to end", f"{overhead:+.1f} %"))
    mask = med(masked, 2)
    rows.append(
        (
            "mask cost per token (fill + apply + accept)",
            f"{mask * 1000:.3f} ms = {mask * med(masked, 3) / med(masked, 1):.1%}",
        )
    )
    rows.append(
        (f"time to first token ({len(tool)}-token prompt)", f"{statistics.median(first_token) * 1000:.0f} ms")
    )
    rows.append(("load average at end", _loadavg()))

    width = max(len(k) for k, _ in rows)
    print(f"{'measure':<{width}} | value")
    print(f"{'-' * width}-|------")
    for k, v in rows:
        print(f"{k:<{width}} | {v}")


if __name__ == "__main__":
    main()
