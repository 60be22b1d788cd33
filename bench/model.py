"""Speed of the embedded model server's engine: load, time to first token, decode tok/s, grammar mask cost.

Run: `.venv/bin/python bench/model.py [--tokens 64] [--reps 3] [--cold]`. It drives `Engine` in-process (no
HTTP) so the numbers are the model's and the grammar's, not the network's. Every decode runs on one torch
thread, and each figure is measured on two engines over the same weights in the same run, interleaved so that
load from other processes hits both alike:

- old: transformers' `forward` per token with a `DynamicCache` (`Engine(decode="hf")`), the reference;
- new: `runtime.modelserver.decoder` (packed weights, a preallocated KV cache, a hand-written step), which
  must give the same tokens: the bench checks that every generation's token ids match.

The machine's load average is printed first and last because on a shared 2-core box other processes change
these numbers several-fold. Aim from issue 16: >= 50 tok/s greedy on one thread with grammar masks on.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
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


TARGET_TOK_S = 50.0


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def _progress(msg: str) -> None:
    print(f"[bench/model] {msg}", file=sys.stderr, flush=True)


@dataclass
class Run:
    """One greedy generation: its speed, its mask cost and the tokens it produced."""

    tok_s: float
    decode_seconds: float
    mask_per_token: float
    tokens: list[int]
    first_token_seconds: float


def _decode(engine: Engine, prompt: list[int], tokens: int, grammar: Any) -> Run:
    """One greedy generation; without a grammar EOS is ignored so that every run decodes exactly `tokens`."""
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=grammar is None)
    for _ in engine.generate(prompt, params, grammar):
        pass
    s = engine.stats
    n = max(s.completion_tokens, 1)
    return Run(n / s.decode_seconds, s.decode_seconds, s.mask_seconds / n, list(s.token_ids),
               s.first_token_seconds)


def _spread(xs: list[float], fmt: str = "{:.1f}") -> str:
    """Median and range: on a shared machine the range says as much as the median."""
    med = statistics.median(xs)
    if len(xs) == 1:
        return fmt.format(med)
    return f"{fmt.format(med)} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=int, default=64, help="max new tokens per decode")
    p.add_argument("--reps", type=int, default=3, help="repetitions per path (median and range reported)")
    p.add_argument("--cold", action="store_true", help="also time a cold GGUF conversion into a temp cache")
    a = p.parse_args()

    rows: list[tuple[str, str]] = [("load average at start (1/5/15 min)", _loadavg())]
    if a.cold:
        _progress("cold load: converting the GGUF into a temporary cache")
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
    _progress("loading the model")
    first = load_model(threads=1)
    label = "load, cold (cache was empty: converted)" if first.converted else "load, cached safetensors"
    if a.cold:
        label += " (imports already warm)"
    rows.append((label, f"{first.load_seconds:.2f} s"))
    if first.converted:
        again = load_model(threads=1)
        rows.append(("load, cached safetensors", f"{again.load_seconds:.2f} s"))
    import torch

    torch.set_num_threads(1)
    rows.append(("torch threads", str(torch.get_num_threads())))
    old_engine = Engine(first, decode="hf")
    _progress("new path: packing weights and checking them against transformers")
    engine = Engine(first)
    rows.append(
        ("new path: pack weights + bitwise self-check (once per start)",
         f"{engine.decoder_seconds:.2f} s (path: {engine.decode_path})")
    )

    _progress("compiling grammars on the real 49k vocabulary")
    for name, c in [
        ("3-tool JSON schema", Constraint("json", json.dumps(TOOLS_SCHEMA))),
        ("10-tool JSON schema", Constraint("json", json.dumps(TEN_TOOLS_SCHEMA))),
        ("EBNF (2 tools, hermes tags)", Constraint("grammar", EBNF)),
    ]:
        cache = GrammarCache(engine.tokenizer_info)  # a fresh cache each, so nothing is reused
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
    schema = Constraint("json", json.dumps(TOOLS_SCHEMA))
    grammars = {id(e): e.grammars.compile(schema) for e in (old_engine, engine)}
    paths = [("old", old_engine), ("new", engine)]
    for _, e in paths:  # warm-up: first forwards allocate and pick kernels
        _decode(e, free, 8, None)
        _decode(e, tool, 8, grammars[id(e)])

    runs: dict[tuple[str, str], list[Run]] = {}
    cases = [("free", free, None), ("tool+grammar", tool, "schema"), ("tool", tool, None)]
    n_masked = len(_decode(engine, tool, a.tokens, grammars[id(engine)]).tokens)
    lengths = {"free": a.tokens, "tool+grammar": a.tokens, "tool": n_masked + 1}
    for rep in range(a.reps):  # interleaved: old and new side by side in every repetition
        for case, prompt, g in cases:
            for name, e in paths:
                _progress(f"rep {rep + 1}/{a.reps}: {case}, {name} path")
                grammar = grammars[id(e)] if g else None
                runs.setdefault((case, name), []).append(_decode(e, prompt, lengths[case], grammar))

    identical = all(
        r_old.tokens == r_new.tokens
        for case, _, _ in cases
        for r_old, r_new in zip(runs[(case, "old")], runs[(case, "new")], strict=True)
    )

    def speed(case: str, name: str) -> list[float]:
        return [r.tok_s for r in runs[(case, name)]]

    def ratio(case: str) -> str:
        pairs = [n.tok_s / o.tok_s for o, n in zip(runs[(case, "old")], runs[(case, "new")], strict=True)]
        return _spread(pairs, "{:.2f}") + "x"

    labels = {
        "free": f"greedy decode, 1 thread, no grammar ({a.tokens} tok, story prompt)",
        "tool+grammar": f"greedy decode, 1 thread, 3-tool JSON schema mask ({n_masked} tok)",
        "tool": f"greedy decode, 1 thread, tool prompt, no grammar ({n_masked + 1} tok)",
    }
    for case, _, _ in cases:
        old, new = _spread(speed(case, "old")), _spread(speed(case, "new"))
        rows.append((labels[case], f"old {old} | new {new} tok/s | new/old {ratio(case)}"))
    rows.append(("same token ids on both paths, every run", "yes" if identical else "NO (a bug: see tests)"))
    for name in ("old", "new"):
        masked = runs[("tool+grammar", name)]
        plain = runs[("tool", name)]
        # n+1 plain tokens = the same number of forwards and picks as n grammar tokens plus their EOS
        overhead = (statistics.median(r.decode_seconds for r in masked)
                    / statistics.median(r.decode_seconds for r in plain) - 1) * 100
        mask = statistics.median(r.mask_per_token for r in masked)
        share = mask * len(masked[0].tokens) / statistics.median(r.decode_seconds for r in masked)
        rows.append(
            (f"{name} path: mask per token (fill + apply + accept); grammar vs plain end to end",
             f"{mask * 1000:.3f} ms = {share:.1%}; {overhead:+.1f} %")
        )
    for name in ("old", "new"):
        ttft = [r.first_token_seconds for r in runs[("tool+grammar", name)]]
        rows.append((f"{name} path: time to first token ({len(tool)}-token prompt, grammar)",
                     _spread([t * 1000 for t in ttft], "{:.0f}") + " ms"))
    best = statistics.median(speed("tool+grammar", "new"))
    plain_best = statistics.median(speed("free", "new"))
    rows.append(
        (f"target: >= {TARGET_TOK_S:.0f} tok/s greedy, 1 thread, grammar masks on",
         f"{'met' if best >= TARGET_TOK_S else 'missed'} ({best:.1f} tok/s; without grammar "
         f"{plain_best:.1f} tok/s, {'met' if plain_best >= TARGET_TOK_S else 'missed'})")
    )
    rows.append(("load average at end", _loadavg()))

    width = max(len(k) for k, _ in rows)
    print(f"{'measure':<{width}} | value")
    print(f"{'-' * width}-|------")
    for k, v in rows:
        print(f"{k:<{width}} | {v}")


if __name__ == "__main__":
    main()
