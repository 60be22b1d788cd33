"""Power loss and disk faults under load, the long version of tests/system/test_powerloss.py: every phase,
with the shipped `sync_interval: always` and with nats-server's default, and a table of what was lost.

    sudo .venv/bin/python bench/powerloss.py [--runs 40] [--window 8] [--seed 40] [--sync always,default]
                                             [--only all,paused,truncate,bitflip] [--strict]

One bed per sync mode (`testbed.powerbed`): a 3-node NATS cluster (R3 streams, deploy/nats/nats.conf with
its sync line as shipped or removed) whose every node stores JetStream on a `testbed.lazyfs` mount, which
drops every write not yet synced when the power goes; two `sa host`, two `sa worker`, the scripted model.
Each phase publishes `--runs` step tasks over `--window` seconds and, a third of the way in, injects:

  all        every node loses power at once (SIGKILL + unsynced writes dropped), powers on after 1 s
  paused     the EVENTS leader loses power while another node is frozen (SIGSTOP) for 2 s and misses
             writes; the leader powers on, then the frozen node resumes
  truncate   a node that does not lead EVENTS is killed, its last EVENTS block file cut to half, restarted
  bitflip    the same with one bit of that file flipped

`--strict` runs the file systems in their strict model (a new file's name durable only once its directory is
synced; `testbed.lazyfs`), where the default is ext4's (any sync commits every name).

After each, once every run ended (or 60 s passed: the runs left are `stuck`): `acked lost` (events a run's
log held just before the fault, gone or changed after), `sa audit`'s findings, the checker's anomaly counts
(`testbed.checker`), and what the file systems dropped. With `always` every count must be 0.

Needs FUSE (`make fuse`); without it, it says why and exits 0 (nothing measured).
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

from testbed.checker import anomalies  # noqa: E402
from testbed.fleet import StepModel  # noqa: E402
from testbed.lazyfs import unavailable  # noqa: E402
from testbed.netfaults import Result  # noqa: E402
from testbed.powerbed import (  # noqa: E402
    PowerBed,
    PowerFault,
    corrupt_block,
    load,
    lose_power_all,
    lose_power_paused,
    power_phase,
)


def faults(seed: int) -> dict[str, tuple[str, PowerFault]]:
    return {"all": ("all nodes lose power", lose_power_all()),
            "paused": ("leader loses power, one frozen", lose_power_paused()),
            "truncate": ("block file truncated", corrupt_block("truncate")),
            "bitflip": ("one bit flipped", corrupt_block("bitflip", seed))}


async def run_mode(sync: str, args: argparse.Namespace) -> list[tuple[str, Result]]:
    root = Path(tempfile.mkdtemp(prefix=f"bench-powerloss-{sync}-"))
    model = StepModel()
    bed = await PowerBed(root, responder=model, sync=sync, strict=args.strict).astart()
    out = []
    try:
        driver = load(bed, args.seed)
        table = faults(args.seed)
        for key in args.only.split(","):
            name, fault = table[key]
            result = await power_phase(bed, model, name, fault, driver, runs=args.runs, window=args.window,
                                       timeout=60.0)
            print(json.dumps({"sync": sync, "fault": result.fault, "recovery_s": result.recovery_s,
                              "notes": result.notes, "counts": result.counts, "ended_s": result.ended_s}),
                  flush=True)
            for line in result.details[:12]:
                print("  anomaly:", line[:400], flush=True)
            out.append((sync, result))
            bed.sync_disks()  # the next phase starts from a synced disk, as the first did
    finally:
        await bed.aclose()
    return out


def print_table(rows: list[tuple[str, Result]]) -> None:
    print(f"\n{'fault':<32} {'sync':<8} {'runs':>4} {'acked':>6} {'acked lost':>10} {'stuck':>5} "
          f"{'audit':>5} {'anomalies':>9} {'fs lost KB':>10} {'recovery s':>10}")
    for sync, r in rows:
        bad = anomalies(r.counts)
        fs = r.notes.get("fs_lost", {}).get("bytes")
        rec = "-" if r.recovery_s is None else f"{r.recovery_s:.1f}"
        print(f"{r.fault:<32} {sync:<8} {r.counts.get('runs', 0):>4} {r.notes.get('acked_before', 0):>6} "
              f"{r.notes.get('acked_lost', 0):>10} {r.notes.get('stuck', 0):>5} {r.notes.get('audit', 0):>5} "
              f"{sum(bad.values()):>9} {'-' if fs is None else f'{fs / 1024:.0f}':>10} {rec:>10}"
              f"{'  ' + json.dumps(bad) if bad else ''}")


async def main(args: argparse.Namespace) -> list[tuple[str, Result]]:
    rows = []
    for sync in args.sync.split(","):
        rows += await run_mode(sync, args)
    return rows


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--runs", type=int, default=40)
    parser.add_argument("--window", type=float, default=8.0)
    parser.add_argument("--seed", type=int, default=40)
    parser.add_argument("--only", default="all,paused,truncate,bitflip")
    parser.add_argument("--sync", default="always,default",
                        help="always: the shipped config; default: nats-server's (sync every 2 minutes)")
    parser.add_argument("--strict", action="store_true",
                        help="disks where only a directory's sync makes its names durable (testbed.lazyfs)")
    args = parser.parse_args()
    why = unavailable()
    if why is not None:
        print(f"bench/powerloss.py: skipped: {why}")
        sys.exit(0)
    t0 = time.monotonic()
    rows = anyio.run(main, args)
    print_table(rows)
    print(f"\n{len(rows)} phase(s) in {time.monotonic() - t0:.0f} s")
