"""Late bytes: a write a client put into its connection to a cut-off NATS node, applied when the node comes
back, after a newer write the client made through another node.

    sudo PYTHONPATH=. .venv/bin/python bench/late_bytes.py [--tries 5] [--cut 10 | --cut 8,9,10]
        [--heal fixed|before-retransmit] [--a leader|follower] [--mode plain|linger] [--server-ping 0]

One bed (`testbed.netbed`, network namespaces on a bridge): a 3-node NATS cluster from
deploy/nats/nats.conf and the `runs` KV bucket at replicas 3 (`runtime.nats.kv.runs_kv`: history 1,
direct get). This process, in the root namespace, is the client. Each try:

  1. node A := the node leading KV_runs (`--a follower`: one of its followers). A client connects with
     [A, B, C] in that order (no randomizing) and our settings (`runtime.nats.connection.connect`: a ping
     every 2 s, 2 outstanding); it writes `late.<i>` = init (plain put) and `cas.<i>` = init.
  2. A's link goes down. At once the client writes `late.<i>` = old (plain `kv.put`) and
     `cas.<i>` = old (`kv.update(..., last=<init's revision>)`): both go into the dead connection and
     time out (2 s).
  3. nats-py misses its pings (5.7 s), closes that socket and reconnects to B; the client writes
     `late.<i>` = new and `cas.<i>` = new (update on init's revision), retrying timeouts as a host does.
  4. A's link comes up: `--heal fixed` at `--cut` s after the cut (or once `new` is stored, if later);
     `--heal before-retransmit` then waits until 0.1 s before the kernel's next retransmission of the
     old socket (its `rto` minus `lastsnd` in `ss -tni`), the luckiest moment for the late bytes.
  5. For `--wait` s: an observer connected to B and C (subscribed to `$KV.runs.>`) records every publish
     that reaches the cluster; the leader's value of the key is polled (STREAM.MSG.GET: direct get may
     answer from the lagging replica A and said `init` once); `ss -tni` follows the old socket; a packet
     log inside A's namespace (AF_PACKET, no tcpdump here) and A's /connz follow the connection A holds.

`stale`: `late.<i>` ends as `old` at a revision above `new`'s. `--mode linger` sets SO_LINGER {1, 0} on
each of the client's sockets (nats-py has no option for it: `nc._transport._io_writer`'s socket), so the
close of the dead connection sends a reset (lost in the cut) and discards the unsent bytes instead of
leaving them to FIN_WAIT1 retransmissions. deploy/nats/nats.conf now sets `ping_interval: "2s"`,
`ping_max: 2` (after these measurements); `--server-ping 0` takes them out (nats-server's default, 2 minutes:
how every figure below but the last was measured), `--server-ping N` sets another interval.

Measured 2026-11-27 (nats-py 2.16, nats-server 2.15.1; the old socket's RTO starts at 0.2 s and doubles,
so its retransmissions fall about 6.3, 12.8 and 25.9 s after the cut; A writes to the dead connection
0.2-0.6 s after the heal, a copy of a reply for the client's inbox, which A still routes to the old
connection, and the client's kernel answers that with a reset: A closes it, "Read Error"):

  A leads KV_runs, heal 0.1 s before a retransmission (5 tries): A processed the late PUBs in 5 (connz
      in_msgs 3 -> 5); `old` stored over `new` in 3, 0.26-0.78 s after the heal; in the other 2 the PUB
      reached the cluster during the stream leader change the healed node's higher term forces: dropped.
  A follows KV_runs, the same (5 tries): processed 5, stored 0 (the same leader change); in an earlier
      run of this setup stored 1 of 3, 0.77 s after the heal.
  A leads, heal at a fixed time, 8 s after the cut (5 tries) and 8, 9, ..., 15 s (one each): processed and
      stored in 1 of 13, the 13 s cut: the retransmission came 13.4 s after the cut, 0.40 s after the heal
      and 0.09 s before A's first write; `old` stored 0.52 s after the heal. In the 12 others the reset
      came first and A never read the late bytes. A follows, 8 s (4 tries): 0 of 4.
  the CAS key (`kv.update` on init's revision): ended `new` in all 42 tries read from the leader; the
      late update reached the cluster whenever the plain put did, and was refused.
  --mode linger (4 with A leading, 4 following, heal 10 s): processed 0 of 8; the socket is gone from
      `ss` at once (no FIN_WAIT1), nothing is retransmitted.
  --server-ping 2 (A leading, heal before a retransmission, 4 tries): processed 0 of 4; A dropped the
      client ("Stale Connection") 6 s into the cut, and the late PUB met a closed socket.
  deploy/nats/nats.conf's ping, the default since (A leading, heal before a retransmission, 3 tries): the
      same, processed 0 of 3, "Stale Connection" 5.9-6.0 s into the cut, the late PUB answered with a reset.

Each try prints one JSON line (ss lines before, during and after, connz, packets, the observer's and the
leader's views) and the script a summary per mode. Needs root and `ip`; the namespaces go at exit
(`testbed.netns.sweep()` removes those of a killed run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from runtime.nats.connection import connect  # noqa: E402
from runtime.nats.kv import runs_kv  # noqa: E402
from testbed import netbed  # noqa: E402
from testbed.netbed import CLIENT, MONITOR, Bed  # noqa: E402
from testbed.netns import unavailable  # noqa: E402

STREAM = "KV_runs"

# A packet log inside A's namespace (no tcpdump here): every TCP segment to or from port 4222 with the
# client's port, one line each: time, direction, flags, seq, ack, payload length and its first bytes.
SNIFFER = r"""
import socket, struct, sys, time
port = int(sys.argv[1])
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.ntohs(3))
while True:
    pkt, addr = s.recvfrom(65535)
    if addr[0] == "lo" or len(pkt) < 34 or pkt[12:14] != b"\x08\x00" or pkt[23] != 6:
        continue
    ihl = (pkt[14] & 15) * 4
    t = 14 + ihl
    sp, dp, seq, ack, off, fl = struct.unpack("!HHIIBB", pkt[t:t + 14])
    if port not in (sp, dp) or 4222 not in (sp, dp):
        continue
    tot = struct.unpack("!H", pkt[16:18])[0]
    data = pkt[t + (off >> 4) * 4:14 + tot]
    flags = "".join(c for c, b in zip("FSRPAU", (1, 2, 4, 8, 16, 32)) if fl & b)
    way = "client>A" if dp == 4222 else "A>client"
    print(f"{time.time():.3f} {way} {flags} seq={seq} ack={ack} len={len(data)} {data[:60]!r}", flush=True)
