"""Network partitions under load, the long version of tests/system/test_partitions.py: every fault, a bigger
load, and a table of recovery times and anomaly counts.

    sudo .venv/bin/python bench/partitions.py [--runs 120] [--window 15] [--seed 28] [--only host,worker]

One bed of machines (network namespaces on a bridge: `runtime.testing.netbed`): a 3-node NATS cluster (R3
streams, deploy/nats/nats.conf), two `sa host` (16 partitions, lease TTL 2 s) and two `sa worker`, each on
its own machine; this process is the load driver and the scripted model server. Each phase publishes
`--runs` step tasks (2-4 workspace-writing tool steps each) over `--window` seconds and, a third of the way
in, injects one fault (`runtime.testing.netfaults`):

  host cut        h0's link down while it serves runs; healed after TTL + 3 s.
                  recovery: until every partition it held is held by h1 (bound: TTL + 1 s)
  worker cut      w0's link down while jobs are held; healed after two AckWaits (its late outcomes arrive)
                  recovery: until the last job it held began again on w1 (bound: tool AckWait, 3 s)
  nats minority   a node leading neither the meta layer nor EVENTS cut off for 8 s
                  recovery: until EVENTS stored an event after the cut
  nats leader     the node leading EVENTS cut off for 8 s; recovery: the same
  host flap       h1's link down and up every 2 s for --flap seconds; recovery: from the last heal until
                  it holds a partition again

After each phase, once every run of it ended, `runtime.testing.checker` counts anomalies from the stores
(each must be 0). Needs root and `ip`; without them it says why and exits 0 (nothing measured).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import anyio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.testing.checker import anomalies  # noqa: E402
from runtime.testing.fleet import StepModel  # noqa: E402
from runtime.testing.netbed import Bed  # noqa: E402
from runtime.testing.netfaults import (  # noqa: E402
    Fault,
    Load,
    Result,
    cut_host,
    cut_nats,
    cut_worker,
    flap_host,
    phase,
)
from runtime.testing.netns import unavailable  # noqa: E402


def faults(flap: float) -> dict[str, tuple[str, Fault]]:
    return {"host": ("host cut (h0)", cut_host("h0")), "worker": ("worker cut (w0)", cut_worker("w0")),
            "minority": ("nats minority cut", cut_nats("minority")),
            "leader": ("nats leader cut (EVENTS)", cut_nats("leader")),
            "flap": (f"host flap (h1, 2 s, {flap:g} s)", flap_host("h1", period=2.0, duration=flap))}


async def main(args: argparse.Namespace) -> list[Result]:
    root = Path(tempfile.mkdtemp(prefix="bench-partitions-"))
    model = StepModel()
    bed = await Bed(root, responder=model, partitions=16).astart()
    results: list[Result] = []
    try:
        load = Load(bed, seed=args.seed)
        table = faults(args.flap)
        for key in args.only.split(","):
            name, fault = table[key]
            result = await phase(bed, model, name, fault, load, runs=args.runs, window=args.window,
                                 timeout=300)
            print(json.dumps({"fault": result.fault, "recovery_s": result.recovery_s, "notes": result.notes,
                              "counts": result.counts, "ended_s": result.ended_s}), flush=True)
            for line in result.details:
                print("  anomaly:", line, flush=True)
            results.append(result)
    finally:
        await bed.aclose()
    return results


def print_table(results: list[Result]) -> None:
    print(f"\n{'fault':<30} {'recovery s':>10} {'bound s':>8} {'runs':>5} {'anomalies':>9}  notes")
    for r in results:
        bad = anomalies(r.counts)
        notes = {k: v for k, v in r.notes.items() if k != "bound_s"}
        bound = r.notes.get("bound_s", "")
        rec = "-" if r.recovery_s is None else f"{r.recovery_s:.2f}"
        print(f"{r.fault:<30} {rec:>10} {bound!s:>8} {r.counts.get('runs', 0):>5} {sum(bad.values()):>9}  "
              f"{json.dumps(notes)}{' ' + json.dumps(bad) if bad else ''}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=120)
    parser.add_argument("--window", type=float, default=15.0)
    parser.add_argument("--flap", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--only", default="host,worker,minority,leader,flap")
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        print(f"bench/partitions.py: skipped: {why}")
        sys.exit(0)
    t0 = time.monotonic()
    out = anyio.run(main, args)
    print_table(out)
    print(f"\n{len(out)} phase(s) in {time.monotonic() - t0:.0f} s")
