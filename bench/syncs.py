"""What a synced write costs, and how many a tool turn pays: the figures behind syncing every write.

    .venv/bin/python bench/syncs.py [--group 3] [--writers 1,100]      # (a) appends against batches
    .venv/bin/python bench/syncs.py --where [--agents 300]             # (b) the syncs of a turn, by stream

(a) One file stream on the embedded server, synced on every write (`sync_interval: always`, what the runtime
ships) and lazily (nats-server's default), alternating: N writers each write groups of `--group` events to
their own subject, one after the other, either as OCC appends in a row (each expecting the subject's last
sequence, as a run's driver does) or as one atomic batch (`Nats-Batch-*`, the expectation on its first
message). Printed: groups/s and the p50 of a group. This says whether batching a turn's appends would win
back what syncing costs: a batch makes k appends one round trip, but only pays where its commit costs less
than the k appends it replaces.

(b) `bench/peers.py --only runtime` at 100 in flight under `strace -f -e fsync` (seccomp-filtered, so only
the traced calls stop), every fsync attributed to the stream whose file it syncs. Printed: fsyncs per tool
turn by stream. The workload's run is 5 turns and one task; a task is stored once and deleted once when
acked (TASKS is a work queue: the delete writes, and syncs, a tombstone), so runs = TASKS' message fsyncs / 2.
Needs `strace`; the traced run is slower than an untraced one, and only the counts are read.

Figures, not assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYNCS_PER_TASK, TURNS_PER_RUN = 2, 5


async def _groups(nc, mode: str, writers: int, groups: int, k: int) -> tuple[float, float]:
    """`writers` writers, `groups` groups each, every group `k` events; (groups/s, p50 ms)."""
    name = "B" + uuid.uuid4().hex[:8]
    config = {"name": name, "subjects": [f"{name}.>"], "storage": "file", "num_replicas": 1,
              "allow_atomic": True}
    answer = json.loads((await nc.request(f"$JS.API.STREAM.CREATE.{name}", json.dumps(config).encode(),
                                          timeout=10)).data)
    if "error" in answer:
        raise SystemExit(f"could not create the stream: {answer['error']}")
    walls: list[float] = []

    async def writer(w: int) -> None:
        last, subject, body = 0, f"{name}.run{w}", b"x" * 300
        for _ in range(groups):
            t0 = time.perf_counter()
            if mode == "appends":
                for _ in range(k):
                    reply = await nc.request(subject, body, timeout=30,
                                             headers={"Nats-Expected-Last-Subject-Sequence": str(last)})
                    last = json.loads(reply.data)["seq"]
            else:
                batch = uuid.uuid4().hex
                for i in range(k):
                    headers = {"Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(i + 1)}
                    if i == 0:
                        headers["Nats-Expected-Last-Subject-Sequence"] = str(last)
                    if i < k - 1:
                        await nc.publish(subject, body, headers=headers)
                        continue
                    headers["Nats-Batch-Commit"] = "1"
                    ack = json.loads((await nc.request(subject, body, headers=headers, timeout=30)).data)
                    if "error" in ack:
                        raise SystemExit(f"the batch was refused: {ack['error']}")
                    last = ack["seq"]
            walls.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(writer(w) for w in range(writers)))
    elapsed = time.perf_counter() - t0
    await nc.request(f"$JS.API.STREAM.DELETE.{name}", b"", timeout=10)
    return writers * groups / elapsed, statistics.median(walls) * 1e3


async def appends_against_batches(k: int, levels: list[int], rounds: int) -> None:
    import nats

    from runtime.nats.server import EmbeddedNats

    print(f"groups of {k} events, one subject per writer; groups/s and p50 per group")
    for sync in ("always", None):
        label = "synced every write" if sync else "synced lazily (default)"
        with tempfile.TemporaryDirectory() as store:
            async with EmbeddedNats(store_dir=Path(store), sync=sync) as server:
                nc = await nats.connect(server.url)
                try:
                    for writers in levels:
                        groups = max(20, 400 // writers)
                        for mode in ("appends", "batch") * rounds:
                            rate, p50 = await _groups(nc, mode, writers, groups, k)
                            print(f"  {label:24} {writers:4} writers  {mode:8} {rate:8.0f} groups/s"
                                  f"  p50 {p50:7.2f} ms", flush=True)
                finally:
                    await nc.close()


STREAM_FILE = re.compile(r"^\d+\s+fsync\(\d+</[^>]*/streams/([^/>]+)(/(msgs|obs))?")


def syncs_of_a_turn(agents: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        trace = Path(scratch) / "strace.out"
        command = ["strace", "-f", "--seccomp-bpf", "-e", "trace=fsync,fdatasync", "-y", "-o", str(trace),
                   sys.executable, str(ROOT / "bench" / "peers.py"), "--only", "runtime", "--flight", "100",
                   "--agents", str(agents), "--latency-agents", "2"]
        print("running:", " ".join(command[8:]), "under strace", flush=True)
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        counts: collections.Counter[str] = collections.Counter()
        for line in trace.read_text().splitlines():
            found = STREAM_FILE.match(line)
            if found:
                counts[found.group(1) + (f" ({found.group(3)})" if found.group(3) else " (meta)")] += 1
    runs = counts["TASKS (msgs)"] / SYNCS_PER_TASK
    if not runs:
        raise SystemExit("no fsync of TASKS was traced: is the embedded server syncing (SA_NATS_SYNC)?")
    turns = runs * TURNS_PER_RUN
    print(f"{sum(counts.values())} fsyncs, {runs:.0f} runs ({turns:.0f} tool turns)")
    print(f"{'stream (file)':28} {'per turn':>9}")
    for where, n in counts.most_common():
        if n / turns >= 0.01:
            print(f"  {where:26} {n / turns:9.2f}")
    print(f"  {'all':26} {sum(counts.values()) / turns:9.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--group", type=int, default=3, help="events per group (a turn's appends in a row)")
    ap.add_argument("--writers", default="1,100", help="concurrent writers, comma-separated")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of (appends, batch) per level")
    ap.add_argument("--where", action="store_true", help="(b): a turn's fsyncs by stream, under strace")
    ap.add_argument("--agents", type=int, default=300, help="(b): agents of the traced peers run")
    args = ap.parse_args()
    if args.where:
        syncs_of_a_turn(args.agents)
    else:
        levels = [int(n) for n in args.writers.split(",")]
        asyncio.run(appends_against_batches(args.group, levels, args.rounds))


if __name__ == "__main__":
    main()
