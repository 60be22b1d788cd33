"""Prometheus metrics and JSON logs: `/metrics` of a real host and worker after real runs holds the counts
their logs imply; the Grafana dashboard and the Kubernetes manifests use exactly the names the code
exposes; JSON log lines carry the run id, agent, seq and call id where known."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
from host_helpers import calc_responder, write_bundle
from prometheus_client.parser import text_string_to_metric_families

from runtime import events as ev
from runtime import nats as bus
from runtime.commands import publish_task
from runtime.host import Host, HostConfig, load_agents
from runtime.log import RunLog
from runtime.logfields import log_context
from runtime.model.client import ModelClient
from runtime.observe.logs import json_handler
from runtime.observe.metrics import UNKNOWN_AGENT, HostMetrics, WorkerMetrics, metric_names, serve_metrics
from runtime.testing import ScriptedModelServer
from runtime.types import ToolError
from runtime.worker import Worker, build_registry

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "structured-agents.json"


def scrape(server: Any) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of `/metrics`: (name, labels) -> value."""
    text = httpx.get(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10).text
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def value(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


@pytest.mark.anyio
async def test_metrics_after_runs_hold_the_counts_the_runs_imply(nats_server, js, tmp_path: Path):
    await bus.ensure_topology(js, partitions=2, tool_ack_wait=2.0)
    bundle = write_bundle(tmp_path)
    host_metrics, worker_metrics = HostMetrics(), WorkerMetrics()
    host_http = serve_metrics(0, host_metrics.registry, addr="127.0.0.1")
    worker_http = serve_metrics(0, worker_metrics.registry, addr="127.0.0.1")
    nc = await bus.connect(nats_server.url, name="metrics-host")
    wnc = await bus.connect(nats_server.url, name="metrics-worker")
    events: list[ev.Event] = []
    try:
        with ScriptedModelServer(responder=calc_responder) as server:
            client = ModelClient(base_url=server.base_url, model="scripted", max_retries=0)
            host = Host(nc, load_agents([bundle], client=client), config=HostConfig(task_ack_wait=2.0),
                        on_event=host_metrics.observe)
            host_metrics.watch_host(host)
            worker = Worker(wnc.jetstream(), build_registry(bundles=[bundle]), concurrency=2,
                            on_outcome=worker_metrics.on_outcome)
            worker_metrics.watch_worker(worker)
            stop = anyio.Event()
            async with anyio.create_task_group() as tg:
                tg.start_soon(host.run, stop)
                tg.start_soon(worker.run, stop)
                with anyio.fail_after(30):
                    await host.ready.wait()
                runs = [await publish_task(js, "calc", "chain: 2", task_id="m-chain"),
                        await publish_task(js, "calc", "compute: 2 +", task_id="m-bad")]
                with anyio.fail_after(60):
                    for run_id in runs:
                        async for e in RunLog(js).follow(run_id):
                            events.append(e)
                    while host.drivers:  # the last run's driver lets go after its end is in the log
                        await anyio.sleep(0.02)
                await host_metrics.queues.poll_once(js)
                await worker_metrics.queues.poll_once(js)
                host_samples, worker_samples = scrape(host_http), scrape(worker_http)
                stop.set()
            await client.aclose()
    finally:
        for s in (host_http, worker_http):
            s.shutdown()
            s.server_close()
        await bus.close(nc)
        await bus.close(wnc)

    def count(kind: type, **match: Any) -> int:
        return sum(1 for e in events
                   if isinstance(e, kind) and all(getattr(e, k) == v for k, v in match.items()))

    h = host_samples
    assert value(h, "sa_runs_started_total", agent="calc") == 2 == count(ev.RunStarted)
    assert value(h, "sa_runs_completed_total", agent="calc") == count(ev.RunCompleted) == 2
    assert value(h, "sa_turn_duration_seconds_count", agent="calc") == count(ev.TurnCompleted) == 5
    assert value(h, "sa_model_call_duration_seconds_count", agent="calc") == count(ev.ModelResponded)
    responded = [e for e in events if isinstance(e, ev.ModelResponded)]
    assert value(h, "sa_model_tokens_total", agent="calc", type="input") == \
        sum(e.usage.prompt_tokens for e in responded) > 0
    assert value(h, "sa_model_tokens_total", agent="calc", type="output") == \
        sum(e.usage.completion_tokens for e in responded) > 0
    (failed,) = [e for e in events if isinstance(e, ev.ToolFailed)]  # `2 +` does not parse
    assert failed.tool == "calculator"
    assert value(h, "sa_tool_calls_failed_total", tool="calculator", error_kind=failed.error.kind) == 1
    for tool in ("calculator", "submit"):
        outcomes = count(ev.ToolCompleted, tool=tool) + count(ev.ToolFailed, tool=tool)
        assert value(h, "sa_tool_call_duration_seconds_count", tool=tool) == outcomes > 0
        sandbox = sum(1 for e in ev.expand_all(events)  # the script runs the outcomes carry
                      if isinstance(e, ev.ScriptCompleted | ev.ScriptFailed) and e.tool == tool)
        assert not count(ev.ScriptCompleted) and not count(ev.ScriptFailed)
        assert value(h, "sa_sandbox_duration_seconds_count", tool=tool) == sandbox > 0
    assert value(h, "sa_host_partitions_owned") == 2
    assert value(h, "sa_host_runs_in_flight") == 0 and value(h, "sa_host_tasks_waiting") == 0
    assert ("sa_host_runs_adopted", frozenset()) in h and value(h, "sa_host_runs_adopted") == 0
    assert value(h, "sa_queue_depth", queue="tasks") == 0 and value(h, "sa_queue_depth", queue="tools") == 0
    assert value(h, "sa_dead_letters") == 0

    w = worker_samples
    ok_calls = count(ev.ToolCompleted, tool="calculator")
    assert value(w, "sa_worker_jobs_total", tool="calculator", outcome="ok") == ok_calls == 2
    assert value(w, "sa_worker_jobs_total", tool="calculator", outcome="failed") == 1
    assert value(w, "sa_worker_tool_failures_total", tool="calculator", error_kind=failed.error.kind) == 1
    assert value(w, "sa_worker_outcomes_total") == count(ev.ToolCompleted) + count(ev.ToolFailed) == 5
    assert value(w, "sa_worker_sandbox_duration_seconds_count", tool="submit") == 2
    assert value(w, "sa_worker_jobs_in_flight") == 0 and value(w, "sa_worker_concurrency") == 2
    assert value(w, "sa_worker_dead_lettered_total") == 0


def dashboard_names() -> set[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard has no queries"
    found = {n for e in exprs for n in re.findall(r"\bsa_[a-z_]+", e)}
    return {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in found}


def test_agent_labels_stay_bounded_by_the_bundles_the_host_serves():
    """A task for an agent no bundle defines still makes a run (started, failed unknown_agent); counted
    under its own name, any publisher could add a series per made-up name. Instances fold into their
    bundle. Before the host is watched, the bundle name is all there is."""
    metrics = HostMetrics()
    metrics.observe(ev.RunStarted(run_id="r0", actor="early", input="x"))
    metrics.watch_host(SimpleNamespace(agents={"calc": None}, partitions=[], drivers={}, waiting={},
                                       stats=SimpleNamespace(runs_adopted=0)))
    for i in range(3):
        metrics.observe(ev.RunStarted(run_id=f"r{i}", actor=f"made-up-{i}", input="x"))
        metrics.observe(ev.RunFailed(run_id=f"r{i}", actor=f"made-up-{i}", reason="unknown_agent"))
    metrics.observe(ev.RunStarted(run_id="r9", actor="calc:alice", input="x"))
    started = {s.labels["agent"]: s.value for fam in metrics.registry.collect()
               for s in fam.samples if s.name == "sa_runs_started_total"}
    assert started == {"early": 1.0, UNKNOWN_AGENT: 3.0, "calc": 1.0}
    failed = metrics.registry.get_sample_value("sa_runs_failed_total",
                                               {"agent": UNKNOWN_AGENT, "reason": "unknown_agent"})
    assert failed == 3.0


def test_sandbox_time_is_counted_from_either_shape_of_log():
    """A script run carried by its outcome and one recorded as `script.*` entries (an older log, say one a
    fork copied) are each one sandbox run, of the sandbox's own duration; a run cut off before it reported
    an end, and a tool that is no script, are none."""
    metrics = HostMetrics()
    run = ev.ScriptRun(started=1.0, ended=1.5, duration_ms=250.0)
    metrics.observe(ev.ToolCompleted(run_id="r1", call_id="r1/0.0", tool="calc", output=1, script=run))
    metrics.observe(ev.ScriptCompleted(run_id="r0", call_id="r0/0.0", tool="calc", duration_ms=250.0))
    metrics.observe(ev.ToolCompleted(run_id="r0", call_id="r0/0.0", tool="calc", output=1))
    late = ToolError("timeout", "late")
    metrics.observe(ev.ToolFailed(run_id="r2", call_id="r2/0.0", tool="calc", error=late,
                                  script=ev.ScriptRun(started=1.0)))
    sample = metrics.registry.get_sample_value
    assert sample("sa_sandbox_duration_seconds_count", {"tool": "calc"}) == 2
    assert sample("sa_sandbox_duration_seconds_sum", {"tool": "calc"}) == 0.5
    assert sample("sa_tool_call_duration_seconds_count", {"tool": "calc"}) == 3


def test_turns_of_runs_the_host_let_go_of_are_forgotten_oldest_first(monkeypatch):
    """A turn is timed from its first model request to turn.completed; a run handed over or superseded
    mid-turn never completes it here, so the open turns are bounded: past the bound the oldest opened go
    (their turn is then not timed), and a run still asking keeps its place."""
    monkeypatch.setattr("runtime.observe.metrics.MAX_OPEN_TURNS", 3)
    metrics = HostMetrics()

    def ask(run: str, turn: int) -> None:
        metrics.observe(ev.ModelRequested(run_id=run, actor="calc", request_id=f"{run}/{turn}", turn=turn,
                                          ts=float(turn)))

    ask("a", 1)
    ask("b", 1)
    ask("c", 1)
    ask("a", 2)  # a new turn of `a`: now the newest
    ask("d", 1)  # one too many: `b`, the oldest, goes
    for run, turn in (("a", 2), ("b", 1), ("c", 1), ("d", 1)):
        metrics.observe(ev.TurnCompleted(run_id=run, actor="calc", turn=turn, ts=10.0))
    timed = metrics.registry.get_sample_value("sa_turn_duration_seconds_count", {"agent": "calc"})
    assert timed == 3.0  # a, c and d; not b


def test_the_dashboard_uses_exactly_the_metric_names_the_code_exposes():
    exposed = metric_names()
    assert "sa_runs_started" in exposed and "sa_worker_jobs_in_flight" in exposed
    used = dashboard_names()
    assert used - exposed == set(), "the dashboard queries metrics nobody exposes"
    assert exposed - used == set(), "metrics the dashboard does not show"


@pytest.mark.anyio
async def test_json_log_lines_carry_the_run_and_call_they_belong_to():
    out = io.StringIO()
    logger = logging.getLogger("runtime.test-json")
    logger.propagate = False
    logger.addHandler(json_handler(out))
    logger.setLevel(logging.INFO)

    async def job(call_id: str) -> None:
        with log_context(call_id=call_id):
            await anyio.sleep(0)
            logger.info("job %s done", call_id, extra={"seq": 7})

    with log_context(run_id="r-1", agent="calc"):
        logger.warning("driving")
        async with anyio.create_task_group() as tg:  # tasks inherit the context, each adds its own
            tg.start_soon(job, "r-1/1.0")
            tg.start_soon(job, "r-1/1.1")
    logger.info("outside")
    lines = [json.loads(line) for line in out.getvalue().splitlines()]
    assert lines[0]["message"] == "driving" and lines[0]["level"] == "WARNING"
    assert (lines[0]["run_id"], lines[0]["agent"], lines[0]["logger"]) == ("r-1", "calc", "runtime.test-json")
    assert "call_id" not in lines[0] and "time" in lines[0]
    jobs = sorted(lines[1:3], key=lambda d: d["call_id"])
    got = [(d["call_id"], d["run_id"], d["seq"]) for d in jobs]
    assert got == [("r-1/1.0", "r-1", 7), ("r-1/1.1", "r-1", 7)]
    assert "run_id" not in lines[3]


def test_every_long_running_command_takes_log_format_and_metrics_port():
    from tests.system.test_deploy import parse_sa

    parse_sa(["host", "b", "--log-format", "json", "--metrics-port", "9464"])
    parse_sa(["worker", "--bundle", "b", "--log-format", "json", "--metrics-port", "9464"])
    parse_sa(["up", "--log-format", "json", "--metrics-port", "9464"])
    parse_sa(["host", "b", "--metrics-port", "9464", "--metrics-addr", "0.0.0.0"])
    parse_sa(["worker", "--metrics-port", "9464", "--metrics-addr", "10.1.2.3"])
    parse_sa(["otel", "--endpoint", "http://collector:4318", "--log-format", "json"])
    with pytest.raises(AssertionError, match="log-format"):
        parse_sa(["host", "--log-format", "xml"])
    with pytest.raises(AssertionError, match="metrics-port"):
        parse_sa(["worker", "--metrics-port", "99999"])


def test_a_worker_with_json_logs_writes_nothing_but_json_lines(nats_server):
    import os
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "from runtime.cli import main; main()", "worker", "--nats",
                             nats_server.url, "--tools", str(ROOT / "agents" / "calculator.pym"),
                             "--log-format", "json"], env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    first = proc.stderr.readline()  # the start-up line: the worker is serving
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=60)
    assert proc.returncode == 0, first + rest
    records = [json.loads(line) for line in (first + rest).splitlines() if line.strip()]
    assert "serving calculator" in records[0]["message"] and records[0]["logger"] == "runtime.cli"
    assert any(r["message"].startswith("sa worker: stopped after 0 job(s)") for r in records)
    assert all({"time", "level", "logger", "message"} <= set(r) for r in records)


