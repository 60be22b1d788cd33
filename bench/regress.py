"""Regressions over recorded runs: how fast, how cheap the second time, and what they cost live traffic.

    .venv/bin/python bench/regress.py [--runs 200] [--live 100] [--concurrency 8]
    .venv/bin/python bench/regress.py --fleet --runs 1000 --model-ms 50 --model-slots 4 --max-in-flight 4
    .venv/bin/python bench/regress.py --fleet --runs 300 --model-ms 300 --model-slots 4 --max-in-flight 4 \
        --regress-slots 1                    # the endpoint scarce: does live traffic keep its latency?

The fleet: embedded NATS, one `sa host` and one `sa worker` process (`--fleet`: two of each, every host with
`--regress-slots` regression slots), the shipped `bundles/demo` (the sandboxed calculator, then
`final_answer`) pointed at the scripted OpenAI-compatible server in a process of its own
(`runtime.testing.ScriptedModelServer`, answering after `--model-ms`, `--model-slots` requests at once, the
others queued; with `--max-in-flight`, the bundle's `endpoint:` share: that many model requests at once across
the fleet). Every task is the one actor `demo`'s, so the live tasks run one at a time in arrival order: their
latency is their queue's. `--runs` tasks are recorded as
production runs; then:

(a) regressions per minute: the recorded set regressed on the same bundle (`Client.regress`; without
    `--fleet` driven from this process with `--concurrency` runs at once, with `--fleet` by the two hosts'
    regression slots; every tool result served from the log, each regression run a real run in the log),
    against re-running the same tasks live on the same fleet with `--concurrency` in flight (each a new
    production run: the host, the worker's sandbox, the model);
(b) the second regression of the same set on the same candidate: its model calls (0: every reply comes from
    the cache) and its rate;
(c) live task latency (start to result, `--live` tasks, 4 in flight) alone, and again while a regression of
    the set runs beside it on a candidate whose system prompt differs (so the cache misses and the
    regression calls the model as a real one would); with `--fleet`, once beside a regression on the
    fleet and once beside one driven in this process (`--local`, `--concurrency` at once) to compare.

Figures printed, nothing asserted: two cores shared with whatever else runs make every figure move.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from testbed.fleet import scripted_server_process  # noqa: E402

LIVE_IN_FLIGHT = 4


_serving: list[threading.Semaphore] = []


def responder(body: dict[str, Any]) -> str:
    """The demo's two turns: the calculator on the task's expression, then its value as the answer (after
    `BENCH_MODEL_MS`, the model's time per request, serving at most `BENCH_MODEL_SLOTS` at once, the others
    queued: a model server's capacity, which a regression must not take from live traffic)."""
    import os

    from runtime.testing import hermes_call

    if not _serving:
        _serving.append(threading.Semaphore(int(os.environ.get("BENCH_MODEL_SLOTS", "0")) or 10**6))
    with _serving[0]:
        time.sleep(float(os.environ.get("BENCH_MODEL_MS", "0")) / 1000)
    task = next(m["content"] for m in body["messages"] if m["role"] == "user")
    expression = task.removeprefix("compute: ")
    done = [m for m in body["messages"]
            if m["role"] != "system" and "<tool_response>" in str(m.get("content"))]
    if not done:
        return hermes_call("calculator", {"expression": expression})
    value = str(done[-1]["content"]).split('"value":', 1)[-1].split("}", 1)[0].split(",")[0].strip(' "')
    return hermes_call("final_answer", {"answer": f"{expression} = {value}"})


def start_model_server(tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The scripted server answering with this bench's `responder`, in its own process."""
    return scripted_server_process(tmp, "regress", ROOT / "bench")


def demo_bundle(tmp: Path, model_url: str, max_in_flight: int | None = None) -> Path:
    """bundles/demo as shipped, its model the scripted server and its calculator beside it (a worker serves
    the tools of one folder); with `max_in_flight`, its endpoint's fleet-wide share."""
    folder = tmp / "demo"
    shutil.copytree(ROOT / "bundles" / "demo", folder)
    shutil.copy(ROOT / "agents" / "calculator.pym", folder / "tools" / "calculator.pym")
    text = (folder / "bundle.yaml").read_text()
    text = text.replace("../../agents/calculator.pym", "tools/calculator.pym")
    text = text.replace("base_url: local", f"base_url: '{model_url}'").replace("name: smollm2-135m-instruct",
                                                                              "name: scripted")
    if max_in_flight is not None:
        text += f"\nendpoint: {{max_in_flight: {max_in_flight}}}\n"
    (folder / "bundle.yaml").write_text(text)
    return folder


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, round(p / 100 * (len(values) - 1)))]


