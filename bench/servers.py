"""What the dialect translation is worth on a live llama.cpp server: invalid calls with and without it.

    make llamacpp && .venv/bin/python bench/servers.py [--rounds 2]

One llama-cpp-python server (built by `make llamacpp`) runs the shipped SmolLM2-135M GGUF on one CPU
thread. The demo bundle and a four-tool notes bundle (`testbed.llamacpp`) each run their tasks three ways,
in the same run, on the same server:

* `translated`: `model.server: llamacpp`, strategy `json_schema`: the tool-call envelope as a JSON schema in
  `response_format`, which llama.cpp turns into a grammar and enforces.
* `vllm fields`: the very same bundle declared `model.server: vllm`, so the constraint goes in vLLM's
  `structured_outputs`, which llama.cpp ignores without a word: what every request said before dialects.
* `none`: `constraint: {strategy: none}`, unconstrained by the bundle's own word (every request says so).

A reply is valid when it parsed into calls and each call names a tool of the bundle with arguments its
schema accepts (`testbed.llamacpp.reply_problem`); invalid when it finished and is not; cut when the server
stopped it at the token limit (no constraint prevents that: `testbed.llamacpp.Tally`). Figures are printed;
nothing asserts.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from testbed.llamacpp import (  # noqa: E402
    SHIPPED_DEMO,
    TASKS,
    LlamaServer,
    Tally,
    llamacpp_python,
    notes_bundle,
    run_tasks,
    variant,
)

MODES = {"translated": ("llamacpp", "json_schema"), "vllm fields": ("vllm", "json_schema"),
         "none": ("llamacpp", "none")}


def bundle_for(which: str, tmp: Path, base_url: str, server: str, strategy: str) -> Path:
    if which == "demo":
        return variant(SHIPPED_DEMO, tmp, base_url, server=server, strategy=strategy)
    return notes_bundle(tmp, base_url, server=server, strategy=strategy)


async def measure(base_url: str, rounds: int) -> list[tuple[str, str, Tally, float]]:
    rows = []
    for which in ("demo", "notes"):
        for mode, (server, strategy) in MODES.items():
            with tempfile.TemporaryDirectory() as tmp:
                path = bundle_for(which, Path(tmp), base_url, server, strategy)
                t0 = time.perf_counter()
                total = Tally()
                for _ in range(rounds):
                    tally = await run_tasks(path, TASKS[which])
                    for name in ("replies", "valid", "invalid", "cut", "runs", "completed", "unconstrained"):
                        setattr(total, name, getattr(total, name) + getattr(tally, name))
                    total.bad.extend(tally.bad[:5 - len(total.bad)])
                rows.append((which, mode, total, time.perf_counter() - t0))
                print(f"  {which:6} {mode:12} replies {total.replies:3}  invalid {total.invalid:3} "
                      f"({100 * total.invalid_share:5.1f} %)  cut {total.cut:3}  runs completed "
                      f"{total.completed}/{total.runs}  {time.perf_counter() - t0:5.1f} s", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="times each bundle's task list is run per mode")
    args = parser.parse_args()
    python = llamacpp_python()
    if python is None:  # `make bench` runs every bench: say why this one measured nothing, and go on
        print("bench/servers.py: no llama.cpp environment; run `make llamacpp` first "
              "(it builds .venv-llamacpp)")
        return
    with tempfile.TemporaryDirectory() as logs, LlamaServer(python, log=Path(logs) / "server.log") as server:
        print(f"llama-cpp-python server at {server.base_url} (SmolLM2-135M Q4_1, 1 thread)")
        rows = anyio.run(measure, server.base_url, args.rounds)
    print("\nbundle  mode          replies  invalid  share    cut  share    examples of what was wrong")
    for which, mode, tally, _ in rows:
        share, cut = 100 * tally.invalid_share, 100 * tally.cut_share
        print(f"{which:7} {mode:13} {tally.replies:7}  {tally.invalid:7}  {share:5.1f} %  {tally.cut:3}  "
              f"{cut:5.1f} %  {'; '.join(tally.bad[:2])[:80]}")


if __name__ == "__main__":
    main()