def test_metrics_bind_loopback_by_default_and_carry_the_process_metrics():
    """A process's own RSS, CPU and open files are exposed beside the `sa_*` families, and the server
    listens on loopback unless told otherwise (metrics name the agents and tools a fleet runs)."""
    import urllib.request

    from runtime.observe.metrics import serve_metrics

    metrics = HostMetrics()
    server = serve_metrics(0, metrics.registry)
    try:
        assert server.server_address[0] == "127.0.0.1"
        url = f"http://127.0.0.1:{server.server_port}/metrics"
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    finally:
        server.shutdown()
    for family in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        value = next(line for line in text.splitlines() if line.startswith(family + " "))
        assert float(value.split()[1]) > 0, value


def test_sa_worker_serves_metrics_on_loopback_unless_told_an_address(nats_server):
    """A real `sa worker --metrics-port P` answers on 127.0.0.1:P and its listening socket is bound to
    loopback (not every interface), as its ready line and /proc say."""
    import os
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-c", "from runtime.cli import main; main()", "worker",
           "--metrics-port", str(port),
           "--tools", "agents/calculator.pym"]
    proc = subprocess.Popen(cmd, env={**os.environ, "NATS_URL": nats_server.url}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=Path(__file__).resolve().parents[2])
    try:
        deadline = time.monotonic() + 60
        text = ""
        while time.monotonic() < deadline and not text:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            except OSError:
                time.sleep(0.2)
        assert "process_resident_memory_bytes" in text and "sa_worker" in text
        listening = Path("/proc/net/tcp").read_text().splitlines()[1:]
        local = {line.split()[1] for line in listening if line.split()[3] == "0A"}  # 0A: LISTEN
        assert f"0100007F:{port:04X}" in local and f"00000000:{port:04X}" not in local
    finally:
        proc.terminate()
        proc.wait(30)