"""


def now() -> float:
    return time.time()


def connz_in(bed: Bed, node: int, name: str) -> list[dict[str, Any]]:
    """A's connections named `name` (open and closed), read from inside A's namespace so it works while A
    is cut off."""
    m = bed.nodes[node]
    code = ("import urllib.request,sys;sys.stdout.write(urllib.request.urlopen("
            f"'http://127.0.0.1:{MONITOR}/connz?state=all&limit=1024',timeout=2).read().decode())")
    done = subprocess.run(m.command([sys.executable, "-c", code]), capture_output=True, text=True, timeout=10)
    try:
        conns = json.loads(done.stdout).get("connections") or []
    except ValueError:
        return []
    keep = ("cid", "port", "in_msgs", "in_bytes", "out_msgs", "last_activity", "stop", "reason", "rtt")
    return [{k: c.get(k) for k in keep if k in c} for c in conns if c.get("name") == name]


def ss_line(address: str, port: int) -> str:
    """`ss -tni` for the client's socket from local `port` to A (empty once the kernel dropped it)."""
    out = subprocess.run(["ss", "-tniH", "state", "all", "dst", f"{address}:{CLIENT}", "sport", f"= :{port}"],
                         capture_output=True, text=True).stdout
    return " ".join(out.split())


def ss_state(line: str) -> str:
    return line.split()[0] if line else "gone"


def stream_leader(bed: Bed) -> int | None:
    for i in range(len(bed.nodes)):
        jsz = bed.monitor(i, "/jsz?streams=true&accounts=true") or {}
        for acc in jsz.get("account_details") or []:
            for s in acc.get("stream_detail") or []:
                if s.get("name") == STREAM:
                    leader = (s.get("cluster") or {}).get("leader")
                    if leader:
                        return next(j for j, m in enumerate(bed.nodes) if m.name == leader)
    return None


