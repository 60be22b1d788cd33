"""What an idle host costs: CPU of one `sa host` with one bundle (16 partitions) and of its nats-server,
with nothing to do.

    .venv/bin/python bench/idle.py [--window 20] [--rounds 3] [--repo PATH]

A fleet of idle hosts should cost next to nothing, yet each host holds leases it renews (16 puts and a
heartbeat every 0.5 s, on a thread of its own), keeps a pull request open per partition consumer, and
watches the lease and host buckets. The bench starts a real nats-server and a real `sa host` process (the
demo bundle, its local model pointed at a closed port: an idle host never asks it), lets it settle for 8 s,
then reads both processes' CPU time from /proc over the window. `--repo` runs the host from another
checkout (a `git worktree` of an older commit) to compare, alternating with this one, same run.
Figures are printed; nothing asserts.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.nats.server import EmbeddedNats  # noqa: E402


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def idle_round(repo: Path, window: float) -> tuple[float, float]:
    """(host %, nats-server %) of a core over `window` seconds of an idle host run from `repo`."""
    server = EmbeddedNats().start()
    env = {**os.environ, "NATS_URL": server.url, "SA_LOCAL_MODEL_URL": "http://127.0.0.1:9"}
    host = subprocess.Popen([sys.executable, "-c", "from runtime.cli import main; main()", "host",
                             str(ROOT / "bundles" / "demo")], cwd=repo, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(8)  # started, partitions taken, first looks done
        assert server.proc is not None
        h0, n0 = cpu_seconds(host.pid), cpu_seconds(server.proc.pid)
        time.sleep(window)
        h1, n1 = cpu_seconds(host.pid), cpu_seconds(server.proc.pid)
        return 100 * (h1 - h0) / window, 100 * (n1 - n0) / window
    finally:
        host.terminate()
        host.wait(15)
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--window", type=float, default=20.0, help="seconds measured per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repo", type=Path, help="also measure a host run from this checkout, alternating")
    args = parser.parse_args()
    repos = [ROOT] + ([args.repo.resolve()] if args.repo else [])
    got: dict[Path, list[tuple[float, float]]] = {r: [] for r in repos}
    for i in range(args.rounds):
        for repo in repos:
            host, nats = idle_round(repo, args.window)
            got[repo].append((host, nats))
            print(f"round {i + 1}  {repo}: host {host:.2f} % of a core, nats-server {nats:.2f} %", flush=True)
    for repo, rows in got.items():
        print(f"median {repo}: host {statistics.median(h for h, _ in rows):.2f} %, "
              f"nats-server {statistics.median(n for _, n in rows):.2f} % of a core")


if __name__ == "__main__":
    main()
