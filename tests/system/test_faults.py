"""The fault-injection suite: a real 3-node NATS cluster (R3), two `sa host` and three `sa worker` OS
processes, the scripted model server, and runs of a few workspace-writing tool steps each, while the test
SIGKILLs a worker mid-job, a host mid-run and the NATS node leading the EVENTS stream (each restarts).

Afterwards, from the stores themselves:
* every run is terminal (completed), none lost;
* every workspace write was applied exactly once: each run appends one line per step to its own file,
  so the file holds exactly its k lines in order and its KV history exactly k revisions;
* the model server saw no repeated request for a recorded step: no request for step j of a run arrived
  after the run's j-th `model.responded` was in the log (a request repeated *before* that, by a host
  killed mid-call, is allowed and counted), and every turn has exactly one `model.requested`;
* no event log has a gap or a fork: seq 0..n-1, one `run.started` first, one terminal event last.

Reproducible: `--fault-seed N` fixes the runs' shapes (steps, tool cost, model latency), the publishing
pace and the kill schedule (order and delays); every run prints its seed. Default: 60 runs (CI); the soak
(`--soak`, marker `soak`) runs 500.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import pytest

from runtime import events as ev
from runtime.commands import publish_task
from runtime.log import RunLog
from runtime.nats.cluster import LocalCluster
from runtime.nats.connection import close, connect
from runtime.nats.kv import fleet_kv, kv_entries, runs_kv, workspace_kv
from runtime.nats.records import RunIndex
from runtime.nats.subjects import (
    ACTIVE_BUCKET,
    EVENTS,
    LEASES_BUCKET,
    TOOLS,
    WORKERS_CONSUMER,
    bundle_token,
    parse_lease_key,
    workspace_bucket,
)
from runtime.nats.topology import ensure_topology
from runtime.testing import ScriptedModelServer
from testbed.fleet import SaProcess, StepModel, start_all, step_task
from testbed.scripts import APPEND_LINE, SUBMIT

pytestmark = [pytest.mark.anyio, pytest.mark.fault_bed]
PARTITIONS = 8
WORKSPACE = "wsfaults"




def write_bundle(root: Path, base_url: str) -> Path:
    folder = root / "faults"
    (folder / "tools").mkdir(parents=True)
    (folder / "tools" / "step.pym").write_text(APPEND_LINE)
    (folder / "tools" / "submit.pym").write_text(SUBMIT)
    (folder / "bundle.yaml").write_text(
        "name: faults\nsystem_prompt: You append lines with tools.\n"
        f"model: {{adapter: hermes, base_url: '{base_url}', name: scripted}}\n"
        "constraint: {strategy: ebnf}\n"
        "tools:\n  - tools/step.pym\n  - tools/submit.pym\n"
        "termination: {terminal_tool: submit, max_turns: 8}\n"
        f"limits: {{max_duration: 60s}}\ndata_provider: workspace\nworkspace: {WORKSPACE}\n")
    return folder / "bundle.yaml"


# ---------------------------------------------------------------------------------------------------------
# the scenario
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Shape:
    index: int
    steps: int
    spin: int
    delay_ms: int
    run_id: str = ""


async def scenario(tmp_path: Path, runs: int, seed: int, timeout: float) -> dict[str, Any]:
    rng = random.Random(seed)
    shapes = [Shape(i, rng.randint(2, 4), rng.choice((0, 20_000, 100_000, 300_000)), rng.randint(20, 250))
              for i in range(runs)]
    publish_window = 15.0 if runs <= 100 else 30.0  # runs keep starting while the faults happen
    report: dict[str, Any] = {"seed": seed, "runs": runs, "kills": []}
    model = StepModel()
    cluster = await LocalCluster(3, root=tmp_path / "cluster").astart()
    procs: list[SaProcess] = []
    nc = None
    try:
        nc = await connect(cluster.urls, name="faults-test")
        js = nc.jetstream()
        await ensure_topology(js, replicas=3, partitions=PARTITIONS, tool_ack_wait=3.0)
        with ScriptedModelServer(responder=model) as server:
            bundle = write_bundle(tmp_path, server.base_url)
            hosts = [SaProcess(f"host{i}", ["host", str(bundle), "--task-ack-wait", "3"], cluster.url,
                          tmp_path / f"host{i}.log", "sa host: serving") for i in range(2)]
            workers = [SaProcess(f"worker{i}", ["worker", "--bundle", str(bundle), "--concurrency", "2"],
                            cluster.url, tmp_path / f"worker{i}.log", "serving") for i in range(3)]
            procs = hosts + workers
            await anyio.to_thread.run_sync(start_all, procs)
            t0 = time.monotonic()

            async def publish() -> None:
                for s in shapes:
                    task = step_task(s.index, steps=s.steps, spin=s.spin, delay_ms=s.delay_ms)
                    while True:  # publishing rides out the leader election too (same task id: stored once)
                        try:
                            s.run_id = await publish_task(js, f"faults:a{s.index}", task,
                                                          task_id=f"faults-{seed}-{s.index}")
                            break
                        except Exception:
                            await anyio.sleep(0.2)
                    await anyio.sleep(rng.uniform(0.5, 1.5) * publish_window / runs)

            async def kill_worker() -> None:
                with anyio.fail_after(60):  # mid-job: the shared consumer shows jobs held by workers
                    while True:
                        try:
                            if (await js.consumer_info(TOOLS, WORKERS_CONSUMER)).num_ack_pending:
                                break
                        except Exception:  # NATS electing a leader
                            pass
                        await anyio.sleep(0.02)
                victim = rng.choice(workers)
                victim.kill9()
                report["kills"].append((round(time.monotonic() - t0, 1), victim.name))
                restarts.start_soon(restart, victim, rng.uniform(0.5, 2.0))

            async def kill_host() -> None:
                with anyio.fail_after(60):  # mid-run: a host serving unfinished runs
                    while True:
                        try:
                            busiest = await busiest_host(js, hosts)
                        except Exception:  # NATS electing a leader (the leader kill may be under way)
                            busiest = None
                        if busiest is not None:
                            break
                        await anyio.sleep(0.05)
                victim, in_flight = busiest
                victim.kill9()
                report["kills"].append((round(time.monotonic() - t0, 1), f"{victim.name} ({in_flight} runs)"))
                restarts.start_soon(restart, victim, rng.uniform(0.5, 2.0))

            async def kill_leader() -> None:
                while True:
                    try:
                        leader = (await js.stream_info(EVENTS)).cluster.leader
                        break
                    except Exception:
                        await anyio.sleep(0.2)
                i = cluster.index_of(leader)
                await anyio.to_thread.run_sync(cluster.kill, i)
                report["kills"].append((round(time.monotonic() - t0, 1), f"nats {leader} (EVENTS leader)"))

                async def node_back(delay: float) -> None:
                    await anyio.sleep(delay)
                    await anyio.to_thread.run_sync(cluster.restart, i)

                restarts.start_soon(node_back, rng.uniform(1.0, 3.0))

            async def restart(proc: SaProcess, delay: float) -> None:
                await anyio.sleep(delay)
                proc.start()
                await anyio.to_thread.run_sync(proc.wait_ready)

            faults = [kill_worker, kill_host, kill_leader]
            rng.shuffle(faults)
            async with anyio.create_task_group() as restarts, anyio.create_task_group() as tg:
                tg.start_soon(publish)
                await anyio.sleep(rng.uniform(1.0, 2.0))
                for fault in faults:  # each while runs are in flight; the victims come back meanwhile
                    await fault()
                    await anyio.sleep(rng.uniform(1.0, 3.0))
            report["faults_done_s"] = round(time.monotonic() - t0, 1)
            await wait_all_terminal(js, shapes, timeout)
            report["all_terminal_s"] = round(time.monotonic() - t0, 1)
            report.update(await verify(js, shapes, model))
        report["host_logs"] = {h.name: h.log.read_text(errors="replace") for h in hosts}
    except BaseException:
        for p in procs:  # what the processes said, for the failure report
            tail = p.log.read_text(errors="replace").splitlines()[-25:] if p.log.exists() else []
            print(f"\n--- {p.name} (lives {p.lives}) ---\n" + "\n".join(line[:200] for line in tail))
        print(f"\nreport so far: {report}")
        raise
    finally:
        for p in procs:
            p.stop()
        if nc is not None:
            await close(nc)
        await anyio.to_thread.run_sync(cluster.stop)
    return report


async def busiest_host(js: Any, hosts: list[SaProcess]) -> tuple[SaProcess, int] | None:
    """The host process serving the most unfinished runs right now (None if none serves any)."""
    leases = await kv_entries(await fleet_kv(js, LEASES_BUCKET))
    holder = {parse_lease_key(k): e.value.decode() for k, e in leases.items()}  # (bundle, partition) -> host
    active = await kv_entries(await fleet_kv(js, ACTIVE_BUCKET))
    count: dict[str, int] = {}
    for key, entry in active.items():
        h = holder.get((bundle_token(entry.value.decode()), int(key.split(".")[0][1:])))
        if h is not None:
            count[h] = count.get(h, 0) + 1
    live = [(h, count.get(h.id, 0)) for h in hosts if h.proc is not None and h.proc.poll() is None]
    best = max(live, key=lambda x: x[1], default=None)
    return best if best is not None and best[1] > 0 else None


async def wait_all_terminal(js: Any, shapes: list[Shape], timeout: float) -> None:
    runs = await runs_kv(js)
    wanted = {s.run_id for s in shapes}
    deadline = time.monotonic() + timeout
    while True:
        try:
            index = await kv_entries(runs)
            ended = ("completed", "failed", "cancelled")
            done = {k for k, e in index.items()
                    if k in wanted and RunIndex.decode(e.value).status in ended}
        except Exception:
            done = set()
        if done == wanted:
            return
        if time.monotonic() > deadline:
            stuck = sorted(wanted - done)[:10]
            detail = []
            for run_id in stuck:
                log = await RunLog(js).read(run_id)
                detail.append(f"{run_id}: {[ev.kind_of(e) for e in log.events][-6:]}")
            raise AssertionError(f"{len(wanted - done)} run(s) not terminal after {timeout} s:\n" +
                                 "\n".join(detail))
        await anyio.sleep(1.0)


async def verify(js: Any, shapes: list[Shape], model: StepModel,
                 stored_at: dict[tuple[str, int], float] | None = None) -> dict[str, Any]:
    """Every check of the module docstring; returns the counts for the report. `stored_at`: when the server
    stored each event ((run id, seq) -> unix time), for a fleet whose hosts' clocks cannot be trusted (an
    event's own `ts` is its writer's clock)."""
    bucket = workspace_bucket(WORKSPACE)
    files = await kv_entries(await workspace_kv(js, WORKSPACE))
    info = await js.stream_info(f"KV_{bucket}", subjects_filter=f"$KV.{bucket}.>")
    revisions = {subject.split(".", 2)[2]: n for subject, n in (info.state.subjects or {}).items()}
    requests: dict[tuple[int, int], list[float]] = {}
    for t, i, step in model.requests:
        requests.setdefault((i, step), []).append(t)
    counts = {"events": 0, "writes": 0, "tool_calls": 0, "model_requests": len(model.requests),
              "repeated_before_recorded": 0}
    for s in shapes:
        log = await RunLog(js).read(s.run_id)
        events = log.events
        kinds = [ev.kind_of(e) for e in events]
        assert events, f"run {s.index} ({s.run_id}) lost"
        # no gap, no fork: one chain 0..n-1, one start, one end
        assert [e.seq for e in events] == list(range(len(events))), (s.index, [e.seq for e in events])
        assert kinds[0] == "run.started" and kinds.count("run.started") == 1, (s.index, kinds)
        terminal = [k for k in kinds if k in ("run.completed", "run.failed", "run.cancelled")]
        assert terminal == ["run.completed"] and kinds[-1] == "run.completed", (s.index, kinds)
        assert events[-1].output == {"answer": f"{s.index} wrote {s.steps}"}
        # one model.requested per turn, and no request for a step after its response was recorded
        requested = [e.turn for e in events if isinstance(e, ev.ModelRequested)]
        assert len(requested) == len(set(requested)) == s.steps + 1, (s.index, requested)
        responded = [e for e in events if isinstance(e, ev.ModelResponded)]
        assert len(responded) == s.steps + 1
        for step, response in enumerate(responded):
            arrivals = requests.get((s.index, step), [])
            assert arrivals, f"run {s.index} step {step}: recorded but never requested"
            recorded = stored_at[(s.run_id, response.seq)] if stored_at is not None else response.ts
            late = [t for t in arrivals if t > recorded]
            assert not late, f"run {s.index} step {step}: requested again after its reply was recorded"
            counts["repeated_before_recorded"] += len(arrivals) - 1
        # every workspace write exactly once: k lines in order, k revisions
        calls = [e for e in events if isinstance(e, ev.ToolCompleted) and e.tool == "step"]
        assert len(calls) == len({c.call_id for c in calls}) == s.steps, (s.index, kinds)
        assert not [e for e in events if isinstance(e, ev.ToolFailed)], (s.index, kinds)
        content = files[f"r{s.index}.txt"].value.decode()
        assert content == "".join(f"{s.index}:{j}\n" for j in range(s.steps)), (s.index, content)
        assert revisions[f"r{s.index}.txt"] == s.steps  # history 5 >= steps: every write is still stored
        counts["events"] += len(events)
        counts["writes"] += s.steps
        counts["tool_calls"] += len(calls) + 1
    return counts


def print_report(report: dict[str, Any]) -> None:
    logs = report.pop("host_logs", {})
    takeovers = sum(text.count("recovered") for text in logs.values())
    report["host_partition_recoveries_logged"] = takeovers
    print("\nfault-injection report: " + json.dumps(report, indent=1))


def seed_of(request: pytest.FixtureRequest) -> int:
    seed = request.config.getoption("--fault-seed")
    return seed if seed is not None else random.randrange(1_000_000)


async def test_faults_every_run_completes_once_with_every_write_applied_once(tmp_path, request):
    seed = seed_of(request)
    print(f"\nfault seed {seed} (rerun: pytest tests/system/test_faults.py --fault-seed {seed})")
    report = await scenario(tmp_path, runs=60, seed=seed, timeout=120)
    print_report(report)
    assert len(report["kills"]) == 3


@pytest.mark.soak
async def test_faults_soak(tmp_path, request):
    seed = seed_of(request)
    print(f"\nfault seed {seed} (rerun: pytest tests/system/test_faults.py --soak --fault-seed {seed})")
    report = await scenario(tmp_path, runs=500, seed=seed, timeout=600)
    print_report(report)
    assert len(report["kills"]) == 3