async def settle(bed: Bed, timeout: float = 60.0) -> int:
    """Until KV_runs has a leader and both followers are current; the leader's index."""
    deadline = now() + timeout
    while now() < deadline:
        leader = stream_leader(bed)
        if leader is not None:
            jsz = bed.monitor(leader, "/jsz?streams=true&accounts=true") or {}
            for acc in jsz.get("account_details") or []:
                for s in acc.get("stream_detail") or []:
                    if s.get("name") == STREAM:
                        replicas = (s.get("cluster") or {}).get("replicas") or []
                        if len(replicas) == 2 and all(r.get("current") for r in replicas):
                            return leader
        await asyncio.sleep(0.5)
    raise RuntimeError("KV_runs did not settle")


def set_linger0(nc: Any) -> None:
    sock = nc._transport._io_writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def local_port(nc: Any) -> int:
    return int(nc._transport._io_writer.get_extra_info("sockname")[1])


async def retry(what: Any, until: float) -> tuple[Any, float, int]:
    """Await `what()` until it succeeds (timeouts retried, as a host retries); (result, time, attempts)."""
    attempts = 0
    while True:
        attempts += 1
        try:
            return await what(), now(), attempts
        except Exception as e:  # timeouts and no-responders while the stream elects
            if now() > until:
                raise RuntimeError(f"gave up after {attempts} attempts: {e!r}") from e
            await asyncio.sleep(0.2)


def next_retransmit(line: str) -> float | None:
    """Seconds until the kernel retransmits on the socket `ss` described (rto minus time since last send)."""
    rto = re.search(r"\brto:(\d+)", line)
    lastsnd = re.search(r"\blastsnd:(\d+)", line)
    if not rto or not lastsnd:
        return None
    return (int(rto.group(1)) - int(lastsnd.group(1))) / 1000