async def bounded(n: int, in_flight: int, one: Callable[[int], Awaitable[Any]]) -> list[Any]:
    gate = asyncio.Semaphore(in_flight)

    async def run(i: int) -> Any:
        async with gate:
            return await one(i)

    return await asyncio.gather(*(run(i) for i in range(n)))


def task_of(i: int) -> str:
    return f"compute: {i} * 3 + {i % 7}"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=200, help="recorded runs to regress")
    parser.add_argument("--live", type=int, default=100, help="live tasks timed for the latency figures")
    parser.add_argument("--concurrency", type=int, default=8, help="runs a regression drives at once in "
                                                                   "process, and live re-runs in flight")
    parser.add_argument("--fleet", action="store_true", help="two hosts and two workers; the regressions "
                                                             "driven by the hosts' regression slots")
    parser.add_argument("--regress-slots", type=int, default=2, help="each host's regression slots (--fleet)")
    parser.add_argument("--model-ms", type=float, default=0.0, help="the model's time per request")
    parser.add_argument("--model-slots", type=int, default=0, help="requests the model server serves at once "
                                                                   "(0: any number)")
    parser.add_argument("--max-in-flight", type=int, default=None, help="the endpoint's fleet-wide share: "
                                                                        "model requests at once")
    args = parser.parse_args()

    import os

    from bench.worker import start_workers, stop
    from runtime.client import Client
    from runtime.nats.server import EmbeddedNats

    os.environ["BENCH_MODEL_MS"] = str(args.model_ms)  # read by the model server's process
    os.environ["BENCH_MODEL_SLOTS"] = str(args.model_slots)
    where = "fleet" if args.fleet else "local"
    size = 2 if args.fleet else 1
    with tempfile.TemporaryDirectory(prefix="sa-bench-regress-") as name:
        tmp = Path(name)
        model, model_url = start_model_server(tmp)
        server = EmbeddedNats(tmp / "nats")
        server.start()
        hosts: list[subprocess.Popen[bytes]] = []
        workers = None
        try:
            bundle = demo_bundle(tmp, model_url, args.max_in_flight)
            from bench.runtime import start_host

            slots = str(args.regress_slots if args.fleet else 0)
            for i in range(size):
                hosts.append(start_host(server.url, bundle, tmp / f"host{i}.log", "--max-runs", "4096",
                                        "--regress-slots", slots))
            workers = start_workers(server.url, bundle / "tools", size, 8, tmp)
            fleet = (f"{size} host(s) ({slots} regression slots each), {size} worker(s), model "
                     f"{args.model_ms:g} ms" + (f", {args.model_slots} at once" if args.model_slots else "")
                     + (f", endpoint share {args.max_in_flight}" if args.max_in_flight else ""))
            async with await Client.connect(server.url) as client:
                ids: list[str] = []

                async def live(i: int) -> float:
                    t0 = time.perf_counter()
                    handle = await client.start("demo", task_of(i))
                    await handle.result(timeout=300)
                    ids.append(handle.run_id)
                    return time.perf_counter() - t0

                t0 = time.perf_counter()
                await bounded(args.runs, args.concurrency, live)
                recorded_s = time.perf_counter() - t0
                recorded = list(ids)
                while sum(r.status == "completed" for r in await client.runs("demo")) < args.runs:
                    await asyncio.sleep(0.1)
                print(f"recorded {args.runs} runs of bundles/demo in {recorded_s:.1f} s ({fleet}; "
                      f"{args.concurrency} in flight)")

                t0 = time.perf_counter()
                await bounded(args.runs, args.concurrency, live)  # the same tasks again, live
                rerun_s = time.perf_counter() - t0

                t0 = time.perf_counter()
                first = await client.regress(bundle, agent="demo", runs=recorded, save="bench",
                                             concurrency=args.concurrency, where=where)
                first_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                second = await client.regress(bundle, set_name="bench", concurrency=args.concurrency,
                                              where=where)
                second_s = time.perf_counter() - t0
                counts = ", ".join(f"{n} {v}" for v, n in first.counts.items() if n)
                print(f"(a) regression ({first.where}): {args.runs / first_s * 60:.0f} runs/min "
                      f"({first_s:.1f} s; {counts}; {first.model_calls} model calls) vs live re-run: "
                      f"{args.runs / rerun_s * 60:.0f} runs/min ({rerun_s:.1f} s): {rerun_s / first_s:.2f}x")
                print(f"(b) second regression: {second.model_calls} model calls, {second.cached} from the "
                      f"cache; {args.runs / second_s * 60:.0f} runs/min ({second_s:.1f} s)")

                alone = await bounded(args.live, LIVE_IN_FLIGHT, live)
                print(f"(c) live task latency, {LIVE_IN_FLIGHT} in flight: alone ({len(alone)} tasks) p50 "
                      f"{statistics.median(alone) * 1000:.0f} ms p99 {pct(alone, 99) * 1000:.0f} ms")
                besides = [(where, "Compute, briefly.")]
                if args.fleet:
                    besides.append(("local", "Compute, tersely."))
                for beside_where, prompt in besides:
                    during, third, took = await beside(client, bundle, live, beside_where, prompt,
                                                       args.concurrency)
                    driven = "by the fleet" if third.where == "fleet" else "in this process"
                    print(f"    beside a regression of the set driven {driven} ({len(during)} live tasks "
                          f"while it ran; it: {third.model_calls} model calls, {args.runs / took * 60:.0f} "
                          f"runs/min): p50 {statistics.median(during) * 1000:.0f} ms p99 "
                          f"{pct(during, 99) * 1000:.0f} ms")
        finally:
            if workers is not None:
                stop(workers)
            for host in hosts:
                host.terminate()
            for host in hosts:
                try:
                    host.wait(60)
                except subprocess.TimeoutExpired:
                    print(f"a host did not stop in 60 s (see {tmp}/host*.log): killed")
                    host.kill()
            server.stop()
            model.terminate()
            model.wait(10)


async def beside(client: Any, bundle: Path, live: Callable[[int], Awaitable[float]], where: str, prompt: str,
                 concurrency: int) -> tuple[list[float], Any, float]:
    """Live tasks, `LIVE_IN_FLIGHT` at a time, for as long as a regression of the set (its prompt changed,
    so every model call is a real one) runs `where`: their latencies, the regression's report, its time."""
    t0 = time.perf_counter()
    regression = asyncio.create_task(client.regress(bundle, set_name="bench", concurrency=concurrency,
                                                    system_prompt=prompt, where=where))
    during: list[float] = []

    async def alongside(k: int) -> None:
        i = k
        while not regression.done():
            during.append(await live(i))
            i += LIVE_IN_FLIGHT

    await asyncio.gather(*(alongside(k) for k in range(LIVE_IN_FLIGHT)))
    report = await regression
    return during, report, time.perf_counter() - t0


if __name__ == "__main__":
    asyncio.run(main())