async def attempt(bed: Bed, i: int, *, mode: str, cut_s: float, wait_s: float, heal: str,
                  role: str) -> dict[str, Any]:
    leader = await settle(bed)
    a = leader if role == "leader" else (leader + 1 + i % 2) % len(bed.nodes)
    others = [j for j in range(len(bed.nodes)) if j != a]
    A = bed.nodes[a]
    out: dict[str, Any] = {"try": i, "mode": mode, "heal": heal, "cut": cut_s, "A": A.name, "A_is": role,
                           "leader_before": bed.nodes[leader].name}
    # the observer: B and C only, sees every publish to the bucket that reaches the cluster
    admin = await connect([bed.urls[j] for j in others], name="late-observer", dont_randomize=True)
    seen: list[tuple[float, str, bytes, str]] = []

    async def on_msg(msg: Any) -> None:
        expected = (msg.headers or {}).get("Nats-Expected-Last-Subject-Sequence", "")
        seen.append((now(), msg.subject, msg.data, expected))

    await admin.subscribe("$KV.runs.>", cb=on_msg)
    await admin.flush()
    jsm = admin.jetstream(timeout=5.0)
    kv_obs = await jsm.key_value("runs")

    name = f"late-client-{i}"
    events: list[tuple[float, str]] = []
    reconnected = asyncio.Event()
    client: Any = None

    async def on_disc() -> None:
        events.append((now(), "disconnected"))

    async def on_rec() -> None:
        events.append((now(), f"reconnected to {client.connected_url.netloc}"))
        if mode == "linger":
            set_linger0(client)
        reconnected.set()

    client = await connect([bed.urls[a]] + [bed.urls[j] for j in others], name=name, dont_randomize=True,
                           disconnected_cb=on_disc, reconnected_cb=on_rec)
    assert client.connected_url.hostname == A.address, client.connected_url
    if mode == "linger":
        set_linger0(client)
    port = local_port(client)
    sniff_log = bed.root / f"sniff-{i}.log"
    with open(sniff_log, "wb") as f:
        sniffer = subprocess.Popen(A.command([sys.executable, "-c", SNIFFER, str(port)]), stdout=f,
                                   stderr=subprocess.STDOUT)
    await asyncio.sleep(0.3)
    js = client.jetstream(timeout=2.0)
    kv = await js.key_value("runs")
    key, cas = f"late.{i}", f"cas.{i}"
    r_init, _, _ = await retry(lambda: kv.put(key, b"init"), now() + 30)  # the first may time out
    c_init, _, _ = await retry(lambda: kv.put(cas, b"init"), now() + 30)
    out["ss_before_cut"] = ss_line(A.address, port)

    t_cut = bed.cut(A.name)
    old_put = asyncio.ensure_future(kv.put(key, b"old"))
    old_cas = asyncio.ensure_future(kv.update(cas, b"old", last=c_init))
    for name_, task in (("old_put", old_put), ("old_cas", old_cas)):
        try:
            await task
            out[name_] = "stored?!"
        except Exception as e:  # the timeout is the point
            out[name_] = type(e).__name__
    out["ss_during_cut"] = ss_line(A.address, port)
    await asyncio.wait_for(reconnected.wait(), 60)
    t_rec = now()
    out["ss_after_reconnect"] = ss_line(A.address, port)
    out["connz_A_during_cut"] = await asyncio.to_thread(connz_in, bed, a, name)

    r_new, t_new, n_new = await retry(lambda: kv.put(key, b"new"), now() + 60)

    async def cas_new() -> int:
        try:
            return await kv.update(cas, b"new", last=c_init)
        except Exception as e:  # a timed-out attempt may have stored it: then it is there
            entry = await kv.get(cas)
            if entry.value == b"new":
                return int(entry.revision)
            raise e

    c_new, _, _ = await retry(cas_new, now() + 60)
    heal_at = max(t_cut + cut_s, now())
    await asyncio.sleep(max(0.0, heal_at - now()))
    if heal == "before-retransmit":  # heal 0.1 s before the kernel's next retransmission of the old bytes
        line = ss_line(A.address, port)
        wait = next_retransmit(line)
        out["ss_at_heal_decision"] = line
        if wait is not None:
            rto = float(re.search(r"\brto:(\d+)", line).group(1)) / 1000  # type: ignore[union-attr]
            while wait < 0.2:
                wait += rto  # the one after (the backoff doubles it; close enough to land after it)
                rto *= 2
            await asyncio.sleep(wait - 0.1)
    t_heal = bed.heal(A.name)

    timeline: list[tuple[float, str]] = []
    leader_view: list[tuple[float, str, int]] = []  # (s after heal, value, revision) at each change
    last_ss = None
    while now() < t_heal + wait_s:
        line = await asyncio.to_thread(ss_line, A.address, port)
        st = ss_state(line)
        if st != last_ss:
            timeline.append((round(now() - t_heal, 2), f"ss {st}: {line[:220]}"))
            last_ss = st
        with contextlib.suppress(Exception):  # the leader's view of the key (none while it is elected)
            m = await jsm.get_last_msg(STREAM, f"$KV.runs.{key}")
            if not leader_view or leader_view[-1][2] != m.seq:
                leader_view.append((round(now() - t_heal, 2), m.data.decode(), m.seq))
        await asyncio.sleep(0.25)
    out["leader_view_from_heal"] = leader_view
    direct = await kv_obs.get(key)  # the bucket reads with direct get: any replica may answer
    out["direct_get_at_end"] = [direct.value.decode(), direct.revision]
    await settle(bed)
    # the leader's answer (STREAM.MSG.GET), not a replica's
    final = await jsm.get_last_msg(STREAM, f"$KV.runs.{key}")
    final_cas = await jsm.get_last_msg(STREAM, f"$KV.runs.{cas}")
    out["connz_A_after"] = await asyncio.to_thread(connz_in, bed, a, name)
    out["leader_after"] = (lambda j: bed.nodes[j].name if j is not None else None)(stream_leader(bed))

    def rel(t: float) -> float:
        return round(t - t_cut, 2)

    out["times_from_cut"] = {"reconnected": rel(t_rec), "new_stored": rel(t_new), "heal": rel(t_heal)}
    out["events"] = [(rel(t), e) for t, e in events]
    out["new_put_attempts"] = n_new
    out["revisions"] = {"init": r_init, "new": r_new, "final": final.seq, "cas_init": c_init,
                        "cas_new": c_new, "cas_final": final_cas.seq}
    out["final"] = final.data.decode()
    out["final_cas"] = final_cas.data.decode()
    out["seen_by_observer"] = [(rel(t), s.split(".", 2)[2], d.decode(), exp) for t, s, d, exp in seen]
    late_old = [t for t, s, d, _ in seen if d == b"old" and s.endswith(key)]
    out["old_put_reached_cluster_after_heal_s"] = round(late_old[0] - t_heal, 2) if late_old else None
    out["stale"] = out["final"] == "old" and final.seq > r_new
    applied = [t for t, v, rev in leader_view if v == "old" and rev > r_new]
    out["stale_applied_after_heal_s"] = applied[0] if applied else None
    out["cas_defended"] = out["final_cas"] == "new"
    out["ss_timeline_from_heal"] = timeline
    sniffer.kill()
    sniffer.wait()
    packets = []
    for row in sniff_log.read_text(errors="replace").splitlines():
        head, _, rest = row.partition(" ")
        with contextlib.suppress(ValueError):
            if float(head) >= t_heal - 0.5:
                packets.append(f"{float(head) - t_heal:+.3f} {rest}")
    out["packets_at_A_from_heal"] = packets[:12]
    with contextlib.suppress(Exception):
        await asyncio.wait_for(client.close(), 5)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(admin.close(), 5)
    return out


async def main(args: argparse.Namespace) -> int:
    why = unavailable()
    if why:
        print(f"late_bytes: not measured: {why}")
        return 0
    root = Path(tempfile.mkdtemp(prefix="late-bytes-"))
    if args.server_ping is not None:  # the deploy config with another server-side ping (0: nats' default)
        kept = [line for line in netbed.CONFIG_TEMPLATE.read_text().splitlines()
                if not line.startswith(("ping_interval:", "ping_max:"))]
        ping = f'ping_interval: "{args.server_ping:g}s"\nping_max: 2\n' if args.server_ping else ""
        conf = root / "nats.conf"
        conf.write_text("\n".join(kept) + "\n" + ping)
        netbed.CONFIG_TEMPLATE = conf
    bed = Bed(root, responder=None, hosts=0, workers=0)  # type: ignore[arg-type]
    results = []
    try:
        await asyncio.to_thread(bed._start_network)
        await asyncio.to_thread(bed.wait_cluster, 60.0)
        nc = await connect(bed.urls, name="late-setup")
        await runs_kv(nc.jetstream(), replicas=3)
        await nc.close()
        modes = args.mode.split(",")
        for i in range(args.tries):
            mode = modes[i % len(modes)]
            cut = float(args.cut.split(",")[i % len(args.cut.split(","))])
            try:
                r = await attempt(bed, i, mode=mode, cut_s=cut, wait_s=args.wait, heal=args.heal, role=args.a)
            except Exception as e:  # a try that could not run (cluster not settled, ...) is not counted
                print(json.dumps({"try": i, "mode": mode, "error": repr(e)}), flush=True)
                for m in bed.nodes:
                    bed.net.heal(m.name)  # type: ignore[union-attr]
                continue
            results.append(r)
            print(json.dumps(r), flush=True)
    finally:
        await asyncio.to_thread(bed.close)
    for mode in sorted({r["mode"] for r in results}):
        rs = [r for r in results if r["mode"] == mode]
        stale = [r for r in rs if r["stale"]]
        delays = [r["old_put_reached_cluster_after_heal_s"] for r in rs
                  if r["old_put_reached_cluster_after_heal_s"] is not None]
        applied = [r["stale_applied_after_heal_s"] for r in stale]
        print(f"{mode}: stale value applied in {len(stale)} of {len(rs)} tries (after {applied} s); old put "
              f"reached the cluster after heal in {len(delays)} (after {delays} s); CAS key ended 'new' in "
              f"{sum(r['cas_defended'] for r in rs)} of {len(rs)}; logs in {root}")
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tries", type=int, default=5)
    p.add_argument("--cut", default="10",
                   help="seconds A stays cut off (at least until new is stored); a comma list cycles")
    p.add_argument("--server-ping", type=float, default=None,
                   help="the servers' ping_interval in s, ping_max 2 (default: deploy/nats/nats.conf's, "
                        "2 s; 0: nats-server's own default, 2 minutes, as measured before it was set)")
    p.add_argument("--wait", type=float, default=30.0, help="seconds to watch after the heal")
    p.add_argument("--heal", default="fixed", choices=["fixed", "before-retransmit"],
                   help="heal at --cut s, or then just before the kernel's next retransmission")
    p.add_argument("--a", default="leader", choices=["leader", "follower"],
                   help="node A (the client's first server, cut off) leads KV_runs, or is a follower of it")
    p.add_argument("--mode", default="plain", help="plain, linger, or a comma list alternated over tries")
    sys.exit(asyncio.run(main(p.parse_args())))
